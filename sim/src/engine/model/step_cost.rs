//! What one model step costs, given what it computes: the two forms of the engine model.
//!
//! [`Roofline`] is how vLLM's steps behave (issue 45 §3). A forward pass streams the weights
//! from memory once, whatever the batch, and every sequence's attention reads that sequence's
//! KV; it also does ~2 FLOPs per parameter for every token it computes, plus attention's
//! context-dependent FLOPs. The two overlap on the device, so the step takes the larger:
//!
//! ```text
//! step = cpu_s + cpu_per_seq_s · seqs
//!      + admit_s · admitted + admit_s_per_prompt_token · admitted_prompt_tokens
//!      + max(memory, compute)
//! memory  = weights_s + kv_s_per_token · Σ_seqs context read (decodes: their context;
//!                                                            chunks: context + chunk)
//! compute = token_s · (prefill tokens + decodes)
//!         + attention_s_per_token_ctx · (Σ_chunks n · (k + n/2) + Σ_decodes context)
//! ```
//!
//! So a short prefill chunk riding in a decode step costs ~nothing while the step is bound by
//! memory (the weights are read anyway), and a long chunk makes the step compute-bound. The CPU
//! terms are vLLM's own per-step work (scheduling, input preparation, sampling, output
//! processing); `admit` is the front end's work on a newly admitted request (HTTP, tokenising,
//! detokenising), which only costs step time when it shares the engine's core (the CPU build
//! on one core; zero on a GPU host, where it runs on other cores).
//!
//! [`Additive`] is the model kvmesh used before issue 45, kept so that old figures can be
//! reproduced (`--engine-profile legacy`): every term adds, so a request joining a batch pays
//! its whole prefill on top of the decode step and every decode waits with it.

/// What a step computes, as far as timing is concerned.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct StepShape {
    /// Sequences in the batch (decodes and prefill chunks).
    pub seqs: u32,
    /// Prompt (or recomputed) tokens computed in this step.
    pub prefill_tokens: u64,
    /// Σ chunk_tokens · (context_before_chunk + chunk_tokens / 2) over prefill chunks.
    pub attention_work: f64,
    /// Σ (context_before_chunk + chunk_tokens) over prefill chunks: the KV their attention reads.
    pub prefill_kv_tokens: u64,
    /// Decoding sequences (one token each).
    pub decode_seqs: u32,
    /// Σ context tokens over decoding sequences.
    pub decode_context_tokens: u64,
    /// Requests scheduled for the first time in this step.
    pub admitted: u32,
    /// Prompt tokens of those requests (cached or not: the front end reads them all).
    pub admitted_prompt_tokens: u64,
    /// Placeholder tokens of the media items the encoder runs over in this step.
    pub encoder_tokens: u64,
}

/// The step time of a GPU-like engine: CPU work plus the larger of memory and compute time.
/// See the module docs; every field is in seconds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Roofline {
    /// Fixed CPU time of a step.
    pub cpu_s: f64,
    /// CPU time per sequence in the batch.
    pub cpu_per_seq_s: f64,
    /// Front-end time per newly admitted request that the step waits for.
    pub admit_s: f64,
    /// Front-end time per prompt token of a newly admitted request that the step waits for.
    pub admit_s_per_prompt_token: f64,
    /// Reading the weights once (weight bytes / memory bandwidth).
    pub weights_s: f64,
    /// Reading one token's KV (KV bytes per token / memory bandwidth).
    pub kv_s_per_token: f64,
    /// Computing one token through the weights (2 · parameters / FLOP/s).
    pub token_s: f64,
    /// Attention's FLOPs per (token × context token) / FLOP/s.
    pub attention_s_per_token_ctx: f64,
}

/// The pre-issue-45 step time, every term added. Seconds, except `prefill_tokens_per_s`.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Additive {
    /// Fixed cost of a step (the decode step time at batch size 1).
    pub step_overhead_s: f64,
    /// Extra step time per sequence in the batch.
    pub per_seq_s: f64,
    /// Extra step time per context token of each decoding sequence (KV reads).
    pub decode_s_per_ctx_token: f64,
    /// Prefill speed for uncached prompt tokens, tokens per second.
    pub prefill_tokens_per_s: f64,
    /// Attention cost, seconds per (token × context token) of prefill chunks.
    pub attention_s_per_token_ctx: f64,
}

/// How a step's duration follows from its shape.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum StepCost {
    Roofline(Roofline),
    Additive(Additive),
}

