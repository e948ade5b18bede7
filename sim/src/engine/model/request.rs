//! What goes into the engine model and what comes out of it.

use super::block_pool::BlockId;
use super::config::EngineConfig;
use super::media::MediaItem;
use super::stats::FinishReason;

/// Caller-chosen identifier of a request, unique among the requests the engine holds.
pub type RequestId = u64;

/// A LoRA adapter a request runs with.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraRef {
    /// vLLM's integer adapter id (1-based, in the order adapters were configured).
    pub id: u32,
    /// The adapter name.
    pub name: String,
}

/// The disaggregation role of a request (vLLM's NixlConnector protocol).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum KvTransfer {
    /// An ordinary request.
    #[default]
    None,
    /// Prefill leg: compute the prompt, answer one token and hand out the blocks.
    RemoteDecode,
    /// Decode leg: pull the prompt's KV from a prefill engine instead of computing it.
    RemotePrefill {
        /// Number of blocks the prefill engine offered (informational).
        remote_blocks: usize,
    },
}

/// A decode leg's request to pull its prompt's KV, handed to the driver: the engine has
/// allocated the blocks and waits (`WAITING_FOR_REMOTE_KVS`) until the driver calls
/// [`Engine::finish_pull`](super::Engine::finish_pull). The driver pulls the remote blocks
/// `first_block .. first_block + num_blocks` of the prompt (the earlier ones hit the local
/// prefix cache). A driver in virtual time can finish it after
/// [`TimingModel::transfer_duration`](super::TimingModel::transfer_duration).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullRequest {
    /// The decode leg.
    pub request: RequestId,
    /// Index of the first prompt block to pull (= blocks hit in the local prefix cache).
    pub first_block: usize,
    /// Number of blocks to pull (at least 1: the last prompt token is never a local hit).
    pub num_blocks: usize,
}

/// How a pull ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PullOutcome {
    /// The blocks arrived: they join the prefix cache and the request decodes.
    Loaded,
    /// The pull failed (prefill engine gone, lease expired, handshake refused): the engine's
    /// [`KvLoadFailurePolicy`](super::KvLoadFailurePolicy) decides.
    Failed,
}

/// A request submitted to the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EngineRequest {
    /// Unique id (the caller's).
    pub id: RequestId,
    /// Prompt token ids (non-empty).
    pub prompt: Vec<u32>,
    /// Upper bound on generated tokens (at least 1).
    pub max_tokens: u32,
    /// The model does not stop on its own before this many tokens.
    pub min_tokens: u32,
    /// Never stop on the model's own end of sequence; only `max_tokens` ends the request.
    pub ignore_eos: bool,
    /// The LoRA adapter, if any.
    pub lora: Option<LoraRef>,
    /// vLLM's `cache_salt`: isolates this request's prefix cache entries.
    pub cache_salt: Option<String>,
    /// Disaggregation role of this request.
    pub kv_transfer: KvTransfer,
    /// Media items of the prompt, in prompt order, each over its run of placeholder tokens in
    /// `prompt`: they key the blocks they overlap and cost encoder time when not cached.
    pub media: Vec<MediaItem>,
}

impl EngineRequest {
    /// An ordinary request with defaults for everything but the prompt and output bound.
    pub fn new(id: RequestId, prompt: Vec<u32>, max_tokens: u32) -> Self {
        Self {
            id,
            prompt,
            max_tokens,
            min_tokens: 0,
            ignore_eos: false,
            lora: None,
            cache_salt: None,
            kv_transfer: KvTransfer::None,
            media: Vec::new(),
        }
    }
}

/// Why a request was refused at submission.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SubmitError {
    /// The prompt has no tokens.
    #[error("the prompt is empty")]
    EmptyPrompt,
    /// `max_tokens` is zero.
    #[error("max_tokens must be at least 1, got 0")]
    ZeroMaxTokens,
    /// Prompt plus output do not fit the context window.
    #[error(
        "This model's maximum context length is {max_model_len} tokens. However, you requested \
         {total} tokens ({prompt} in the messages, {max_tokens} in the completion). Please reduce \
         the length of the messages or completion."
    )]
    TooLong {
        /// Prompt tokens.
        prompt: usize,
        /// Requested output tokens.
        max_tokens: u32,
        /// Their sum.
        total: usize,
        /// The engine's context window.
        max_model_len: u32,
    },
    /// A request with this id is already in the engine.
    #[error("request id {0} is already in use")]
    DuplicateId(RequestId),
}

/// Details of a finished request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Finished {
    /// Why it finished.
    pub reason: FinishReason,
    /// Prompt tokens.
    pub prompt_tokens: u32,
    /// Generated tokens.
    pub completion_tokens: u32,
    /// Prompt tokens served from the prefix cache (or pulled from a prefill engine) the first
    /// time the request was scheduled.
    pub cached_tokens: u32,
    /// For a prefill leg ([`KvTransfer::RemoteDecode`]) that finished by length: the leased
    /// blocks holding the prompt's KV, for the decode engine to read.
    pub remote_block_ids: Option<Vec<BlockId>>,
}

/// One generated token of one request; the last one of a request carries [`Finished`]. A
/// request that ends in error ([`FinishReason::Error`]) ends with an output carrying no token:
/// empty `text`, `token_id` 0.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Output {
    /// The request.
    pub request: RequestId,
    /// The generated token id (the pseudo-tokenizer's id of `text`).
    pub token_id: u32,
    /// The generated text piece (4 bytes).
    pub text: &'static str,
    /// Present on the request's last token.
    pub finished: Option<Finished>,
}

/// Checks a request's lengths against `cfg` as [`Engine::submit`](super::Engine::submit) does, so a server can
/// refuse a request before handing it over.
pub fn validate(cfg: &EngineConfig, prompt_len: usize, max_tokens: u32) -> Result<(), SubmitError> {
    if prompt_len == 0 {
        return Err(SubmitError::EmptyPrompt);
    }
    if max_tokens == 0 {
        return Err(SubmitError::ZeroMaxTokens);
    }
    let max_model_len = cfg
        .max_model_len
        .min(cfg.num_gpu_blocks.saturating_mul(cfg.block_size));
    let total = prompt_len + max_tokens as usize;
    if total > max_model_len as usize {
        return Err(SubmitError::TooLong {
            prompt: prompt_len,
            max_tokens,
            total,
            max_model_len,
        });
    }
    Ok(())
}
