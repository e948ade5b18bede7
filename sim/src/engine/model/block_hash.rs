//! Chained block hashes of the engine's prefix cache.
//!
//! Like vLLM, a block's hash covers its parent's hash, its token ids and its extra keys, so a
//! hash names the block *and everything before it*. Only full blocks are hashed. The extra keys
//! follow vLLM's order (`generate_block_hash_extra_keys`): the LoRA adapter name (every
//! block), then the identifier of every media item whose placeholders overlap the block, in
//! prompt order (`_gen_mm_extra_hash_keys`), then `cache_salt` (first block only). So the same
//! picture at the same place hits, and a different picture with as many placeholders misses
//! from the first block it overlaps. The same keys, as strings, are the block's
//! `BlockStored.extra_keys` ([`CacheKey::block_extra_keys`]).
//!
//! The hash is blake3 truncated to its first 8 bytes (little endian); the root ("parent of the
//! first block") is derived from the engine seed, so, like vLLM with a random
//! `PYTHONHASHSEED`, two engines started with different seeds report different hashes for the
//! same tokens. Consumers must key on the `token_ids` of KV events, never on these values.

use super::media::MediaItem;

/// A block hash as published in KV events (vLLM's default integer form).
pub type BlockHash = u64;

/// What besides tokens identifies cached KV: the adapter, the media and the cache salt.
#[derive(Debug, Clone, Default, PartialEq, Eq, Hash)]
pub struct CacheKey {
    /// LoRA adapter name; `None` for the base model.
    pub lora: Option<String>,
    /// The request's `cache_salt`; `None` when absent.
    pub cache_salt: Option<String>,
    /// The prompt's media items, in prompt order.
    pub media: Vec<MediaItem>,
}

/// One extra key of a block, by kind (each kind enters the hash under its own tag).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ExtraKey<'a> {
    /// The LoRA adapter's name.
    Lora(&'a str),
    /// A media item's identifier.
    Media(&'a str),
    /// The cache salt.
    Salt(&'a str),
}

impl<'a> ExtraKey<'a> {
    /// The key as it appears in `BlockStored.extra_keys`.
    pub fn as_str(self) -> &'a str {
        match self {
            Self::Lora(s) | Self::Media(s) | Self::Salt(s) => s,
        }
    }

    fn tag(self) -> &'static [u8] {
        match self {
            Self::Lora(_) => b"\x01lora",
            Self::Media(_) => b"\x03mm",
            Self::Salt(_) => b"\x02salt",
        }
    }
}

impl CacheKey {
    /// The extra keys of the block at chain position `index` (`block_size` tokens), in vLLM's
    /// order (see the module docs).
    pub fn block_extra_keys(
        &self,
        index: usize,
        block_size: usize,
    ) -> impl Iterator<Item = ExtraKey<'_>> {
        let (start, end) = (index * block_size, (index + 1) * block_size);
        let media = self
            .media
            .iter()
            .filter(move |m| m.overlaps(start, end))
            .map(|m| ExtraKey::Media(&m.identifier));
        let salt = self.cache_salt.as_deref().filter(|_| index == 0);
        self.lora
            .as_deref()
            .map(ExtraKey::Lora)
            .into_iter()
            .chain(media)
            .chain(salt.map(ExtraKey::Salt))
    }

    /// The block's `BlockStored.extra_keys` entry: `None` when it has no extra key.
    pub fn block_extra_key_strings(&self, index: usize, block_size: usize) -> Option<Vec<String>> {
        let keys: Vec<String> = self
            .block_extra_keys(index, block_size)
            .map(|k| k.as_str().to_owned())
            .collect();
        (!keys.is_empty()).then_some(keys)
    }
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
        for extra in key.block_extra_keys(index, self.block_size) {
            let s = extra.as_str();
            h.update(extra.tag());
            h.update(&(s.len() as u64).to_le_bytes());
            h.update(s.as_bytes());
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
            ..CacheKey::default()
        };
        let salt = CacheKey {
            cache_salt: Some("s".into()),
            ..CacheKey::default()
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

    fn image(identifier: &str, offset: usize, length: usize) -> MediaItem {
        MediaItem {
            modality: super::super::media::Modality::Image,
            identifier: identifier.into(),
            offset,
            length,
        }
    }

    #[test]
    fn media_keys_the_blocks_it_overlaps_in_vllm_order() {
        let key = CacheKey {
            lora: Some("ad".into()),
            cache_salt: Some("s".into()),
            media: vec![image("a", 2, 4), image("b", 5, 6)],
        };
        let keys = |i| key.block_extra_key_strings(i, 4);
        assert_eq!(keys(0), Some(vec!["ad".into(), "a".into(), "s".into()]));
        assert_eq!(keys(1), Some(vec!["ad".into(), "a".into(), "b".into()]));
        assert_eq!(keys(2), Some(vec!["ad".into(), "b".into()]));
        assert_eq!(keys(3), Some(vec!["ad".into()]));
        let plain = CacheKey {
            media: vec![image("a", 4, 4)],
            ..CacheKey::default()
        };
        assert_eq!(plain.block_extra_key_strings(0, 4), None);
        assert_eq!(plain.block_extra_key_strings(1, 4), Some(vec!["a".into()]));
    }

    #[test]
    fn a_different_item_changes_the_chain_from_its_first_block() {
        let tokens: Vec<u32> = (0..16).collect();
        let h = BlockHasher::new(0, 4);
        let with = |id: &str| CacheKey {
            media: vec![image(id, 6, 4)],
            ..CacheKey::default()
        };
        let a = chain(&h, &tokens, &with("a"));
        let b = chain(&h, &tokens, &with("b"));
        assert_eq!(a, chain(&h, &tokens, &with("a")));
        assert_eq!(a[0], b[0], "block 0 does not overlap the item");
        assert!(a[1..].iter().zip(&b[1..]).all(|(x, y)| x != y));
        assert_eq!(
            chain(&h, &tokens, &CacheKey::default())[0],
            a[0],
            "no extra key, same hash as before media existed"
        );
    }
}
