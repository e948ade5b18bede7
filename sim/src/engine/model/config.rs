//! Static configuration and instantaneous gauges of an engine.

use super::timing::TimingModel;

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
}

impl Default for EngineConfig {
    fn default() -> Self {
        Self {
            num_gpu_blocks: 8192,
            num_offload_blocks: 0,
            block_size: 16,
            max_num_seqs: 256,
            max_num_batched_tokens: 8192,
            max_model_len: 131_072,
            timing: TimingModel::default(),
            seed: 0,
        }
    }
}

/// Gauges of the engine at one instant.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct EngineGauges {
    /// Sequences in the running batch.
    pub running: usize,
    /// Requests waiting (including those waiting for a KV transfer).
    pub waiting: usize,
    /// Fraction of KV blocks referenced by requests.
    pub kv_usage: f64,
}
