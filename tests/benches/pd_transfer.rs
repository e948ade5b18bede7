//! The latency a P→D pull adds at the default bandwidth and handshake, on loopback: a
//! 2,048-token prompt's decode leg against the same prompt served from the decode engine's own
//! cache. A measurement, not a check (BENCHMARKS.md#pd-engine):
//! `cargo build --release --bins && cargo bench -p kvmesh-tests --bench pd_transfer`.

use std::time::{Duration, Instant};

use kvmesh_tests::Timing;
use kvmesh_tests::nixl::{decode_body, nixl_engine, post, prefill_leg, prompt};
use serde_json::json;

fn main() {
    const RUNS: u32 = 30;
    let p = nixl_engine("prefill", Timing::Scaled(1.0), &[]);
    let d = nixl_engine("decode", Timing::Scaled(1.0), &[]);
    let (mut pd, mut local, mut prefill) = (Vec::new(), Vec::new(), Vec::new());
    for run in 0..RUNS {
        let body = json!({"model": "mock", "prompt": prompt(100 + run, 2048), "max_tokens": 1,
            "stream": false});
        let started = Instant::now();
        let params = prefill_leg(&p, &body);
        prefill.push(started.elapsed());
        let started = Instant::now();
        let r = post(&d, &decode_body(&body, &params));
        pd.push(started.elapsed());
        assert_eq!(r.status, 200, "{}", r.describe());
        // The same prompt again: now in the decode engine's own cache, nothing to pull.
        let started = Instant::now();
        assert_eq!(post(&d, &body).status, 200);
        local.push(started.elapsed());
    }
    let ms = |d: Duration| d.as_secs_f64() * 1e3;
    let median = |v: &[Duration]| {
        let mut v = v[1..].to_vec(); // the first decode leg pays the handshake
        v.sort();
        ms(v[v.len() / 2])
    };
    let xfer = d.metric("vllm:nixl_xfer_time_seconds_sum", &[]) * 1e3 / f64::from(RUNS);
    println!(
        "2048-token prompt, {RUNS} runs: prefill leg median {:.1} ms; decode leg first (with \
         handshake) {:.1} ms, then median {:.1} ms; same prompt cached locally median {:.1} ms; \
         added by the pull (median) {:.1} ms; vllm:nixl_xfer_time_seconds mean {:.1} ms",
        median(&prefill),
        ms(pd[0]),
        median(&pd),
        median(&local),
        median(&pd) - median(&local),
        xfer
    );
}
