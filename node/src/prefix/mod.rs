//! What this node knows of its own engine's prefix cache, and how it tells the mesh.
//!
//! Approximate mode (the default): every chain this node's engine served is inserted into an
//! LRU [`PrefixIndex`] bounded by the engine's real capacity (`num_gpu_blocks × block_size`
//! from `vllm:cache_config_info`, in hash blocks). Changes flow into a [`SummaryBuilder`], whose
//! changed shards are gossiped as keys `s/NN` (base64 of the validated shard envelope), and
//! into this node's own [`PeerSummary`], so this node judges itself exactly as peers judge it.

use base64::Engine as _;
use kvmesh_protocol::index::{IndexChanges, PrefixIndex};
use kvmesh_protocol::summary::{EncodedShard, PeerSummary, SummaryBuilder, SummaryConfig};
use std::sync::Arc;

/// Gossip key prefix of summary shards.
pub const SHARD_KEY_PREFIX: &str = "s/";

/// Capacity assumed until the engine reports its own (blocks of the hash chain).
const DEFAULT_CAPACITY: usize = 8192;

pub fn shard_key(index: u16) -> String {
    format!("{SHARD_KEY_PREFIX}{index:03}")
}

pub fn encode_shard_value(bytes: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(bytes)
}

pub fn decode_shard_value(value: &str) -> Option<Vec<u8>> {
    base64::engine::general_purpose::STANDARD.decode(value).ok()
}

/// The local index, the summary built from it, and this node's view of its own summary.
#[derive(Debug)]
pub struct LocalPrefixes {
    index: PrefixIndex,
    builder: SummaryBuilder,
    own: Arc<PeerSummary>,
    published_bytes: Vec<usize>,
}

impl LocalPrefixes {
    pub fn new(config: SummaryConfig, generation: u64) -> Result<Self, String> {
        Ok(Self {
            index: PrefixIndex::new(DEFAULT_CAPACITY),
            builder: SummaryBuilder::new(config, generation)?,
            own: Arc::new(PeerSummary::new()),
            published_bytes: vec![0; config.num_shards as usize],
        })
    }

    /// The engine served a request with this chain.
    pub fn observe_chain(&mut self, chain: &[u64]) {
        let changes = self.index.insert_chain(chain);
        self.apply(changes);
    }

    /// The engine reported its capacity, in hash blocks.
    pub fn set_capacity(&mut self, blocks: usize) {
        if blocks > 0 && blocks != self.index.capacity() {
            let changes = self.index.set_capacity(blocks);
            self.apply(changes);
        }
    }

    fn apply(&mut self, changes: IndexChanges) {
        for hash in changes.added {
            self.builder.insert(hash);
        }
        for hash in changes.evicted {
            self.builder.remove(hash);
        }
    }

    /// Encodes the changed shards for gossip and applies them to this node's own summary.
    pub fn publish(&mut self) -> Vec<EncodedShard> {
        let shards = self.builder.publish_dirty();
        if shards.is_empty() {
            return shards;
        }
        // Copy-on-write: routing threads may still hold the previous summary.
        let own = Arc::make_mut(&mut self.own);
        for shard in &shards {
            if own.apply_bytes(&shard.bytes).is_ok() {
                self.published_bytes[shard.index as usize] = shard.bytes.len();
            }
        }
        shards
    }

    /// This node's summary as its peers see it (as of the last publish).
    pub fn own_summary(&self) -> Arc<PeerSummary> {
        self.own.clone()
    }

    pub fn blocks(&self) -> usize {
        self.index.len()
    }

    pub fn capacity(&self) -> usize {
        self.index.capacity()
    }

    /// Bytes of every shard as last published.
    pub fn summary_bytes(&self) -> usize {
        self.published_bytes.iter().sum()
    }

    pub fn estimated_false_match_rate(&self) -> f64 {
        self.builder.estimated_false_match_rate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_chains_become_published_shards_and_a_matching_own_summary() {
        let mut local = LocalPrefixes::new(SummaryConfig::default(), 1).unwrap();
        let chain: Vec<u64> = (1..=20u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        local.observe_chain(&chain);
        let shards = local.publish();
        assert!(!shards.is_empty());
        assert_eq!(local.own_summary().longest_match(&chain), 20);
        let mut peer = PeerSummary::new();
        for shard in &shards {
            let value = encode_shard_value(&shard.bytes);
            assert!(value.len() < 2048);
            peer.apply_bytes(&decode_shard_value(&value).unwrap())
                .unwrap();
        }
        assert_eq!(peer.longest_match(&chain), 20);
        assert!(local.publish().is_empty(), "nothing changed since");
        local.set_capacity(5);
        assert_eq!(local.blocks(), 5);
        local.publish();
        assert_eq!(
            local.own_summary().longest_match(&chain),
            5,
            "the prefix outlives the tail"
        );
    }
}
