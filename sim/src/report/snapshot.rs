//! One engine's `/metrics` at one instant: the gauges and counters the report charts.
//!
//! The load generator's own scrape (`load::scrape`) keeps only the three counters its report
//! needs, before and after a run; the report also wants queue depth over time and the
//! engine-side TTFT histogram. Both read the text with the protocol's `engine_metrics`.

use kvmesh_protocol::engine_metrics;
use serde::{Deserialize, Serialize};

/// What the report keeps of one engine's exposition.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct EngineSnapshot {
    /// `vllm:num_requests_running`.
    pub running: f64,
    /// `vllm:num_requests_waiting`.
    pub waiting: f64,
    /// `vllm:kv_cache_usage_perc` (0..1).
    pub kv_usage: f64,
    /// `vllm:request_success_total`, all finish reasons.
    pub requests: f64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub hits: f64,
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub queries: f64,
    /// Cumulative `vllm:time_to_first_token_seconds` buckets: (upper bound, count), ascending,
    /// without `+Inf`.
    pub ttft_buckets: Vec<(f64, f64)>,
    /// `vllm:time_to_first_token_seconds_count`.
    pub ttft_count: f64,
}

/// Reads the series the report needs with the shared vLLM parser, summed over label sets
/// (engines of a DP group, finish reasons); `kv_usage` is the engines' mean.
pub fn parse(text: &str) -> EngineSnapshot {
    let m = engine_metrics::parse(text);
    EngineSnapshot {
        running: m.running,
        waiting: m.waiting,
        kv_usage: m.kv_usage,
        requests: m.requests,
        hits: m.prefix_hits,
        queries: m.prefix_queries,
        ttft_buckets: m.ttft_buckets,
        ttft_count: m.ttft_count,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const TEXT: &str = "# HELP vllm:num_requests_running Number of requests.\n\
        # TYPE vllm:num_requests_running gauge\n\
        vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 3.0\n\
        vllm:num_requests_waiting{model_name=\"m\",engine=\"0\"} 2.0\n\
        vllm:kv_cache_usage_perc{model_name=\"m\",engine=\"0\"} 0.25\n\
        vllm:prefix_cache_queries_total{model_name=\"m\",engine=\"0\"} 400.0\n\
        vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 300.0\n\
        vllm:request_success_total{model_name=\"m\",engine=\"0\",finished_reason=\"stop\"} 4.0\n\
        vllm:request_success_total{model_name=\"m\",engine=\"0\",finished_reason=\"length\"} 6.0\n\
        vllm:time_to_first_token_seconds_bucket{model_name=\"a \\\"b\\\"\",engine=\"0\",le=\"0.1\"} 5.0\n\
        vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"0.01\"} 1.0\n\
        vllm:time_to_first_token_seconds_bucket{model_name=\"m\",engine=\"0\",le=\"+Inf\"} 10.0\n\
        vllm:time_to_first_token_seconds_count{model_name=\"m\",engine=\"0\"} 10.0\n";

    #[test]
    fn reads_gauges_counters_and_sorted_buckets() {
        let s = parse(TEXT);
        assert_eq!(s.running, 3.0);
        assert_eq!(s.waiting, 2.0);
        assert_eq!(s.kv_usage, 0.25);
        assert_eq!(s.queries, 400.0);
        assert_eq!(s.hits, 300.0);
        assert_eq!(s.requests, 10.0);
        assert_eq!(s.ttft_buckets, vec![(0.01, 1.0), (0.1, 5.0)]);
        assert_eq!(s.ttft_count, 10.0);
    }

    #[test]
    fn falls_back_to_old_prefix_cache_names() {
        let s = parse(
            "vllm:gpu_prefix_cache_hits_total{engine=\"0\"} 7\nvllm:gpu_prefix_cache_queries_total 9\n",
        );
        assert_eq!((s.hits, s.queries), (7.0, 9.0));
    }

    #[test]
    fn garbage_lines_are_skipped() {
        let s =
            parse("vllm:num_requests_running{oops 1\nnot a metric\nvllm:num_requests_waiting x\n");
        assert_eq!(s, EngineSnapshot::default());
    }
}
