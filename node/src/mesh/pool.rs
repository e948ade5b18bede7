//! Outgoing connections: one per peer address, dialed on first use and again after it closed.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use quinn::Connection;
use tokio::time::timeout;

use super::MeshError;
use super::acceptor::{StreamRouter, identify_peer};
use super::metrics::MeshMetrics;
use super::wire::{StreamKind, codes};
use crate::tls::{self, PeerRole, SNI};

/// An established connection and the node name its certificate proves.
#[derive(Debug, Clone)]
pub struct PeerConnection {
    pub conn: Connection,
    pub peer_name: Arc<str>,
}

impl PeerConnection {
    pub fn remote_address(&self) -> SocketAddr {
        self.conn.remote_address()
    }

    fn is_open(&self) -> bool {
        self.conn.close_reason().is_none()
    }
}

/// After a failed dial, callers for the same peer fail at once for this long instead of each
/// dialing in turn: requests queued behind a dead peer's handshake would otherwise wait one
/// connect timeout each, one after another, before their retry on another node.
const FAILED_DIAL_HOLD: Duration = Duration::from_secs(1);

/// One slot per peer address. The slot's async lock is held while dialing, so concurrent
/// callers for the same peer wait for one handshake instead of racing several.
type Slot = Arc<tokio::sync::Mutex<SlotState>>;

#[derive(Default)]
struct SlotState {
    conn: Option<PeerConnection>,
    /// The last dial's failure, while it is recent enough to answer for the next dial.
    failed: Option<(Instant, String)>,
}

pub(crate) struct ConnectionPool {
    endpoint: quinn::Endpoint,
    slots: Mutex<HashMap<SocketAddr, Slot>>,
    router: StreamRouter,
    connect_timeout: Duration,
    metrics: MeshMetrics,
}

impl ConnectionPool {
    pub fn new(
        endpoint: quinn::Endpoint,
        router: StreamRouter,
        connect_timeout: Duration,
        metrics: MeshMetrics,
    ) -> Self {
        Self {
            endpoint,
            slots: Mutex::new(HashMap::new()),
            router,
            connect_timeout,
            metrics,
        }
    }

    /// The open connection to `addr`, dialing it if there is none.
    pub async fn get(&self, addr: SocketAddr) -> Result<PeerConnection, MeshError> {
        let slot = self.slot(addr);
        let mut guard = slot.lock().await;
        if let Some(existing) = guard.conn.as_ref().filter(|c| c.is_open()) {
            return Ok(existing.clone());
        }
        guard.conn = None;
        if let Some((at, reason)) = guard
            .failed
            .as_ref()
            .filter(|(at, _)| at.elapsed() < FAILED_DIAL_HOLD)
        {
            return Err(MeshError::Connect {
                addr,
                reason: format!(
                    "a dial {} ms ago failed: {reason}",
                    at.elapsed().as_millis()
                ),
            });
        }
        match self.dial(addr).await {
            Ok(peer) => {
                self.metrics.connections_opened.inc();
                *guard = SlotState {
                    conn: Some(peer.clone()),
                    failed: None,
                };
                Ok(peer)
            }
            Err(err) => {
                self.metrics.connect_failures.inc();
                let error = err.to_string();
                // A refused certificate is loud once per spell, not at every gossip round.
                let before = guard.failed.as_ref().map(|(_, e)| tls::refusal_reason(e));
                if let Some(reason) = tls::refusal_reason(&error)
                    && before != Some(Some(reason))
                {
                    tracing::warn!(
                        %addr,
                        reason,
                        %error,
                        "mesh connection to {addr} refused: {reason}"
                    );
                }
                guard.failed = Some((Instant::now(), error));
                Err(err)
            }
        }
    }

    /// Forgets `stale` (if it is still the pooled connection to `addr`), so the next
    /// [`get`](Self::get) dials again.
    pub async fn invalidate(&self, addr: SocketAddr, stale: &PeerConnection) {
        let slot = self.slot(addr);
        let mut guard = slot.lock().await;
        if guard
            .conn
            .as_ref()
            .is_some_and(|c| c.conn.stable_id() == stale.conn.stable_id())
        {
            guard.conn = None;
        }
    }

