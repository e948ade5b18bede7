//! The load digest: what a node tells the mesh about its engine, every ~100 ms.

use crate::codec::{self, DecodeError, Kind};
use crate::hashing::HASH_VERSION;
use crate::route::Gauges;
use rkyv::{Archive, Deserialize, Serialize};

/// What kind of work an engine takes, for prefill/decode disaggregation (the node's `--role`,
/// named as [`Role::as_str`] spells it in flags, files and reports).
#[derive(
    Archive,
    Serialize,
    Deserialize,
    serde::Serialize,
    serde::Deserialize,
    Copy,
    Clone,
    Debug,
    PartialEq,
    Eq,
    Hash,
)]
#[rkyv(derive(Debug))]
#[serde(rename_all = "snake_case")]
#[repr(u8)]
pub enum Role {
    /// Takes whole requests (the default, and the only role without disaggregation).
    Mixed,
    /// Runs prefill legs only.
    Prefill,
    /// Runs decode legs, and whole requests when a request is not disaggregated.
    Decode,
}

impl Role {
    /// Whether an engine of this role takes work of kind `work`: [`Role::Mixed`] for a whole
    /// request, [`Role::Prefill`] or [`Role::Decode`] for one leg of a disaggregated one. A
    /// decode engine runs whole requests too (the prompts too short to disaggregate, and the
    /// fallbacks); a mixed engine takes no leg, since it may run without a KV connector.
    pub fn takes(self, work: Role) -> bool {
        match self {
            Role::Mixed => work == Role::Mixed,
            Role::Prefill => work == Role::Prefill,
            Role::Decode => matches!(work, Role::Mixed | Role::Decode),
        }
    }

    /// Every role, in the order their names are listed.
    pub const ALL: [Role; 3] = [Role::Mixed, Role::Prefill, Role::Decode];

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Mixed => "mixed",
            Role::Prefill => "prefill",
            Role::Decode => "decode",
        }
    }
}

impl std::fmt::Display for Role {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for Role {
    type Err = UnknownRole;

    fn from_str(name: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|role| role.as_str() == name)
            .ok_or_else(|| UnknownRole(name.to_owned()))
    }
}

/// A name that is no [`Role`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("expected `mixed`, `prefill` or `decode`, not `{0}`")]
pub struct UnknownRole(pub String);

/// One node's load report. Gauges come from the engine's `/metrics`; EWMAs from what the node
/// observed; `version` orders digests of one incarnation, `timestamp_ms` is the publisher's
/// wall clock (informational: staleness is judged by the receiver's clock on arrival).
#[derive(Archive, Serialize, Deserialize, Clone, Debug, PartialEq)]
#[rkyv(derive(Debug))]
pub struct LoadDigest {
    pub version: u64,
    pub timestamp_ms: u64,
    /// `vllm:num_requests_running`.
    pub running: u32,
    /// `vllm:num_requests_waiting`.
    pub waiting: u32,
    /// `vllm:kv_cache_usage_perc`, 0..=1.
    pub kv_usage: f32,
    /// Prompt tokens queued ahead of a new request, as the node's serving state counts them
    /// (`lifecycle::ServingState::queued_tokens`); `None` when it cannot say.
    pub queued_tokens: Option<u32>,
    /// `num_gpu_blocks` of `vllm:cache_config_info`.
    pub kv_capacity_blocks: u32,
    /// `block_size` of `vllm:cache_config_info`, in tokens.
    pub block_size: u16,
    /// Observed time to first token, exponentially weighted, milliseconds.
    pub ttft_ewma_ms: f32,
    /// Observed prefill throughput, exponentially weighted, tokens per second (0 = unknown).
    pub prefill_tokens_per_s: f32,
    /// Requests other sidecars forwarded here that have not finished.
    pub inflight_forwarded: u32,
    pub role: Role,
    pub healthy: bool,
    /// The hash version this node computes chains with ([`crate::hashing::HASH_VERSION`]).
    pub hash_version: u16,
    /// Served model names (`/v1/models`).
    pub models: Vec<String>,
    /// LoRA adapters served, addressed by name like models.
    pub loras: Vec<String>,
    /// Which adapters the engine is running and queueing now (`vllm:lora_requests_info`).
    pub lora_use: LoraUse,
}

