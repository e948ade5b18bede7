//! Publishing this node's load digest and prefix summary: both refreshed every digest
//! interval, the digest used locally at once and gossiped when `protocol`'s
//! [`DigestPublisher`] says (its load changed, or once a second, so peers can tell a quiet
//! node from a stuck one), the summary's changed shards gossiped. Between those ticks, a
//! change to the engine queue ([`PublishSoon`]) publishes the digest within
//! [`PUBLISH_COALESCE`]: a request's load then waits only for the next gossip exchange, not
//! for the next tick as well. The summary keeps the tick: in the simulator, publishing it at
//! once too lengthened rag-pressure's tail (`docs/studies/digest-publish.md`).

use crate::engine::models::{ModelCard, encode_cards};
use crate::serve::state::{SharedState, lock};
use kvmesh_protocol::cadence::{DigestPublisher, PUBLISH_COALESCE};
use kvmesh_protocol::gossip_keys;
use kvmesh_protocol::{EngineFacts, LoadDigest};
use std::sync::Arc;
use std::sync::atomic::Ordering;
use tokio::sync::Notify;

/// Told of every change to the engine queue (a request handed over, begun or ended): wakes
/// the publish loop. Changes while it publishes leave one wake-up pending, so none is lost
/// and a burst costs one publication per [`PUBLISH_COALESCE`].
#[derive(Clone, Debug, Default)]
pub struct PublishSoon(Arc<Notify>);

impl PublishSoon {
    pub fn nudge(&self) {
        self.0.notify_one();
    }

    async fn nudged(&self) {
        self.0.notified().await;
    }
}

pub async fn publish_loop(state: SharedState) {
    let mut ticker = tokio::time::interval(state.config.digest_interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut publisher = DigestPublisher::new();
    let mut cards_published = None;
    loop {
        let tick = tokio::select! {
            _ = ticker.tick() => true,
            () = state.engine_queue.changes().nudged() => false,
        };
        if !tick {
            // What changes in the next few milliseconds (the rest of a burst) goes out with it.
            tokio::time::sleep(PUBLISH_COALESCE).await;
            publish_digest(&state, &mut publisher).await;
            continue;
        }
        publish_cards(&state, &mut cards_published).await;
        publish_digest(&state, &mut publisher).await;
        publish_summary(&state).await;
        let now = state.now_ms();
        let view = state.view.load();
        lock(&state.entry).prune(now, |key| {
            view.peers
                .iter()
                .find(|p| p.key == key)
                .map_or(0, |p| p.digest_received_ms)
        });
    }
}

/// Refreshes this node's own digest and gossips it if its load changed (or a quiet second
/// passed).
async fn publish_digest(state: &SharedState, publisher: &mut DigestPublisher) {
    let digest = refresh_own_digest(state, publisher.next_version());
    if publisher.should_gossip(&digest, state.now_ms()) {
        gossip_digest(state, &digest).await;
    }
}

/// Builds and publishes a first digest (version 0) at once, before the periodic loop's.
pub async fn publish_once(state: &SharedState) {
    let digest = refresh_own_digest(state, 0);
    gossip_digest(state, &digest).await;
}

/// Builds the digest from the engine's latest state and makes it this node's own view.
fn refresh_own_digest(state: &SharedState, version: u64) -> LoadDigest {
    let digest = build_digest(state, version);
    let now = state.now_ms();
    *state.self_digest.write().unwrap_or_else(|e| e.into_inner()) =
        Some((Arc::new(digest.clone()), now));
    digest
}

async fn gossip_digest(state: &SharedState, digest: &LoadDigest) {
    if let Err(error) = state
        .mesh
        .gossip()
        .set(gossip_keys::DIGEST, &gossip_keys::encode_digest(digest))
        .await
    {
        tracing::error!(%error, "publishing the load digest");
    }
}

/// Gossips the engine's model cards when they changed (a restart, an adapter loaded).
async fn publish_cards(state: &SharedState, published: &mut Option<Vec<ModelCard>>) {
    let cards = state.engine.state().cards.clone();
    if cards.is_empty() || published.as_ref() == Some(&cards) {
        return;
    }
    match state
        .mesh
        .gossip()
        .set(gossip_keys::MODELS, &encode_cards(&cards))
        .await
    {
        Ok(()) => *published = Some(cards),
        Err(error) => tracing::error!(%error, "publishing the model cards"),
    }
}

/// Sizes the index by the engine's real capacity and gossips the summary shards that changed.
async fn publish_summary(state: &SharedState) {
    let engine = state.engine.state();
    let capacity = engine.metrics.num_gpu_blocks.map(|blocks| {
        let tokens = blocks * u64::from(engine.metrics.block_size.unwrap_or(16));
        (tokens as f32 / state.config.hashing.tokens_per_block()).floor() as usize
    });
    let (shards, bytes, blocks, offload_blocks, capacity, false_match) = {
        let mut prefixes = lock(&state.prefixes);
        if let Some(capacity) = capacity {
            prefixes.set_capacity(capacity);
        }
        let shards = prefixes.publish();
        (
            shards,
            prefixes.summary_bytes(),
            prefixes.blocks(),
            prefixes.offload_blocks(),
            prefixes.capacity(),
            prefixes.estimated_false_match_rate(),
        )
    };
    let metrics = &state.metrics;
    metrics.summary_bytes.set(bytes as i64);
    metrics.index_blocks.set(blocks as i64);
    metrics.index_offload_blocks.set(offload_blocks as i64);
    metrics.index_capacity_blocks.set(capacity as i64);
    metrics.summary_false_match_rate.set(false_match);
    for shard in shards {
        metrics.summary_shards_published.inc();
        if let Err(error) = state.mesh.gossip().set(&shard.key, &shard.value).await {
            tracing::error!(%error, shard = shard.key, "publishing a summary shard");
        }
    }
}

/// The digest's load is the engine queue's: the last poll's gauges with the queue this node
/// counts exactly, the same figures its load reports carry.
fn build_digest(state: &SharedState, version: u64) -> LoadDigest {
    let engine = state.engine.state();
    let metrics = &engine.metrics;
    state.engine_queue.set_digest_version(version);
    let queue = state.engine_queue.gauges();
    let facts = EngineFacts {
        kv_capacity_blocks: metrics.num_gpu_blocks.unwrap_or(0),
        block_size: metrics.block_size.unwrap_or(16),
        ttft_ewma_ms: engine.ttft_ewma_ms,
        prefill_tokens_per_s: engine.prefill_tokens_per_s,
        inflight_forwarded: state.inflight_forwarded.load(Ordering::Relaxed),
        role: state.config.role,
        healthy: engine.healthy && !state.is_draining(),
        models: engine.models.clone(),
        loras: engine.loras.clone(),
        lora_use: metrics
            .lora_use
            .as_ref()
            .map(|(_, lora_use)| lora_use.clone())
            .unwrap_or_default(),
    };
    LoadDigest::new(version, crate::view::unix_ms(), queue, facts)
}
