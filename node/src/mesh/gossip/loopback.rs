//! Chitchat over QUIC: a loopback shim around chitchat's own UDP socket.
//!
//! # Why a shim
//! chitchat 0.13 makes its `Transport`/`Socket` traits public, but the encoding of the
//! `ChitchatEnvelope` they carry is crate-private (`serialize`/`deserialize` are
//! `pub(crate)`, and `Digest`/`Delta` are not even exported), so an implementation of
//! `Socket` cannot turn envelopes into bytes. The only public encoder and decoder is
//! chitchat's own [`chitchat::transport::UdpSocket`]. Reimplementing chitchat's wire format
//! would be a fragile copy of private code; instead chitchat keeps its UDP socket, bound to
//! `127.0.0.1` on an ephemeral port, and this module moves the bytes between that socket
//! and QUIC.
//!
//! # Addressing
//! chitchat must see each peer under the address in the peer's `ChitchatId`, its *gossip
//! advertise address*, which we set to the node's QUIC advertise address. So:
//! - [`RelayedSocket`] wraps chitchat's socket and implements chitchat's `Socket` trait.
//!   When chitchat sends to peer `P` (a QUIC address), it sends the datagram through the
//!   inner UDP socket to the loopback address `L(P)` of a per-peer [`Link`] socket instead.
//!   When the inner socket receives a datagram from `L(P)`, chitchat is told it came from
//!   `P`, so its replies go back to `P`.
//! - Each link socket is connected to the chitchat socket, so the kernel drops datagrams
//!   from anyone else; the link forwards what chitchat wrote to `P` over QUIC as one gossip
//!   stream, stamped with our advertise address, and writes datagrams received over QUIC
//!   from `P` into the chitchat socket.
//! - The chitchat socket itself cannot be connected (it talks to every link), so
//!   [`RelayedSocket::recv`] drops any datagram whose source is not a link.
//!
//! Nothing but loopback ever carries plain gossip: every byte between hosts is in a QUIC
//! stream of a connection that passed mutual TLS against the cluster CA.

