//! Named parameter sets of the step-cost model, with where every number comes from
//! (docs/engine-model.md has the derivations and the fit in full).
//!
//! - `h100-8b`: Llama-3-8B in BF16 on one H100 SXM, from published specifications, with the
//!   efficiencies that Vidur's published H100 and A100 profiles show (below). The default.
//! - `cpu-tiny`: vLLM's CPU build on one core serving the project's tiny model
//!   (scripts/lib/vllm.sh), fitted to measurements by scripts/lib/fit-engine-profile.py.
//! - `legacy`: the additive model and defaults kvmesh used before issue 45 ("roughly an 8B
//!   model on a modern GPU"), to reproduce figures recorded with it.

use std::fmt;
use std::str::FromStr;

use super::step_cost::{Additive, Roofline, StepCost};

/// A named engine profile; see the module docs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum EngineProfile {
    #[default]
    H100_8b,
    CpuTiny,
    Legacy,
}

// --- h100-8b -------------------------------------------------------------------------------
// H100 SXM: 3.35 TB/s of HBM3, 989 TFLOPS dense BF16 (NVIDIA's datasheet). Llama-3-8B: 32
// layers, hidden 4096, 32 query heads and 8 KV heads of 128, FFN 14336, vocabulary 128256
// (its config.json). Vidur's profiles (microsoft/vidur, data/profiling/compute/h100/meta-llama/
// Llama-2-7b-hf/mlp.csv and .../a100/meta-llama/Meta-Llama-3-8B/mlp.csv: every linear layer of
// a transformer layer, timed per batch size) show the linear layers at 69% (H100, 7B) and 77%
// (A100, 8B) of the memory bandwidth at one token and 66-67% of peak FLOPs at thousands of
// tokens: we take 75% and 65%.
const H100_BYTES_PER_S: f64 = 3.35e12 * 0.75;
const H100_FLOPS: f64 = 989e12 * 0.65;
/// Bytes read per step: the 32 layers (6.98B parameters) and the LM head (0.53B; the
/// embedding table is gathered, not read), in BF16.
const LLAMA3_8B_WEIGHT_BYTES: f64 = 7.505e9 * 2.0;
/// 32 layers × 8 KV heads × 128 × (K, V) × 2 bytes.
const LLAMA3_8B_KV_BYTES_PER_TOKEN: f64 = 131_072.0;
/// 2 FLOPs per parameter of the 32 layers for every token computed.
const LLAMA3_8B_FLOPS_PER_TOKEN: f64 = 2.0 * 6.98e9;
/// QKᵀ and PV: 2 × 2 × 32 heads × 128 per layer, × 32 layers, per (token, context token) pair.
const LLAMA3_8B_ATTENTION_FLOPS_PER_PAIR: f64 = 4.0 * 32.0 * 128.0 * 32.0;
/// FlashAttention reaches less of the peak than the GEMMs do: we take 50%.
const H100_ATTENTION_FLOPS: f64 = 989e12 * 0.5;

/// The `h100-8b` step cost.
pub const H100_8B: Roofline = Roofline {
    // vLLM V1's per-step CPU work (schedule, prepare inputs, sample, process outputs), much of
    // it overlapped with the GPU: an estimate, ~0.7 ms plus 5 µs per sequence. With the weights
    // read, a batch-1 decode takes ~6.7 ms (~150 tokens/s, an H100's share of the ~75 tokens/s
    // measured for the same model on an A100-40GB).
    cpu_s: 0.000_7,
    cpu_per_seq_s: 0.000_005,
    // The API server runs on cores of its own: its work does not hold up a step.
    admit_s: 0.0,
    admit_s_per_prompt_token: 0.0,
    weights_s: LLAMA3_8B_WEIGHT_BYTES / H100_BYTES_PER_S,
    kv_s_per_token: LLAMA3_8B_KV_BYTES_PER_TOKEN / H100_BYTES_PER_S,
    token_s: LLAMA3_8B_FLOPS_PER_TOKEN / H100_FLOPS,
    attention_s_per_token_ctx: LLAMA3_8B_ATTENTION_FLOPS_PER_PAIR / H100_ATTENTION_FLOPS,
};

