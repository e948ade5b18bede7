//! `/metrics` in the Prometheus text format (0.0.4), with vLLM's series, labels and help texts.
//!
//! Written by hand rather than through a client library so that the output matches what
//! vLLM's Python `prometheus_client` emits: colons in names, `_total` on counter samples and on
//! their `# TYPE` line, labels in vLLM's order (`model_name`, `engine`, then any extra), and
//! float values (`1.0`).

use std::fmt::Write;

use crate::engine::model::{EngineGauges, EngineStats, FinishReason, Histogram};
use crate::engine::nixl::stats::TransferStats;

/// Content type of the exposition.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// What the exposition needs besides the engine state.
#[derive(Debug, Clone)]
pub struct MetricsLabels {
    /// Served model name (the first `--model`).
    pub model_name: String,
    /// The `engine` label value.
    pub engine: String,
    /// Tokens per block.
    pub block_size: u32,
    /// KV capacity in blocks.
    pub num_gpu_blocks: u32,
}

/// Renders the exposition; `transfers` (the NIXL connector's, when configured) adds vLLM's
/// `vllm:nixl_*` series.
pub fn render(
    labels: &MetricsLabels,
    gauges: &EngineGauges,
    stats: &EngineStats,
    transfers: Option<&TransferStats>,
) -> String {
    let mut out = String::with_capacity(8 * 1024);
    let base = format!(
        "model_name=\"{}\",engine=\"{}\"",
        escape(&labels.model_name),
        escape(&labels.engine)
    );
    let gauge = |out: &mut String, name: &str, help: &str, v: f64| {
        header(out, name, help, "gauge");
        sample(out, name, &base, v);
    };
    let counter = |out: &mut String, name: &str, help: &str, v: u64| {
        let name = format!("{name}_total");
        header(out, &name, help, "counter");
        sample(out, &name, &base, v as f64);
    };
    gauge(
        &mut out,
        "vllm:num_requests_running",
        "Number of requests in model execution batches.",
        gauges.running as f64,
    );
    gauge(
        &mut out,
        "vllm:num_requests_waiting",
        "Number of requests waiting to be processed.",
        gauges.waiting as f64,
    );
    gauge(
        &mut out,
        "vllm:kv_cache_usage_perc",
        "KV-cache usage. 1 means 100 percent usage.",
        gauges.kv_usage,
    );
    counter(
        &mut out,
        "vllm:num_preemptions",
        "Cumulative number of preemption from the engine.",
        stats.num_preemptions,
    );
    counter(
        &mut out,
        "vllm:prefix_cache_queries",
        "Prefix cache queries, in terms of number of queried tokens.",
        stats.prefix_cache_queries,
    );
    counter(
        &mut out,
        "vllm:prefix_cache_hits",
        "Prefix cache hits, in terms of number of cached tokens.",
        stats.prefix_cache_hits,
    );
    counter(
        &mut out,
        "vllm:external_prefix_cache_queries",
        "External prefix cache queries from KV connector cross-instance cache sharing, \
         in terms of number of queried tokens.",
        stats.external_prefix_cache_queries,
    );
    counter(
        &mut out,
        "vllm:external_prefix_cache_hits",
        "External prefix cache hits from KV connector cross-instance cache sharing, \
         in terms of number of cached tokens.",
        stats.external_prefix_cache_hits,
    );
    counter(
        &mut out,
        "vllm:prompt_tokens",
        "Number of prefill tokens processed.",
        stats.prompt_tokens,
    );
    header(
        &mut out,
        "vllm:prompt_tokens_by_source_total",
        "Number of prompt tokens by source.",
        "counter",
    );
    let sources = &stats.prompt_sources;
    for (source, n) in [
        ("local_compute", sources.local_compute),
        ("local_cache_hit", sources.local_cache_hit),
        ("external_kv_transfer", sources.external_kv_transfer),
    ] {
        let l = format!("{base},source=\"{source}\"");
        sample(&mut out, "vllm:prompt_tokens_by_source_total", &l, n as f64);
    }
    counter(
        &mut out,
        "vllm:prompt_tokens_cached",
        "Number of cached prompt tokens (local + external).",
        sources.cached,
    );
    counter(
        &mut out,
        "vllm:prompt_tokens_recomputed",
        "Number of cached tokens recomputed for forward pass.",
        sources.recomputed,
    );
    counter(
        &mut out,
        "vllm:generation_tokens",
        "Number of generation tokens processed.",
        stats.generation_tokens,
    );
    header(
        &mut out,
        "vllm:request_success_total",
        "Count of successfully processed requests.",
        "counter",
    );
    for (reason, n) in FinishReason::ALL.iter().zip(stats.finished) {
        let l = format!("{base},finished_reason=\"{}\"", reason.as_str());
        sample(&mut out, "vllm:request_success_total", &l, n as f64);
    }
    histogram(
        &mut out,
        "vllm:time_to_first_token_seconds",
        "Histogram of time to first token in seconds.",
        &base,
        &stats.ttft,
    );
    histogram(
        &mut out,
        "vllm:e2e_request_latency_seconds",
        "Histogram of e2e request latency in seconds.",
        &base,
        &stats.e2e,
    );
    header(
        &mut out,
        "vllm:cache_config_info",
        "Information of the LLMEngine CacheConfig",
        "gauge",
    );
    let info = format!(
        "block_size=\"{}\",cache_dtype=\"auto\",enable_prefix_caching=\"True\",\
         engine=\"{}\",model_name=\"{}\",num_cpu_blocks=\"None\",num_gpu_blocks=\"{}\",\
         prefix_caching_hash_algo=\"blake3\"",
        labels.block_size,
        escape(&labels.engine),
        escape(&labels.model_name),
        labels.num_gpu_blocks
    );
    sample(&mut out, "vllm:cache_config_info", &info, 1.0);
    if let Some(t) = transfers {
        nixl(&mut out, &base, t, stats.kv_expired_reqs);
    }
    out
}

