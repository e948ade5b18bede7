//! The cluster as this node sees it: every live peer's decoded digest, rebuilt when gossip
//! changes and read lock-free-ish (an `Arc` swap) on every request.

use crate::engine::models::{ModelCard, decode_cards};
use crate::mesh::{Membership, Peer};
use crate::metrics::NodeMetrics;
use kvmesh_protocol::LoadDigest;
use kvmesh_protocol::gossip_keys::{self, Tier};
use kvmesh_protocol::route::{LoadableAdapters, node_key};
use kvmesh_protocol::summary::PeerSummary;
use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, RwLock};
use std::time::Instant;

/// One live peer.
#[derive(Clone, Debug)]
pub struct PeerView {
    pub name: String,
    pub key: u64,
    pub mesh_addr: SocketAddr,
    pub http_addr: Option<String>,
    /// Its kvmesh version (`None` from a node older than this key).
    pub version: Option<String>,
    /// The hash of its intents configuration (`None`: it has none, or is older than the key).
    pub intents: Option<String>,
    /// `None` until a valid digest arrives: such a peer is not a target.
    pub digest: Option<Arc<LoadDigest>>,
    /// When the current digest value arrived, in this node's monotonic milliseconds.
    pub digest_received_ms: u64,
    /// The peer's prefix summary (its engine's GPU), assembled from its gossiped shards.
    pub summary: Arc<PeerSummary>,
    /// What its engine holds in offload tiers (CPU, storage): exact mode only.
    pub offload: Arc<PeerSummary>,
    /// Its engine's model cards (empty until valid ones arrive).
    pub models: Arc<Vec<ModelCard>>,
    /// The adapters its engine may load at run time (empty: none, or invalid ones sent).
    pub loadable: Arc<LoadableAdapters>,
    generation: u64,
    digest_raw: String,
    models_raw: String,
    loadable_raw: String,
    shards_raw: BTreeMap<String, String>,
    offload_raw: BTreeMap<String, String>,
}

/// Every live peer, this node excluded.
#[derive(Clone, Debug, Default)]
pub struct ClusterView {
    pub peers: Vec<PeerView>,
}

/// The shared, swappable view.
#[derive(Debug, Default)]
pub struct SharedView(RwLock<Arc<ClusterView>>);

impl SharedView {
    pub fn load(&self) -> Arc<ClusterView> {
        self.0.read().unwrap_or_else(|e| e.into_inner()).clone()
    }

    fn store(&self, view: ClusterView) {
        *self.0.write().unwrap_or_else(|e| e.into_inner()) = Arc::new(view);
    }

    /// Rebuilds the view from a membership snapshot, decoding only digests that changed.
    pub fn update(&self, membership: &Membership, now_ms: u64, metrics: &NodeMetrics) {
        let previous = self.load();
        let known: HashMap<&str, &PeerView> = previous
            .peers
            .iter()
            .map(|p| (p.name.as_str(), p))
            .collect();
        let peers = membership
            .peers
            .iter()
            .map(|peer| {
                let old = known
                    .get(peer.name.as_str())
                    .filter(|old| old.generation == peer.generation);
                let raw = peer
                    .key_values
                    .get(gossip_keys::DIGEST)
                    .cloned()
                    .unwrap_or_default();
                let (digest, received) = match old {
                    Some(old) if old.digest_raw == raw => {
                        (old.digest.clone(), old.digest_received_ms)
                    }
                    _ => (decode_digest(&peer.name, &raw, metrics), now_ms),
                };
                let models_raw = peer
                    .key_values
                    .get(gossip_keys::MODELS)
                    .cloned()
                    .unwrap_or_default();
                let models = match old {
                    Some(old) if old.models_raw == models_raw => old.models.clone(),
                    _ => Arc::new(decode_models(&peer.name, &models_raw)),
                };
                let loadable_raw = peer
                    .key_values
                    .get(gossip_keys::LORA)
                    .cloned()
                    .unwrap_or_default();
                let loadable = match old {
                    Some(old) if old.loadable_raw == loadable_raw => old.loadable.clone(),
                    _ => Arc::new(decode_loadable(&peer.name, &loadable_raw)),
                };
                let shards_raw = keys_with_prefix(peer, Tier::Gpu.key_prefix());
                let offload_raw = keys_with_prefix(peer, Tier::Offload.key_prefix());
                let summary = updated_summary(
                    peer,
                    old.map(|old| (&old.summary, &old.shards_raw)),
                    &shards_raw,
                    Tier::Gpu,
                    metrics,
                );
                let offload = updated_summary(
                    peer,
                    old.map(|old| (&old.offload, &old.offload_raw)),
                    &offload_raw,
                    Tier::Offload,
                    metrics,
                );
                PeerView {
                    name: peer.name.clone(),
                    key: node_key(&peer.name),
                    mesh_addr: peer.mesh_addr,
                    http_addr: peer.key_values.get(gossip_keys::HTTP).cloned(),
                    version: peer.key_values.get(gossip_keys::VERSION).cloned(),
                    intents: peer.key_values.get(gossip_keys::INTENTS).cloned(),
                    digest,
                    digest_received_ms: received,
                    summary,
                    offload,
                    models,
                    loadable,
                    generation: peer.generation,
                    digest_raw: raw,
                    models_raw,
                    loadable_raw,
                    shards_raw,
                    offload_raw,
                }
            })
            .collect();
        self.store(ClusterView { peers });
    }
}

