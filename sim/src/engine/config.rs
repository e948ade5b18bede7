//! Command-line configuration of `kvmesh-sim engine`.

use std::net::{IpAddr, Ipv4Addr};
use std::time::Duration;

use super::model::config as model_config;
use super::model::timing::encoder_s_per_media_token;
use super::model::{
    EngineConfig, EngineProfile, KvLoadFailurePolicy, MediaConfig, Overrides, TimingModel,
};

/// Parses `--engine-profile`, listing the names on a mistake.
pub fn parse_engine_profile(s: &str) -> Result<EngineProfile, String> {
    s.parse()
}

/// KV connector of the engine (vLLM's `--kv-transfer-config` `kv_connector`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum KvConnector {
    /// vLLM's NixlConnector: prefill legs lend their KV, decode legs pull it. Like vLLM's, it
    /// ignores `kv_role`: any engine serves either leg; the proxy decides.
    Nixl,
}

/// `--kv-load-failure-policy`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum LoadFailurePolicy {
    /// The decode leg fails (HTTP 500, as vLLM answers it).
    Fail,
    /// The decode engine prefills the prompt itself.
    Recompute,
}

/// A fault the NIXL side channel injects when this engine is the prefill side (for tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum NixlFault {
    /// Refuse every handshake (as an incompatible or broken NIXL agent would).
    HandshakeFailure,
    /// Answer reads only after `--nixl-fault-delay-ms`.
    SlowRead,
    /// Never answer reads.
    HungRead,
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
    /// LoRA adapter slots on the GPU (vLLM's `--max-loras`, default 1): at most this many
    /// distinct adapters in a batch and loaded at a time (LRU among adapters with no running
    /// request). LoRA is on when this, a `--lora` or `--allow-runtime-lora-updating` is given.
    #[arg(long)]
    pub max_loras: Option<u32>,
    /// Modelled time to load an adapter into a GPU slot, milliseconds (times --time-scale).
    #[arg(long, default_value_t = 100.0)]
    pub lora_load_ms: f64,
    /// Serve `POST /v1/load_lora_adapter` and `/v1/unload_lora_adapter` (vLLM with
    /// VLLM_ALLOW_RUNTIME_LORA_UPDATING=True; without it they are unknown paths, 404).
    #[arg(long)]
    pub allow_runtime_lora_updating: bool,
    /// KV cache capacity in blocks (vLLM's num_gpu_blocks).
    #[arg(long, default_value_t = model_config::DEFAULT_NUM_GPU_BLOCKS)]
    pub kv_blocks: u32,
    /// Blocks of a modelled CPU offload tier (vLLM's OffloadingConnector); 0 = none. Every
    /// block the GPU caches is copied there, evicted in LRU order, and reported in the KV events
    /// with medium CPU. Events only: prefix hits still come from the GPU alone.
    #[arg(long, default_value_t = 0)]
    pub kv_offload_blocks: u32,
    /// Tokens per KV block.
    #[arg(long, default_value_t = model_config::DEFAULT_BLOCK_SIZE)]
    pub block_size: u32,
    /// The modelled engine: `h100-8b` (Llama-3-8B on one H100, the default), `cpu-tiny`
    /// (vLLM's CPU build on one core serving the tiny model of scripts/lib/vllm.sh) or `legacy`
    /// (kvmesh's model before issue 45, to reproduce figures recorded with it). See
    /// docs/engine-model.md. The flags below override single terms of it.
    #[arg(long, value_parser = parse_engine_profile, default_value_t = EngineProfile::default())]
    pub engine_profile: EngineProfile,
    /// Most sequences in a batch (default: the profile's, vLLM's default on that platform).
    #[arg(long)]
    pub max_num_seqs: Option<u32>,
    /// Token budget of one step (chunked prefill; default: the profile's, vLLM's default on
    /// that platform).
    #[arg(long)]
    pub max_num_batched_tokens: Option<u32>,
    /// Context window (prompt + output); defaults to the KV capacity.
    #[arg(long)]
    pub max_model_len: Option<u32>,
    /// Prefill speed for uncached tokens, tokens per second (the profile's compute time per
    /// token, overridden).
    #[arg(long)]
    pub prefill_tokens_per_s: Option<f64>,
    /// Step time at batch size 1 (the decode step), milliseconds (under a roofline profile,
    /// sets the weights' read time so that a batch-1 decode takes this long).
    #[arg(long)]
    pub decode_step_ms: Option<f64>,
    /// Extra step time per sequence in the batch, milliseconds.
    #[arg(long)]
    pub decode_step_ms_per_seq: Option<f64>,
    /// Decode cost of reading the KV: nanoseconds per context token of each decoding sequence.
    #[arg(long)]
    pub decode_ns_per_ctx_token: Option<f64>,
    /// Attention cost of prefill, nanoseconds per (token × context token).
    #[arg(long)]
    pub attention_ns_per_token_ctx: Option<f64>,
    /// Placeholder tokens of every chat media item (image, audio, video). Default: an image
    /// sent as a base64 `data:` URL gets one token per 28×28 pixels of its header's size
    /// (Qwen2-VL's merged patches), anything else 256.
    #[arg(long)]
    pub media_tokens_per_item: Option<u32>,
    /// Multimodal encoder cost, milliseconds per 1000 placeholder tokens of the media items a
    /// request does not find cached. Default: a third of the prefill cost of as many tokens
    /// (≈7.2 under h100-8b, ≈27.8 under legacy; see `timing::encoder_s_per_media_token`).
    #[arg(long)]
    pub encoder_ms_per_1k_media_tokens: Option<f64>,
    /// Multiplier on every modelled duration (1.0 = real time, 0.1 = ten times faster).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// No modelled delay at all (cache bookkeeping and metrics still run).
    #[arg(long)]
    pub instant: bool,
    /// KV connector. Without one, `kv_transfer_params` are ignored, as vLLM ignores them.
    #[arg(long, value_enum)]
    pub kv_connector: Option<KvConnector>,
    /// Address of the NIXL side channel decode engines pull from (default: --host); reported
    /// to them as `remote_host` (vLLM's VLLM_NIXL_SIDE_CHANNEL_HOST).
    #[arg(long)]
    pub nixl_side_channel_host: Option<IpAddr>,
    /// Port of the NIXL side channel; 0 picks a free one (printed on stdout as `nixl side
    /// channel on HOST:PORT`; vLLM's VLLM_NIXL_SIDE_CHANNEL_PORT).
    #[arg(long, default_value_t = 0)]
    pub nixl_side_channel_port: u16,
    /// Seconds a finished prefill leg keeps its blocks for the decode engine (vLLM's
    /// `kv_lease_duration`). A decode engine heartbeats every sixth of its own lease; each
    /// heartbeat extends the prefill side's lease to 2/3 of this. Real time (no --time-scale).
    #[arg(long, default_value_t = 30.0)]
    pub kv_lease_duration_s: f64,
    /// What a decode leg does when its pull fails.
    #[arg(long, value_enum, default_value_t = LoadFailurePolicy::Fail)]
    pub kv_load_failure_policy: LoadFailurePolicy,
    /// Bytes of KV per token (the default is an 8B model: 32 layers × 8 KV heads × 128 × K,V ×
    /// fp16); sets the bytes a pull moves.
    #[arg(long, default_value_t = 131_072)]
    pub kv_bytes_per_token: u64,
    /// Modelled bandwidth of a pull, GB/s (1e9 bytes per second).
    #[arg(long, default_value_t = 10.0)]
    pub nixl_bandwidth_gb_s: f64,
    /// Modelled handshake on a decode engine's first contact with a prefill engine,
    /// milliseconds.
    #[arg(long, default_value_t = 5000.0)]
    pub nixl_handshake_ms: f64,
    /// Fault the side channel injects as the prefill side.
    #[arg(long, value_enum)]
    pub nixl_fault: Option<NixlFault>,
    /// Delay of `--nixl-fault slow-read`, milliseconds.
    #[arg(long, default_value_t = 1000)]
    pub nixl_fault_delay_ms: u64,
    /// Publish KV cache events on a ZMQ PUB socket, as vLLM does: bound on a wildcard or ipc
    /// endpoint (tcp://*:5557; tcp://*:0 picks a free loopback port), connected to any other
    /// (tcp://127.0.0.1:5557: the subscriber listens there). The endpoint is printed on stdout.
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
    /// Engine id reported to decode engines (vLLM's `engine_id`; default: a fresh random id per
    /// process, as vLLM's uuid4, so a restarted engine is a new peer).
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
    /// Refuses flag values the engine cannot run with.
    pub fn validate(&self) -> Result<(), String> {
        let positive = |name: &str, v: f64| {
            if v.is_finite() && v > 0.0 {
                Ok(())
            } else {
                Err(format!("--{name} must be a positive number, got {v}"))
            }
        };
        positive("kv-lease-duration-s", self.kv_lease_duration_s)?;
        positive("nixl-bandwidth-gb-s", self.nixl_bandwidth_gb_s)?;
        if !(self.nixl_handshake_ms.is_finite() && self.nixl_handshake_ms >= 0.0) {
            return Err(format!(
                "--nixl-handshake-ms must be zero or more, got {}",
                self.nixl_handshake_ms
            ));
        }
        if self.max_loras == Some(0) {
            return Err("--max-loras must be at least 1".into());
        }
        if !(self.lora_load_ms.is_finite() && self.lora_load_ms >= 0.0) {
            return Err(format!(
                "--lora-load-ms must be zero or more, got {}",
                self.lora_load_ms
            ));
        }
        if self.media_tokens_per_item == Some(0) {
            return Err("--media-tokens-per-item must be at least 1".into());
        }
        if let Some(ms) = self.encoder_ms_per_1k_media_tokens
            && !(ms.is_finite() && ms >= 0.0)
        {
            return Err(format!(
                "--encoder-ms-per-1k-media-tokens must be zero or more, got {ms}"
            ));
        }
        if self.kv_bytes_per_token == 0 {
            return Err("--kv-bytes-per-token must be at least 1".into());
        }
        Ok(())
    }

    /// Bytes of KV in one block.
    pub fn kv_bytes_per_block(&self) -> u64 {
        self.kv_bytes_per_token
            .saturating_mul(u64::from(self.block_size.max(1)))
    }

    /// GPU adapter slots: 0 when LoRA is off, else `--max-loras` (vLLM's default 1).
    pub fn max_loras(&self) -> u32 {
        let enabled =
            !self.loras.is_empty() || self.max_loras.is_some() || self.allow_runtime_lora_updating;
        if enabled {
            self.max_loras.unwrap_or(1).max(1)
        } else {
            0
        }
    }

    /// How chat media items are sized.
    pub fn media_config(&self) -> MediaConfig {
        MediaConfig {
            tokens_per_item: self.media_tokens_per_item,
        }
    }

    /// The older timing flags, as overrides of the profile's terms.
    pub fn timing_overrides(&self) -> Overrides {
        Overrides {
            prefill_tokens_per_s: self.prefill_tokens_per_s,
            decode_step_s: self.decode_step_ms.map(|ms| ms / 1e3),
            per_seq_s: self.decode_step_ms_per_seq.map(|ms| ms / 1e3),
            decode_s_per_ctx_token: self.decode_ns_per_ctx_token.map(|ns| ns / 1e9),
            attention_s_per_token_ctx: self.attention_ns_per_token_ctx.map(|ns| ns / 1e9),
        }
    }

    /// The engine model configuration these flags describe.
    pub fn engine_config(&self) -> EngineConfig {
        let capacity = self.kv_blocks.saturating_mul(self.block_size);
        let profile = self.engine_profile;
        let step = profile.step_cost().with(&self.timing_overrides());
        EngineConfig {
            num_gpu_blocks: self.kv_blocks.max(1),
            num_offload_blocks: self.kv_offload_blocks,
            block_size: self.block_size.max(1),
            max_num_seqs: self.max_num_seqs.unwrap_or(profile.max_num_seqs()).max(1),
            max_num_batched_tokens: self
                .max_num_batched_tokens
                .unwrap_or(profile.max_num_batched_tokens())
                .max(1),
            max_model_len: self.max_model_len.unwrap_or(capacity).min(capacity),
            timing: TimingModel {
                kv_transfer_s_per_block: self.kv_bytes_per_block() as f64
                    / (self.nixl_bandwidth_gb_s.max(1e-9) * 1e9),
                kv_handshake_s: self.nixl_handshake_ms.max(0.0) / 1e3,
                lora_load_s: self.lora_load_ms.max(0.0) / 1e3,
                encoder_s_per_media_token: match self.encoder_ms_per_1k_media_tokens {
                    Some(ms) => ms.max(0.0) / 1e6,
                    None => encoder_s_per_media_token(step.prefill_tokens_per_s()),
                },
                time_scale: self.time_scale.max(0.0),
                instant: self.instant,
                ..TimingModel::of(step)
            },
            seed: self.seed,
            kv_lease: Duration::from_secs_f64(self.kv_lease_duration_s.clamp(1e-3, 1e9)),
            kv_load_failure_policy: match self.kv_load_failure_policy {
                LoadFailurePolicy::Fail => KvLoadFailurePolicy::Fail,
                LoadFailurePolicy::Recompute => KvLoadFailurePolicy::Recompute,
            },
            max_loras: self.max_loras(),
        }
    }
}

#[cfg(test)]
mod defaults_tests {
    use super::*;

    /// `kvmesh-sim engine` without flags is the engine model's default engine, which the
    /// simulator's engines are too (`simulate::args`'s `defaults_are_the_sidecars`).
    #[test]
    fn the_flags_defaults_are_the_models() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(flatten)]
            args: EngineArgs,
        }
        let args = <Cli as clap::Parser>::parse_from(["engine"]).args;
        let (flags, model) = (args.engine_config(), EngineConfig::default());
        assert_eq!(flags.num_gpu_blocks, model.num_gpu_blocks);
        assert_eq!(flags.block_size, model.block_size);
        assert_eq!(flags.max_num_seqs, model.max_num_seqs);
        assert_eq!(flags.max_num_batched_tokens, model.max_num_batched_tokens);
        assert_eq!(flags.timing.step, model.timing.step);
        assert_eq!(
            flags.timing.encoder_s_per_media_token,
            model.timing.encoder_s_per_media_token
        );
    }
}
