//! Membership, failure detection and key-value state: chitchat, carried over the mesh's
//! QUIC endpoint (see [`loopback`] for how and why).
//!
//! The rest of the node sees [`Gossip`]: publish its own key-values, read the live peers
//! with theirs ([`Membership`]), and wait for changes.

#[cfg(test)]
mod freshness_tests;
mod loopback;
mod membership;
#[cfg(test)]
mod partition_tests;
mod seeds;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use chitchat::transport::Transport;
use chitchat::{
    ChitchatConfig, ChitchatHandle, ChitchatId, FailureDetectorConfig, ProtocolVersion,
    spawn_chitchat,
};
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;

use self::membership::{LiveSnapshots, MembershipTracker};
pub use self::membership::{Membership, Peer};
use super::acceptor::InboundGossip;
use super::config::GossipConfig;
use super::metrics::MeshMetrics;
use super::pool::ConnectionPool;

/// Largest value [`Gossip::set`] accepts, in bytes.
///
/// chitchat sends state in datagrams of at most 65,507 bytes that also carry the sender's
/// digest (tens of bytes per node); a key-value that does not fit is never sent, and blocks
/// every later key of this node behind it. 16 KiB leaves room for the digest of several
/// hundred nodes. Large state (prefix summaries) belongs in many small keys (1–2 KB), so a
/// change re-gossips one shard, not everything.
pub const MAX_VALUE_LEN: usize = 16 * 1024;
/// Largest key [`Gossip::set`] accepts, in bytes.
pub const MAX_KEY_LEN: usize = 256;

/// Errors of the gossip layer.
#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    #[error("value of key {key:?} is {len} bytes, over the {max}-byte limit")]
    ValueTooLarge { key: String, len: usize, max: usize },
    #[error("invalid key {key:?}: {reason}")]
    InvalidKey { key: String, reason: &'static str },
    #[error("cannot start gossip: {0}")]
    Start(String),
}

/// This node as gossip announces it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SelfNode {
    pub name: String,
    /// Start time in ms since the Unix epoch: a restart is a new incarnation.
    pub generation: u64,
    pub mesh_addr: SocketAddr,
}

/// Handle on the running gossip. Dropping it stops chitchat and the relay.
pub struct Gossip {
    handle: Arc<ChitchatHandle>,
    self_node: SelfNode,
    membership: watch::Receiver<Arc<Membership>>,
    tasks: Vec<JoinHandle<()>>,
    /// Keeps the key-change listener of [`Changes::peer_changed`] subscribed.
    _listener: chitchat::ListenerHandle,
}

impl Drop for Gossip {
    fn drop(&mut self) {
        self.handle.abort();
        for task in &self.tasks {
            task.abort();
        }
    }
}

/// What [`start`] needs from the mesh: the node, and how its datagrams cross QUIC.
pub(crate) struct GossipStart {
    pub node: GossipNode,
    pub pool: Arc<ConnectionPool>,
    pub inbound: mpsc::Receiver<InboundGossip>,
    pub send_timeout: Duration,
}

pub(crate) async fn start(start: GossipStart) -> Result<Gossip, GossipError> {
    let GossipStart {
        node,
        pool,
        mut inbound,
        send_timeout,
    } = start;
    let (relay, transport) =
        loopback::Relay::bind(pool, node.advertise, send_timeout, node.metrics.clone())
            .await
            .map_err(|err| GossipError::Start(format!("loopback gossip socket: {err}")))?;
    let mut gossip = start_over(&transport, node).await?;
    let delivering = relay.clone();
    gossip.tasks.push(tokio::spawn(async move {
        while let Some(gossip) = inbound.recv().await {
            tracing::trace!(peer = %gossip.peer_name, sender = %gossip.sender, len = gossip.datagram.len(), "gossip in");
            delivering.deliver(gossip.sender, &gossip.datagram).await;
        }
    }));
    let sweeping = relay;
    gossip.tasks.push(tokio::spawn(async move {
        let mut ticker = tokio::time::interval(loopback::LINK_IDLE / 2);
        loop {
            ticker.tick().await;
            sweeping.sweep(Instant::now());
        }
    }));
    Ok(gossip)
}

