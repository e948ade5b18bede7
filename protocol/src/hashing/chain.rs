//! The chained block hash itself.

use super::media::MediaId;
use super::{BlockHash, MAX_CHAIN_BLOCKS};

/// What a block holds; part of the key so a text block can never collide with a media block
/// or a token block of the same bytes.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
#[repr(u8)]
enum BlockKind {
    Text = 1,
    Media = 2,
    Tokens = 3,
    /// A token block that overlaps media placeholders: its ids and the items' identities.
    MediaTokens = 4,
}

/// Domain-separation tag mixed into every key.
const KEY_TAG: &[u8; 7] = b"kvmesh1";

/// The starting point of a chain: folds in everything that makes KV blocks unshareable.
#[derive(Copy, Clone, Debug, PartialEq, Eq, Hash)]
pub struct ChainSeed(pub u64);

impl ChainSeed {
    /// `model` is the `model` field of the request: a served model name or a LoRA adapter name.
    pub fn new(model: &str, cache_salt: Option<&str>) -> Self {
        let mut hasher = blake3::Hasher::new_derive_key("kvmesh chain seed v1");
        hasher.update(&(model.len() as u64).to_le_bytes());
        hasher.update(model.as_bytes());
        match cache_salt {
            Some(salt) => {
                hasher.update(&[1]);
                hasher.update(&(salt.len() as u64).to_le_bytes());
                hasher.update(salt.as_bytes());
            }
            None => {
                hasher.update(&[0]);
            }
        }
        Self(truncate(hasher.finalize().as_bytes()))
    }
}

fn truncate(digest: &[u8; 32]) -> u64 {
    let mut first = [0u8; 8];
    first.copy_from_slice(&digest[..8]);
    u64::from_le_bytes(first)
}

/// `H(prev, block)`: blake3 keyed by the previous hash and the block's kind.
fn link(prev: u64, kind: BlockKind, block: &[u8]) -> BlockHash {
    let mut key = [0u8; 32];
    key[..8].copy_from_slice(&prev.to_le_bytes());
    key[8] = kind as u8;
    key[9..16].copy_from_slice(KEY_TAG);
    truncate(blake3::keyed_hash(&key, block).as_bytes())
}

/// Builds a chain incrementally from text, media and token pieces, in order.
///
/// Text accumulates into blocks of `block_bytes`. A media item first closes the text block in
/// progress (so its blocks sit at the same position whatever text length preceded it), then
/// adds as many blocks as its tokens fill, each keyed by the item's identity and its offset
/// within the item: an image worth a thousand tokens weighs in a match as a thousand tokens
/// of text would. A trailing partial text block is dropped: only whole blocks count, as in
/// vLLM's prefix cache. The chain stops at [`MAX_CHAIN_BLOCKS`].
#[derive(Debug)]
pub struct ChainBuilder {
    prev: u64,
    block_bytes: usize,
    pending: Vec<u8>,
    chain: Vec<BlockHash>,
    total_bytes: usize,
    media_tokens: u64,
}

impl ChainBuilder {
    /// `block_bytes` must be non-zero.
    pub fn new(seed: ChainSeed, block_bytes: usize) -> Self {
        assert!(block_bytes > 0, "block size must be positive");
        Self {
            prev: seed.0,
            block_bytes,
            pending: Vec::with_capacity(block_bytes),
            chain: Vec::new(),
            total_bytes: 0,
            media_tokens: 0,
        }
    }

    /// Appends text bytes.
    pub fn push_text(&mut self, mut bytes: &[u8]) {
        self.total_bytes += bytes.len();
        if !self.pending.is_empty() {
            let take = (self.block_bytes - self.pending.len()).min(bytes.len());
            self.pending.extend_from_slice(&bytes[..take]);
            bytes = &bytes[take..];
            if self.pending.len() == self.block_bytes {
                self.emit_pending();
            }
        }
        let whole = bytes.len() - bytes.len() % self.block_bytes;
        let room = MAX_CHAIN_BLOCKS.saturating_sub(self.chain.len());
        self.chain.reserve((whole / self.block_bytes).min(room));
        for block in bytes[..whole].chunks_exact(self.block_bytes).take(room) {
            self.prev = link(self.prev, BlockKind::Text, block);
            self.chain.push(self.prev);
        }
        self.pending.extend_from_slice(&bytes[whole..]);
    }

