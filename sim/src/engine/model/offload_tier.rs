//! The CPU offload tier, as its KV events show it.
//!
//! vLLM's `OffloadingConnector` (CPU offloading) copies the blocks the GPU caches to a CPU
//! buffer of fixed size and evicts from that buffer in LRU order. It reports both in the same
//! event batches as the GPU's own events, under the GPU's block hashes: a token-less
//! `BlockStored` with medium `CPU` once a copy is done, a `BlockRemoved` with medium `CPU` when
//! the buffer evicts. [`OffloadTier`] follows the GPU's events and adds those
//! ([`KvCacheEvent::OffloadStored`], [`KvCacheEvent::OffloadRemoved`]).
//!
//! **It models the events of an offload tier, not its hits.** The engine's prefix-cache hit
//! accounting looks at the GPU alone: a prompt whose blocks survive only on the CPU is
//! recomputed as if nothing held them (loading from the CPU is not modelled). The tier exists
//! so that consumers of KV events (the sidecar's offload tier) can be exercised end to end.
//!
//! The rules:
//! - every block the GPU stores is stored here too, right after the GPU's `BlockStored` in the
//!   same batch (a consumer maps a token-less store through the tokens of that earlier event);
//!   a hash already here is refreshed (most recently stored again) and not reported again;
//! - past capacity, the least recently stored hashes are evicted; a hash stored and evicted
//!   within one GPU event (an event longer than the tier) is never reported;
//! - GPU evictions leave CPU copies alone;
//! - `AllBlocksCleared` empties this tier too: consumers forget every tier on it, so a tier
//!   that kept its copies would never report them again and drift from what they believe;
//! - capacity 0 turns the tier off: events pass through unchanged.

use std::collections::{BTreeMap, HashMap};

use super::block_hash::BlockHash;
use super::block_pool::KvCacheEvent;

/// An LRU set of block hashes of fixed capacity that follows the GPU's KV events.
#[derive(Debug, Default)]
pub struct OffloadTier {
    capacity: usize,
    /// Hash → the stamp of its latest store.
    stamps: HashMap<BlockHash, u64>,
    /// Stamp → hash, oldest first: the eviction order.
    order: BTreeMap<u64, BlockHash>,
    next_stamp: u64,
}

impl OffloadTier {
    /// A tier of `capacity` blocks; 0 = no tier.
    pub fn new(capacity: u32) -> Self {
        Self {
            capacity: capacity as usize,
            ..Self::default()
        }
    }

    /// Whether the tier exists (capacity > 0).
    pub fn is_enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Blocks held.
    pub fn len(&self) -> usize {
        self.stamps.len()
    }

    /// Whether no block is held.
    pub fn is_empty(&self) -> bool {
        self.stamps.is_empty()
    }