/// What chitchat needs to run for this node, whatever carries its datagrams.
pub(crate) struct GossipNode {
    pub name: String,
    pub advertise: SocketAddr,
    pub cluster_id: String,
    pub seeds: Vec<String>,
    pub config: GossipConfig,
    pub metrics: MeshMetrics,
}

#[cfg(test)]
impl GossipNode {
    /// A node of the in-process test cluster `cluster_id`, seeded with the cluster's first
    /// node (`None` for that one).
    pub(crate) fn for_test(
        cluster_id: &str,
        name: String,
        advertise: SocketAddr,
        seed: Option<SocketAddr>,
        config: GossipConfig,
    ) -> Self {
        Self {
            name,
            advertise,
            cluster_id: cluster_id.to_owned(),
            seeds: seed.iter().map(SocketAddr::to_string).collect(),
            config,
            metrics: MeshMetrics::default(),
        }
    }
}

/// Runs chitchat for `node` over `transport`: the mesh's QUIC relay in a node, chitchat's
/// in-process channels (with links cut, datagrams dropped or delayed) in tests.
pub(crate) async fn start_over(
    transport: &dyn Transport,
    node: GossipNode,
) -> Result<Gossip, GossipError> {
    let GossipNode {
        name,
        advertise,
        cluster_id,
        seeds,
        config,
        metrics,
    } = node;
    let self_node = SelfNode {
        name,
        generation: generation_now(),
        mesh_addr: advertise,
    };
    let chitchat_id = ChitchatId::new(self_node.name.clone(), self_node.generation, advertise);
    let chitchat_config = ChitchatConfig {
        chitchat_id: chitchat_id.clone(),
        cluster_id,
        gossip_interval: config.interval,
        listen_addr: advertise,
        seed_nodes: seeds.clone(),
        failure_detector_config: FailureDetectorConfig {
            phi_threshold: config.phi_threshold,
            sampling_window_size: config.sampling_window_size,
            max_interval: config.max_heartbeat_interval,
            initial_interval: config.interval,
            dead_node_grace_period: config.dead_node_grace_period,
        },
        marked_for_deletion_grace_period: config.deleted_key_grace_period,
        catchup_callback: None,
        extra_liveness_predicate: None,
        // Every node of a kvmesh cluster runs this chitchat, so the compressed digest is safe.
        protocol_version: ProtocolVersion::V1,
    };
    let handle = spawn_chitchat(chitchat_config, Vec::new(), transport)
        .await
        .map_err(|err| GossipError::Start(err.to_string()))?;
    let handle = Arc::new(handle);

    let mut tasks = vec![tokio::spawn(seeds::refresh_loop(
        handle.clone(),
        seeds,
        advertise,
        config.seed_refresh_interval,
    ))];
    let live = handle.with_chitchat(|c| c.live_nodes_watcher()).await;
    let peer_changed = Arc::new(Notify::new());
    let self_id = chitchat_id;
    let listener = handle
        .with_chitchat(|c| {
            let (notify, self_id) = (peer_changed.clone(), self_id.clone());
            c.subscribe_event("", move |event| {
                if *event.node != self_id {
                    notify.notify_one();
                }
            })
        })
        .await;
    let (membership_tx, membership) = watch::channel(Arc::new(Membership::default()));
    tasks.push(tokio::spawn(publish_membership(
        handle.clone(),
        Changes { live, peer_changed },
        membership_tx,
        MembershipTracker::new(self_node.name.clone()),
        metrics,
    )));

    Ok(Gossip {
        handle,
        self_node,
        membership,
        tasks,
        _listener: listener,
    })
}

