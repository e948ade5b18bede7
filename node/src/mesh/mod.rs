//! The mesh: one QUIC endpoint per node, mutual TLS against the cluster CA, carrying both
//! gossip (chitchat) and forwarded requests.
//!
//! - [`endpoint`]: binding the endpoint with its transport settings.
//! - [`wire`]: the kind byte that starts every stream, and the gossip frame.
//! - [`pool`]: one outgoing connection per peer address, re-dialed when closed.
//! - [`acceptor`]: accepting connections and dispatching their streams.
//! - [`trust`]: re-checking established connections' certificates after a TLS reload.
//! - [`gossip`]: chitchat over the endpoint; membership and key-values.
//! - [`metrics`]: counters for `/metrics`.
//!
//! [`Mesh`] ties them together and is what the rest of the node uses.

mod acceptor;
pub mod config;
mod endpoint;
pub mod gossip;
pub mod metrics;
mod pool;
mod trust;
pub mod wire;

use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::{RecvStream, SendStream};
use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio::time::timeout;

pub use self::acceptor::IncomingForward;
use self::acceptor::StreamRouter;
pub use self::config::{GossipConfig, MeshConfig, QuicConfig};
pub use self::gossip::{Gossip, GossipError, Membership, Peer, SelfNode};
pub use self::metrics::MeshMetrics;
use self::pool::ConnectionPool;
use self::wire::{StreamKind, codes};
use crate::tls::{LiveTls, NodeIdentity, TlsError};

/// Incoming forward streams waiting for the forwarding layer; beyond this, peers are told
/// [`codes::NOT_ACCEPTING`] at once.
const FORWARD_QUEUE: usize = 1024;
/// Gossip datagrams waiting for the relay; beyond this they are dropped like UDP.
const GOSSIP_QUEUE: usize = 1024;

