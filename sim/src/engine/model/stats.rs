//! Counters and histograms the engine keeps, with vLLM's semantics.

use std::time::Duration;

/// Bucket upper bounds of `vllm:time_to_first_token_seconds` (vLLM V1's).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// Bucket upper bounds of `vllm:e2e_request_latency_seconds` and of the request phase
/// histograms such as `vllm:request_prefill_time_seconds` (vLLM V1's request latency buckets).
pub const E2E_BUCKETS: [f64; 19] = [
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0, 240.0,
    480.0, 960.0,
];

/// A cumulative histogram with fixed bucket bounds (Prometheus semantics).
#[derive(Debug, Clone, PartialEq)]
pub struct Histogram {
    bounds: &'static [f64],
    counts: Vec<u64>,
    sum: f64,
    count: u64,
}

impl Histogram {
    /// An empty histogram over `bounds` (ascending; `+Inf` is implicit).
    pub fn new(bounds: &'static [f64]) -> Self {
        Self {
            bounds,
            counts: vec![0; bounds.len()],
            sum: 0.0,
            count: 0,
        }
    }

    /// Records one observation.
    pub fn observe(&mut self, v: f64) {
        if let Some(i) = self.bounds.iter().position(|&b| v <= b) {
            self.counts[i] += 1;
        }
        self.sum += v;
        self.count += 1;
    }

    /// `(upper bound, cumulative count)` per finite bucket.
    pub fn cumulative(&self) -> impl Iterator<Item = (f64, u64)> + '_ {
        let mut acc = 0;
        self.bounds.iter().zip(&self.counts).map(move |(&b, &c)| {
            acc += c;
            (b, acc)
        })
    }

    /// Sum of all observations.
    pub fn sum(&self) -> f64 {
        self.sum
    }

    /// Number of observations (the `+Inf` bucket).
    pub fn count(&self) -> u64 {
        self.count
    }
}

/// Why a request finished (vLLM's `finished_reason` label values).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FinishReason {
    /// The model stopped on its own (end of sequence).
    Stop,
    /// `max_tokens` was reached.
    Length,
    /// The client went away or the request was aborted.
    Abort,
    /// The engine failed the request (a decode leg whose KV pull failed, under the `fail`
    /// policy).
    Error,
}

impl FinishReason {
    /// The OpenAI / vLLM string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
            FinishReason::Error => "error",
        }
    }

    /// Every reason, in `vllm:request_success` label order.
    pub const ALL: [FinishReason; 4] = [
        FinishReason::Stop,
        FinishReason::Length,
        FinishReason::Abort,
        FinishReason::Error,
    ];
}

/// Prompt tokens by where their KV came from (vLLM's `PromptTokenStats`), counted when a
/// request's prefill produces its first token.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct PromptTokenSources {
    /// Computed by this engine (`source="local_compute"`).
    pub local_compute: u64,
    /// Found in this engine's prefix cache (`source="local_cache_hit"`).
    pub local_cache_hit: u64,
    /// Pulled from a prefill engine (`source="external_kv_transfer"`).
    pub external_kv_transfer: u64,
    /// Cached tokens, local and external (`vllm:prompt_tokens_cached`).
    pub cached: u64,
    /// Cached tokens recomputed anyway, the last prompt token (`vllm:prompt_tokens_recomputed`).
    pub recomputed: u64,
}

impl PromptTokenSources {
    /// Counts one prefill, with vLLM's arithmetic (`PromptTokenStats.update_from_output`):
    /// when all but one prompt token were cached, that one is taken to be a cached token the
    /// scheduler recomputed, so it counts as a hit as well as computed.
    pub fn count(&mut self, prompt_len: u64, cached: u64, external: u64) {
        let recomputed = u64::from(cached + 1 == prompt_len);
        self.local_compute += prompt_len - cached;
        self.external_kv_transfer += external;
        self.local_cache_hit += (cached + recomputed).saturating_sub(external);
        self.cached += cached;
        self.recomputed += recomputed;
    }
}

