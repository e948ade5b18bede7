//! Chained block hashes of the engine's prefix cache.
//!
//! Like vLLM, a block's hash covers its parent's hash, its token ids and its extra keys, so a
//! hash names the block *and everything before it*. Only full blocks are hashed. The extra keys
//! follow vLLM's order: the LoRA adapter name (every block), then `cache_salt` (first block
//! only). The hash is blake3 truncated to its first 8 bytes (little endian); the root
//! ("parent of the first block") is derived from the engine seed, so, like vLLM with a random
//! `PYTHONHASHSEED`, two engines started with different seeds report different hashes for the
//! same tokens. Consumers must key on the `token_ids` of KV events, never on these values.

/// A block hash as published in KV events (vLLM's default integer form).
pub type BlockHash = u64;

/// What besides tokens identifies cached KV: the adapter and the cache salt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// LoRA adapter name; `None` for the base model.
    pub lora: Option<String>,
    /// The request's `cache_salt`; `None` when absent.
    pub cache_salt: Option<String>,
}

/// Hashes token blocks in a chain rooted at a per-engine seed.
#[derive(Debug, Clone)]
pub struct BlockHasher {
    root: BlockHash,
    block_size: usize,
}

impl BlockHasher {
    /// A hasher for `block_size`-token blocks whose root hash derives from `seed`.
    pub fn new(seed: u64, block_size: usize) -> Self {
        let mut h = blake3::Hasher::new();
        h.update(b"kvmesh-sim/none-hash");
        h.update(&seed.to_le_bytes());
        Self {
            root: truncate(h.finalize()),
            block_size,
        }
    }

    /// Tokens per block.
    pub fn block_size(&self) -> usize {
        self.block_size
    }

    /// Hash of the full block `tokens` whose position in the chain is `index` and whose
    /// parent hash is `parent` (`None` for the first block).
    pub fn hash_block(
        &self,
        parent: Option<BlockHash>,
        index: usize,
        tokens: &[u32],
        key: &CacheKey,
    ) -> BlockHash {
        debug_assert_eq!(tokens.len(), self.block_size);
        let mut h = blake3::Hasher::new();
        h.update(&parent.unwrap_or(self.root).to_le_bytes());
        let mut buf = [0u8; 4 * 64];
        for chunk in tokens.chunks(64) {
            for (i, t) in chunk.iter().enumerate() {
                buf[4 * i..4 * i + 4].copy_from_slice(&t.to_le_bytes());
            }
            h.update(&buf[..4 * chunk.len()]);
        }
        if let Some(lora) = &key.lora {
            h.update(b"\x01lora");
            h.update(&(lora.len() as u64).to_le_bytes());
            h.update(lora.as_bytes());
        }
        if index == 0
            && let Some(salt) = &key.cache_salt
        {
            h.update(b"\x02salt");
            h.update(&(salt.len() as u64).to_le_bytes());
            h.update(salt.as_bytes());
        }
        truncate(h.finalize())
    }

    /// Appends to `hashes` the hashes of the full blocks of `tokens` not hashed yet.
    pub fn extend_chain(&self, hashes: &mut Vec<BlockHash>, tokens: &[u32], key: &CacheKey) {
        let full = tokens.len() / self.block_size;
        for i in hashes.len()..full {
            let parent = if i == 0 { None } else { Some(hashes[i - 1]) };
            let block = &tokens[i * self.block_size..(i + 1) * self.block_size];
            hashes.push(self.hash_block(parent, i, block, key));
        }
    }
}

fn truncate(hash: blake3::Hash) -> BlockHash {
    let b = hash.as_bytes();
    u64::from_le_bytes([b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7]])
}

#[cfg(test)]
mod tests {
    use super::*;

    fn chain(h: &BlockHasher, tokens: &[u32], key: &CacheKey) -> Vec<BlockHash> {
        let mut v = Vec::new();
        h.extend_chain(&mut v, tokens, key);
        v
    }

    #[test]
    fn chain_covers_only_full_blocks_and_shares_prefixes() {
        let h = BlockHasher::new(0, 4);
        let a: Vec<u32> = (0..10).collect();
        let mut b = a.clone();
        b[9] = 99; // differs in the partial third block only
        b.push(7);
        let ca = chain(&h, &a, &CacheKey::default());
        assert_eq!(ca.len(), 2);
        assert_eq!(ca, chain(&h, &b, &CacheKey::default()));
        let mut c = a.clone();
        c[1] = 42; // first block differs: every hash differs
        let cc = chain(&h, &c, &CacheKey::default());
        assert_ne!(ca[0], cc[0]);
        assert_ne!(ca[1], cc[1]);
    }

    #[test]
    fn lora_salt_and_seed_change_the_chain() {
        let tokens: Vec<u32> = (0..8).collect();
        let h = BlockHasher::new(0, 4);
        let base = chain(&h, &tokens, &CacheKey::default());
        let lora = CacheKey {
            lora: Some("a".into()),
            cache_salt: None,
        };
        let salt = CacheKey {
            lora: None,
            cache_salt: Some("s".into()),
        };
        assert_ne!(base, chain(&h, &tokens, &lora));
        let salted = chain(&h, &tokens, &salt);
        assert_ne!(base[0], salted[0]);
        assert_ne!(
            base[1], salted[1],
            "the salt reaches later blocks through the parent"
        );
        assert_ne!(
            base,
            chain(&BlockHasher::new(1, 4), &tokens, &CacheKey::default())
        );
    }
}
