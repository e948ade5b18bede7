//! Prefix summaries: a bounded-size encoding of the set of chain hashes an engine holds,
//! published through gossip and queried by every entry node.
//!
//! The set is split into `num_shards` shards by the top bits of each hash, so a change
//! re-publishes only the shards it touched, and each shard stays a small gossip value
//! (1 KiB of filter by default). A shard holding few hashes is sent as an exact sorted list;
//! a fuller one as a Bloom filter of fixed size, whose false-match rate at the advertised
//! capacity is pinned by a test (`tests/summary_false_match.rs`) and recorded in
//! `BENCHMARKS.md#summary-false-match`. Past capacity the summary does not grow: its
//! false-match rate does, and [`SummaryBuilder::estimated_false_match_rate`] reports it so an
//! operator can raise the budget.
//!
//! A summary answers "does this node hold `h`?"; because a chain hash names a whole prefix,
//! the longest match walks the chain from the start and stops at the first miss, so a false
//! match only ever extends a match by one block with the filter's false-match probability.

mod bloom;
mod builder;
mod peer;
mod shard;

pub use builder::{EncodedShard, SummaryBuilder};
pub use peer::PeerSummary;
pub use shard::{DecodedShard, ShardBody, ShardWire};

/// Summary geometry. Every node should use the same one; a receiver reads the geometry from
/// each shard, so a mismatch costs accuracy, never correctness.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct SummaryConfig {
    /// Number of shards; a power of two in `1..=1024`. Default 32.
    pub num_shards: u16,
    /// Bytes of Bloom filter per shard; a power of two, at least 8. Default 1024, so the
    /// default budget is 32 KiB.
    pub shard_bytes: u32,
}

impl Default for SummaryConfig {
    fn default() -> Self {
        Self {
            num_shards: 32,
            shard_bytes: 1024,
        }
    }
}

impl SummaryConfig {
    /// A geometry for a total byte budget (rounded down to powers of two), keeping shards at
    /// 1 KiB so each gossip value stays small.
    pub fn with_budget(budget_bytes: usize) -> Self {
        let shard_bytes: u32 = 1024;
        let shards = (budget_bytes / shard_bytes as usize).clamp(1, MAX_SHARDS as usize);
        Self {
            num_shards: prev_power_of_two(shards) as u16,
            shard_bytes,
        }
    }

    /// Total bytes of filter when every shard is a Bloom filter.
    pub fn budget_bytes(&self) -> usize {
        self.num_shards as usize * self.shard_bytes as usize
    }

    /// How many hashes the summary holds at or under [`bloom::DESIGN_FALSE_MATCH_RATE`].
    pub fn capacity(&self) -> usize {
        self.num_shards as usize * bloom::capacity(self.shard_bytes as usize * 8)
    }

    /// Which shard a hash belongs to: its top bits, so shards split the hash space evenly.
    pub fn shard_of(&self, hash: u64) -> u16 {
        shard_of(hash, self.num_shards)
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        if !self.num_shards.is_power_of_two() || self.num_shards > MAX_SHARDS {
            return Err(format!(
                "num_shards {} is not a power of two <= 1024",
                self.num_shards
            ));
        }
        if !self.shard_bytes.is_power_of_two() || !(8..=MAX_SHARD_BYTES).contains(&self.shard_bytes)
        {
            return Err(format!(
                "shard_bytes {} is not a power of two in 8..=65536",
                self.shard_bytes
            ));
        }
        Ok(())
    }
}

pub(crate) const MAX_SHARDS: u16 = 1024;
pub(crate) const MAX_SHARD_BYTES: u32 = 65_536;

pub(crate) fn shard_of(hash: u64, num_shards: u16) -> u16 {
    if num_shards <= 1 {
        return 0;
    }
    let bits = num_shards.trailing_zeros();
    (hash >> (64 - bits)) as u16
}

fn prev_power_of_two(n: usize) -> usize {
    if n.is_power_of_two() {
        n
    } else {
        n.next_power_of_two() / 2
    }
}

pub use bloom::DESIGN_FALSE_MATCH_RATE;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_geometry() {
        let config = SummaryConfig::default();
        assert_eq!(config.budget_bytes(), 32 * 1024);
        assert!(config.capacity() > 20_000, "capacity {}", config.capacity());
        assert_eq!(SummaryConfig::with_budget(32 * 1024), config);
        assert_eq!(SummaryConfig::with_budget(100 * 1024).num_shards, 64);
        assert!(config.validate().is_ok());
        assert!(
            SummaryConfig {
                num_shards: 3,
                shard_bytes: 1024
            }
            .validate()
            .is_err()
        );
    }

    #[test]
    fn shards_split_the_hash_space_by_top_bits() {
        assert_eq!(shard_of(u64::MAX, 32), 31);
        assert_eq!(shard_of(0, 32), 0);
        assert_eq!(shard_of(1 << 59, 32), 1);
        assert_eq!(shard_of(u64::MAX, 1), 0);
    }
}
