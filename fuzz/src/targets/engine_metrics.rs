//! `engine_metrics::parse`: the local engine's Prometheus text exposition (`/metrics`,
//! scraped every ~100 ms), read as the node's poller reads it (bytes made text lossily).
//!
//! Checks what the poller and the digest rely on: every figure is finite (they are
//! differenced, divided and cast to the digest's integers and floats) and `kv_usage` lies in
//! 0..=1 (a digest outside it is rejected by every peer, which would drop this node from all
//! their views).

use crate::samples;
use kvmesh_protocol::engine_metrics::parse;

pub fn run(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let m = parse(&text);
    assert!((0.0..=1.0).contains(&m.kv_usage), "kv_usage {}", m.kv_usage);
    let figures = [
        ("running", m.running),
        ("waiting", m.waiting),
        ("prefix_queries", m.prefix_queries),
        ("prefix_hits", m.prefix_hits),
        ("prompt_tokens", m.prompt_tokens),
        ("ttft_sum", m.ttft_sum),
        ("ttft_count", m.ttft_count),
        ("requests", m.requests),
        ("prefill_time_sum", m.prefill_time_sum.unwrap_or(0.0)),
        ("preemptions", m.preemptions),
    ];
    for (name, value) in figures {
        assert!(value.is_finite(), "{name} is {value}");
    }
    for &(le, count) in &m.ttft_buckets {
        assert!(le.is_finite() && count.is_finite(), "bucket ({le}, {count})");
    }
}

pub fn seeds() -> Vec<Vec<u8>> {
    samples::METRICS_TEXTS
        .iter()
        .map(|text| text.as_bytes().to_vec())
        .collect()
}