/// Cumulative engine statistics, as exposed on `/metrics`.
#[derive(Debug, Clone, PartialEq)]
pub struct EngineStats {
    /// Prompt tokens looked up in the prefix cache (`vllm:prefix_cache_queries`).
    pub prefix_cache_queries: u64,
    /// Prompt tokens found in the prefix cache (`vllm:prefix_cache_hits`).
    pub prefix_cache_hits: u64,
    /// Requests preempted for lack of KV blocks (`vllm:num_preemptions`).
    pub num_preemptions: u64,
    /// Prompt tokens of requests that had their first token (`vllm:prompt_tokens`).
    pub prompt_tokens: u64,
    /// Generated tokens (`vllm:generation_tokens`).
    pub generation_tokens: u64,
    /// Finished requests by reason, in [`FinishReason::ALL`] order (`vllm:request_success`).
    pub finished: [u64; 4],
    /// Prompt tokens by source (`vllm:prompt_tokens_by_source`).
    pub prompt_sources: PromptTokenSources,
    /// Prompt tokens a decode leg looked up beyond its local hit
    /// (`vllm:external_prefix_cache_queries`).
    pub external_prefix_cache_queries: u64,
    /// Of those, tokens the prefill engine offered (`vllm:external_prefix_cache_hits`).
    pub external_prefix_cache_hits: u64,
    /// Prefill legs whose lease ran out before a decode engine read them
    /// (`vllm:nixl_num_kv_expired_reqs`).
    pub kv_expired_reqs: u64,
    /// Placeholder tokens of the media items the encoder ran over (items not wholly cached at
    /// admission). The mock's own counter; vLLM exports no such metric.
    pub media_encoder_tokens: u64,
    /// Time to first token, seconds.
    pub ttft: Histogram,
    /// From a request's first scheduling to its first token, seconds
    /// (`vllm:request_prefill_time_seconds`): its TTFT without the time it queued, what the
    /// sidecar measures the engine's prefill speed by.
    pub prefill_time: Histogram,
    /// End-to-end latency of finished requests, seconds.
    pub e2e: Histogram,
    /// `vllm:lora_requests_info`: the label sets recorded at step ends, each with the time
    /// it was last recorded, oldest first (empty when LoRA is off).
    pub lora_info: Vec<LoraInfoSample>,
}

/// One label set of `vllm:lora_requests_info` and when an engine step last reported it. vLLM
/// sets the gauge to the current time under the step's labels, and `prometheus_client` keeps
/// every label set it was ever given, so the newest value marks the current state.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoraInfoSample {
    /// Adapters with running requests, comma-separated.
    pub running: String,
    /// Adapters with waiting requests, comma-separated.
    pub waiting: String,
    /// When a step last ended with these labels.
    pub at: Duration,
}

/// Label sets of `vllm:lora_requests_info` kept: vLLM keeps all of them for the life of the
/// process; the mock keeps the most recent ones so that a long run stays bounded.
pub const LORA_INFO_SERIES: usize = 64;

impl Default for EngineStats {
    fn default() -> Self {
        Self {
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            num_preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            finished: [0; 4],
            prompt_sources: PromptTokenSources::default(),
            external_prefix_cache_queries: 0,
            external_prefix_cache_hits: 0,
            kv_expired_reqs: 0,
            media_encoder_tokens: 0,
            ttft: Histogram::new(&TTFT_BUCKETS),
            prefill_time: Histogram::new(&E2E_BUCKETS),
            e2e: Histogram::new(&E2E_BUCKETS),
            lora_info: Vec::new(),
        }
    }
}

impl EngineStats {
    /// Counts a finished request.
    pub fn count_finished(&mut self, reason: FinishReason) {
        let i = match reason {
            FinishReason::Stop => 0,
            FinishReason::Length => 1,
            FinishReason::Abort => 2,
            FinishReason::Error => 3,
        };
        self.finished[i] += 1;
    }

    /// Records a step's `vllm:lora_requests_info` labels at `at`, keeping the label sets in
    /// order of their last recording and at most [`LORA_INFO_SERIES`] of them.
    pub fn record_lora_info(&mut self, running: String, waiting: String, at: Duration) {
        let series = &mut self.lora_info;
        if let Some(last) = series.last_mut()
            && last.running == running
            && last.waiting == waiting
        {
            last.at = at;
            return;
        }
        series.retain(|s| s.running != running || s.waiting != waiting);
        if series.len() >= LORA_INFO_SERIES {
            series.remove(0);
        }
        series.push(LoraInfoSample {
            running,
            waiting,
            at,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prompt_sources_follow_vllm_arithmetic() {
        let mut s = PromptTokenSources::default();
        // A decode leg of 2048 tokens that pulled all of it: 2047 cached, the last recomputed.
        s.count(2048, 2047, 2048);
        assert_eq!(
            (s.local_compute, s.local_cache_hit, s.external_kv_transfer),
            (1, 0, 2048)
        );
        // A local request of 100 tokens with 64 cached.
        s.count(100, 64, 0);
        assert_eq!((s.local_compute, s.local_cache_hit), (37, 64));
        assert_eq!((s.cached, s.recomputed), (2047 + 64, 1));
    }

    #[test]
    fn histogram_is_cumulative() {
        let mut h = Histogram::new(&TTFT_BUCKETS);
        h.observe(0.003);
        h.observe(0.5);
        h.observe(10_000.0);
        let c: Vec<_> = h.cumulative().collect();
        assert_eq!(c[0], (0.001, 0));
        assert_eq!(c[1], (0.005, 1));
        assert_eq!(c[9].1, 2);
        assert_eq!(c.last().unwrap().1, 2);
        assert_eq!(h.count(), 3);
        assert!((h.sum() - 10_000.503).abs() < 1e-9);
    }
}
