//! Configuration of the mesh layer, with its defaults and why they are what they are.

use std::net::SocketAddr;
use std::time::Duration;

use crate::tls::TlsReload;

/// Everything [`crate::mesh::Mesh::start`] needs besides the node's TLS identity.
#[derive(Debug, Clone)]
pub struct MeshConfig {
    /// UDP address the QUIC endpoint binds (e.g. `0.0.0.0:7946`).
    pub bind: SocketAddr,
    /// Address peers reach this node at. Defaults to the bound address, which must then be
    /// a specific IP (not `0.0.0.0`). A port of 0 means "the bound port".
    pub advertise: Option<SocketAddr>,
    /// Nodes of different clusters refuse each other's gossip (chitchat's cluster id).
    pub cluster_id: String,
    /// Seed peers as `host:port`; host names are resolved again periodically.
    pub seeds: Vec<String>,
    pub gossip: GossipConfig,
    pub quic: QuicConfig,
    /// Where the node's TLS files are and how often to look for changes; `None` keeps the
    /// material loaded at start for the life of the mesh.
    pub tls_reload: Option<TlsReload>,
}

impl MeshConfig {
    /// A configuration with the defaults below for everything but the addresses.
    pub fn new(bind: SocketAddr, cluster_id: impl Into<String>, seeds: Vec<String>) -> Self {
        Self {
            bind,
            advertise: None,
            cluster_id: cluster_id.into(),
            seeds,
            gossip: GossipConfig::default(),
            quic: QuicConfig::default(),
            tls_reload: None,
        }
    }
}

/// Gossip and failure-detection tuning.
///
/// chitchat's phi-accrual detector declares a peer dead after `phi_threshold` mean heartbeat
/// intervals without a new heartbeat, checked once per gossip round. A node's heartbeat
/// advances every gossip round *and* every message it processes, so peers observe a new one
/// every ~100 ms in a small cluster (more often in a larger one) and at most every `interval`
/// (200 ms). With a threshold of 8 a stopped node is therefore noticed after 0.8 s to 1.6 s of
/// silence plus up to one round: within the 2 s target in the worst case, while a node must
/// stall for 8 heartbeat intervals before it is wrongly declared dead (measured figures in
/// `MESH-NOTES.md`).
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// Period of gossip rounds (each round talks to up to 3 live peers, plus possibly a seed
    /// and a dead node). Also the failure detector's prior heartbeat interval: chitchat's
    /// default prior of 5 s would make a young node's death take ~40 s to notice.
    pub interval: Duration,
    /// Mean heartbeat intervals of silence after which a peer is declared dead.
    pub phi_threshold: f64,
    /// Heartbeat intervals kept to estimate the mean (200 intervals: 20–40 s of history).
    pub sampling_window_size: usize,
    /// Heartbeat gaps longer than this are not taken into the mean (a pause or partition
    /// must not teach the detector to be lenient afterwards).
    pub max_heartbeat_interval: Duration,
    /// How long a dead node's state is kept before it is forgotten. Long enough that every
    /// node has declared it dead before any forgets it (seconds, at the failure detector's
    /// pace); a restarted node is a new generation, so this never delays a rejoin, and a
    /// node forgotten during a partition is learnt again from its newer heartbeats after
    /// the heal. Short enough that restarts do not pile up dead state: each restart leaves
    /// one dead identity (its summary, its digest, a gossip link) for this long.
    pub dead_node_grace_period: Duration,
    /// Tombstones of deleted keys are kept this long so lagging peers learn the deletion.
    pub deleted_key_grace_period: Duration,
    /// How often seed host names are resolved again (and seeds not yet in the membership
    /// are contacted). chitchat itself only re-resolves every 60 s.
    pub seed_refresh_interval: Duration,
}

impl Default for GossipConfig {
    fn default() -> Self {
        Self {
            interval: kvmesh_protocol::cadence::GOSSIP_INTERVAL,
            phi_threshold: 8.0,
            sampling_window_size: 200,
            max_heartbeat_interval: Duration::from_secs(2),
            dead_node_grace_period: Duration::from_secs(2 * 60),
            deleted_key_grace_period: Duration::from_secs(60),
            seed_refresh_interval: Duration::from_secs(5),
        }
    }
}

/// QUIC transport tuning, applied on both the server and the client side.
#[derive(Debug, Clone)]
pub struct QuicConfig {
    /// Concurrent bidirectional streams a peer may open (forwarded requests); quinn's default
    /// of 100 would cap in-flight forwards between two nodes. quinn keeps a table entry for
    /// every stream a peer may open, on every connection (two per peer: one dialed, one
    /// accepted), so the limit costs memory: 4096 bidirectional plus 4096 unidirectional
    /// streams took about 0.4 MB per connection, 1.2 MB per peer.
    pub max_concurrent_bidi_streams: u32,
    /// Concurrent unidirectional streams a peer may open (one per gossip datagram, read at
    /// once: a handful are open at a time).
    pub max_concurrent_uni_streams: u32,
    /// Keep-alive pings keep idle connections (and NAT mappings) open and detect a silent
    /// peer before the idle timeout. Short, because a request waiting for a peer's answer
    /// gives up after three intervals of silence (`Mesh::peer_silent`): a few small packets a
    /// second per connection buy failing over from a frozen peer in under a second.
    pub keep_alive_interval: Duration,
    /// A connection with no packet for this long is closed; a pooled connection to a dead
    /// peer is dropped after at most this.
    pub idle_timeout: Duration,
    /// Bound on establishing a connection: QUIC + TLS handshake and the server's welcome
    /// that proves it accepted our certificate.
    pub connect_timeout: Duration,
    /// Bound on opening a stream and writing its first bytes on an established connection.
    pub stream_open_timeout: Duration,
}

impl Default for QuicConfig {
    fn default() -> Self {
        Self {
            max_concurrent_bidi_streams: 1024,
            max_concurrent_uni_streams: 128,
            keep_alive_interval: Duration::from_millis(250),
            idle_timeout: Duration::from_secs(5),
            connect_timeout: Duration::from_secs(2),
            stream_open_timeout: Duration::from_secs(2),
        }
    }
}
