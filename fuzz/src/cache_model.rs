//! What the node keeps from an [`ExactCache`]'s changes, checked against the cache itself.
//!
//! The sidecar never reads the cache's sets: it applies each event's reported changes to its
//! summary, added hashes first, then removed ones (`LocalPrefixes::apply_events`). So the
//! changes must tell the whole truth: a hash reported added was not held before, a hash
//! reported removed was, and after every event the set rebuilt from the changes is exactly
//! what the cache holds, tier by tier. A wrong change would make a node advertise a prefix its
//! engine does not hold, or hide one it does, with no error anywhere.

use kvmesh_protocol::kv_events::{ExactCache, KvEvent, Tier, TierChanges};
use std::collections::HashSet;

/// The served model name the targets seed chains with.
pub const MODEL: &str = "meta-llama/Llama-3.1-8B-Instruct";

/// An [`ExactCache`] and the sets its changes describe.
#[derive(Debug)]
pub struct CheckedCache {
    cache: ExactCache,
    gpu: HashSet<u64>,
    offload: HashSet<u64>,
}

impl CheckedCache {
    pub fn new(block_tokens: usize) -> Self {
        Self {
            cache: ExactCache::new(block_tokens),
            gpu: HashSet::new(),
            offload: HashSet::new(),
        }
    }

    /// Applies one event and checks the changes it reported; panics on any disagreement.
    pub fn apply(&mut self, event: &KvEvent) {
        let changes = self.cache.apply(event, MODEL);
        follow(&mut self.gpu, &changes.gpu, "gpu");
        follow(&mut self.offload, &changes.offload, "offload");
        if let Some((_, blocks)) = changes.skipped {
            let stored = match event {
                KvEvent::BlockStored { block_hashes, .. } => block_hashes.len(),
                _ => 0,
            };
            assert!(
                blocks <= stored,
                "{blocks} blocks skipped of a {stored}-block event"
            );
        }
        if matches!(event, KvEvent::AllBlocksCleared) {
            assert!(self.gpu.is_empty() && self.offload.is_empty());
        }
        self.check(&changes.gpu, &changes.offload);
    }

    /// The cache agrees with the followed sets: sizes, and membership of every hash the
    /// event touched and every hash held.
    fn check(&self, gpu: &TierChanges, offload: &TierChanges) {
        for (tier, set, changes) in [
            (Tier::Gpu, &self.gpu, gpu),
            (Tier::Offload, &self.offload, offload),
        ] {
            assert_eq!(self.cache.len(tier), set.len(), "{tier:?} size");
            for hash in changes.added.iter().chain(&changes.removed).chain(set) {
                assert_eq!(
                    self.cache.contains(tier, *hash),
                    set.contains(hash),
                    "{tier:?} membership of {hash:#x}"
                );
            }
        }
    }
}

/// Applies one tier's changes as the node does: added first, then removed.
fn follow(set: &mut HashSet<u64>, changes: &TierChanges, tier: &str) {
    for hash in &changes.added {
        assert!(
            set.insert(*hash),
            "{tier}: {hash:#x} added but already held"
        );
    }
    for hash in &changes.removed {
        assert!(set.remove(hash), "{tier}: {hash:#x} removed but not held");
    }
}
