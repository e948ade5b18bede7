//! One advertised tier of the engine's cache: its summary builder, the gossip keys its shards
//! go under, and this node's own view of it as peers will decode it.

use kvmesh_protocol::gossip_keys::{self, Tier};
use kvmesh_protocol::summary::{PeerSummary, SummaryBuilder, SummaryConfig};
use std::sync::Arc;

/// A changed shard, ready to gossip.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GossipShard {
    pub key: String,
    pub value: String,
}

#[derive(Debug)]
pub struct TierSummary {
    tier: Tier,
    builder: SummaryBuilder,
    own: Arc<PeerSummary>,
    published_bytes: Vec<usize>,
}

impl TierSummary {
    pub fn new(tier: Tier, config: SummaryConfig, generation: u64) -> Result<Self, String> {
        Ok(Self {
            tier,
            builder: SummaryBuilder::new(config, generation)?,
            own: Arc::new(PeerSummary::new()),
            published_bytes: vec![0; config.num_shards as usize],
        })
    }

    pub fn insert(&mut self, hash: u64) {
        self.builder.insert(hash);
    }

    pub fn remove(&mut self, hash: u64) {
        self.builder.remove(hash);
    }

    /// Encodes the changed shards for gossip and applies them to this node's own summary.
    pub fn publish(&mut self) -> Vec<GossipShard> {
        let shards = self.builder.publish_dirty();
        if shards.is_empty() {
            return Vec::new();
        }
        // Copy-on-write: routing threads may still hold the previous summary.
        let own = Arc::make_mut(&mut self.own);
        shards
            .iter()
            .map(|shard| {
                if own.apply_bytes(&shard.bytes).is_ok() {
                    self.published_bytes[shard.index as usize] = shard.bytes.len();
                }
                GossipShard {
                    key: self.tier.shard_key(shard.index),
                    value: gossip_keys::encode_bytes(&shard.bytes),
                }
            })
            .collect()
    }

    /// The summary as peers see it (as of the last publish).
    pub fn own(&self) -> Arc<PeerSummary> {
        self.own.clone()
    }

    /// Bytes of every shard as last published.
    pub fn bytes(&self) -> usize {
        self.published_bytes.iter().sum()
    }

    pub fn estimated_false_match_rate(&self) -> f64 {
        self.builder.estimated_false_match_rate()
    }
}
