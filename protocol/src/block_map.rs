//! Maps and sets keyed by hashes: block hashes of the chain, vLLM's block hashes, node keys.
//!
//! Their keys are already uniformly distributed 64-bit hashes, so std's default SipHash buys
//! nothing but cost: the entry node's record of where it sent each chain spent most of its
//! time hashing hashes (4% of an entry sidecar's CPU). foldhash mixes a u64 in a few
//! instructions and, seeded at random per process, still keeps an outsider who can choose
//! prompts from aiming many keys at one bucket.

/// A hash map keyed by hashes.
pub type BlockMap<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// A hash set of hashes.
pub type BlockSet<K> = std::collections::HashSet<K, foldhash::fast::RandomState>;