impl Roofline {
    /// Seconds of a step of `shape`, before the encoder and the time scale.
    pub fn seconds(&self, shape: &StepShape) -> f64 {
        let memory = self.weights_s
            + self.kv_s_per_token * (shape.prefill_kv_tokens + shape.decode_context_tokens) as f64;
        let compute = self.token_s * (shape.prefill_tokens + u64::from(shape.decode_seqs)) as f64
            + self.attention_s_per_token_ctx
                * (shape.attention_work + shape.decode_context_tokens as f64);
        self.cpu_s
            + self.cpu_per_seq_s * f64::from(shape.seqs)
            + self.admit_s * f64::from(shape.admitted)
            + self.admit_s_per_prompt_token * shape.admitted_prompt_tokens as f64
            + memory.max(compute)
    }
}

impl Additive {
    /// Seconds of a step of `shape`, before the encoder and the time scale.
    pub fn seconds(&self, shape: &StepShape) -> f64 {
        self.step_overhead_s
            + self.per_seq_s * f64::from(shape.seqs)
            + self.decode_s_per_ctx_token * shape.decode_context_tokens as f64
            + shape.prefill_tokens as f64 / self.prefill_tokens_per_s.max(1e-9)
            + self.attention_s_per_token_ctx * shape.attention_work
    }
}

/// The knobs of the mock engine's and the simulator's older flags, applied over either form
/// (`None` keeps the profile's value). Under the roofline each maps to the term it names:
/// prefill speed to `token_s`, the batch-1 decode step to the memory floor `weights_s`, the
/// per-sequence cost to `cpu_per_seq_s`, the per-context-token decode cost to `kv_s_per_token`.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Overrides {
    pub prefill_tokens_per_s: Option<f64>,
    pub decode_step_s: Option<f64>,
    pub per_seq_s: Option<f64>,
    pub decode_s_per_ctx_token: Option<f64>,
    pub attention_s_per_token_ctx: Option<f64>,
}

impl StepCost {
    /// Seconds of a step of `shape`, before the encoder and the time scale.
    pub fn seconds(&self, shape: &StepShape) -> f64 {
        match self {
            Self::Roofline(r) => r.seconds(shape),
            Self::Additive(a) => a.seconds(shape),
        }
    }

    /// Seconds per prompt token of a long prefill, without the attention: what the engine's
    /// "prefill speed" is (the encoder's cost and the simulator's oracle derive from it).
    pub fn prefill_s_per_token(&self) -> f64 {
        match self {
            Self::Roofline(r) => r.token_s,
            Self::Additive(a) => 1.0 / a.prefill_tokens_per_s.max(1e-9),
        }
    }

    /// The nominal prefill speed, tokens per second (see [`prefill_s_per_token`]).
    ///
    /// [`prefill_s_per_token`]: Self::prefill_s_per_token
    pub fn prefill_tokens_per_s(&self) -> f64 {
        1.0 / self.prefill_s_per_token().max(1e-12)
    }