/// vLLM's `NixlPromMetrics` families.
fn nixl(out: &mut String, base: &str, t: &TransferStats, kv_expired_reqs: u64) {
    let histograms = [
        (
            "vllm:nixl_xfer_time_seconds",
            "Histogram of transfer duration for NIXL KV Cache transfers.",
            &t.xfer_time,
        ),
        (
            "vllm:nixl_post_time_seconds",
            "Histogram of transfer post time for NIXL KV Cache transfers.",
            &t.post_time,
        ),
        (
            "vllm:nixl_bytes_transferred",
            "Histogram of bytes transferred per NIXL KV Cache transfers.",
            &t.bytes,
        ),
        (
            "vllm:nixl_num_descriptors",
            "Histogram of number of descriptors per NIXL  KV Cache transfers.",
            &t.descriptors,
        ),
    ];
    for (name, help, h) in histograms {
        histogram(out, name, help, base, h);
    }
    let counters = [
        (
            "vllm:nixl_num_failed_transfers_total",
            "Number of failed NIXL KV Cache transfers.",
            t.failed_transfers,
        ),
        (
            "vllm:nixl_num_failed_notifications_total",
            "Number of failed NIXL KV Cache notifications.",
            t.failed_notifications,
        ),
        (
            "vllm:nixl_num_kv_expired_reqs_total",
            "Number of requests that had their KV expire. NOTE: This metric is tracked on \
             the P instance.",
            kv_expired_reqs,
        ),
    ];
    for (name, help, v) in counters {
        header(out, name, help, "counter");
        sample(out, name, base, v as f64);
    }
}

fn header(out: &mut String, name: &str, help: &str, kind: &str) {
    let _ = writeln!(out, "# HELP {name} {help}");
    let _ = writeln!(out, "# TYPE {name} {kind}");
}

fn sample(out: &mut String, name: &str, labels: &str, v: f64) {
    let _ = writeln!(out, "{name}{{{labels}}} {}", float(v));
}

fn histogram(out: &mut String, name: &str, help: &str, base: &str, h: &Histogram) {
    header(out, name, help, "histogram");
    for (le, n) in h.cumulative() {
        let _ = writeln!(
            out,
            "{name}_bucket{{{base},le=\"{}\"}} {}",
            float(le),
            float(n as f64)
        );
    }
    let _ = writeln!(
        out,
        "{name}_bucket{{{base},le=\"+Inf\"}} {}",
        float(h.count() as f64)
    );
    let _ = writeln!(out, "{name}_count{{{base}}} {}", float(h.count() as f64));
    let _ = writeln!(out, "{name}_sum{{{base}}} {}", float(h.sum()));
}

/// Python's `repr(float)` for the values we emit (`0.0`, `1.0`, `0.001`, `+Inf`).
fn float(v: f64) -> String {
    if v.is_infinite() {
        return if v > 0.0 {
            "+Inf".into()
        } else {
            "-Inf".into()
        };
    }
    if v.is_nan() {
        return "NaN".into();
    }
    format!("{v:?}")
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_carry_total_and_labels_come_in_vllm_order() {
        let labels = MetricsLabels {
            model_name: "m".into(),
            engine: "0".into(),
            block_size: 16,
            num_gpu_blocks: 100,
        };
        let g = EngineGauges {
            running: 2,
            waiting: 1,
            kv_usage: 0.5,
        };
        let stats = EngineStats {
            prefix_cache_hits: 32,
            ..Default::default()
        };
        let text = render(&labels, &g, &stats, None);
        assert!(text.contains("# TYPE vllm:prefix_cache_hits_total counter\n"));
        assert!(
            text.contains("vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 32.0\n")
        );
        assert!(text.contains("vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 2.0\n"));
        assert!(text.contains("le=\"+Inf\"} 0.0\n"));
        assert!(text.contains("num_gpu_blocks=\"100\""));
    }
}
