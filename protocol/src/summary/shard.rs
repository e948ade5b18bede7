//! One shard on the wire, and its validated, queryable form.

use super::{MAX_SHARD_BYTES, MAX_SHARDS, bloom, shard_of};
use crate::codec::{self, DecodeError, Kind};
use rkyv::{Archive, Deserialize, Serialize};

/// A shard as gossiped.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct ShardWire {
    /// Must equal [`crate::hashing::HASH_VERSION`] for the hashes to mean anything here.
    pub hash_version: u16,
    pub num_shards: u16,
    pub index: u16,
    /// The publishing summary's incarnation; a newer one replaces everything older.
    pub generation: u64,
    /// Monotonic per shard within a generation.
    pub version: u64,
    pub body: ShardBody,
}

/// A few hashes are cheaper to send exactly than as a filter (and never match falsely).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
pub enum ShardBody {
    /// Strictly ascending hashes, all belonging to this shard.
    Exact(Vec<u64>),
    /// A Bloom filter: `words.len() * 64` bits (a power of two), `probes` probes per hash.
    Bloom { probes: u8, words: Vec<u64> },
}

impl ShardBody {
    /// Hashes the body holds: counted when exact, estimated from its fill when a filter.
    pub fn estimated_len(&self) -> usize {
        match self {
            ShardBody::Exact(hashes) => hashes.len(),
            ShardBody::Bloom { probes, words } => bloom::estimated_count(words, *probes),
        }
    }
}

/// Most hashes an exact shard may carry (bounds what a peer can make us allocate).
const MAX_EXACT: usize = MAX_SHARD_BYTES as usize / 8;

impl ShardWire {
    pub fn encode(&self) -> Vec<u8> {
        codec::encode(Kind::SummaryShard, self)
    }

    /// Decodes and validates everything a lookup relies on.
    pub fn decode(bytes: &[u8]) -> Result<DecodedShard, DecodeError> {
        let wire: ShardWire = codec::decode(Kind::SummaryShard, bytes)?;
        wire.validate()?;
        Ok(DecodedShard {
            encoded_len: bytes.len(),
            estimated_len: wire.body.estimated_len(),
            wire,
        })
    }

    fn validate(&self) -> Result<(), DecodeError> {
        let bad = |why: String| Err(DecodeError::Semantic(why));
        if self.hash_version != crate::hashing::HASH_VERSION {
            return bad(format!("hash version {} is not ours", self.hash_version));
        }
        if !self.num_shards.is_power_of_two() || self.num_shards > MAX_SHARDS {
            return bad(format!("num_shards {}", self.num_shards));
        }
        if self.index >= self.num_shards {
            return bad(format!("shard {} of {}", self.index, self.num_shards));
        }
        match &self.body {
            ShardBody::Exact(hashes) => {
                if hashes.len() > MAX_EXACT {
                    return bad(format!("{} exact hashes", hashes.len()));
                }
                if !hashes.windows(2).all(|w| w[0] < w[1]) {
                    return bad("exact hashes not strictly ascending".into());
                }
                if hashes
                    .iter()
                    .any(|&h| shard_of(h, self.num_shards) != self.index)
                {
                    return bad("exact hash outside its shard".into());
                }
            }
            ShardBody::Bloom { probes, words } => {
                if !(1..=16).contains(probes) {
                    return bad(format!("{probes} probes"));
                }
                let bytes = words.len() * 8;
                if !words.len().is_power_of_two() || bytes > MAX_SHARD_BYTES as usize {
                    return bad(format!("{bytes}-byte filter"));
                }
            }
        }
        Ok(())
    }
}

/// A validated shard, ready for lookups.
#[derive(Clone, Debug, PartialEq)]
pub struct DecodedShard {
    pub wire: ShardWire,
    /// Size on the wire, for metrics.
    pub encoded_len: usize,
    /// [`ShardBody::estimated_len`], counted once: a filter's count reads every word.
    estimated_len: usize,
}

impl DecodedShard {
    #[inline]
    pub fn contains(&self, hash: u64) -> bool {
        match &self.wire.body {
            ShardBody::Exact(hashes) => hashes.binary_search(&hash).is_ok(),
            ShardBody::Bloom { probes, words } => bloom::contains(words, hash, *probes),
        }
    }

    /// Hashes this shard holds: counted when exact, estimated from its fill when a filter.
    pub fn estimated_len(&self) -> usize {
        self.estimated_len
    }

    /// Expected probability that a hash not in the set is reported present.
    pub fn false_match_rate(&self) -> f64 {
        match &self.wire.body {
            ShardBody::Exact(_) => 0.0,
            ShardBody::Bloom { probes, words } => bloom::false_match_rate(words, *probes),
        }
    }
}
