//! Static configuration and instantaneous gauges of an engine.

use std::time::Duration;

use super::profile::EngineProfile;
use super::timing::TimingModel;

/// What a decode leg does when pulling its KV from the prefill engine fails (vLLM's
/// `kv_load_failure_policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum KvLoadFailurePolicy {
    /// The request ends with an error (vLLM's default since 0.14: a failed pull is loud).
    #[default]
    Fail,
    /// The decode engine prefills the missing part of the prompt itself.
    Recompute,
}

/// Static configuration of an engine.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineConfig {
    /// KV capacity in blocks (vLLM's `num_gpu_blocks`).
    pub num_gpu_blocks: u32,
    /// Blocks of the CPU offload tier whose KV events the engine publishes; 0 = no tier
    /// (see [`OffloadTier`](super::offload_tier::OffloadTier): events only, no hits).
    pub num_offload_blocks: u32,
    /// Tokens per block.
    pub block_size: u32,
    /// Most sequences in one batch.
    pub max_num_seqs: u32,
    /// Most tokens computed in one step (chunked prefill budget).
    pub max_num_batched_tokens: u32,
    /// Context window: prompt plus output tokens.
    pub max_model_len: u32,
    /// Step timing.
    pub timing: TimingModel,
    /// Seed of the output text and of the block-hash root.
    pub seed: u64,
    /// How long a finished prefill leg keeps its blocks for the decode engine before they
    /// expire (vLLM's `kv_lease_duration`); each renewal extends it to 2/3 of this from then.
    /// A protocol timer, so real time: `time_scale` does not apply.
    pub kv_lease: Duration,
    /// What a decode leg does when its pull fails.
    pub kv_load_failure_policy: KvLoadFailurePolicy,
    /// LoRA adapter slots on the GPU (vLLM's `max_loras`): at most this many distinct adapters
    /// in a batch, loaded in LRU slots ([`LoraSlots`](super::lora_slots::LoraSlots)). 0 turns
    /// LoRA bookkeeping off: adapters need no slot and `vllm:lora_requests_info` is not kept.
    pub max_loras: u32,
}

/// vLLM's shape defaults as the mock engine and the simulator model them (both command lines
/// read them from here; the batch limits are the engine profile's, see
/// [`EngineProfile::max_num_seqs`]).
pub const DEFAULT_NUM_GPU_BLOCKS: u32 = 8192;
pub const DEFAULT_BLOCK_SIZE: u32 = 16;

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_gpu_blocks: DEFAULT_NUM_GPU_BLOCKS,
            num_offload_blocks: 0,
            block_size: DEFAULT_BLOCK_SIZE,
            max_num_seqs: EngineProfile::default().max_num_seqs(),
            max_num_batched_tokens: EngineProfile::default().max_num_batched_tokens(),
            max_model_len: 131_072,
            timing: TimingModel::default(),
            seed: 0,
            kv_lease: Duration::from_secs(30),
            kv_load_failure_policy: KvLoadFailurePolicy::Fail,
            max_loras: 0,
        }
    }
}

/// Gauges of the engine at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineGauges {
    /// Sequences in the running batch.
    pub running: usize,
    /// Requests waiting (including those waiting for their KV to be pulled).
    pub waiting: usize,
    /// Fraction of KV blocks referenced by requests.
    pub kv_usage: f64,
}