/// Errors of the mesh layer.
#[derive(Debug, thiserror::Error)]
pub enum MeshError {
    #[error("cannot bind the mesh endpoint on {bind}: {source}")]
    Bind {
        bind: SocketAddr,
        #[source]
        source: std::io::Error,
    },
    #[error("mesh configuration: {0}")]
    Config(String),
    #[error(transparent)]
    Tls(#[from] TlsError),
    #[error("cannot connect to peer {addr}: {reason}")]
    Connect { addr: SocketAddr, reason: String },
    #[error("{what} to peer {addr} timed out")]
    Timeout {
        addr: SocketAddr,
        what: &'static str,
    },
    #[error("stream to peer {addr} failed: {reason}")]
    Stream { addr: SocketAddr, reason: String },
    #[error(transparent)]
    Gossip(#[from] GossipError),
}

/// A forwarded-request stream this node opened to a peer; the kind byte is already sent.
#[derive(Debug)]
pub struct ForwardStream {
    /// The node name proven by the peer's certificate (compare it with the node you meant).
    pub peer_name: Arc<str>,
    pub peer_addr: SocketAddr,
    pub send: SendStream,
    pub recv: RecvStream,
}

/// A running mesh node. Dropping it stops every task and closes the endpoint.
pub struct Mesh {
    name: String,
    local_addr: SocketAddr,
    advertise: SocketAddr,
    endpoint: quinn::Endpoint,
    pool: Arc<ConnectionPool>,
    gossip: Gossip,
    incoming_forwards: Mutex<Option<mpsc::Receiver<IncomingForward>>>,
    metrics: MeshMetrics,
    stream_open_timeout: Duration,
    keep_alive_interval: Duration,
    tasks: Vec<JoinHandle<()>>,
}

impl Drop for Mesh {
    fn drop(&mut self) {
        for task in &self.tasks {
            task.abort();
        }
        self.endpoint.close(codes::SHUTDOWN, b"shutdown");
    }
}

impl Mesh {
    /// Binds the endpoint, starts accepting peers and starts gossip.
    ///
    /// With `config.tls_reload`, the node's TLS files are watched and reloaded (and
    /// established connections re-checked against them) for as long as the mesh runs.
    pub async fn start(config: MeshConfig, identity: NodeIdentity) -> Result<Mesh, MeshError> {
        let metrics = MeshMetrics::default();
        let name = identity.name.clone();
        let tls = LiveTls::new(identity)?;
        metrics.tls.loaded(&tls.current());
        let endpoint = endpoint::bind(&tls, config.bind, &config.quic)?;
        let local_addr = endpoint.local_addr().map_err(|source| MeshError::Bind {
            bind: config.bind,
            source,
        })?;
        let advertise = advertise_addr(config.advertise, local_addr)?;

        let (gossip_tx, gossip_rx) = mpsc::channel(GOSSIP_QUEUE);
        let (forward_tx, forward_rx) = mpsc::channel(FORWARD_QUEUE);
        let established = Arc::new(trust::Established::default());
        let router = StreamRouter {
            gossip: gossip_tx,
            forwards: forward_tx,
            metrics: metrics.clone(),
            header_timeout: config.quic.stream_open_timeout,
            established: established.clone(),
        };
        let pool = Arc::new(ConnectionPool::new(
            endpoint.clone(),
            router.clone(),
            config.quic.connect_timeout,
            metrics.clone(),
        ));

        let mut tasks = vec![tokio::spawn(acceptor::accept_loop(
            endpoint.clone(),
            router,
            config.quic.connect_timeout,
        ))];
        tasks.push(tokio::spawn(trust::recheck_loop(
            tls.clone(),
            established,
            metrics.clone(),
        )));
        if let Some(reload) = config.tls_reload {
            tasks.push(crate::tls::reload::spawn(
                tls.clone(),
                reload,
                metrics.tls.clone(),
            ));
        }
        let pruning = pool.clone();
        tasks.push(tokio::spawn(async move {
            let mut ticker = tokio::time::interval(Duration::from_secs(60));
            loop {
                ticker.tick().await;
                pruning.prune();
            }
        }));

        let gossip = gossip::start(gossip::GossipStart {
            node: gossip::GossipNode {
                name: name.clone(),
                advertise,
                cluster_id: config.cluster_id,
                seeds: config.seeds,
                config: config.gossip,
                metrics: metrics.clone(),
            },
            pool: pool.clone(),
            inbound: gossip_rx,
            send_timeout: config.quic.connect_timeout + config.quic.stream_open_timeout,
        });
        let gossip = match gossip.await {
            Ok(gossip) => gossip,
            Err(err) => {
                for task in &tasks {
                    task.abort();
                }
                endpoint.close(codes::SHUTDOWN, b"startup failed");
                return Err(err.into());
            }
        };
        tracing::info!(node = %name, %local_addr, %advertise, "mesh started");
        Ok(Mesh {
            name,
            local_addr,
            advertise,
            endpoint,
            pool,
            gossip,
            incoming_forwards: Mutex::new(Some(forward_rx)),
            metrics,
            stream_open_timeout: config.quic.stream_open_timeout,
            keep_alive_interval: config.quic.keep_alive_interval,
            tasks,
        })
    }

    /// This node's name (from its certificate).
    pub fn node_name(&self) -> &str {
        &self.name
    }

    /// The UDP address the endpoint is bound to.
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The address peers reach this node at (its gossip address).
    pub fn advertise_addr(&self) -> SocketAddr {
        self.advertise
    }

    pub fn gossip(&self) -> &Gossip {
        &self.gossip
    }

    pub fn metrics(&self) -> &MeshMetrics {
        &self.metrics
    }

    /// The stream of forwarded requests peers open to this node. Returns `None` after the
    /// first call: there is one consumer, the forwarding layer.
    pub fn take_incoming_forwards(&self) -> Option<mpsc::Receiver<IncomingForward>> {
        self.incoming_forwards
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
    }

    /// Opens a forwarded-request stream to the peer at `peer_addr`, reusing the pooled
    /// connection (dialing it if needed). Fails within the connect and open timeouts, also
    /// when the peer refuses our certificate. A pooled connection found dead is replaced
    /// once.
    pub async fn open_forward_stream(
        &self,
        peer_addr: SocketAddr,
    ) -> Result<ForwardStream, MeshError> {
        let mut attempt = 0;
        loop {
            attempt += 1;
            let peer = self.pool.get(peer_addr).await?;
            let opening = async {
                let (mut send, recv) = peer.conn.open_bi().await?;
                send.write_all(&[StreamKind::Forward as u8]).await?;
                Ok::<_, Box<dyn std::error::Error + Send + Sync>>((send, recv))
            };
            match timeout(self.stream_open_timeout, opening).await {
                Ok(Ok((send, recv))) => {
                    return Ok(ForwardStream {
                        peer_name: peer.peer_name,
                        peer_addr,
                        send,
                        recv,
                    });
                }
                Ok(Err(err)) if attempt == 1 => {
                    tracing::debug!(%peer_addr, error = %err, "pooled connection failed; redialing");
                    self.pool.invalidate(peer_addr, &peer).await;
                }
                Ok(Err(err)) => {
                    return Err(MeshError::Stream {
                        addr: peer_addr,
                        reason: err.to_string(),
                    });
                }
                Err(_) => {
                    return Err(MeshError::Timeout {
                        addr: peer_addr,
                        what: "opening a forward stream",
                    });
                }
            }
        }
    }

    /// Resolves once the peer at `peer_addr` has sent nothing on its connection for three
    /// keep-alive intervals. A live peer sends at least a keep-alive every interval (both
    /// sides ping), a frozen one (SIGSTOP, a paused VM) nothing, so this notices it well before
    /// the failure detector does. Never resolves when there is no open connection to watch.
    pub async fn peer_silent(&self, peer_addr: SocketAddr) {
        let Some(conn) = self.pool.open_connection(peer_addr).await else {
            return std::future::pending().await;
        };
        quiet_for(&conn, self.keep_alive_interval * 3).await;
    }

    /// Resolves once the connection to `peer_addr`, a peer gossip declared dead, has carried
    /// nothing for two keep-alive intervals, or at once when there is none: the verdict
    /// [`Self::close_peer`] acts on. A peer that still answers is busy, not dead (a starved
    /// machine delays heartbeats), and this never resolves while it does.
    pub async fn confirm_dead(&self, peer_addr: SocketAddr) {
        if let Some(conn) = self.pool.open_connection(peer_addr).await {
            quiet_for(&conn, self.keep_alive_interval * 2).await;
        }
    }

    /// Closes the pooled connection to a peer gossip declared dead, unless it keeps answering
    /// for two keep-alive intervals, so requests in flight on a dead peer fail (and are retried
    /// elsewhere) well before the idle timeout, while a peer gossip misjudged keeps its streams.
    pub async fn close_peer(&self, peer_addr: SocketAddr) -> bool {
        self.pool
            .close_if_silent(peer_addr, self.keep_alive_interval * 2)
            .await
    }

    /// Stops gossip and closes the endpoint, waiting (bounded) for peers to be told.
    pub async fn shutdown(&self, within: Duration) {
        self.gossip.stop();
        self.endpoint.close(codes::SHUTDOWN, b"shutdown");
        let _ = timeout(within, self.endpoint.wait_idle()).await;
    }
}

/// Resolves once `conn` has received nothing for `bound` (watched at a quarter of it).
async fn quiet_for(conn: &quinn::Connection, bound: Duration) {
    let received = || conn.stats().udp_rx.datagrams;
    let mut last = received();
    let mut quiet_since = tokio::time::Instant::now();
    loop {
        tokio::time::sleep(bound / 4).await;
        let now = received();
        if now != last {
            last = now;
            quiet_since = tokio::time::Instant::now();
        } else if quiet_since.elapsed() >= bound {
            return;
        }
    }
}

/// The advertised address: explicit, or the bound one; a port of 0 takes the bound port.
fn advertise_addr(
    advertise: Option<SocketAddr>,
    local_addr: SocketAddr,
) -> Result<SocketAddr, MeshError> {
    let mut addr = advertise.unwrap_or(local_addr);
    if addr.port() == 0 {
        addr.set_port(local_addr.port());
    }
    if addr.ip().is_unspecified() {
        return Err(MeshError::Config(format!(
            "mesh bound to {local_addr}: an advertise address with a specific IP is required"
        )));
    }
    Ok(addr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn advertise_defaults_to_bound_and_rejects_unspecified() {
        let bound: SocketAddr = "127.0.0.1:7946".parse().unwrap();
        assert_eq!(advertise_addr(None, bound).unwrap(), bound);
        let wildcard: SocketAddr = "0.0.0.0:7946".parse().unwrap();
        assert!(advertise_addr(None, wildcard).is_err());
        let explicit: SocketAddr = "10.0.0.5:0".parse().unwrap();
        assert_eq!(
            advertise_addr(Some(explicit), wildcard).unwrap(),
            "10.0.0.5:7946".parse::<SocketAddr>().unwrap()
        );
    }
}