/// A peer's model cards; none while it has published none or sent invalid ones.
fn decode_models(peer: &str, raw: &str) -> Vec<ModelCard> {
    if raw.is_empty() {
        return Vec::new();
    }
    decode_cards(raw).unwrap_or_else(|error| {
        tracing::warn!(%peer, %error, "ignoring invalid model cards");
        Vec::new()
    })
}

/// The adapters a peer's engine may load, as gossiped; none when it gossips none or
/// something invalid.
fn decode_loadable(peer: &str, raw: &str) -> LoadableAdapters {
    if raw.is_empty() {
        return LoadableAdapters::default();
    }
    let decoded = serde_json::from_str::<LoadableAdapters>(raw)
        .map_err(|e| e.to_string())
        .and_then(|loadable| loadable.check().map(|()| loadable));
    decoded.unwrap_or_else(|error| {
        tracing::warn!(%peer, %error, "ignoring invalid loadable adapters");
        LoadableAdapters::default()
    })
}

/// What this node gossips under [`gossip_keys::LORA`].
pub fn encode_loadable(loadable: &LoadableAdapters) -> String {
    serde_json::to_string(loadable).expect("plain strings serialize")
}

/// A peer's gossip values under one key prefix.
fn keys_with_prefix(peer: &Peer, prefix: &str) -> BTreeMap<String, String> {
    peer.key_values
        .range(prefix.to_owned()..)
        .take_while(|(key, _)| key.starts_with(prefix))
        .map(|(key, value)| (key.clone(), value.clone()))
        .collect()
}

/// A peer's summary (of one tier) after applying the shards whose gossip
/// value changed. The summary is shared with older views, so it is copied only when one of its
/// shards changed.
fn updated_summary(
    peer: &Peer,
    old: Option<(&Arc<PeerSummary>, &BTreeMap<String, String>)>,
    shards_raw: &BTreeMap<String, String>,
    tier: Tier,
    metrics: &NodeMetrics,
) -> Arc<PeerSummary> {
    let (mut summary, old_raw) = match old {
        Some((summary, raw)) if raw == shards_raw => return summary.clone(),
        Some((summary, raw)) => (summary.clone(), Some(raw)),
        None => (Arc::new(PeerSummary::new()), None),
    };
    let target = Arc::make_mut(&mut summary);
    for (key, value) in shards_raw {
        if old_raw.and_then(|raw| raw.get(key)) == Some(value) {
            continue;
        }
        let applied = gossip_keys::decode_bytes(value)
            .ok_or_else(|| "not base64".to_owned())
            .and_then(|bytes| target.apply_bytes(&bytes).map_err(|e| e.to_string()));
        if let Err(error) = applied {
            metrics.summary_decode_errors.inc();
            tracing::warn!(peer = peer.name, key, %error, "rejected a summary shard");
        }
    }
    if let Some(old_raw) = old_raw {
        for key in old_raw.keys().filter(|key| !shards_raw.contains_key(*key)) {
            if let Some(index) = tier.shard_index(key) {
                target.remove_shard(index);
            }
        }
    }
    summary
}

fn decode_digest(peer: &str, raw: &str, metrics: &NodeMetrics) -> Option<Arc<LoadDigest>> {
    if raw.is_empty() {
        return None;
    }
    match gossip_keys::decode_digest(raw) {
        Ok(digest) => Some(Arc::new(digest)),
        Err(error) => {
            metrics.digest_decode_errors.inc();
            tracing::warn!(peer, %error, "rejected a peer's load digest");
            None
        }
    }
}

/// Wall-clock milliseconds since the Unix epoch: for deadlines and timestamps other nodes read
/// (routing decisions use [`monotonic_ms`]).
pub fn unix_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

/// Milliseconds since `start`: the node's monotonic clock for everything `protocol` decides.
pub fn monotonic_ms(start: Instant) -> u64 {
    start.elapsed().as_millis() as u64
}
