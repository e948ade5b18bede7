//! Command-line configuration of `kvmesh-sim engine`.

use std::net::{IpAddr, Ipv4Addr};

use super::model::{EngineConfig, TimingModel};

/// Disaggregation role of the engine (vLLM's NixlConnector `kv_role`, as the router sees it).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Role {
    /// Serves whole requests and both legs of disaggregated ones (`kv_both`).
    Mixed,
    /// Serves ordinary requests and prefill legs; refuses decode legs.
    Prefill,
    /// Serves ordinary requests and decode legs; refuses prefill legs.
    Decode,
}

/// Shape of KV-event messages on the wire.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvEventsFormat {
    /// msgspec `array_like` structs: positional arrays, tag first (vLLM up to mid-2026).
    Array,
    /// Maps with a `type` key (newer vLLM).
    Map,
}

/// `kvmesh-sim engine`: a mock vLLM V1 server with a modelled GPU.
#[derive(Debug, Clone, clap::Args)]
pub struct EngineArgs {
    /// Address to listen on (loopback by default).
    #[arg(long, default_value_t = IpAddr::V4(Ipv4Addr::LOCALHOST))]
    pub host: IpAddr,
    /// HTTP port; 0 picks a free one (the chosen address is printed on stdout).
    #[arg(long, default_value_t = 8000)]
    pub port: u16,
    /// Served model name (repeatable: aliases of the same weights; the first names metrics).
    #[arg(long = "model", default_value = "mock-model")]
    pub models: Vec<String>,
    /// LoRA adapter name served on top of the base model (repeatable).
    #[arg(long = "lora")]
    pub loras: Vec<String>,
    /// KV cache capacity in blocks (vLLM's num_gpu_blocks).
    #[arg(long, default_value_t = 8192)]
    pub kv_blocks: u32,
    /// Blocks of a modelled CPU offload tier (vLLM's OffloadingConnector); 0 = none. Every
    /// block the GPU caches is copied there, evicted in LRU order, and reported in the KV events
    /// with medium CPU. Events only: prefix hits still come from the GPU alone.
    #[arg(long, default_value_t = 0)]
    pub kv_offload_blocks: u32,
    /// Tokens per KV block.
    #[arg(long, default_value_t = 16)]
    pub block_size: u32,
    /// Most sequences in a batch.
    #[arg(long, default_value_t = 256)]
    pub max_num_seqs: u32,
    /// Token budget of one step (chunked prefill).
    #[arg(long, default_value_t = 8192)]
    pub max_num_batched_tokens: u32,
    /// Context window (prompt + output); defaults to the KV capacity.
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// Prefill speed for uncached tokens, tokens per second.
    #[arg(long, default_value_t = 12_000.0)]
    pub prefill_tokens_per_s: f64,
    /// Step time at batch size 1 (the decode step), milliseconds.
    #[arg(long, default_value_t = 12.0)]
    pub decode_step_ms: f64,
    /// Extra step time per sequence in the batch, milliseconds.
    #[arg(long, default_value_t = 0.15)]
    pub decode_step_ms_per_seq: f64,
    /// Decode cost of reading the KV: nanoseconds per context token of each decoding sequence.
    #[arg(long, default_value_t = 10.0)]
    pub decode_ns_per_ctx_token: f64,
    /// Attention cost of prefill, nanoseconds per (token × context token).
    #[arg(long, default_value_t = 1.0)]
    pub attention_ns_per_token_ctx: f64,
    /// Modelled KV transfer time per block for decode legs, milliseconds.
    #[arg(long, default_value_t = 0.2)]
    pub kv_transfer_ms_per_block: f64,
    /// Multiplier on every modelled duration (1.0 = real time, 0.1 = ten times faster).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// No modelled delay at all (cache bookkeeping and metrics still run).
    #[arg(long)]
    pub instant: bool,
    /// Disaggregation role.
    #[arg(long, value_enum, default_value_t = Role::Mixed)]
    pub role: Role,
    /// Publish KV cache events on a ZMQ PUB socket bound here, e.g. tcp://127.0.0.1:5557
    /// (port 0 picks a free one; the endpoint is printed on stdout; vLLM's tcp://*:PORT
    /// means all interfaces).
    #[arg(long)]
    pub kv_events: Option<String>,
    /// ZMQ ROUTER endpoint answering replay requests (e.g. tcp://127.0.0.1:5558).
    #[arg(long, requires = "kv_events")]
    pub kv_events_replay: Option<String>,
    /// Topic frame of KV-event messages.
    #[arg(long, default_value = "kv-events")]
    pub kv_events_topic: String,
    /// Wire shape of KV events.
    #[arg(long, value_enum, default_value_t = KvEventsFormat::Array)]
    pub kv_events_format: KvEventsFormat,
    /// Event batches kept for replay.
    #[arg(long, default_value_t = 10_000)]
    pub kv_events_buffer: usize,
    /// Seed of output text and block hashes.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Value of the `engine` label on metrics.
    #[arg(long, default_value_t = 0)]
    pub engine_index: u32,
    /// Engine id reported to decode engines (default: derived from seed and port).
    #[arg(long)]
    pub engine_id: Option<String>,
    /// Largest accepted request body, bytes (larger bodies get 413).
    #[arg(long, default_value_t = 32 * 1024 * 1024)]
    pub max_body_bytes: usize,
    /// Report `usage.prompt_tokens_details.cached_tokens`.
    #[arg(long)]
    pub enable_prompt_tokens_details: bool,
}

impl EngineArgs {
    /// The engine model configuration these flags describe.
    pub fn engine_config(&self) -> EngineConfig {
        let capacity = self.kv_blocks.saturating_mul(self.block_size);
        EngineConfig {
            num_gpu_blocks: self.kv_blocks.max(1),
            num_offload_blocks: self.kv_offload_blocks,
            block_size: self.block_size.max(1),
            max_num_seqs: self.max_num_seqs.max(1),
            max_num_batched_tokens: self.max_num_batched_tokens.max(1),
            max_model_len: self.max_model_len.unwrap_or(capacity).min(capacity),
            timing: TimingModel {
                step_overhead_s: self.decode_step_ms / 1e3,
                per_seq_s: self.decode_step_ms_per_seq / 1e3,
                decode_s_per_ctx_token: self.decode_ns_per_ctx_token / 1e9,
                prefill_tokens_per_s: self.prefill_tokens_per_s.max(1e-9),
                attention_s_per_token_ctx: self.attention_ns_per_token_ctx / 1e9,
                kv_transfer_s_per_block: self.kv_transfer_ms_per_block / 1e3,
                time_scale: self.time_scale.max(0.0),
                instant: self.instant,
            },
            seed: self.seed,
        }
    }
}