    /// Closes the pooled connection to `addr` if the peer stays silent for `listen`: every
    /// stream on it then fails at once instead of waiting out the idle timeout. Used when
    /// gossip declares the peer dead; gossip can be wrong (a starved CPU delays heartbeats),
    /// and a live peer answers our keep-alives, so a connection that received anything while
    /// we listened is kept with its streams. Returns whether it was closed.
    pub async fn close_if_silent(&self, addr: SocketAddr, listen: Duration) -> bool {
        let slot = self.slot(addr);
        let Some(peer) = slot.lock().await.conn.clone() else {
            return false;
        };
        let received = || peer.conn.stats().udp_rx.datagrams;
        let before = received();
        tokio::time::sleep(listen).await;
        if received() != before && peer.is_open() {
            self.metrics.dead_peer_connections_kept.inc();
            tracing::info!(peer = %peer.peer_name, %addr, "peer declared dead still answers; keeping its connection");
            return false;
        }
        let mut guard = slot.lock().await;
        if guard
            .conn
            .as_ref()
            .is_some_and(|c| c.conn.stable_id() == peer.conn.stable_id())
        {
            guard.conn = None;
        }
        drop(guard);
        peer.conn
            .close(codes::PEER_DEAD, b"declared dead by gossip");
        self.metrics.dead_peer_connections_closed.inc();
        true
    }

    /// The open pooled connection to `addr`, if there is one (it is not dialed).
    pub async fn open_connection(&self, addr: SocketAddr) -> Option<Connection> {
        let slot = self.slot(addr);
        let guard = slot.lock().await;
        guard
            .conn
            .as_ref()
            .filter(|c| c.is_open())
            .map(|c| c.conn.clone())
    }

    /// Drops slots that hold no open connection and that nobody is dialing, so addresses of
    /// departed peers do not accumulate.
    pub fn prune(&self) {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.retain(|_, slot| match slot.try_lock() {
            Ok(guard) => guard.conn.as_ref().is_some_and(PeerConnection::is_open),
            Err(_) => true,
        });
    }

    fn slot(&self, addr: SocketAddr) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|e| e.into_inner());
        slots.entry(addr).or_default().clone()
    }

    /// Handshake, then wait for the server's welcome: only then do we know that it accepted
    /// our certificate (in TLS 1.3 the client finishes its handshake before the server has
    /// checked the client certificate).
    async fn dial(&self, addr: SocketAddr) -> Result<PeerConnection, MeshError> {
        let connecting = self
            .endpoint
            .connect(addr, SNI)
            .map_err(|err| MeshError::Connect {
                addr,
                reason: err.to_string(),
            })?;
        let establish = async {
            let conn = connecting.await.map_err(|err| MeshError::Connect {
                addr,
                reason: err.to_string(),
            })?;
            let refused = |err: &dyn std::fmt::Display| MeshError::Connect {
                addr,
                reason: format!("peer closed the connection before welcoming us: {err}"),
            };
            let mut welcome = conn.accept_uni().await.map_err(|err| refused(&err))?;
            let mut kind = [0u8; 1];
            welcome
                .read_exact(&mut kind)
                .await
                .map_err(|err| refused(&err))?;
            if StreamKind::from_byte(kind[0]) != Some(StreamKind::Welcome) {
                conn.close(super::wire::codes::MALFORMED, b"expected welcome");
                return Err(MeshError::Connect {
                    addr,
                    reason: format!("peer sent stream kind {:#x} instead of welcome", kind[0]),
                });
            }
            let peer_name = identify_peer(&conn).map_err(|err| MeshError::Connect {
                addr,
                reason: err.to_string(),
            })?;
            Ok(PeerConnection { conn, peer_name })
        };
        let peer = timeout(self.connect_timeout, establish)
            .await
            .map_err(|_| MeshError::Timeout {
                addr,
                what: "connect",
            })??;
        tracing::debug!(peer = %peer.peer_name, %addr, "mesh connection established");
        self.router.serve(peer.clone(), PeerRole::Server);
        Ok(peer)
    }
}
