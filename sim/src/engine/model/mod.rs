//! The sans-IO engine model: pseudo-tokenizer, multimodal chat prompts, prefix cache,
//! scheduler and timing (plus the KV events of a CPU offload tier and the KV leases of
//! disaggregated prefill).
//!
//! No sockets, no runtime, no clock: time is a [`Duration`](std::time::Duration) since an
//! epoch the caller chooses, passed into every call. The HTTP server drives it in real time;
//! the cluster simulator drives the same code in virtual time.

pub mod block_hash;
pub mod block_pool;
pub mod chat_prompt;
pub mod config;
pub mod engine;
pub mod lease;
pub mod lora_slots;
pub mod media;
pub mod offload_tier;
pub mod profile;
pub mod request;
pub mod stats;
pub mod step_cost;
pub mod timing;
pub mod tokenizer;

pub use block_hash::{BlockHash, BlockHasher, CacheKey, ExtraKey};
pub use block_pool::{BlockId, BlockPool, KvCacheEvent};
pub use config::{EngineConfig, EngineGauges, KvLoadFailurePolicy};
pub use engine::Engine;
pub use lease::ReadRefused;
pub use lora_slots::{LoraSlots, SlotState};
pub use media::{MediaConfig, MediaItem, Modality};
pub use offload_tier::OffloadTier;
pub use profile::EngineProfile;
pub use request::{
    EngineRequest, Finished, KvTransfer, LoraRef, Output, PullOutcome, PullRequest, RequestId,
    SubmitError, validate,
};
pub use stats::{
    EngineStats, FinishReason, Histogram, LORA_INFO_SERIES, LoraInfoSample, PromptTokenSources,
};
pub use step_cost::{Additive, Overrides, Roofline, StepCost, StepShape};
pub use timing::TimingModel;

#[cfg(test)]
mod engine_lora_tests;
#[cfg(test)]
mod engine_media_tests;
#[cfg(test)]
mod engine_pd_tests;
#[cfg(test)]
mod engine_tests;
