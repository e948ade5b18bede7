//! The receiving side: what one peer advertises, assembled from its shards.

use super::shard::{DecodedShard, ShardWire};
use super::shard_of;
use crate::codec::DecodeError;

/// A peer's summary: the latest shard of each index, all of one generation and geometry.
#[derive(Clone, Debug, Default)]
pub struct PeerSummary {
    num_shards: u16,
    generation: u64,
    shards: Vec<Option<DecodedShard>>,
    /// The sum of the held shards' [`DecodedShard::estimated_len`], kept as they change: the
    /// decision reads it for every candidate.
    blocks: usize,
}

/// What applying a shard did.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum Applied {
    Updated,
    /// Older than what is held (an earlier generation or version): ignored.
    Stale,
}

impl PeerSummary {
    pub fn new() -> Self {
        Self::default()
    }

    /// Decodes, validates and applies one gossiped shard.
    pub fn apply_bytes(&mut self, bytes: &[u8]) -> Result<Applied, DecodeError> {
        Ok(self.apply(ShardWire::decode(bytes)?))
    }

    /// Applies a validated shard. A newer generation or a new geometry replaces everything.
    pub fn apply(&mut self, shard: DecodedShard) -> Applied {
        let wire = &shard.wire;
        if wire.generation < self.generation {
            return Applied::Stale;
        }
        if wire.generation > self.generation || wire.num_shards != self.num_shards {
            self.generation = wire.generation;
            self.num_shards = wire.num_shards;
            self.shards = vec![None; wire.num_shards as usize];
            self.blocks = 0;
        }
        let slot = &mut self.shards[wire.index as usize];
        if let Some(held) = slot
            && held.wire.version > wire.version
        {
            return Applied::Stale;
        }
        let replaced = slot.as_ref().map_or(0, DecodedShard::estimated_len);
        self.blocks = self.blocks - replaced + shard.estimated_len();
        *slot = Some(shard);
        Applied::Updated
    }

    /// Forgets one shard (its gossip key was deleted).
    pub fn remove_shard(&mut self, index: u16) {
        if let Some(shard) = self.shards.get_mut(index as usize).and_then(Option::take) {
            self.blocks -= shard.estimated_len();
        }
    }

    #[inline]
    pub fn contains(&self, hash: u64) -> bool {
        match self.shards.get(shard_of(hash, self.num_shards) as usize) {
            Some(Some(shard)) => shard.contains(hash),
            _ => false,
        }
    }

    /// Number of leading blocks of `chain` this peer holds.
    ///
    /// Holding `h_i` means holding the whole prefix up to block `i` (engines evict a chain from
    /// its tail), so the match is found by galloping (probe blocks 1, 2, 4, 8, ... until a
    /// miss) and then bisecting: O(log n) lookups instead of n, which matters when hundreds of
    /// peers all hold a long shared prefix. A false match while galloping needs a run of
    /// independent false matches to reach far; while bisecting it can overstate a real match
    /// by at most the remaining interval, with the filter's false-match probability per probe.
    #[inline]
    pub fn longest_match(&self, chain: &[u64]) -> usize {
        if self.shards.is_empty() || chain.is_empty() || !self.contains(chain[0]) {
            return 0;
        }
        // Invariant: blocks [0, held) are held; block `missing` (if < len) is not.
        let (mut held, mut step) = (1usize, 1usize);
        let mut missing = chain.len();
        while held < chain.len() {
            let probe = (held + step).min(chain.len()) - 1;
            if self.contains(chain[probe]) {
                held = probe + 1;
                step *= 2;
            } else {
                missing = probe;
                break;
            }
        }
        while held < missing {
            let mid = held + (missing - held) / 2;
            if self.contains(chain[mid]) {
                held = mid + 1;
            } else {
                missing = mid;
            }
        }
        held
    }

    /// The longest match by walking every block from the start: the reference the galloping
    /// search is tested against.
    pub fn longest_match_linear(&self, chain: &[u64]) -> usize {
        chain
            .iter()
            .take_while(|&&hash| self.contains(hash))
            .count()
    }

    /// Bytes of all held shards as they came over the wire.
    pub fn encoded_bytes(&self) -> usize {
        self.shards.iter().flatten().map(|s| s.encoded_len).sum()
    }

    /// Blocks this peer advertises: exact shards counted, filters estimated from their fill.
    pub fn estimated_blocks(&self) -> usize {
        self.blocks
    }

    /// Expected false-match rate of a lookup, averaged over shards.
    pub fn estimated_false_match_rate(&self) -> f64 {
        if self.shards.is_empty() {
            return 0.0;
        }
        let sum: f64 = self
            .shards
            .iter()
            .flatten()
            .map(DecodedShard::false_match_rate)
            .sum();
        sum / self.shards.len() as f64
    }