    /// Appends a media item of about `tokens` prompt tokens: one block per
    /// [`Self::tokens_per_block`] of them (at least one).
    pub fn push_media(&mut self, id: &MediaId, tokens: u32) {
        if !self.pending.is_empty() {
            self.emit_pending();
        }
        self.media_tokens += u64::from(tokens);
        let blocks = (tokens as usize).div_ceil(self.tokens_per_block()).max(1);
        let blocks = blocks.min(MAX_CHAIN_BLOCKS.saturating_sub(self.chain.len()));
        let mut block = [0u8; 36];
        block[..32].copy_from_slice(&id.0);
        self.chain.reserve(blocks);
        for offset in 0..blocks as u32 {
            block[32..].copy_from_slice(&offset.to_le_bytes());
            self.prev = link(self.prev, BlockKind::Media, &block);
            self.chain.push(self.prev);
        }
    }

    /// Prompt tokens a text block stands for (at the usual 4 bytes per token).
    pub fn tokens_per_block(&self) -> usize {
        (self.block_bytes as f32 / super::BYTES_PER_TOKEN_ESTIMATE)
            .ceil()
            .max(1.0) as usize
    }

    fn emit_pending(&mut self) {
        if self.chain.len() < MAX_CHAIN_BLOCKS {
            self.prev = link(self.prev, BlockKind::Text, &self.pending);
            self.chain.push(self.prev);
        }
        self.pending.clear();
    }

    /// Text bytes pushed so far, whether or not they completed a block.
    pub fn total_bytes(&self) -> usize {
        self.total_bytes
    }

    /// Tokens of the media items pushed so far.
    pub fn media_tokens(&self) -> u64 {
        self.media_tokens
    }

    /// The chain of whole blocks; a trailing partial text block is dropped.
    pub fn finish(self) -> Vec<BlockHash> {
        self.chain
    }
}

/// The chain of a plain text prompt.
pub fn chain_from_text(seed: ChainSeed, text: &[u8], block_bytes: usize) -> Vec<BlockHash> {
    let mut builder = ChainBuilder::new(seed, block_bytes);
    builder.push_text(text);
    builder.finish()
}

/// The chain of a tokenized prompt: blocks of `block_tokens` ids (little-endian u32 each);
/// a trailing partial block is dropped. `block_tokens` must be non-zero.
pub fn chain_from_tokens(seed: ChainSeed, tokens: &[u32], block_tokens: usize) -> Vec<BlockHash> {
    assert!(block_tokens > 0, "block size must be positive");
    let mut prev = seed.0;
    let mut bytes = Vec::with_capacity(block_tokens * 4);
    tokens
        .chunks_exact(block_tokens)
        .take(MAX_CHAIN_BLOCKS)
        .map(|block| {
            bytes.clear();
            for token in block {
                bytes.extend_from_slice(&token.to_le_bytes());
            }
            prev = link(prev, BlockKind::Tokens, &bytes);
            prev
        })
        .collect()
}

/// Extends a chain by one token block: what exact mode uses to follow vLLM's `BlockStored`
/// events, which name a parent and carry the new block's token ids.
pub fn extend_with_tokens(parent: u64, tokens: &[u32]) -> BlockHash {
    extend_with_media_tokens(parent, tokens, &[])
}

/// Extends a chain by one token block that overlaps the placeholders of `media` (in prompt
/// order), as vLLM keys such a block by the items' identifiers besides its ids. With no
/// media it is [`extend_with_tokens`].
pub fn extend_with_media_tokens(parent: u64, tokens: &[u32], media: &[MediaId]) -> BlockHash {
    let mut bytes = Vec::with_capacity(tokens.len() * 4 + media.len() * 32);
    for token in tokens {
        bytes.extend_from_slice(&token.to_le_bytes());
    }
    if media.is_empty() {
        return link(parent, BlockKind::Tokens, &bytes);
    }
    for id in media {
        bytes.extend_from_slice(&id.0);
    }
    link(parent, BlockKind::MediaTokens, &bytes)
}

/// Where a media item's placeholder tokens sit in a tokenized prompt.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct MediaSpan {
    pub offset: usize,
    pub length: usize,
    pub id: MediaId,
}