/// The adapters an engine uses now, as `vllm:lora_requests_info` says: an adapter with
/// requests running is in a GPU slot; one with requests waiting is not yet, or waits for a
/// slot; any other known adapter must be loaded into a slot before it runs, which a free slot
/// makes quick.
#[derive(Archive, Serialize, Deserialize, Clone, Debug, Default, PartialEq, Eq)]
#[rkyv(derive(Debug))]
pub struct LoraUse {
    pub running: Vec<String>,
    pub waiting: Vec<String>,
    /// `--max-loras`: adapters a batch can hold at once (0: unknown).
    pub max_loras: u16,
}

/// How ready an engine is to run a request for an adapter it serves.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub enum LoraReadiness {
    /// Requests queue for it, waiting for a slot or for it to load.
    Waiting,
    /// Known, not in use, and every slot taken: it would wait for one to free.
    NoSlot,
    /// Known, not in use, and a slot is free: it loads at once.
    FreeSlot,
    /// Requests run with it now: it is in a slot.
    Running,
}

impl LoraUse {
    /// How ready the engine is to run `adapter` (one it serves).
    pub fn readiness(&self, adapter: &str) -> LoraReadiness {
        let named = |list: &[String]| list.iter().any(|name| name == adapter);
        if named(&self.running) {
            LoraReadiness::Running
        } else if named(&self.waiting) {
            LoraReadiness::Waiting
        } else if self.max_loras == 0 || self.running.len() < usize::from(self.max_loras) {
            LoraReadiness::FreeSlot
        } else {
            LoraReadiness::NoSlot
        }
    }
}

/// Everything a digest says besides its number, its time and the queue: the engine's
/// `/metrics` (capacity, block size, models, adapters) and what its node observed of it. The
/// node's poller and the simulated engine fill it; [`LoadDigest::new`] is the one place it
/// becomes a digest.
#[derive(Clone, Debug, PartialEq)]
pub struct EngineFacts {
    /// `num_gpu_blocks` (0: not reported yet).
    pub kv_capacity_blocks: u64,
    /// Tokens per KV block.
    pub block_size: u32,
    pub ttft_ewma_ms: f64,
    /// 0: unknown.
    pub prefill_tokens_per_s: f64,
    /// Requests other sidecars forwarded here that have not finished.
    pub inflight_forwarded: u32,
    pub role: Role,
    pub healthy: bool,
    pub models: Vec<String>,
    pub loras: Vec<String>,
    pub lora_use: LoraUse,
}

impl LoadDigest {
    /// Digest number `version` (a node numbers its digests with
    /// [`crate::cadence::DigestPublisher`]), stamped with the publisher's wall clock: the
    /// engine's queue as the serving state counts it (`ServingState::gauges`), and `engine`.
    /// Values wider than the digest's fields saturate.
    pub fn new(version: u64, timestamp_ms: u64, queue: Gauges, engine: EngineFacts) -> Self {
        LoadDigest {
            version,
            timestamp_ms,
            running: queue.running,
            waiting: queue.waiting,
            kv_usage: queue.kv_usage.clamp(0.0, 1.0),
            queued_tokens: queue.queued_tokens,
            kv_capacity_blocks: engine.kv_capacity_blocks.min(u64::from(u32::MAX)) as u32,
            block_size: engine.block_size.min(u32::from(u16::MAX)) as u16,
            ttft_ewma_ms: engine.ttft_ewma_ms as f32,
            prefill_tokens_per_s: engine.prefill_tokens_per_s as f32,
            inflight_forwarded: engine.inflight_forwarded,
            role: engine.role,
            healthy: engine.healthy,
            hash_version: HASH_VERSION,
            models: engine.models,
            loras: engine.loras,
            lora_use: engine.lora_use,
        }
    }