    pub fn generation(&self) -> u64 {
        self.generation
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::summary::{EncodedShard, SummaryBuilder, SummaryConfig};

    fn hashes(n: u64, salt: u64) -> Vec<u64> {
        (0..n).map(|i| blake3_u64(i, salt)).collect()
    }

    fn blake3_u64(i: u64, salt: u64) -> u64 {
        let digest = blake3::hash(&[i.to_le_bytes(), salt.to_le_bytes()].concat());
        u64::from_le_bytes(digest.as_bytes()[..8].try_into().unwrap())
    }

    /// A builder of generation `generation` holding `held`.
    fn holding(held: &[u64], generation: u64) -> SummaryBuilder {
        let mut builder = SummaryBuilder::new(SummaryConfig::default(), generation).unwrap();
        held.iter().for_each(|&h| {
            builder.insert(h);
        });
        builder
    }

    /// Publishes `builder`'s changed shards to `peer`; returns them.
    fn apply_dirty(peer: &mut PeerSummary, builder: &mut SummaryBuilder) -> Vec<EncodedShard> {
        let shards = builder.publish_dirty();
        shards.iter().for_each(|s| {
            peer.apply_bytes(&s.bytes).unwrap();
        });
        shards
    }

    #[test]
    fn publishes_only_changed_shards_and_peers_follow() {
        let mut builder = SummaryBuilder::new(SummaryConfig::default(), 1).unwrap();
        let held = hashes(5_000, 1);
        held.iter().for_each(|&h| {
            builder.insert(h);
        });
        let mut peer = PeerSummary::new();
        for shard in builder.publish_dirty() {
            assert!(
                shard.bytes.len() <= 1200,
                "shard of {} bytes",
                shard.bytes.len()
            );
            assert_eq!(peer.apply_bytes(&shard.bytes).unwrap(), Applied::Updated);
        }
        assert!(held.iter().all(|&h| peer.contains(h)));
        assert_eq!(builder.dirty_count(), 0);

        builder.remove(held[0]);
        let changed = builder.publish_dirty();
        assert_eq!(changed.len(), 1);
        for shard in &changed {
            peer.apply_bytes(&shard.bytes).unwrap();
        }
    }

    #[test]
    fn small_sets_are_exact() {
        let mut peer = PeerSummary::new();
        apply_dirty(&mut peer, &mut holding(&hashes(40, 2), 1));
        assert_eq!(peer.estimated_false_match_rate(), 0.0);
        assert!(hashes(10_000, 3).iter().all(|&h| !peer.contains(h)));
    }

    #[test]
    fn longest_match_walks_the_chain() {
        let chain = hashes(10, 4);
        let mut peer = PeerSummary::new();
        assert_eq!(peer.longest_match(&chain), 0);
        apply_dirty(&mut peer, &mut holding(&chain[..6], 1));
        assert_eq!(peer.longest_match(&chain), 6);
        assert_eq!(peer.longest_match(&chain[..3]), 3);
        assert_eq!(peer.longest_match(&[]), 0);
        for len in 0..=chain.len() {
            assert_eq!(
                peer.longest_match(&chain[..len]),
                peer.longest_match_linear(&chain[..len])
            );
        }
    }

    #[test]
    fn newer_generation_replaces_older_and_stale_is_ignored() {
        let (a, b) = (hashes(3, 5), hashes(3, 6));
        let mut peer = PeerSummary::new();
        let old_shards = apply_dirty(&mut peer, &mut holding(&a, 1));
        apply_dirty(&mut peer, &mut holding(&b, 2));
        assert!(
            a.iter().all(|&h| !peer.contains(h)),
            "old generation dropped"
        );
        assert!(b.iter().all(|&h| peer.contains(h)));
        assert_eq!(
            peer.apply_bytes(&old_shards[0].bytes).unwrap(),
            Applied::Stale
        );
        assert_eq!(peer.generation(), 2);
    }

    /// The running count follows every change: a shard replaced, removed, or dropped with its
    /// generation. Exact shards count exactly; filters are estimated from their fill.
    #[test]
    fn the_block_count_follows_replacements_removals_and_generations() {
        // Counted afresh from every held shard's body.
        let recount = |peer: &PeerSummary| -> usize {
            let shards = peer.shards.iter().flatten();
            shards.map(|shard| shard.wire.body.estimated_len()).sum()
        };
        let held = hashes(40, 7);
        let mut builder = holding(&held, 1);
        let mut peer = PeerSummary::new();
        let first = apply_dirty(&mut peer, &mut builder);
        assert_eq!(peer.estimated_blocks(), 40);

        held[..10].iter().for_each(|&h| {
            builder.remove(h);
        });
        apply_dirty(&mut peer, &mut builder);
        assert_eq!(peer.estimated_blocks(), 30);
        let index = first[0].index;
        let in_shard = held[10..]
            .iter()
            .filter(|&&h| shard_of(h, peer.num_shards) == index)
            .count();
        peer.remove_shard(index);
        peer.remove_shard(index);
        assert_eq!(peer.estimated_blocks(), 30 - in_shard);

        apply_dirty(&mut peer, &mut holding(&hashes(20_000, 8), 2));
        assert!(
            peer.estimated_false_match_rate() > 0.0,
            "filters, not lists"
        );
        assert_eq!(peer.estimated_blocks(), recount(&peer));
        let estimate = peer.estimated_blocks();
        assert!((19_000..21_000).contains(&estimate), "{estimate}");

        apply_dirty(&mut peer, &mut holding(&held[..1], 3));
        assert_eq!(peer.estimated_blocks(), 1);
    }
}
