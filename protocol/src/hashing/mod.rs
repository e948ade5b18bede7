//! Prefix hashing: a request becomes a chain of 64-bit block hashes.
//!
//! `h_0 = H(seed, block_0)`, `h_i = H(h_{i-1}, block_i)`, where H is blake3 in keyed mode (the
//! key carries the previous hash and the block's kind) truncated to its first 8 bytes. Because
//! each hash covers everything before it, "node X holds `h_i`" means X holds the first `i + 1`
//! blocks, and a longest match is found by walking the chain.
//!
//! Using the previous hash as the blake3 key rather than as a prefix of the input keeps a
//! 64-byte block a single blake3 compression, which is what makes a 32 KiB prompt hash in tens
//! of microseconds (see `BENCHMARKS.md#protocol-benches`).
//!
//! The seed folds in the model name (vLLM addresses a LoRA adapter by its name in the `model`
//! field, so an adapter seeds differently from its base model) and `cache_salt`: requests that
//! vLLM would never let share KV blocks never share a chain hash either.
//!
//! Any change to what is hashed is a deliberate, versioned break: the golden vectors in
//! `tests/golden.rs` pin it, and [`HASH_VERSION`] goes into every node's digest.

mod canonical_json;
mod chain;
mod media;
mod pin;
mod request;
mod splice;

pub use chain::{
    ChainBuilder, ChainSeed, MediaSpan, chain_from_media_tokens, chain_from_text,
    chain_from_tokens, extend_with_media_tokens, extend_with_tokens,
};
pub use media::{
    DEFAULT_MEDIA_TOKENS, MediaId, MediaPart, VERIFIED_UUID_PREFIX, content_parts,
    content_parts_mut, data_url_bytes, image_dimensions, media_token_estimate,
};
pub use pin::{MOVED_UUID_PREFIX, PinReport, pin_media_uuids, pin_media_uuids_raw};
pub use request::{
    Endpoint, HashError, RequestHashes, hash_request, hash_request_seeded, hash_tokenized,
    hash_tokenized_seeded,
};

/// The hash of a whole prefix, up to and including one block.
pub type BlockHash = u64;

/// Bumped whenever the bytes fed to the hash change; nodes with different versions never match.
pub const HASH_VERSION: u16 = 2;

/// The longest chain hashed: 65,536 blocks, about a million tokens, past any model's context.
/// Blocks beyond it add nothing to routing, and without a bound a request could claim huge
/// images a few bytes each (a header says the size) and make the entry hash and hold
/// millions of blocks.
pub const MAX_CHAIN_BLOCKS: usize = 1 << 16;

/// Default text block: 64 bytes, about 16 tokens, vLLM's default KV block.
pub const DEFAULT_BLOCK_BYTES: usize = 64;
/// Default token block: vLLM's default KV block size.
pub const DEFAULT_BLOCK_TOKENS: usize = 16;
/// The rough bytes-per-token ratio of English text with common BPE tokenizers; used only to
/// estimate token counts in text mode.
pub const BYTES_PER_TOKEN_ESTIMATE: f32 = 4.0;

/// How a prompt is cut into blocks.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case", tag = "mode")]
pub enum HashMode {
    /// Blocks of `block_bytes` bytes of the canonically rendered prompt. Needs no tokenizer.
    Text { block_bytes: usize },
    /// Blocks of `block_tokens` token ids, aligned with the engine's KV blocks.
    Token { block_tokens: usize },
}

/// Hashing configuration; every node of a cluster must use the same one.
#[derive(Copy, Clone, Debug, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct HashConfig {
    pub mode: HashMode,
    /// Block size used for prompts that arrive as token ids even in text mode (completions
    /// `prompt: [1, 2, 3]`): there is no text to cut, so they are cut into token blocks.
    pub token_prompt_block_tokens: usize,
}

impl Default for HashConfig {
    fn default() -> Self {
        Self {
            mode: HashMode::Text {
                block_bytes: DEFAULT_BLOCK_BYTES,
            },
            token_prompt_block_tokens: DEFAULT_BLOCK_TOKENS,
        }
    }
}

impl HashConfig {
    /// Estimated tokens covered by one block, for converting matched blocks into tokens.
    pub fn tokens_per_block(&self) -> f32 {
        match self.mode {
            HashMode::Text { block_bytes } => block_bytes as f32 / BYTES_PER_TOKEN_ESTIMATE,
            HashMode::Token { block_tokens } => block_tokens as f32,
        }
    }
}