/// [`chain_from_tokens`] for a prompt with media placeholders: a block overlapping any of
/// `spans` (sorted by offset, not overlapping) is keyed by those items' identities, exactly
/// where vLLM's `_gen_mm_extra_hash_keys` puts them, so the chain equals the one exact mode
/// builds from the engine's events for the same prompt.
pub fn chain_from_media_tokens(
    seed: ChainSeed,
    tokens: &[u32],
    block_tokens: usize,
    spans: &[MediaSpan],
) -> Vec<BlockHash> {
    assert!(block_tokens > 0, "block size must be positive");
    let mut prev = seed.0;
    let mut media = Vec::new();
    tokens
        .chunks_exact(block_tokens)
        .take(MAX_CHAIN_BLOCKS)
        .enumerate()
        .map(|(index, block)| {
            let (start, end) = (index * block_tokens, (index + 1) * block_tokens);
            media.clear();
            media.extend(
                spans
                    .iter()
                    .filter(|s| s.offset < end && start < s.offset + s.length)
                    .map(|s| s.id),
            );
            prev = extend_with_media_tokens(prev, block, &media);
            prev
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_pieces_give_the_same_chain_as_one_piece() {
        let seed = ChainSeed::new("m", None);
        let text: Vec<u8> = (0..1000u32).map(|i| (i % 251) as u8).collect();
        let whole = chain_from_text(seed, &text, 64);
        let mut builder = ChainBuilder::new(seed, 64);
        for piece in text.chunks(7) {
            builder.push_text(piece);
        }
        assert_eq!(builder.finish(), whole);
        assert_eq!(whole.len(), 1000 / 64);
    }

    #[test]
    fn seed_separates_models_and_salts() {
        let text = [b'x'; 128];
        let a = chain_from_text(ChainSeed::new("a", None), &text, 64);
        let b = chain_from_text(ChainSeed::new("b", None), &text, 64);
        let salted = chain_from_text(ChainSeed::new("a", Some("s")), &text, 64);
        let empty_salt = chain_from_text(ChainSeed::new("a", Some("")), &text, 64);
        assert_ne!(a[0], b[0]);
        assert_ne!(a[0], salted[0]);
        assert_ne!(a[0], empty_salt[0], "an empty salt is still a salt");
    }

    #[test]
    fn media_closes_the_text_block_in_progress() {
        let seed = ChainSeed::new("m", None);
        let mut builder = ChainBuilder::new(seed, 64);
        builder.push_text(b"describe:");
        builder.push_media(&MediaId([7; 32]), 40);
        assert_eq!(builder.media_tokens(), 40);
        let chain = builder.finish();
        assert_eq!(
            chain.len(),
            4,
            "partial text block, then 40 tokens' worth of media blocks"
        );
    }

    #[test]
    fn chains_stop_at_their_bound_whatever_the_media_claim() {
        let seed = ChainSeed::new("m", None);
        let mut builder = ChainBuilder::new(seed, 64);
        for i in 0..200u8 {
            builder.push_text(b"a caption");
            builder.push_media(&MediaId([i; 32]), 16_384);
        }
        let chain = builder.finish();
        assert_eq!(chain.len(), MAX_CHAIN_BLOCKS);
        let text = vec![b'x'; 64 * (MAX_CHAIN_BLOCKS + 10)];
        assert_eq!(chain_from_text(seed, &text, 64).len(), MAX_CHAIN_BLOCKS);
        let tokens = vec![1u32; 16 * (MAX_CHAIN_BLOCKS + 10)];
        assert_eq!(chain_from_tokens(seed, &tokens, 16).len(), MAX_CHAIN_BLOCKS);
        assert_eq!(
            chain_from_media_tokens(seed, &tokens, 16, &[]).len(),
            MAX_CHAIN_BLOCKS
        );
    }

    #[test]
    fn media_token_blocks_are_keyed_by_the_items_they_overlap() {
        let seed = ChainSeed::new("m", None);
        let tokens: Vec<u32> = (0..64).collect();
        let plain = chain_from_tokens(seed, &tokens, 16);
        let span = |offset, id| MediaSpan {
            offset,
            length: 20,
            id: MediaId([id; 32]),
        };
        // Tokens 18..38 overlap blocks 1 and 2; blocks 0 and 3 are plain token blocks.
        let a = chain_from_media_tokens(seed, &tokens, 16, &[span(18, 1)]);
        assert_eq!(a[0], plain[0]);
        assert_ne!(a[1], plain[1]);
        assert_eq!(
            a[1],
            extend_with_media_tokens(a[0], &tokens[16..32], &[MediaId([1; 32])])
        );
        assert_eq!(a[3], extend_with_tokens(a[2], &tokens[48..64]));
        let b = chain_from_media_tokens(seed, &tokens, 16, &[span(18, 2)]);
        assert_eq!(a[0], b[0]);
        assert!(a[1..].iter().zip(&b[1..]).all(|(x, y)| x != y));
        // An item ending exactly where a block starts does not key that block.
        let edge = chain_from_media_tokens(seed, &tokens, 16, &[span(12, 1)]);
        assert_eq!(edge[2], extend_with_tokens(edge[1], &tokens[32..48]));
    }

    #[test]
    fn token_chain_extends_block_by_block() {
        let seed = ChainSeed::new("m", None);
        let tokens: Vec<u32> = (0..40).collect();
        let chain = chain_from_tokens(seed, &tokens, 16);
        assert_eq!(chain.len(), 2);
        assert_eq!(extend_with_tokens(seed.0, &tokens[..16]), chain[0]);
        assert_eq!(extend_with_tokens(chain[0], &tokens[16..32]), chain[1]);
    }
}
