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
    /// The gossiped key-values this was decoded from: a peer whose key-values are still
    /// these (the same allocation) is not looked at again, and one whose are not is decoded
    /// only where a value differs from these.
    source: Arc<BTreeMap<String, String>>,
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

    /// Rebuilds the view from a membership snapshot, decoding only values that changed.
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
                match old {
                    Some(old) if Arc::ptr_eq(&old.source, &peer.key_values) => (*old).clone(),
                    _ => decode_peer(peer, old.copied(), now_ms, metrics),
                }
            })
            .collect();
        self.store(ClusterView { peers });
    }
}

/// `peer` as this node sees it, reusing what `old` (its view of the same incarnation, if any)
/// decoded from values that have not changed.
fn decode_peer(
    peer: &Peer,
    old: Option<&PeerView>,
    now_ms: u64,
    metrics: &NodeMetrics,
) -> PeerView {
    let value = |key: &str| peer.key_values.get(key).map_or("", String::as_str);
    let unchanged =
        |key: &str| old.is_some_and(|old| old.source.get(key) == peer.key_values.get(key));
    let (digest, digest_received_ms) = match old {
        Some(old) if unchanged(gossip_keys::DIGEST) => (old.digest.clone(), old.digest_received_ms),
        _ => (
            decode_digest(&peer.name, value(gossip_keys::DIGEST), metrics),
            now_ms,
        ),
    };
    let models = match old {
        Some(old) if unchanged(gossip_keys::MODELS) => old.models.clone(),
        _ => Arc::new(decode_models(&peer.name, value(gossip_keys::MODELS))),
    };
    let loadable = match old {
        Some(old) if unchanged(gossip_keys::LORA) => old.loadable.clone(),
        _ => Arc::new(decode_loadable(&peer.name, value(gossip_keys::LORA))),
    };
    let summary = updated_summary(
        peer,
        old.map(|old| (&old.summary, &*old.source)),
        Tier::Gpu,
        metrics,
    );
    let offload = updated_summary(
        peer,
        old.map(|old| (&old.offload, &*old.source)),
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
        digest_received_ms,
        summary,
        offload,
        models,
        loadable,
        generation: peer.generation,
        source: peer.key_values.clone(),
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

/// Key-values of `values` under `prefix`.
fn with_prefix<'a>(
    values: &'a BTreeMap<String, String>,
    prefix: &'a str,
) -> impl Iterator<Item = (&'a String, &'a String)> {
    values
        .range(prefix.to_owned()..)
        .take_while(move |(key, _)| key.starts_with(prefix))
}

/// `peer`'s summary of `tier`, from `old` (the summary and the key-values it was decoded
/// from) with only the shards that changed applied.
fn updated_summary(
    peer: &Peer,
    old: Option<(&Arc<PeerSummary>, &BTreeMap<String, String>)>,
    tier: Tier,
    metrics: &NodeMetrics,
) -> Arc<PeerSummary> {
    let prefix = tier.key_prefix();
    let (mut summary, old_values) = match old {
        Some((summary, values))
            if with_prefix(values, prefix).eq(with_prefix(&peer.key_values, prefix)) =>
        {
            return summary.clone();
        }
        Some((summary, values)) => (summary.clone(), Some(values)),
        None => (Arc::new(PeerSummary::new()), None),
    };
    let target = Arc::make_mut(&mut summary);
    for (key, value) in with_prefix(&peer.key_values, prefix) {
        if old_values.and_then(|values| values.get(key)) == Some(value) {
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
    if let Some(old_values) = old_values {
        let gone =
            with_prefix(old_values, prefix).filter(|(key, _)| !peer.key_values.contains_key(*key));
        for (key, _) in gone {
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
