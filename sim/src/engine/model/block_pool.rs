//! The KV block pool: reference counts, the prefix-cache map and the LRU free-block queue.
//!
//! Modelled on vLLM V1's `BlockPool`. Every block is either in use (reference count > 0) or in
//! the free queue. A free block may still hold cached KV (it has a hash): it can be revived by
//! a prefix hit until it is reused. Allocation takes the block at the head of the free queue
//! (least recently freed) and evicts its hash; freed blocks are appended at the tail, so
//! unreferenced cached blocks are evicted in LRU order. The pool records a [`KvCacheEvent`] for
//! every store, eviction and clear, in the order they happen.

use std::collections::HashMap;

use super::block_hash::BlockHash;

/// Index of a block in the pool (the `remote_block_ids` of the PD protocol).
pub type BlockId = u32;

const NIL: u32 = u32::MAX;

/// A change of the cache state, in vLLM's KV-event vocabulary.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KvCacheEvent {
    /// Consecutive blocks of one sequence became cached.
    BlockStored {
        /// Hashes of the stored blocks, in chain order.
        block_hashes: Vec<BlockHash>,
        /// Hash of the block before the first stored one (`None` at the start of a chain).
        parent_block_hash: Option<BlockHash>,
        /// Token ids of all stored blocks, concatenated.
        token_ids: Vec<u32>,
        /// Tokens per block.
        block_size: u32,
        /// Integer id of the LoRA adapter (`None` for the base model).
        lora_id: Option<u32>,
        /// Name of the LoRA adapter (`None` for the base model).
        lora_name: Option<String>,
        /// Per stored block, its extra keys in hash order (LoRA name, media identifiers,
        /// cache salt), `None` for a block with none (see
        /// [`CacheKey::block_extra_keys`](super::block_hash::CacheKey::block_extra_keys)).
        extra_keys: Vec<Option<Vec<String>>>,
    },
    /// Cached blocks were evicted.
    BlockRemoved {
        /// Hashes of the evicted blocks.
        block_hashes: Vec<BlockHash>,
    },
    /// The whole prefix cache was reset (and, with an offload tier, that tier too).
    AllBlocksCleared,
    /// Blocks the GPU stored were copied to the CPU offload tier (never recorded by the pool:
    /// see [`OffloadTier`](super::offload_tier::OffloadTier)). On the wire: a `BlockStored`
    /// with the GPU's block hashes, no parent, no token ids, block size 0 and medium `CPU`.
    OffloadStored {
        /// Hashes of the offloaded blocks (the hashes their GPU store used).
        block_hashes: Vec<BlockHash>,
    },
    /// The CPU offload tier evicted blocks. On the wire: a `BlockRemoved` with medium `CPU`.
    OffloadRemoved {
        /// Hashes of the evicted blocks.
        block_hashes: Vec<BlockHash>,
    },
}

#[derive(Debug, Clone)]
struct Block {
    ref_cnt: u32,
    hash: Option<BlockHash>,
    prev: u32,
    next: u32,
    in_free_queue: bool,
}

/// The pool of KV blocks of one engine.
#[derive(Debug)]
pub struct BlockPool {
    blocks: Vec<Block>,
    head: u32,
    tail: u32,
    num_free: u32,
    cached: HashMap<BlockHash, BlockId>,
    events: Vec<KvCacheEvent>,
}

impl BlockPool {
    /// A pool of `num_blocks` empty blocks, all free.
    pub fn new(num_blocks: u32) -> Self {
        let mut pool = Self {
            blocks: Vec::with_capacity(num_blocks as usize),
            head: NIL,
            tail: NIL,
            num_free: 0,
            cached: HashMap::new(),
            events: Vec::new(),
        };
        for i in 0..num_blocks {
            pool.blocks.push(Block {
                ref_cnt: 0,
                hash: None,
                prev: NIL,
                next: NIL,
                in_free_queue: false,
            });
            pool.push_tail(i);
        }
        pool
    }

    /// Total number of blocks.
    pub fn num_blocks(&self) -> u32 {
        self.blocks.len() as u32
    }

    /// Blocks not referenced by any request (cached or empty).
    pub fn num_free(&self) -> u32 {
        self.num_free
    }

    /// Blocks holding cached KV that a prefix hit could use.
    pub fn num_cached(&self) -> usize {
        self.cached.len()
    }

    /// Fraction of blocks referenced by requests (vLLM's `kv_cache_usage_perc`).
    pub fn usage(&self) -> f64 {
        if self.blocks.is_empty() {
            return 0.0;
        }
        1.0 - f64::from(self.num_free) / self.blocks.len() as f64
    }

    /// The block caching `hash`, if any.
    pub fn lookup(&self, hash: BlockHash) -> Option<BlockId> {
        self.cached.get(&hash).copied()
    }

    /// Whether `block` is in the free queue (no request holds it).
    pub fn is_free(&self, block: BlockId) -> bool {
        self.blocks[block as usize].in_free_queue
    }

    /// Whether `hash` is cached.
    pub fn contains(&self, hash: BlockHash) -> bool {
        self.cached.contains_key(&hash)
    }

    /// Takes a reference on a cached block found by [`lookup`](Self::lookup), reviving it
    /// from the free queue if nobody held it.
    pub fn touch(&mut self, block: BlockId) {
        if self.blocks[block as usize].ref_cnt == 0 {
            self.unlink(block);
        }
        self.blocks[block as usize].ref_cnt += 1;
    }