// --- cpu-tiny ------------------------------------------------------------------------------
/// The `cpu-tiny` step cost: scripts/lib/fit-engine-profile.py's fit, recorded with its
/// measurements in docs/engine-model-fit.json (2026-12-07 09:32 UTC, load average ~2.5: the
/// core nearly to itself; see docs/engine-model.md). The tiny model's weights (a few MB) sit
/// in the CPU's caches, so there is no weights floor; what the fit puts in the memory term is
/// decode attention, a matrix-vector product per sequence, ~0.10 µs per context token. The
/// front end shares the core, so a newly admitted request holds its step up by ~3.6 ms plus
/// ~2.6 µs per prompt token.
pub const CPU_TINY: Roofline = Roofline {
    cpu_s: 0.002_68,
    cpu_per_seq_s: 0.000_094_8,
    admit_s: 0.003_64,
    admit_s_per_prompt_token: 0.000_002_60,
    weights_s: 0.0,
    kv_s_per_token: 0.000_000_104,
    token_s: 0.000_017_3,
    attention_s_per_token_ctx: 0.000_000_010_6,
};

// --- legacy --------------------------------------------------------------------------------
/// The pre-issue-45 defaults: 12,000 prefill tokens/s, a 12 ms decode step plus 0.15 ms per
/// sequence and 10 ns per context token read, 1 ns per attention pair.
pub const LEGACY: Additive = Additive {
    step_overhead_s: 0.012,
    per_seq_s: 0.000_15,
    decode_s_per_ctx_token: 10e-9,
    prefill_tokens_per_s: 12_000.0,
    attention_s_per_token_ctx: 1e-9,
};

impl EngineProfile {
    /// Every profile, in the order the flags list them.
    pub const ALL: [Self; 3] = [Self::H100_8b, Self::CpuTiny, Self::Legacy];

    /// The profile's name on command lines.
    pub fn name(self) -> &'static str {
        match self {
            Self::H100_8b => "h100-8b",
            Self::CpuTiny => "cpu-tiny",
            Self::Legacy => "legacy",
        }
    }

    /// The step cost.
    pub fn step_cost(self) -> StepCost {
        match self {
            Self::H100_8b => StepCost::Roofline(H100_8B),
            Self::CpuTiny => StepCost::Roofline(CPU_TINY),
            Self::Legacy => StepCost::Additive(LEGACY),
        }
    }

    /// vLLM's default token budget of a step on that platform (its API server's
    /// `max_num_batched_tokens`: 8192 on a GPU of 70 GiB or more, 2048 on the CPU build).
    pub fn max_num_batched_tokens(self) -> u32 {
        match self {
            Self::H100_8b | Self::Legacy => 8192,
            Self::CpuTiny => 2048,
        }
    }

    /// vLLM's default batch limit on that platform (`max_num_seqs`: 1024 on a GPU of 70 GiB or
    /// more, 128 on the CPU build; kvmesh's legacy default was 256).
    pub fn max_num_seqs(self) -> u32 {
        match self {
            Self::H100_8b => 1024,
            Self::CpuTiny => 128,
            Self::Legacy => 256,
        }
    }
}

impl fmt::Display for EngineProfile {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// By name, as the simulator's JSON report records its flags.
impl serde::Serialize for EngineProfile {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_str(self.name())
    }
}

impl FromStr for EngineProfile {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        Self::ALL
            .into_iter()
            .find(|p| p.name() == s)
            .ok_or_else(|| {
                let names: Vec<_> = Self::ALL.iter().map(|p| p.name()).collect();
                format!("unknown engine profile {s:?} (one of {})", names.join(", "))
            })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for p in EngineProfile::ALL {
            assert_eq!(p.name().parse::<EngineProfile>(), Ok(p));
        }
        assert!("a100".parse::<EngineProfile>().is_err());
    }

    /// The derived H100 figures, pinned so that a change to a constant shows here.
    #[test]
    fn h100_8b_is_what_its_sources_say() {
        let r = H100_8B;
        assert!((r.weights_s * 1e3 - 5.97).abs() < 0.01, "{}", r.weights_s);
        assert!(
            (r.kv_s_per_token * 1e9 - 52.2).abs() < 0.1,
            "{}",
            r.kv_s_per_token
        );
        // ~46,000 prefill tokens/s against the legacy 12,000.
        assert!(
            (1.0 / r.token_s - 46_050.0).abs() < 100.0,
            "{}",
            1.0 / r.token_s
        );
        assert!((r.attention_s_per_token_ctx * 1e9 - 1.06).abs() < 0.01);
        // The ridge: a step turns compute-bound at ~275 tokens.
        let ridge = r.weights_s / r.token_s;
        assert!((250.0..300.0).contains(&ridge), "{ridge}");
    }
}