    /// Whether `hash` is held.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.stamps.contains_key(&hash)
    }

    /// The GPU's events, in order, each followed by what this tier did because of it.
    pub fn follow(&mut self, events: Vec<KvCacheEvent>) -> Vec<KvCacheEvent> {
        if !self.is_enabled() {
            return events;
        }
        let mut out = Vec::with_capacity(events.len() * 2);
        for event in events {
            match &event {
                KvCacheEvent::BlockStored { block_hashes, .. } => {
                    let hashes = block_hashes.clone();
                    out.push(event);
                    self.store(&hashes, &mut out);
                }
                KvCacheEvent::AllBlocksCleared => {
                    self.clear();
                    out.push(event);
                }
                _ => out.push(event),
            }
        }
        out
    }

    /// Stores `hashes`, then evicts past capacity; appends the events that describe it.
    fn store(&mut self, hashes: &[BlockHash], out: &mut Vec<KvCacheEvent>) {
        let mut stored = Vec::new();
        for &hash in hashes {
            let stamp = self.next_stamp;
            self.next_stamp += 1;
            match self.stamps.insert(hash, stamp) {
                Some(old) => {
                    self.order.remove(&old);
                }
                None => stored.push(hash),
            }
            self.order.insert(stamp, hash);
        }
        let mut removed = Vec::new();
        while self.stamps.len() > self.capacity {
            let (_, victim) = self.order.pop_first().expect("order mirrors stamps");
            self.stamps.remove(&victim);
            match stored.iter().position(|&h| h == victim) {
                Some(i) => {
                    stored.remove(i);
                }
                None => removed.push(victim),
            }
        }
        if !stored.is_empty() {
            out.push(KvCacheEvent::OffloadStored {
                block_hashes: stored,
            });
        }
        if !removed.is_empty() {
            out.push(KvCacheEvent::OffloadRemoved {
                block_hashes: removed,
            });
        }
    }

    fn clear(&mut self) {
        self.stamps.clear();
        self.order.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn gpu_stored(hashes: &[BlockHash]) -> KvCacheEvent {
        KvCacheEvent::BlockStored {
            block_hashes: hashes.to_vec(),
            parent_block_hash: None,
            token_ids: vec![0; hashes.len() * 4],
            block_size: 4,
            lora_id: None,
            lora_name: None,
            extra_keys: vec![None; hashes.len()],
        }
    }

    fn gpu_removed(hashes: &[BlockHash]) -> KvCacheEvent {
        KvCacheEvent::BlockRemoved {
            block_hashes: hashes.to_vec(),
        }
    }

    fn cpu_stored(hashes: &[BlockHash]) -> KvCacheEvent {
        KvCacheEvent::OffloadStored {
            block_hashes: hashes.to_vec(),
        }
    }

    fn cpu_removed(hashes: &[BlockHash]) -> KvCacheEvent {
        KvCacheEvent::OffloadRemoved {
            block_hashes: hashes.to_vec(),
        }
    }

    #[test]
    fn each_gpu_store_is_followed_by_its_cpu_store() {
        let mut tier = OffloadTier::new(8);
        let events = tier.follow(vec![gpu_stored(&[1, 2]), gpu_stored(&[3])]);
        assert_eq!(
            events,
            vec![
                gpu_stored(&[1, 2]),
                cpu_stored(&[1, 2]),
                gpu_stored(&[3]),
                cpu_stored(&[3]),
            ]
        );
        assert_eq!(tier.len(), 3);
    }

    #[test]
    fn gpu_evictions_leave_cpu_copies() {
        let mut tier = OffloadTier::new(8);
        tier.follow(vec![gpu_stored(&[1, 2])]);
        let events = tier.follow(vec![gpu_removed(&[1, 2])]);
        assert_eq!(events, vec![gpu_removed(&[1, 2])]);
        assert!(tier.contains(1) && tier.contains(2));
    }

    #[test]
    fn over_capacity_the_least_recently_stored_go_first() {
        let mut tier = OffloadTier::new(3);
        tier.follow(vec![gpu_stored(&[1, 2, 3])]);
        let events = tier.follow(vec![gpu_stored(&[4, 5])]);
        assert_eq!(
            events,
            vec![
                gpu_stored(&[4, 5]),
                cpu_stored(&[4, 5]),
                cpu_removed(&[1, 2])
            ]
        );
        assert!(!tier.contains(1) && !tier.contains(2));
        assert!(tier.contains(3) && tier.contains(4) && tier.contains(5));
        assert_eq!(tier.len(), 3);
    }

    #[test]
    fn storing_again_refreshes_without_reporting() {
        let mut tier = OffloadTier::new(3);
        tier.follow(vec![gpu_stored(&[1, 2, 3])]);
        // 1 was evicted from the GPU and computed again: the CPU copy is the most recent now.
        let events = tier.follow(vec![gpu_stored(&[1])]);
        assert_eq!(events, vec![gpu_stored(&[1])], "nothing new on the CPU");
        let events = tier.follow(vec![gpu_stored(&[4])]);
        assert_eq!(
            events,
            vec![gpu_stored(&[4]), cpu_stored(&[4]), cpu_removed(&[2])],
            "2 is now the least recently stored"
        );
        assert!(tier.contains(1));
    }

    #[test]
    fn a_store_longer_than_the_tier_reports_only_what_stays() {
        let mut tier = OffloadTier::new(2);
        tier.follow(vec![gpu_stored(&[1])]);
        let events = tier.follow(vec![gpu_stored(&[2, 3, 4])]);
        assert_eq!(
            events,
            vec![
                gpu_stored(&[2, 3, 4]),
                cpu_stored(&[3, 4]),
                cpu_removed(&[1])
            ]
        );
        assert_eq!(tier.len(), 2);
    }

    #[test]
    fn a_reset_clears_the_tier_too() {
        let mut tier = OffloadTier::new(4);
        tier.follow(vec![gpu_stored(&[1, 2])]);
        let events = tier.follow(vec![KvCacheEvent::AllBlocksCleared, gpu_stored(&[1])]);
        assert_eq!(
            events,
            vec![
                KvCacheEvent::AllBlocksCleared,
                gpu_stored(&[1]),
                cpu_stored(&[1]),
            ],
            "after a reset, a stored block is reported again"
        );
        assert_eq!(tier.len(), 1);
    }

    #[test]
    fn capacity_zero_is_no_tier() {
        let mut tier = OffloadTier::new(0);
        assert!(!tier.is_enabled());
        let events = vec![
            gpu_stored(&[1, 2]),
            gpu_removed(&[1]),
            KvCacheEvent::AllBlocksCleared,
        ];
        assert_eq!(tier.follow(events.clone()), events);
        assert!(tier.is_empty());
    }

    mod prop {
        use std::collections::HashSet;

        use proptest::prelude::*;

        use super::*;

        #[derive(Debug, Clone)]
        enum Op {
            Store(Vec<BlockHash>),
            Evict(Vec<BlockHash>),
            Clear,
        }

        fn op() -> impl Strategy<Value = Op> {
            prop_oneof![
                6 => proptest::collection::vec(0u64..24, 1..8).prop_map(Op::Store),
                3 => proptest::collection::vec(0u64..24, 1..4).prop_map(Op::Evict),
                1 => Just(Op::Clear),
            ]
        }

        proptest! {
            /// A consumer that keeps a set from the CPU events alone holds what the tier holds,
            /// never sees a hash stored twice or removed unseen, and never exceeds the capacity.
            #[test]
            fn cpu_events_mirror_the_tier(
                capacity in 1u32..10,
                ops in proptest::collection::vec(op(), 1..40),
            ) {
                let mut tier = OffloadTier::new(capacity);
                let mut mirror = HashSet::new();
                for op in ops {
                    let event = match op {
                        Op::Store(hashes) => gpu_stored(&hashes),
                        Op::Evict(hashes) => gpu_removed(&hashes),
                        Op::Clear => KvCacheEvent::AllBlocksCleared,
                    };
                    for ev in tier.follow(vec![event]) {
                        match ev {
                            KvCacheEvent::OffloadStored { block_hashes } => {
                                for h in block_hashes {
                                    prop_assert!(mirror.insert(h), "stored twice");
                                }
                            }
                            KvCacheEvent::OffloadRemoved { block_hashes } => {
                                for h in block_hashes {
                                    prop_assert!(mirror.remove(&h), "removed unseen");
                                }
                            }
                            KvCacheEvent::AllBlocksCleared => mirror.clear(),
                            _ => {}
                        }
                    }
                    prop_assert!(mirror.len() <= capacity as usize);
                    prop_assert_eq!(mirror.len(), tier.len());
                    prop_assert!(mirror.iter().all(|&h| tier.contains(h)));
                }
            }
        }
    }
}
