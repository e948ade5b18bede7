//! Prefill/decode disaggregation in a simulated cluster: which engines prefill, when a
//! request is split, and when its decode engine is chosen.
//!
//! kvmesh's decision is the protocol's (`EntryState::route_pd`, `route_decode`,
//! `record_pair`); the centralized baselines split every request and pick each leg's engine
//! by their own rule. The legs and the transfer run in [`super::cluster`] on the engine
//! model's NixlConnector (a prefill leg holds its blocks until pulled, a decode leg waits for
//! its pull).

use kvmesh_protocol::route::PdConfig;

/// When a disaggregated request's decode engine is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum DecodeChoice {
    /// When the prefill leg answers, on the load known then (runtime redirection; vLLM's toy
    /// proxy, Dynamo's NIXL path, llm-d's coordinator).
    PrefillEnd,
    /// With the prefill engine, when the request arrives (vllm-router, the SGLang gateway,
    /// llm-d's sidecar): the decode leg waits for the prefill with its engine already chosen.
    Arrival,
}

/// Which requests are disaggregated.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum SplitRule {
    /// `PdConfig`'s rule: split when the uncached prompt is long enough and a prefill engine
    /// is not busy (pd-skip-short, pd-skip-busy otherwise).
    Skip,
    /// Every request (a fixed split, as the proxies that always disaggregate).
    Always,
}

/// A cluster's disaggregation: nodes `0..prefill_nodes` prefill, the others decode.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct PdSetup {
    pub prefill_nodes: usize,
    pub config: PdConfig,
    pub decode_choice: DecodeChoice,
}

impl PdSetup {
    /// `config` as `split` makes it: a fixed split disaggregates whatever the prompt's length
    /// and the prefill engines' queues.
    pub fn new(
        prefill_nodes: usize,
        config: PdConfig,
        split: SplitRule,
        decode_choice: DecodeChoice,
    ) -> Self {
        let config = match split {
            SplitRule::Skip => config,
            SplitRule::Always => PdConfig {
                min_uncached_tokens: 0,
                max_prefill_wait_ms: u64::MAX,
                ..config
            },
        };
        Self {
            prefill_nodes,
            config,
            decode_choice,
        }
    }
}

/// The latency objectives goodput counts requests against (DistServe's definition: a request
/// counts when its TTFT and its mean time per output token both meet theirs).
#[derive(Debug, Clone, Copy, PartialEq, serde::Serialize)]
pub struct Slo {
    pub ttft_s: f64,
    /// Mean gap between output tokens (TPOT), seconds.
    pub itl_s: f64,
}

impl Slo {
    /// Whether a request with this TTFT, time from first to last token and output length meets
    /// both objectives (a one-token answer has no gap to judge).
    pub fn met(&self, ttft_s: f64, decode_s: f64, output_tokens: u32) -> bool {
        let tpot = match output_tokens {
            0 | 1 => 0.0,
            n => decode_s / f64::from(n - 1),
        };
        ttft_s <= self.ttft_s && tpot <= self.itl_s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_fixed_split_lifts_both_skip_rules_and_keeps_the_rest() {
        let base = PdConfig {
            warm_margin: 7,
            ..PdConfig::default()
        };
        let fixed = PdSetup::new(4, base, SplitRule::Always, DecodeChoice::Arrival).config;
        assert_eq!(
            (
                fixed.min_uncached_tokens,
                fixed.max_prefill_wait_ms,
                fixed.warm_margin
            ),
            (0, u64::MAX, 7)
        );
        let skip = PdSetup::new(4, base, SplitRule::Skip, DecodeChoice::PrefillEnd).config;
        assert_eq!(skip, base);
    }

    #[test]
    fn goodput_needs_both_objectives() {
        let slo = Slo {
            ttft_s: 1.0,
            itl_s: 0.05,
        };
        assert!(slo.met(0.9, 0.4, 11), "40 ms per token");
        assert!(!slo.met(1.1, 0.4, 11), "TTFT missed");
        assert!(!slo.met(0.9, 0.6, 11), "60 ms per token");
        assert!(slo.met(0.9, 0.0, 1), "one token: no gap");
    }
}
