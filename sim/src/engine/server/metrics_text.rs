//! `/metrics` in the Prometheus text format (0.0.4), with vLLM's series, labels and help texts.
//!
//! Written by hand rather than through a client library so that the output matches what
//! vLLM's Python `prometheus_client` emits: colons in names, `_total` on counter samples and on
//! their `# TYPE` line, labels in vLLM's order (`model_name`, `engine`, then any extra), and
//! float values formatted by its `floatToGoString` (`1.0`, `1.789828498802105e+09`).

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
    /// LoRA slots (`max_lora`); 0 = LoRA off, no `vllm:lora_requests_info`.
    pub max_loras: u32,
}

/// Renders the exposition; `transfers` (the NIXL connector's, when configured) adds vLLM's
/// `vllm:nixl_*` series. `epoch_unix_s` is the Unix time of the model's time zero.
pub fn render(
    labels: &MetricsLabels,
    gauges: &EngineGauges,
    stats: &EngineStats,
    transfers: Option<&TransferStats>,
    epoch_unix_s: f64,
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
        "vllm:request_prefill_time_seconds",
        "Histogram of time spent in PREFILL phase for request.",
        &base,
        &stats.prefill_time,
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
    if labels.max_loras > 0 {
        lora_info(&mut out, labels.max_loras, stats, epoch_unix_s);
    }
    if let Some(t) = transfers {
        nixl(&mut out, &base, t, stats.kv_expired_reqs);
    }
    out
}

/// `vllm:lora_requests_info` as vLLM's `PrometheusStatLogger` writes it: no `model_name` or
/// `engine` label, its labels in their declared order (`max_lora`, `waiting_lora_adapters`,
/// `running_lora_adapters`), and one sample per label set ever recorded, valued at the Unix
/// time a step last recorded it (`set_to_current_time`): the newest value is the current state.
/// Before the first step there is no sample, as in vLLM.
fn lora_info(out: &mut String, max_loras: u32, stats: &EngineStats, epoch_unix_s: f64) {
    let name = "vllm:lora_requests_info";
    header(out, name, "Running stats on lora requests.", "gauge");
    for s in &stats.lora_info {
        let labels = format!(
            "max_lora=\"{max_loras}\",waiting_lora_adapters=\"{}\",running_lora_adapters=\"{}\"",
            escape(&s.waiting),
            escape(&s.running)
        );
        sample(out, name, &labels, epoch_unix_s + s.at.as_secs_f64());
    }
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

/// `prometheus_client`'s `floatToGoString`: Python's `repr(float)` (`0.0`, `0.001`, `+Inf`),
/// except that a positive value with more than six digits before the point is written with
/// an exponent, as Go does (`1789828498.802105` → `1.789828498802105e+09`).
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
    let s = format!("{v:?}");
    match s.find('.') {
        Some(dot) if v > 0.0 && dot > 6 => {
            let digits = format!("{}{}", &s[1..dot], &s[dot + 1..]);
            let mantissa = format!("{}.{digits}", &s[..1]);
            // Python strips every trailing '0' and '.', and pads the exponent with one '0'
            // whatever its length ("e+09", "e+010").
            let mantissa = mantissa.trim_end_matches(['0', '.']);
            format!("{mantissa}e+0{}", dot - 1)
        }
        _ => s,
    }
}

fn escape(s: &str) -> String {
    s.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Model `m`, engine `0`, 100 blocks of 16 tokens, `max_loras` adapter slots.
    fn labels(max_loras: u32) -> MetricsLabels {
        MetricsLabels {
            model_name: "m".into(),
            engine: "0".into(),
            block_size: 16,
            num_gpu_blocks: 100,
            max_loras,
        }
    }

    fn idle() -> EngineGauges {
        EngineGauges {
            running: 0,
            waiting: 0,
            kv_usage: 0.0,
        }
    }

    #[test]
    fn counters_carry_total_and_labels_come_in_vllm_order() {
        let labels = labels(0);
        let g = EngineGauges {
            running: 2,
            waiting: 1,
            kv_usage: 0.5,
        };
        let stats = EngineStats {
            prefix_cache_hits: 32,
            ..Default::default()
        };
        let text = render(&labels, &g, &stats, None, 0.0);
        assert!(!text.contains("lora"));
        assert!(text.contains("# TYPE vllm:prefix_cache_hits_total counter\n"));
        assert!(
            text.contains("vllm:prefix_cache_hits_total{model_name=\"m\",engine=\"0\"} 32.0\n")
        );
        assert!(text.contains("vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 2.0\n"));
        assert!(text.contains("le=\"+Inf\"} 0.0\n"));
        assert!(text.contains("num_gpu_blocks=\"100\""));
    }

    #[test]
    fn the_sidecar_reads_the_prefill_time_it_measures_the_engines_speed_by() {
        let labels = labels(0);
        let g = idle();
        let mut stats = EngineStats::default();
        stats.prefill_time.observe(0.25);
        stats.prefill_time.observe(0.5);
        let text = render(&labels, &g, &stats, None, 0.0);
        assert!(text.contains("# TYPE vllm:request_prefill_time_seconds histogram\n"));
        let parsed = kvmesh_protocol::engine_metrics::parse(&text);
        assert_eq!(parsed.prefill_time_sum, Some(0.75));
    }

    #[test]
    fn floats_follow_prometheus_clients_go_style() {
        assert_eq!(float(0.0), "0.0");
        assert_eq!(float(0.001), "0.001");
        assert_eq!(float(123456.0), "123456.0");
        assert_eq!(float(1789828498.802105), "1.789828498802105e+09");
        assert_eq!(float(2097152.0), "2.097152e+06");
        assert_eq!(float(1e6), "1e+06");
        assert_eq!(float(f64::INFINITY), "+Inf");
    }

    #[test]
    fn lora_requests_info_has_vllms_labels_and_a_timestamp_per_label_set() {
        let labels = labels(2);
        let g = idle();
        let mut stats = EngineStats::default();
        let empty = render(&labels, &g, &stats, None, 1.7e9);
        assert!(empty.contains("# TYPE vllm:lora_requests_info gauge\n"));
        assert!(!empty.contains("vllm:lora_requests_info{"));
        let ms = std::time::Duration::from_millis;
        stats.record_lora_info("a,b".into(), "c".into(), ms(500));
        stats.record_lora_info(String::new(), String::new(), ms(1000));
        let text = render(&labels, &g, &stats, None, 1_700_000_000.0);
        assert!(text.contains(
            "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"c\",\
             running_lora_adapters=\"a,b\"} 1.7000000005e+09\n"
        ));
        assert!(text.contains(
            "vllm:lora_requests_info{max_lora=\"2\",waiting_lora_adapters=\"\",\
             running_lora_adapters=\"\"} 1.700000001e+09\n"
        ));
    }
}
