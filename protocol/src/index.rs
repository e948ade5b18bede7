//! A node's approximate index of its own engine's prefix cache.
//!
//! Without KV events, a node cannot see its engine's cache, but it knows every prompt it sent
//! there: the engine cached those blocks when it computed them, and evicts least recently used
//! blocks when it runs out. The index mirrors that: inserting a request's chain touches its
//! blocks, and past `capacity` the least recently used are evicted. Within one chain the first
//! block is the most recently used, like vLLM, which frees a finished request's blocks tail
//! first so that a shared prefix outlives the suffixes that hang off it.

use crate::block_map::BlockMap;
use std::collections::BTreeMap;

/// What an operation changed, for the summary that advertises the index.
#[derive(Debug, Default, PartialEq, Eq)]
pub struct IndexChanges {
    pub added: Vec<u64>,
    pub evicted: Vec<u64>,
}

/// LRU set of chain hashes with a capacity in blocks.
#[derive(Debug)]
pub struct PrefixIndex {
    capacity: usize,
    stamp_of: BlockMap<u64, u64>,
    by_stamp: BTreeMap<u64, u64>,
    clock: u64,
}

impl PrefixIndex {
    pub fn new(capacity: usize) -> Self {
        Self {
            capacity,
            stamp_of: BlockMap::default(),
            by_stamp: BTreeMap::new(),
            clock: 0,
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity
    }

    pub fn len(&self) -> usize {
        self.stamp_of.len()
    }

    pub fn is_empty(&self) -> bool {
        self.stamp_of.is_empty()
    }

    pub fn contains(&self, hash: u64) -> bool {
        self.stamp_of.contains_key(&hash)
    }

    /// Records that the engine computed (or reused) every block of `chain`.
    pub fn insert_chain(&mut self, chain: &[u64]) -> IndexChanges {
        let mut changes = IndexChanges::default();
        // Tail first, so the chain's first block ends up the most recent.
        for &hash in chain.iter().rev() {
            self.clock += 1;
            match self.stamp_of.insert(hash, self.clock) {
                Some(old) => {
                    self.by_stamp.remove(&old);
                }
                None => changes.added.push(hash),
            }
            self.by_stamp.insert(self.clock, hash);
        }
        self.evict_to(self.capacity, &mut changes);
        changes
    }

    /// Forgets one block (exact mode: the engine said it evicted it).
    pub fn remove(&mut self, hash: u64) -> bool {
        match self.stamp_of.remove(&hash) {
            Some(stamp) => {
                self.by_stamp.remove(&stamp);
                true
            }
            None => false,
        }
    }

    /// Empties the index (the engine cleared its cache, or restarted).
    pub fn clear(&mut self) -> Vec<u64> {
        self.by_stamp.clear();
        self.stamp_of.drain().map(|(hash, _)| hash).collect()
    }

    /// Changes the capacity (the engine reported its real size), evicting if it shrank.
    pub fn set_capacity(&mut self, capacity: usize) -> IndexChanges {
        self.capacity = capacity;
        let mut changes = IndexChanges::default();
        self.evict_to(capacity, &mut changes);
        changes
    }

    fn evict_to(&mut self, capacity: usize, changes: &mut IndexChanges) {
        while self.stamp_of.len() > capacity {
            let Some((_, hash)) = self.by_stamp.pop_first() else {
                break;
            };
            self.stamp_of.remove(&hash);
            match changes.added.iter().position(|&h| h == hash) {
                // Added and evicted by the same operation: it never was advertised.
                Some(i) => {
                    changes.added.swap_remove(i);
                }
                None => changes.evicted.push(hash),
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recent_and_suffixes_before_prefixes() {
        let mut index = PrefixIndex::new(5);
        let first = index.insert_chain(&[1, 2, 3]);
        assert_eq!(first.added, vec![3, 2, 1]);
        // A second request shares block 1 and adds 4, 5, 6: capacity 5 forces one eviction,
        // and the oldest block is the first chain's tail (3).
        let second = index.insert_chain(&[1, 4, 5, 6]);
        assert_eq!(second.evicted, vec![3]);
        assert!(index.contains(1) && index.contains(2) && !index.contains(3));
        assert_eq!(index.len(), 5);
    }

    #[test]
    fn a_chain_longer_than_capacity_keeps_its_prefix() {
        let mut index = PrefixIndex::new(3);
        let changes = index.insert_chain(&[10, 11, 12, 13, 14]);
        assert!(index.contains(10) && index.contains(11) && index.contains(12));
        assert_eq!(changes.added.len(), 3);
        assert!(
            changes.evicted.is_empty(),
            "never-advertised blocks are not reported evicted"
        );
    }

    #[test]
    fn shrinking_capacity_and_removal() {
        let mut index = PrefixIndex::new(10);
        index.insert_chain(&[1, 2, 3, 4]);
        assert!(index.remove(4));
        assert!(!index.remove(4));
        let changes = index.set_capacity(1);
        assert_eq!(changes.evicted, vec![3, 2]);
        assert_eq!(index.clear(), vec![1]);
        assert!(index.is_empty());
    }
}
