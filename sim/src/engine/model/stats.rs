//! Counters and histograms the engine keeps, with vLLM's semantics.

/// Bucket upper bounds of `vllm:time_to_first_token_seconds` (vLLM V1's).
pub const TTFT_BUCKETS: [f64; 22] = [
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
];

/// Bucket upper bounds of `vllm:e2e_request_latency_seconds` (vLLM V1's).
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
}

impl FinishReason {
    /// The OpenAI / vLLM string.
    pub fn as_str(self) -> &'static str {
        match self {
            FinishReason::Stop => "stop",
            FinishReason::Length => "length",
            FinishReason::Abort => "abort",
        }
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
    /// Prompt tokens of finished requests (`vllm:prompt_tokens`).
    pub prompt_tokens: u64,
    /// Generated tokens (`vllm:generation_tokens`).
    pub generation_tokens: u64,
    /// Finished requests by reason: stop, length, abort (`vllm:request_success`).
    pub finished: [u64; 3],
    /// Time to first token, seconds.
    pub ttft: Histogram,
    /// End-to-end latency of finished requests, seconds.
    pub e2e: Histogram,
}

impl Default for EngineStats {
    fn default() -> Self {
        Self {
            prefix_cache_queries: 0,
            prefix_cache_hits: 0,
            num_preemptions: 0,
            prompt_tokens: 0,
            generation_tokens: 0,
            finished: [0; 3],
            ttft: Histogram::new(&TTFT_BUCKETS),
            e2e: Histogram::new(&E2E_BUCKETS),
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
        };
        self.finished[i] += 1;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