use std::collections::HashMap;
use std::net::{Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use async_trait::async_trait;
use chitchat::ChitchatEnvelope;
use chitchat::transport::{RecvOutcome, SendOutcome, Socket, Transport, UdpSocket};
use tokio::task::JoinHandle;
use tokio::time::timeout;

use crate::mesh::metrics::MeshMetrics;
use crate::mesh::pool::ConnectionPool;
use crate::mesh::wire::{GossipFrame, MAX_GOSSIP_PAYLOAD};

/// Peers the relay keeps a link for at most; a bound against a flood of invented addresses.
const MAX_LINKS: usize = 4096;
/// A link unused for this long is closed (it is recreated on the next datagram, at the cost
/// of binding a loopback socket). chitchat keeps gossiping to a dead node until it forgets it
/// (`dead_node_grace_period`), so a dead peer's link lasts about that long plus this; a live
/// peer is written to every few seconds even in a large cluster.
pub(crate) const LINK_IDLE: Duration = Duration::from_secs(30);
/// After a failed connect, datagrams to that peer are dropped for a while rather than each
/// paying a connect timeout; the pause doubles up to the maximum and ends early when the
/// peer is heard from.
const BACKOFF_MIN: Duration = Duration::from_millis(250);
const BACKOFF_MAX: Duration = Duration::from_secs(4);

/// Moves gossip datagrams between chitchat's loopback socket and QUIC.
pub(crate) struct Relay {
    chitchat_addr: SocketAddr,
    links: Mutex<Links>,
    sender: Arc<QuicSender>,
}

#[derive(Default)]
struct Links {
    by_peer: HashMap<SocketAddr, Arc<Link>>,
    peer_by_loopback: HashMap<SocketAddr, SocketAddr>,
}

/// The loopback socket standing for one peer.
struct Link {
    socket: Arc<tokio::net::UdpSocket>,
    loopback: SocketAddr,
    last_used: Mutex<Instant>,
    /// Set when the peer is heard from: its pending backoff, if any, is lifted.
    heard_from: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl Drop for Link {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// What a link needs to send over QUIC.
struct QuicSender {
    pool: Arc<ConnectionPool>,
    self_addr: SocketAddr,
    send_timeout: Duration,
    metrics: MeshMetrics,
}

impl Relay {
    /// Creates the relay and the chitchat transport bound to it.
    pub async fn bind(
        pool: Arc<ConnectionPool>,
        self_addr: SocketAddr,
        send_timeout: Duration,
        metrics: MeshMetrics,
    ) -> std::io::Result<(Arc<Relay>, RelayTransport)> {
        let inner = UdpSocket::open(SocketAddr::from((Ipv4Addr::LOCALHOST, 0)))
            .await
            .map_err(std::io::Error::other)?;
        let chitchat_addr = inner.local_addr().map_err(std::io::Error::other)?;
        let relay = Arc::new(Relay {
            chitchat_addr,
            links: Mutex::new(Links::default()),
            sender: Arc::new(QuicSender {
                pool,
                self_addr,
                send_timeout,
                metrics,
            }),
        });
        let socket = RelayedSocket {
            inner,
            relay: relay.clone(),
        };
        let transport = RelayTransport {
            socket: Mutex::new(Some(socket)),
        };
        Ok((relay, transport))
    }

    /// Hands a datagram received over QUIC from `peer` to chitchat.
    pub async fn deliver(&self, peer: SocketAddr, datagram: &[u8]) {
        if peer == self.sender.self_addr {
            // Nobody legitimately gossips to us in our own name.
            self.sender.metrics.gossip_datagrams_dropped.inc();
            return;
        }
        let Some(link) = self.link(peer) else {
            self.sender.metrics.gossip_datagrams_dropped.inc();
            return;
        };
        link.heard_from.store(true, Ordering::Relaxed);
        if let Err(err) = link.socket.send(datagram).await {
            self.sender.metrics.gossip_datagrams_dropped.inc();
            tracing::debug!(%peer, error = %err, "cannot inject gossip into chitchat");
        }
    }

    /// Closes links unused for [`LINK_IDLE`].
    pub fn sweep(&self, now: Instant) {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        let idle: Vec<SocketAddr> = links
            .by_peer
            .iter()
            .filter(|(_, link)| {
                let last = *link.last_used.lock().unwrap_or_else(|e| e.into_inner());
                now.saturating_duration_since(last) > LINK_IDLE
            })
            .map(|(peer, _)| *peer)
            .collect();
        for peer in idle {
            if let Some(link) = links.by_peer.remove(&peer) {
                links.peer_by_loopback.remove(&link.loopback);
            }
        }
    }

    fn peer_of(&self, loopback: SocketAddr) -> Option<SocketAddr> {
        let links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        links.peer_by_loopback.get(&loopback).copied()
    }

    /// The link for `peer`, created on first use. `None` when the table is full or a
    /// loopback socket cannot be bound.
    fn link(&self, peer: SocketAddr) -> Option<Arc<Link>> {
        let mut links = self.links.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(link) = links.by_peer.get(&peer) {
            *link.last_used.lock().unwrap_or_else(|e| e.into_inner()) = Instant::now();
            return Some(link.clone());
        }
        if links.by_peer.len() >= MAX_LINKS {
            tracing::warn!(%peer, "gossip relay link table full");
            return None;
        }
        let link = match self.open_link(peer) {
            Ok(link) => Arc::new(link),
            Err(err) => {
                tracing::warn!(%peer, error = %err, "cannot open gossip relay link");
                return None;
            }
        };
        links.peer_by_loopback.insert(link.loopback, peer);
        links.by_peer.insert(peer, link.clone());
        Some(link)
    }

    fn open_link(&self, peer: SocketAddr) -> std::io::Result<Link> {
        let std_socket = std::net::UdpSocket::bind((Ipv4Addr::LOCALHOST, 0))?;
        // Only chitchat's socket may write to this link.
        std_socket.connect(self.chitchat_addr)?;
        std_socket.set_nonblocking(true)?;
        let socket = Arc::new(tokio::net::UdpSocket::from_std(std_socket)?);
        let loopback = socket.local_addr()?;
        let heard_from = Arc::new(AtomicBool::new(false));
        let task = tokio::spawn(pump_to_quic(
            socket.clone(),
            peer,
            self.sender.clone(),
            heard_from.clone(),
        ));
        Ok(Link {
            socket,
            loopback,
            last_used: Mutex::new(Instant::now()),
            heard_from,
            task,
        })
    }
}

/// Forwards, in order, every datagram chitchat writes to `peer`'s link over QUIC.
async fn pump_to_quic(
    socket: Arc<tokio::net::UdpSocket>,
    peer: SocketAddr,
    sender: Arc<QuicSender>,
    heard_from: Arc<AtomicBool>,
) {
    let mut backoff = BACKOFF_MIN;
    let mut paused_until: Option<Instant> = None;
    loop {
        let Some(datagram) = next_datagram(&socket, peer).await else {
            continue;
        };
        if heard_from.swap(false, Ordering::Relaxed) {
            paused_until = None;
            backoff = BACKOFF_MIN;
        }
        if paused_until.is_some_and(|until| Instant::now() < until) {
            sender.metrics.gossip_datagrams_dropped.inc();
            continue;
        }
        let mut frame = Vec::with_capacity(datagram.len() + 32);
        GossipFrame {
            sender: sender.self_addr,
            datagram: &datagram,
        }
        .encode(&mut frame);
        match timeout(sender.send_timeout, sender.send(peer, &frame)).await {
            Ok(Ok(())) => {
                sender.metrics.gossip_bytes_sent.inc_by(frame.len() as u64);
                paused_until = None;
                backoff = BACKOFF_MIN;
            }
            outcome => {
                sender.metrics.gossip_datagrams_dropped.inc();
                let reason = match outcome {
                    Ok(Err(err)) => err.to_string(),
                    _ => "timed out".to_owned(),
                };
                tracing::debug!(%peer, error = %reason, ?backoff, "gossip send failed; pausing");
                paused_until = Some(Instant::now() + backoff);
                backoff = (backoff * 2).min(BACKOFF_MAX);
            }
        }
    }
}

/// The next datagram chitchat wrote to a link, in a buffer of its own: a link waits far more
/// than it sends, and the relay keeps one for every peer chitchat gossips with, dead ones
/// included, so a buffer held across the wait would cost 64 KiB per peer for nothing.
/// `None` after a transient error (an ICMP report), once a short pause has passed so that a
/// persistent one cannot spin.
async fn next_datagram(socket: &tokio::net::UdpSocket, peer: SocketAddr) -> Option<Vec<u8>> {
    let result = match socket.readable().await {
        Ok(()) => {
            let mut datagram = Vec::with_capacity(MAX_GOSSIP_PAYLOAD);
            socket.try_recv_buf(&mut datagram).map(|_| datagram)
        }
        Err(err) => Err(err),
    };
    match result {
        Ok(datagram) => Some(datagram),
        Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => None,
        Err(err) => {
            tracing::debug!(%peer, error = %err, "gossip relay link recv error");
            tokio::time::sleep(Duration::from_millis(10)).await;
            None
        }
    }
}

impl QuicSender {
    async fn send(&self, peer: SocketAddr, frame: &[u8]) -> Result<(), crate::mesh::MeshError> {
        let conn = self.pool.get(peer).await?;
        let result = async {
            let mut stream = conn.conn.open_uni().await?;
            stream.write_all(frame).await?;
            stream.finish()?;
            Ok::<_, Box<dyn std::error::Error + Send + Sync>>(())
        }
        .await;
        if let Err(err) = result {
            self.pool.invalidate(peer, &conn).await;
            return Err(crate::mesh::MeshError::Stream {
                addr: peer,
                reason: err.to_string(),
            });
        }
        Ok(())
    }
}

/// chitchat's `Transport`, handing out the one [`RelayedSocket`].
pub(crate) struct RelayTransport {
    socket: Mutex<Option<RelayedSocket>>,
}

#[async_trait]
impl Transport for RelayTransport {
    /// chitchat passes its configured listen address; the socket is already bound on
    /// loopback, so it is ignored.
    async fn open(&self, _listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let socket = self
            .socket
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take()
            .ok_or_else(|| anyhow::anyhow!("the relayed gossip socket can be opened only once"))?;
        Ok(Box::new(socket))
    }
}

/// chitchat's UDP socket with peer addresses translated to and from relay links.
pub(crate) struct RelayedSocket {
    inner: UdpSocket,
    relay: Arc<Relay>,
}

#[async_trait]
impl Socket for RelayedSocket {
    fn local_addr(&self) -> anyhow::Result<SocketAddr> {
        self.inner.local_addr()
    }

    async fn send(
        &mut self,
        to: SocketAddr,
        envelope: ChitchatEnvelope,
    ) -> anyhow::Result<SendOutcome> {
        let Some(link) = self.relay.link(to) else {
            // Like a lost UDP datagram; an error here would stop chitchat's server.
            self.relay.sender.metrics.gossip_datagrams_dropped.inc();
            return Ok(SendOutcome { num_bytes_sent: 0 });
        };
        self.inner.send(link.loopback, envelope).await
    }

    /// Cancel-safe (chitchat polls it in a `select!`): nothing is held across the await.
    async fn recv(&mut self) -> anyhow::Result<RecvOutcome> {
        loop {
            let outcome = self.inner.recv().await?;
            match self.relay.peer_of(outcome.from_addr) {
                Some(peer) => {
                    return Ok(RecvOutcome {
                        from_addr: peer,
                        ..outcome
                    });
                }
                None => {
                    self.relay.sender.metrics.gossip_datagrams_dropped.inc();
                    tracing::warn!(from = %outcome.from_addr, "dropped gossip datagram not from the relay");
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use chitchat::{ChitchatMessage, ProtocolVersion};
    use tokio::sync::mpsc;

    use super::*;
    use crate::cert::{DEFAULT_CA_VALIDITY, DEFAULT_NODE_VALIDITY, init_ca, issue_node_cert};
    use crate::mesh::acceptor::StreamRouter;
    use crate::mesh::config::QuicConfig;
    use crate::tls::NodeIdentity;

    fn bad_cluster() -> ChitchatEnvelope {
        ChitchatEnvelope {
            version: ProtocolVersion::V0,
            message: ChitchatMessage::BadCluster,
        }
    }

    /// A relay whose pool dials with a short timeout, and its chitchat-side socket.
    async fn relay(metrics: &MeshMetrics) -> (tempfile::TempDir, Arc<Relay>, Box<dyn Socket>) {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        issue_node_cert(dir.path(), "me", dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap();
        let identity = NodeIdentity::load(dir.path(), "me").unwrap();
        let endpoint = crate::mesh::endpoint::bind(
            &crate::tls::LiveTls::new(identity).unwrap(),
            "127.0.0.1:0".parse().unwrap(),
            &QuicConfig::default(),
        )
        .unwrap();
        let self_addr = endpoint.local_addr().unwrap();
        let router = StreamRouter {
            gossip: mpsc::channel(1).0,
            forwards: mpsc::channel(1).0,
            metrics: metrics.clone(),
            header_timeout: Duration::from_secs(1),
            established: Default::default(),
        };
        let connect_timeout = Duration::from_millis(200);
        let pool = Arc::new(ConnectionPool::new(
            endpoint,
            router,
            connect_timeout,
            metrics.clone(),
        ));
        // Longer than the connect timeout, as in production, so connect failures count.
        let send_timeout = Duration::from_secs(1);
        let (relay, transport) = Relay::bind(pool, self_addr, send_timeout, metrics.clone())
            .await
            .unwrap();
        let socket = transport.open(self_addr).await.unwrap();
        assert!(transport.open(self_addr).await.is_err(), "opened twice");
        (dir, relay, socket)
    }

    /// The bytes chitchat's own encoder produces for `envelope`.
    async fn encode(envelope: ChitchatEnvelope) -> Vec<u8> {
        let sink = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        let mut encoder = UdpSocket::open("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        encoder
            .send(sink.local_addr().unwrap(), envelope)
            .await
            .unwrap();
        let mut buf = vec![0u8; MAX_GOSSIP_PAYLOAD];
        let len = sink.recv(&mut buf).await.unwrap();
        buf.truncate(len);
        buf
    }

    #[tokio::test]
    async fn delivered_datagrams_appear_from_the_peer_and_strangers_are_dropped() {
        let metrics = MeshMetrics::default();
        let (_dir, relay, mut socket) = relay(&metrics).await;
        let chitchat_addr = socket.local_addr().unwrap();
        assert!(chitchat_addr.ip().is_loopback());

        // A datagram from a process that is not the relay never reaches chitchat.
        let mut stranger = UdpSocket::open("127.0.0.1:0".parse().unwrap())
            .await
            .unwrap();
        stranger.send(chitchat_addr, bad_cluster()).await.unwrap();
        let recv = tokio::time::timeout(Duration::from_millis(300), socket.recv()).await;
        assert!(recv.is_err(), "stranger's datagram was accepted: {recv:?}");

        // A datagram delivered by the relay appears to come from the peer's mesh address.
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        relay.deliver(peer, &encode(bad_cluster()).await).await;
        let outcome = tokio::time::timeout(Duration::from_secs(5), socket.recv())
            .await
            .expect("delivered datagram")
            .unwrap();
        assert_eq!(outcome.from_addr, peer);
        assert_eq!(outcome.envelope, bad_cluster());
    }

    #[tokio::test]
    async fn links_only_relay_what_chitchat_sends() {
        let metrics = MeshMetrics::default();
        let (_dir, relay, mut socket) = relay(&metrics).await;
        // Nobody listens at the peer address, so every relayed datagram ends in a failed
        // connect: that is how we observe what a link forwarded.
        let peer: SocketAddr = "127.0.0.1:9".parse().unwrap();
        let link = relay.link(peer).unwrap();

        let stranger = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
        stranger
            .send_to(&encode(bad_cluster()).await, link.loopback)
            .await
            .unwrap();
        tokio::time::sleep(Duration::from_millis(500)).await;
        assert_eq!(
            metrics.connect_failures.get(),
            0,
            "link relayed a stranger's datagram"
        );

        socket.send(peer, bad_cluster()).await.unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        while metrics.connect_failures.get() == 0 && Instant::now() < deadline {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        assert_eq!(
            metrics.connect_failures.get(),
            1,
            "chitchat's datagram was not relayed"
        );
        assert_eq!(metrics.gossip_datagrams_dropped.get(), 1);
    }
}
