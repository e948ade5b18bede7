//! What this node knows of its own engine's prefix cache, and how it tells the mesh.
//!
//! Approximate mode (the default): every chain this node's engine served is inserted into an
//! LRU [`PrefixIndex`] bounded by the engine's real capacity (`num_gpu_blocks × block_size`
//! from `vllm:cache_config_info`, in hash blocks). Changes flow into a summary builder, whose
//! changed shards are gossiped as keys `s/NNN` (base64 of the validated shard envelope; the
//! schema is `kvmesh_protocol::gossip_keys`), and
//! into this node's own [`PeerSummary`], so this node judges itself exactly as peers judge it.
//!
//! Exact mode (`--kv-events`): the engine's KV events say what it holds (see
//! [`crate::kv_events`]); served chains are ignored. The GPU tier feeds the same `s/` summary;
//! the offload tier (CPU, storage) a second one under `o/NNN`, which routing weighs lower.

mod tier;

use kvmesh_protocol::gossip_keys::Tier;
use kvmesh_protocol::index::{IndexChanges, PrefixIndex};
use kvmesh_protocol::kv_events::TierChanges;
use kvmesh_protocol::summary::{PeerSummary, SummaryConfig};
use std::sync::Arc;
pub use tier::GossipShard;
use tier::TierSummary;

/// Capacity assumed until the engine reports its own (blocks of the hash chain).
const DEFAULT_CAPACITY: usize = 8192;

/// Where this node's knowledge of its engine's cache comes from.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum IndexMode {
    /// From the requests it served.
    Approximate,
    /// From the engine's KV events.
    Exact,
}

/// The local index, the summary built from it, and this node's view of its own summary.
#[derive(Debug)]
pub struct LocalPrefixes {
    mode: IndexMode,
    /// Approximate mode's LRU; in exact mode it stays empty and only records the capacity.
    index: PrefixIndex,
    /// Exact mode: blocks the engine holds on its GPU and in offload tiers.
    exact_blocks: usize,
    exact_offload_blocks: usize,
    gpu: TierSummary,
    offload: TierSummary,
}

impl LocalPrefixes {
    pub fn new(config: SummaryConfig, generation: u64, mode: IndexMode) -> Result<Self, String> {
        Ok(Self {
            mode,
            index: PrefixIndex::new(DEFAULT_CAPACITY),
            exact_blocks: 0,
            exact_offload_blocks: 0,
            gpu: TierSummary::new(Tier::Gpu, config, generation)?,
            offload: TierSummary::new(Tier::Offload, config, generation)?,
        })
    }

    pub fn mode(&self) -> IndexMode {
        self.mode
    }

    /// The engine served a request with this chain (approximate mode; exact mode waits for
    /// the engine's own events).
    pub fn observe_chain(&mut self, chain: &[u64]) {
        if self.mode == IndexMode::Approximate {
            let changes = self.index.insert_chain(chain);
            self.apply(changes);
        }
    }

    /// The engine's KV events changed its tiers; `gpu_blocks` and `offload_blocks` are the
    /// tiers' sizes afterwards.
    pub fn apply_events(
        &mut self,
        gpu: &TierChanges,
        offload: &TierChanges,
        gpu_blocks: usize,
        offload_blocks: usize,
    ) {
        for (tier, changes) in [(&mut self.gpu, gpu), (&mut self.offload, offload)] {
            for &hash in &changes.added {
                tier.insert(hash);
            }
            for &hash in &changes.removed {
                tier.remove(hash);
            }
        }
        self.exact_blocks = gpu_blocks;
        self.exact_offload_blocks = offload_blocks;
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
            self.gpu.insert(hash);
        }
        for hash in changes.evicted {
            self.gpu.remove(hash);
        }
    }

    /// Encodes the changed shards of both tiers for gossip and applies them to this node's
    /// own summaries.
    pub fn publish(&mut self) -> Vec<GossipShard> {
        let mut shards = self.gpu.publish();
        shards.extend(self.offload.publish());
        shards
    }

    /// This node's GPU-tier summary as its peers see it (as of the last publish).
    pub fn own_summary(&self) -> Arc<PeerSummary> {
        self.gpu.own()
    }

    /// This node's offload-tier summary as its peers see it.
    pub fn own_offload(&self) -> Arc<PeerSummary> {
        self.offload.own()
    }

    /// Blocks this node advertises (on the engine's GPU).
    pub fn blocks(&self) -> usize {
        match self.mode {
            IndexMode::Approximate => self.index.len(),
            IndexMode::Exact => self.exact_blocks,
        }
    }

    /// Exact mode: blocks in the engine's CPU and storage tiers.
    pub fn offload_blocks(&self) -> usize {
        self.exact_offload_blocks
    }

    pub fn capacity(&self) -> usize {
        self.index.capacity()
    }

    /// Bytes of every shard of both tiers as last published.
    pub fn summary_bytes(&self) -> usize {
        self.gpu.bytes() + self.offload.bytes()
    }

    /// Of the GPU tier's summary, the one routing leans on.
    pub fn estimated_false_match_rate(&self) -> f64 {
        self.gpu.estimated_false_match_rate()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn served_chains_become_published_shards_and_a_matching_own_summary() {
        let mut local =
            LocalPrefixes::new(SummaryConfig::default(), 1, IndexMode::Approximate).unwrap();
        let chain: Vec<u64> = (1..=20u64)
            .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15))
            .collect();
        local.observe_chain(&chain);
        let shards = local.publish();
        assert!(!shards.is_empty());
        assert_eq!(local.own_summary().longest_match(&chain), 20);
        let mut peer = PeerSummary::new();
        for shard in &shards {
            assert!(Tier::Gpu.shard_index(&shard.key).is_some());
            assert!(shard.value.len() < 2048);
            peer.apply_bytes(&kvmesh_protocol::gossip_keys::decode_bytes(&shard.value).unwrap())
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

    #[test]
    fn exact_mode_advertises_each_tier_under_its_own_keys() {
        let mut local = LocalPrefixes::new(SummaryConfig::default(), 1, IndexMode::Exact).unwrap();
        local.observe_chain(&[1, 2, 3]);
        assert!(
            local.publish().is_empty(),
            "served chains do not count in exact mode"
        );
        let gpu = TierChanges {
            added: vec![10, 11],
            removed: Vec::new(),
        };
        let offload = TierChanges {
            added: vec![10, 11, 12],
            removed: Vec::new(),
        };
        local.apply_events(&gpu, &offload, 2, 3);
        let shards = local.publish();
        for tier in Tier::ALL {
            assert!(shards.iter().any(|s| tier.shard_index(&s.key).is_some()));
        }
        assert_eq!(local.own_summary().longest_match(&[10, 11, 12]), 2);
        assert_eq!(local.own_offload().longest_match(&[10, 11, 12]), 3);
        assert_eq!((local.blocks(), local.offload_blocks()), (2, 3));
        let evicted = TierChanges {
            added: Vec::new(),
            removed: vec![11],
        };
        local.apply_events(&evicted, &TierChanges::default(), 1, 3);
        local.publish();
        assert_eq!(local.own_summary().longest_match(&[10, 11, 12]), 1);
    }
}
