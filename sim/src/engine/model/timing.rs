//! How long a model step takes, and the other modelled durations.
//!
//! A step is one forward pass over a batch (vLLM V1 mixes prefill chunks and decodes in one
//! step). Its duration is the [`StepCost`] of its [`StepShape`] (the roofline of
//! [`super::step_cost`], or the additive model kvmesh used before), plus
//! `encoder · encoder_tokens`, all multiplied by `time_scale` (1.0 = real time; 0.1 = ten
//! times faster). The encoder term is the multimodal encoder (a ViT) run over the media items a
//! request admitted in this step does not find cached: vLLM skips the encoder for an item whose
//! KV is all in the prefix cache. Placeholder tokens are prompt tokens besides, so media pays
//! prefill and attention like text. `instant` makes every step take zero time (the bookkeeping
//! still runs). A KV transfer for a disaggregated decode costs `kv_transfer_s_per_block` per
//! block pulled, and the first contact between a decode engine and a prefill engine a handshake
//! of `kv_handshake_s`; loading a LoRA adapter into a GPU slot costs `lora_load_s`.

use std::time::Duration;

use super::profile::EngineProfile;
use super::step_cost::StepCost;
pub use super::step_cost::StepShape;

/// Parameters of the timing model; see the module docs for the formula.
#[derive(Debug, Clone, PartialEq)]
pub struct TimingModel {
    /// Duration of a step from its shape.
    pub step: StepCost,
    /// Modelled KV transfer time per block pulled from a prefill engine, seconds.
    pub kv_transfer_s_per_block: f64,
    /// Modelled handshake of a decode engine with a prefill engine it has not met, seconds.
    pub kv_handshake_s: f64,
    /// Modelled time to load one LoRA adapter into a GPU slot, seconds.
    pub lora_load_s: f64,
    /// Multimodal encoder time per placeholder token of a media item it encodes, seconds.
    pub encoder_s_per_media_token: f64,
    /// Multiplier applied to every modelled duration.
    pub time_scale: f64,
    /// Zero modelled time for everything.
    pub instant: bool,
}

impl Default for TimingModel {
    /// The default profile's engine ([`EngineProfile::default`]).
    fn default() -> Self {
        Self::of(EngineProfile::default().step_cost())
    }
}

impl TimingModel {
    /// An engine whose steps cost `step`, with the mock engine's other defaults.
    pub fn of(step: StepCost) -> Self {
        Self {
            step,
            // 2 MiB blocks (16 tokens of an 8B model's KV) at 10 GB/s.
            kv_transfer_s_per_block: 0.000_21,
            // The NIXL handshake llm-d reports (~5 s per pair: agent metadata exchange).
            kv_handshake_s: 5.0,
            // A rank-16 adapter of an 8B model (tens of MB) read and copied to the GPU.
            lora_load_s: 0.1,
            encoder_s_per_media_token: encoder_s_per_media_token(step.prefill_tokens_per_s()),
            time_scale: 1.0,
            instant: false,
        }
    }

    /// The engine's nominal prefill speed, tokens per second ([`StepCost::prefill_tokens_per_s`]).
    pub fn prefill_tokens_per_s(&self) -> f64 {
        self.step.prefill_tokens_per_s()
    }
}

/// The encoder's share of the prefill cost of a token: see [`encoder_s_per_media_token`].
pub const ENCODER_FRACTION_OF_PREFILL: f64 = 1.0 / 3.0;

/// The default encoder cost per media token for an engine prefilling `prefill_tokens_per_s`.
///
/// Why a third of a prefill token: in a Qwen2-VL-style model one media token is 2×2 ViT patches
/// merged, and the 7B model's ViT has ~0.68B parameters, so encoding one token runs about
/// 4 × 0.68 ≈ 2.7B parameter-passes against the language model's ~7.6B per prefilled token:
/// roughly a third of the FLOPs (the ViT's own attention is windowed and short). At the legacy
/// 12,000 prefill tokens per second that is ~28 µs per media token, ~7 ms for a 256-token image.
pub fn encoder_s_per_media_token(prefill_tokens_per_s: f64) -> f64 {
    ENCODER_FRACTION_OF_PREFILL / prefill_tokens_per_s.max(1e-9)
}

impl TimingModel {
    /// Duration of a step of the given shape.
    pub fn step_duration(&self, shape: &StepShape) -> Duration {
        if self.instant || shape.seqs == 0 {
            return Duration::ZERO;
        }
        let s =
            self.step.seconds(shape) + self.encoder_s_per_media_token * shape.encoder_tokens as f64;
        scaled(s * self.time_scale)
    }

    /// Duration of pulling `blocks` KV blocks from a remote prefill engine.
    pub fn transfer_duration(&self, blocks: usize) -> Duration {
        if self.instant {
            return Duration::ZERO;
        }
        scaled(self.kv_transfer_s_per_block * blocks as f64 * self.time_scale)
    }

    /// Duration of a decode engine's first handshake with a prefill engine.
    pub fn handshake_duration(&self) -> Duration {
        if self.instant {
            return Duration::ZERO;
        }
        scaled(self.kv_handshake_s * self.time_scale)
    }

    /// Duration of loading one LoRA adapter into a GPU slot.
    pub fn lora_load_duration(&self) -> Duration {
        if self.instant {
            return Duration::ZERO;
        }
        scaled(self.lora_load_s * self.time_scale)
    }
}

fn scaled(seconds: f64) -> Duration {
    Duration::from_secs_f64(seconds.max(0.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefill_dominates_long_prompts_and_scale_applies() {
        let t = TimingModel::default();
        let small = StepShape {
            seqs: 1,
            prefill_tokens: 16,
            attention_work: 16.0 * 8.0,
            ..Default::default()
        };
        let big = StepShape {
            seqs: 1,
            prefill_tokens: 4096,
            attention_work: 4096.0 * 2048.0,
            ..Default::default()
        };
        assert!(t.step_duration(&big) > t.step_duration(&small) * 10);
        let fast = TimingModel {
            time_scale: 0.1,
            ..t.clone()
        };
        let ratio = t.step_duration(&big).as_secs_f64() / fast.step_duration(&big).as_secs_f64();
        assert!((ratio - 10.0).abs() < 1e-6);
        let instant = TimingModel {
            instant: true,
            ..t.clone()
        };
        assert_eq!(instant.step_duration(&big), Duration::ZERO);
        assert_eq!(t.step_duration(&StepShape::default()), Duration::ZERO);
    }

    #[test]
    fn decode_step_grows_with_batch() {
        let t = TimingModel::default();
        let one = StepShape {
            seqs: 1,
            ..Default::default()
        };
        let many = StepShape {
            seqs: 128,
            ..Default::default()
        };
        assert!(t.step_duration(&many) > t.step_duration(&one));
    }

    #[test]
    fn encoder_tokens_add_their_cost() {
        let t = TimingModel::default();
        let text = StepShape {
            seqs: 1,
            prefill_tokens: 256,
            ..Default::default()
        };
        let image = StepShape {
            encoder_tokens: 256,
            ..text
        };
        let extra = t.step_duration(&image) - t.step_duration(&text);
        // A third of the profile's prefill cost per token (see encoder_s_per_media_token).
        let expected = 256.0 * t.step.prefill_s_per_token() / 3.0;
        assert!((extra.as_secs_f64() - expected).abs() < 1e-6, "{extra:?}");
    }
}