/// What wakes [`publish_membership`].
struct Changes {
    /// chitchat's live-node set, updated once per gossip round: liveness, joins, departures,
    /// deleted keys.
    live: watch::Receiver<std::collections::BTreeMap<ChitchatId, chitchat::NodeState>>,
    /// Notified as soon as a gossip message sets one of a peer's values. chitchat tells its
    /// live-node watcher of new values only at this node's next round, after it sent that
    /// round's messages, so a value arriving in a reply or in another node's round would wait
    /// up to a whole gossip interval (half of one on average) before the node routed on it.
    peer_changed: Arc<Notify>,
}

/// Converts chitchat's live nodes and their current values into [`Membership`] whenever
/// either changes.
async fn publish_membership(
    chitchat: Arc<ChitchatHandle>,
    mut changes: Changes,
    publish: watch::Sender<Arc<Membership>>,
    mut tracker: MembershipTracker,
    metrics: MeshMetrics,
) {
    let mut snapshots = LiveSnapshots::default();
    loop {
        changes.live.borrow_and_update();
        // The round's report is only marked seen: the states are read from chitchat itself,
        // as they are now. The listener fires inside chitchat's lock, while it applies a
        // message: taking the lock here reads the state after that message.
        let snapshot = chitchat.with_chitchat(|c| snapshots.read(c)).await;
        let view = tracker.update(snapshot, Instant::now());
        metrics.peers_alive.set(view.len() as i64);
        if publish.send(Arc::new(view)).is_err() {
            return;
        }
        tokio::select! {
            changed = changes.live.changed() => if changed.is_err() { return },
            () = changes.peer_changed.notified() => {}
        }
    }
}

fn generation_now() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

fn validate_key(key: &str) -> Result<(), GossipError> {
    let invalid = |reason| GossipError::InvalidKey {
        key: key.chars().take(64).collect(),
        reason,
    };
    if key.is_empty() {
        return Err(invalid("empty"));
    }
    if key.len() > MAX_KEY_LEN {
        return Err(invalid("longer than 256 bytes"));
    }
    Ok(())
}

impl Gossip {
    pub fn self_node(&self) -> &SelfNode {
        &self.self_node
    }

    /// Publishes `key = value` for this node; peers see it within a few gossip rounds.
    pub async fn set(&self, key: &str, value: &str) -> Result<(), GossipError> {
        validate_key(key)?;
        if value.len() > MAX_VALUE_LEN {
            return Err(GossipError::ValueTooLarge {
                key: key.to_owned(),
                len: value.len(),
                max: MAX_VALUE_LEN,
            });
        }
        self.handle
            .with_chitchat(|chitchat| chitchat.self_node_state().set(key, value))
            .await;
        Ok(())
    }

    /// Deletes `key` for this node (a tombstone is gossiped so peers drop it too).
    pub async fn delete(&self, key: &str) -> Result<(), GossipError> {
        validate_key(key)?;
        self.handle
            .with_chitchat(|chitchat| chitchat.self_node_state().delete(key))
            .await;
        Ok(())
    }

    /// The latest view of live peers.
    pub fn membership(&self) -> Arc<Membership> {
        self.membership.borrow().clone()
    }

    /// A receiver notified whenever the view changes: a peer joins, leaves, dies, or
    /// changes a key-value. Heartbeats alone do not notify.
    pub fn watch(&self) -> watch::Receiver<Arc<Membership>> {
        self.membership.clone()
    }

    /// Waits until `done(view)` holds, up to `within`. Returns the view that satisfied it.
    pub async fn wait_for(
        &self,
        within: Duration,
        mut done: impl FnMut(&Membership) -> bool,
    ) -> Option<Arc<Membership>> {
        let mut watch = self.watch();
        let waiting = watch.wait_for(|view| done(view));
        match tokio::time::timeout(within, waiting).await {
            Ok(Ok(view)) => Some(view.clone()),
            _ => None,
        }
    }

    /// Stops gossiping (peers will declare this node dead).
    pub fn stop(&self) {
        self.handle.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_and_values_are_bounded() {
        validate_key("digest").unwrap();
        assert!(validate_key("").is_err());
        assert!(validate_key(&"k".repeat(MAX_KEY_LEN + 1)).is_err());
    }
}
