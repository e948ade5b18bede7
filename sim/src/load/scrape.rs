//! Reading the counters the report needs from an engine's `/metrics`.

use kvmesh_protocol::engine_metrics;

use super::client::LoadClient;

/// Counters of one engine at one instant (summed over `engine` and other labels).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct EngineCounters {
    /// `vllm:prefix_cache_queries_total` (tokens).
    pub prefix_cache_queries: f64,
    /// `vllm:prefix_cache_hits_total` (tokens).
    pub prefix_cache_hits: f64,
    /// `vllm:request_success_total`, all finish reasons but `abort`.
    pub requests: f64,
    /// `vllm:request_success_total{finished_reason="abort"}`.
    pub aborted: f64,
}

/// Extracts the counters from a Prometheus text exposition (the shared vLLM parser, which
/// falls back to the names vLLM used before 0.12 when the current ones are absent).
pub fn parse_counters(text: &str) -> EngineCounters {
    let m = engine_metrics::parse(text);
    EngineCounters {
        prefix_cache_queries: m.prefix_queries,
        prefix_cache_hits: m.prefix_hits,
        requests: m.requests - m.aborted,
        aborted: m.aborted,
    }
}

/// Scrapes `base_url/metrics`.
pub async fn scrape(client: &LoadClient, base_url: &str) -> Result<EngineCounters, String> {
    let url = format!("{}/metrics", base_url.trim_end_matches('/'));
    let (status, text) = client.get_text(&url).await?;
    if !status.is_success() {
        return Err(format!("GET {url}: HTTP {status}"));
    }
    Ok(parse_counters(&text))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sums_series_and_falls_back_to_old_names() {
        let text = "# TYPE vllm:prefix_cache_hits_total counter\n\
            vllm:prefix_cache_hits_total{model_name=\"a b\",engine=\"0\"} 10.0\n\
            vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"1\"} 5\n\
            vllm:prefix_cache_hits_created{engine=\"0\"} 17.0\n\
            vllm:gpu_prefix_cache_queries_total{engine=\"0\"} 40.0\n\
            vllm:request_success_total{finished_reason=\"stop\"} 2.0\n\
            vllm:request_success_total{finished_reason=\"length\"} 3.0\n\
            vllm:request_success_total{finished_reason=\"abort\"} 4.0\n";
        let c = parse_counters(text);
        assert_eq!(c.prefix_cache_hits, 15.0);
        assert_eq!(c.prefix_cache_queries, 40.0);
        assert_eq!(c.requests, 5.0, "aborted requests are not finished ones");
        assert_eq!(c.aborted, 4.0);
    }
}