    /// Whether `self` and `other` report the same load: every field but the number and the
    /// time.
    pub fn same_load(&self, other: &LoadDigest) -> bool {
        LoadDigest {
            version: other.version,
            timestamp_ms: other.timestamp_ms,
            ..self.clone()
        } == *other
    }

    /// Whether this node's engine serves `model` (a model or an adapter name).
    pub fn serves(&self, model: &str) -> bool {
        self.models.iter().chain(&self.loras).any(|m| m == model)
    }

    /// The queue the bounded-load rule balances: everything admitted and not yet finished.
    pub fn load(&self) -> u32 {
        self.running.saturating_add(self.waiting)
    }

    pub fn encode(&self) -> Vec<u8> {
        codec::encode(Kind::LoadDigest, self)
    }

    /// Validates structure (bytecheck) and values (finite, in range).
    pub fn decode(bytes: &[u8]) -> Result<Self, DecodeError> {
        let digest: Self = codec::decode(Kind::LoadDigest, bytes)?;
        let finite_non_negative = |x: f32| x.is_finite() && x >= 0.0;
        if !(0.0..=1.0).contains(&digest.kv_usage) {
            return Err(DecodeError::Semantic(format!(
                "kv_usage {} out of 0..=1",
                digest.kv_usage
            )));
        }
        if !finite_non_negative(digest.ttft_ewma_ms)
            || !finite_non_negative(digest.prefill_tokens_per_s)
        {
            return Err(DecodeError::Semantic("negative or non-finite EWMA".into()));
        }
        Ok(digest)
    }
}

#[cfg(test)]
pub(crate) fn sample_digest() -> LoadDigest {
    LoadDigest {
        version: 7,
        timestamp_ms: 1_790_000_000_000,
        running: 12,
        waiting: 3,
        kv_usage: 0.42,
        queued_tokens: None,
        kv_capacity_blocks: 20_000,
        block_size: 16,
        ttft_ewma_ms: 180.5,
        prefill_tokens_per_s: 9_000.0,
        inflight_forwarded: 4,
        role: Role::Mixed,
        healthy: true,
        hash_version: crate::hashing::HASH_VERSION,
        models: vec!["meta-llama/Llama-3.1-8B-Instruct".into()],
        loras: vec![],
        lora_use: LoraUse::default(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roles_parse_from_the_names_they_are_shown_by() {
        for role in Role::ALL {
            assert_eq!(role.as_str().parse::<Role>(), Ok(role));
            assert_eq!(role.to_string(), role.as_str());
            let json = serde_json::to_string(&role).unwrap();
            assert_eq!(json, format!("\"{role}\""));
            assert_eq!(serde_json::from_str::<Role>(&json).unwrap(), role);
        }
        assert_eq!("both".parse::<Role>(), Err(UnknownRole("both".into())));
        assert!(serde_json::from_str::<Role>("\"Mixed\"").is_err());
    }

    #[test]
    fn round_trips_and_stays_small() {
        let digest = sample_digest();
        let bytes = digest.encode();
        assert_eq!(LoadDigest::decode(&bytes).unwrap(), digest);
        let names: usize = digest
            .models
            .iter()
            .chain(&digest.loras)
            .map(String::len)
            .sum();
        assert!(
            bytes.len() - names <= 160,
            "digest is {} bytes plus names",
            bytes.len() - names
        );
    }

    #[test]
    fn rejects_out_of_range_values() {
        let mut digest = sample_digest();
        digest.kv_usage = 1.5;
        assert!(matches!(
            LoadDigest::decode(&digest.encode()),
            Err(DecodeError::Semantic(_))
        ));
        let mut digest = sample_digest();
        digest.ttft_ewma_ms = f32::NAN;
        assert!(matches!(
            LoadDigest::decode(&digest.encode()),
            Err(DecodeError::Semantic(_))
        ));
    }

    #[test]
    fn serves_models_and_adapters() {
        let mut digest = sample_digest();
        digest.loras.push("sql-adapter".into());
        assert!(digest.serves("sql-adapter"));
        assert!(digest.serves("meta-llama/Llama-3.1-8B-Instruct"));
        assert!(!digest.serves("other"));
    }
}
