//! The publishing side: a node's own set of chain hashes, tracked per shard.

use super::shard::{ShardBody, ShardWire};
use super::{SummaryConfig, bloom};
use crate::block_map::BlockSet;

/// One shard ready to publish.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EncodedShard {
    pub index: u16,
    pub bytes: Vec<u8>,
}

/// The set of chain hashes a node advertises, with the shards changed since the last publish.
#[derive(Debug)]
pub struct SummaryBuilder {
    config: SummaryConfig,
    generation: u64,
    sets: Vec<BlockSet<u64>>,
    versions: Vec<u64>,
    dirty: Vec<bool>,
}

impl SummaryBuilder {
    /// `generation` distinguishes incarnations of a node (e.g. its start time in ms): peers drop
    /// every shard of an older generation when a newer one arrives.
    pub fn new(config: SummaryConfig, generation: u64) -> Result<Self, String> {
        config.validate()?;
        let shards = config.num_shards as usize;
        Ok(Self {
            config,
            generation,
            sets: vec![BlockSet::default(); shards],
            versions: vec![0; shards],
            dirty: vec![false; shards],
        })
    }

    pub fn config(&self) -> SummaryConfig {
        self.config
    }

    pub fn insert(&mut self, hash: u64) -> bool {
        let shard = self.config.shard_of(hash) as usize;
        let added = self.sets[shard].insert(hash);
        self.dirty[shard] |= added;
        added
    }

    pub fn remove(&mut self, hash: u64) -> bool {
        let shard = self.config.shard_of(hash) as usize;
        let removed = self.sets[shard].remove(&hash);
        self.dirty[shard] |= removed;
        removed
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.sets[self.config.shard_of(hash) as usize].contains(&hash)
    }

    pub fn clear(&mut self) {
        for (set, dirty) in self.sets.iter_mut().zip(&mut self.dirty) {
            *dirty |= !set.is_empty();
            set.clear();
        }
    }

    pub fn len(&self) -> usize {
        self.sets.iter().map(BlockSet::len).sum()
    }

    pub fn is_empty(&self) -> bool {
        self.sets.iter().all(BlockSet::is_empty)
    }

    /// Number of shards changed since the last [`Self::publish_dirty`].
    pub fn dirty_count(&self) -> usize {
        self.dirty.iter().filter(|d| **d).count()
    }

    /// Encodes every changed shard with a new version, and marks all clean.
    pub fn publish_dirty(&mut self) -> Vec<EncodedShard> {
        let mut out = Vec::new();
        for index in 0..self.sets.len() {
            if std::mem::take(&mut self.dirty[index]) {
                self.versions[index] += 1;
                out.push(EncodedShard {
                    index: index as u16,
                    bytes: self.encode_shard(index as u16),
                });
            }
        }
        out
    }

    /// Encodes one shard at its current version (for a full re-publish).
    pub fn encode_shard(&self, index: u16) -> Vec<u8> {
        self.shard_wire(index).encode()
    }

    fn shard_wire(&self, index: u16) -> ShardWire {
        let set = &self.sets[index as usize];
        let filter_bytes = self.config.shard_bytes as usize;
        let body = if set.len() * 8 <= filter_bytes {
            let mut hashes: Vec<u64> = set.iter().copied().collect();
            hashes.sort_unstable();
            ShardBody::Exact(hashes)
        } else {
            let mut words = vec![0u64; filter_bytes / 8];
            for &hash in set {
                bloom::insert(&mut words, hash, bloom::PROBES);
            }
            ShardBody::Bloom {
                probes: bloom::PROBES,
                words,
            }
        };
        ShardWire {
            hash_version: crate::hashing::HASH_VERSION,
            num_shards: self.config.num_shards,
            index,
            generation: self.generation,
            version: self.versions[index as usize],
            body,
        }
    }

    /// Expected false-match rate of a lookup of a hash not in the set, averaged over shards
    /// (lookups spread evenly over shards), from each shard's fill as it would be encoded.
    pub fn estimated_false_match_rate(&self) -> f64 {
        let bits = self.config.shard_bytes as f64 * 8.0;
        let k = f64::from(bloom::PROBES);
        let total: f64 = self
            .sets
            .iter()
            .filter(|set| set.len() * 8 > self.config.shard_bytes as usize)
            .map(|set| (1.0 - (-k * set.len() as f64 / bits).exp()).powf(k))
            // Not `.sum()`: an empty float sum is -0.0, which /metrics would print as such.
            .fold(0.0, |total, rate| total + rate);
        total / self.sets.len() as f64
    }
}