    /// Allocates one block from the head of the free queue, evicting its cached hash.
    pub fn allocate(&mut self) -> Option<BlockId> {
        let id = self.head;
        if id == NIL {
            return None;
        }
        self.unlink(id);
        let block = &mut self.blocks[id as usize];
        block.ref_cnt = 1;
        if let Some(hash) = block.hash.take() {
            self.cached.remove(&hash);
            self.events.push(KvCacheEvent::BlockRemoved {
                block_hashes: vec![hash],
            });
        }
        Some(id)
    }

    /// Releases one reference on each block; blocks nobody holds go to the free-queue tail in
    /// the given order (so pass a sequence's blocks tail first: its last blocks get evicted
    /// first, as in vLLM).
    pub fn free(&mut self, blocks: impl IntoIterator<Item = BlockId>) {
        for id in blocks {
            let block = &mut self.blocks[id as usize];
            debug_assert!(block.ref_cnt > 0, "double free of block {id}");
            block.ref_cnt -= 1;
            if block.ref_cnt == 0 {
                self.push_tail(id);
            }
        }
    }

    /// Marks the just-filled `block` as caching `hash`. Returns `false` (and changes nothing)
    /// when another block already caches the same hash: that duplicate stays uncached and is
    /// simply reused when freed, so every hash names at most one block and the events describe
    /// a set.
    pub fn cache_block(&mut self, block: BlockId, hash: BlockHash) -> bool {
        if self.cached.contains_key(&hash) {
            return false;
        }
        debug_assert!(self.blocks[block as usize].hash.is_none());
        self.blocks[block as usize].hash = Some(hash);
        self.cached.insert(hash, block);
        true
    }

    /// Records an event (used by the scheduler for `BlockStored`, which it batches).
    pub fn record(&mut self, event: KvCacheEvent) {
        self.events.push(event);
    }

    /// Drops every cached hash if no block is in use (vLLM's `reset_prefix_cache`).
    pub fn reset_prefix_cache(&mut self) -> bool {
        if self.num_free != self.num_blocks() {
            return false;
        }
        for b in &mut self.blocks {
            b.hash = None;
        }
        self.cached.clear();
        self.events.push(KvCacheEvent::AllBlocksCleared);
        true
    }

    /// Takes the events recorded since the last call.
    pub fn take_events(&mut self) -> Vec<KvCacheEvent> {
        std::mem::take(&mut self.events)
    }

    /// Whether events are waiting to be taken.
    pub fn has_events(&self) -> bool {
        !self.events.is_empty()
    }

    /// The hashes of all cached blocks (for tests and the cluster simulator).
    pub fn cached_hashes(&self) -> impl Iterator<Item = BlockHash> + '_ {
        self.cached.keys().copied()
    }

    fn push_tail(&mut self, id: BlockId) {
        let tail = self.tail;
        let b = &mut self.blocks[id as usize];
        debug_assert!(!b.in_free_queue);
        b.prev = tail;
        b.next = NIL;
        b.in_free_queue = true;
        if tail == NIL {
            self.head = id;
        } else {
            self.blocks[tail as usize].next = id;
        }
        self.tail = id;
        self.num_free += 1;
    }

    fn unlink(&mut self, id: BlockId) {
        let (prev, next) = {
            let b = &mut self.blocks[id as usize];
            debug_assert!(b.in_free_queue);
            b.in_free_queue = false;
            (
                std::mem::replace(&mut b.prev, NIL),
                std::mem::replace(&mut b.next, NIL),
            )
        };
        if prev == NIL {
            self.head = next;
        } else {
            self.blocks[prev as usize].next = next;
        }
        if next == NIL {
            self.tail = prev;
        } else {
            self.blocks[next as usize].prev = prev;
        }
        self.num_free -= 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allocation_is_lru_and_evicts_cached_hashes() {
        let mut pool = BlockPool::new(3);
        let a = pool.allocate().unwrap();
        let b = pool.allocate().unwrap();
        assert!(pool.cache_block(a, 10));
        assert!(pool.cache_block(b, 11));
        assert!(!pool.cache_block(b, 10), "a hash names at most one block");
        pool.free([b, a]); // b freed first: b is older in the free queue
        assert_eq!(pool.num_free(), 3);
        assert_eq!(pool.usage(), 0.0);
        // The never-used third block is at the head, then b, then a.
        let c = pool.allocate().unwrap();
        assert!(c != a && c != b);
        assert!(pool.take_events().is_empty());
        assert_eq!(pool.allocate(), Some(b));
        assert_eq!(
            pool.take_events(),
            vec![KvCacheEvent::BlockRemoved {
                block_hashes: vec![11]
            }]
        );
        assert_eq!(pool.lookup(10), Some(a));
        assert_eq!(pool.lookup(11), None);
        assert_eq!(pool.allocate(), Some(a));
        assert_eq!(pool.allocate(), None);
        assert!((pool.usage() - 1.0).abs() < 1e-12);
    }

    #[test]
    fn touch_revives_a_free_cached_block() {
        let mut pool = BlockPool::new(2);
        let a = pool.allocate().unwrap();
        pool.cache_block(a, 5);
        pool.free([a]);
        let hit = pool.lookup(5).unwrap();
        pool.touch(hit);
        assert_eq!(pool.num_free(), 1);
        let other = pool.allocate().unwrap();
        assert_ne!(other, a);
        assert_eq!(pool.allocate(), None, "the touched block is not evictable");
        assert!(pool.contains(5));
        pool.free([a, other]);
        assert!(pool.reset_prefix_cache());
        assert!(!pool.contains(5));
        assert_eq!(pool.take_events(), vec![KvCacheEvent::AllBlocksCleared]);
    }
}