    /// This cost with the older flags' values applied (see [`Overrides`]).
    pub fn with(mut self, o: &Overrides) -> Self {
        match &mut self {
            Self::Roofline(r) => {
                if let Some(v) = o.prefill_tokens_per_s {
                    r.token_s = 1.0 / v.max(1e-9);
                }
                if let Some(v) = o.per_seq_s {
                    r.cpu_per_seq_s = v.max(0.0);
                }
                if let Some(v) = o.decode_step_s {
                    // A batch-1 decode over a short context: CPU parts plus the weights.
                    r.weights_s = (v - r.cpu_s - r.cpu_per_seq_s).max(0.0);
                }
                if let Some(v) = o.decode_s_per_ctx_token {
                    r.kv_s_per_token = v.max(0.0);
                }
                if let Some(v) = o.attention_s_per_token_ctx {
                    r.attention_s_per_token_ctx = v.max(0.0);
                }
            }
            Self::Additive(a) => {
                if let Some(v) = o.prefill_tokens_per_s {
                    a.prefill_tokens_per_s = v.max(1e-9);
                }
                if let Some(v) = o.decode_step_s {
                    a.step_overhead_s = v.max(0.0);
                }
                if let Some(v) = o.per_seq_s {
                    a.per_seq_s = v.max(0.0);
                }
                if let Some(v) = o.decode_s_per_ctx_token {
                    a.decode_s_per_ctx_token = v.max(0.0);
                }
                if let Some(v) = o.attention_s_per_token_ctx {
                    a.attention_s_per_token_ctx = v.max(0.0);
                }
            }
        }
        self
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::model::profile::EngineProfile;

    fn h100() -> Roofline {
        match EngineProfile::H100_8b.step_cost() {
            StepCost::Roofline(r) => r,
            StepCost::Additive(_) => unreachable!("h100-8b is a roofline"),
        }
    }

    /// `batch` decodes of `ctx` context each, plus one prefill chunk of `chunk` tokens after
    /// `prior` cached ones (none when `chunk` is 0).
    fn mixed(batch: u32, ctx: u64, chunk: u64, prior: u64) -> StepShape {
        let n = chunk as f64;
        StepShape {
            seqs: batch + u32::from(chunk > 0),
            prefill_tokens: chunk,
            attention_work: n * (prior as f64 + n / 2.0),
            prefill_kv_tokens: if chunk > 0 { prior + chunk } else { 0 },
            decode_seqs: batch,
            decode_context_tokens: u64::from(batch) * ctx,
            ..Default::default()
        }
    }

    #[test]
    fn a_short_chunk_rides_in_a_memory_bound_decode_step_almost_free() {
        let r = h100();
        let decode = r.seconds(&mixed(32, 1024, 0, 0));
        let with_chunk = r.seconds(&mixed(32, 1024, 64, 0));
        // Only the chunk's sequence's CPU share and its KV reads are added: under 2%.
        assert!(
            with_chunk - decode < 0.02 * decode,
            "{decode} -> {with_chunk}"
        );
        // The additive model charges the chunk's whole prefill on top.
        let legacy = EngineProfile::Legacy.step_cost();
        let (d, w) = (
            legacy.seconds(&mixed(32, 1024, 0, 0)),
            legacy.seconds(&mixed(32, 1024, 64, 0)),
        );
        assert!(w - d > 0.03 * d, "{d} -> {w}");
    }

    #[test]
    fn a_long_chunk_makes_the_step_compute_bound() {
        let r = h100();
        let shape = mixed(32, 1024, 4096, 0);
        let compute = r.token_s * (4096.0 + 32.0)
            + r.attention_s_per_token_ctx * (shape.attention_work + 32.0 * 1024.0);
        let memory = r.weights_s + r.kv_s_per_token * (4096.0 + 32.0 * 1024.0);
        assert!(compute > memory);
        let cpu = r.cpu_s + r.cpu_per_seq_s * 33.0;
        assert!((r.seconds(&shape) - (cpu + compute)).abs() < 1e-12);
        // And a compute-bound step grows with the chunk: twice the tokens, about twice the time.
        let double = r.seconds(&mixed(32, 1024, 8192, 0));
        let ratio = (double - cpu) / (r.seconds(&shape) - cpu);
        assert!((2.0..2.6).contains(&ratio), "{ratio}");
    }

    #[test]
    fn decode_steps_grow_with_the_kv_they_read() {
        let r = h100();
        let short = r.seconds(&mixed(64, 128, 0, 0));
        let long = r.seconds(&mixed(64, 8192, 0, 0));
        // 64 × 8064 more KV tokens read at kv_s_per_token each, the step memory-bound.
        let expected = 64.0 * 8064.0 * r.kv_s_per_token;
        assert!(
            ((long - short) - expected).abs() < 1e-6,
            "{short} -> {long}"
        );
        // A batch-1 decode is the weights read plus the CPU part.
        let one = r.seconds(&mixed(1, 16, 0, 0));
        assert!((one - (r.cpu_s + r.cpu_per_seq_s + r.weights_s)).abs() < 1e-4);
    }

    #[test]
    fn admission_costs_only_where_the_profile_says_so() {
        let shape = StepShape {
            admitted: 1,
            admitted_prompt_tokens: 4096,
            ..mixed(0, 0, 32, 4064)
        };
        let bare = StepShape {
            admitted: 0,
            admitted_prompt_tokens: 0,
            ..shape
        };
        assert_eq!(h100().seconds(&shape), h100().seconds(&bare));
        let cpu = EngineProfile::CpuTiny.step_cost();
        assert!(cpu.seconds(&shape) > cpu.seconds(&bare) + 0.005);
    }

    #[test]
    fn overrides_set_the_term_they_name() {
        let o = Overrides {
            prefill_tokens_per_s: Some(100.0),
            decode_step_s: Some(0.020),
            ..Default::default()
        };
        let StepCost::Roofline(r) = EngineProfile::H100_8b.step_cost().with(&o) else {
            unreachable!()
        };
        assert_eq!(r.token_s, 0.01);
        let one = r.seconds(&mixed(1, 0, 0, 0));
        assert!((one - 0.020).abs() < 1e-12, "{one}");
        let StepCost::Additive(a) = EngineProfile::Legacy.step_cost().with(&o) else {
            unreachable!()
        };
        assert_eq!((a.prefill_tokens_per_s, a.step_overhead_s), (100.0, 0.020));
        assert_eq!(
            EngineProfile::Legacy
                .step_cost()
                .with(&Overrides::default()),
            EngineProfile::Legacy.step_cost()
        );
    }
}
