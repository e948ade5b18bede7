//! Issue 5 acceptance, hot prefix, over real processes: 4 modelled engines and 4 sidecars,
//! requests sent to random entry nodes by the real load generator (`kvmesh-sim load
//! --workload hot`).
//!
//! One system prompt is in 80% of the traffic, at a rate one engine cannot carry. Asserted:
//! nothing is lost, no engine's waiting queue stays above 2× the mean, and the hot prefix is
//! cached on at least 2 engines. Printed, not asserted: p99 TTFT against the same load spread
//! over distinct prefixes (the control run: same seed, so the same arrivals, questions and
//! other 20%, with the shared 80% spread over `CONTROL_PREFIXES` system prompts instead of
//! one). The bound on it (within 1.5×) is a latency figure, noise on a loaded 2-core
//! box with debug sidecars; it is measured in BENCHMARKS.md#hot-prefix with this test's
//! `--nocapture` output. The control keeps the cache's value: a
//! control in which every request had a prefix of its own (`--hot-fraction 0`) would prefill
//! 2.1× the tokens of the hot run and make the ratio easy to meet.
//!
//! `without_the_load_bound_…` runs the same checks with every spreading mechanism switched off
//! and asserts that they catch the herding that follows.
//!
//! # Why one engine cannot carry the hot share, but four can
//!
//! Every hot request finds the system prompt cached (after its first request on an engine) and
//! prefills its own `QUESTION_LEN` tokens; the engine model prefills at most
//! `PREFILL_TOKENS_PER_S` uncached tokens per second whatever else it does, so one engine
//! serves at most `PREFILL_TOKENS_PER_S / QUESTION_LEN` = 6000 / 512 = 11.7 hot requests per
//! second, before counting its decode steps (each 12 ms plus 0.15 ms per sequence). The hot
//! share arrives at `HOT_FRACTION × RATE` = 0.8 × 16 = 12.8 requests/s: more than one engine's
//! bound. Over the cluster, the prefill work per second is 12.8 × 512 (hot) + 3.2 × 1536 (the
//! other 20%, whose prefixes are all new) = 11,469 tokens, 48% of the 4 engines' 24,000
//! tokens/s, which leaves room for the decode steps. A step computes at most `STEP_TOKENS`
//! tokens (4 new questions), so an engine that falls behind shows it as waiting requests
//! (`vllm:num_requests_waiting`), not only as longer steps.
//!
//! The rates are modest on purpose: every request crosses debug-build sidecars on a shared
//! 2-core machine, and the comparison is between two runs of the same test.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvmesh_protocol::prometheus_text;
use kvmesh_tests::load::{engine_urls, number, run_load, sidecar_urls};
use kvmesh_tests::{Cluster, NodeSpec, Request, Timing};
use serde_json::Value;

const NODES: usize = 4;
const LOAD_TIMEOUT: Duration = Duration::from_secs(120);

/// The engine's prefill speed (its default, passed explicitly because the arithmetic above
/// depends on it).
const PREFILL_TOKENS_PER_S: u32 = 6_000;
/// Token budget of one engine step (vLLM's `max_num_batched_tokens`).
const STEP_TOKENS: u32 = 2048;
const SYSTEM_LEN: u32 = 1024;
const QUESTION_LEN: u32 = 512;
const OUTPUT_LEN: u32 = 16;
const HOT_FRACTION: f64 = 0.8;
/// Cluster arrival rate, requests/s.
const RATE: f64 = 16.0;
const REQUESTS: u64 = 240;
/// System prompts the control spreads the same 80% over.
const CONTROL_PREFIXES: u32 = 16;
/// How often each engine's waiting queue is read.
const SAMPLE_EVERY: Duration = Duration::from_millis(100);
/// An engine serving at least this many requests from the cached system prompt holds it.
const HOLDER_HITS: f64 = 10.0;

/// Four nodes over modelled engines, their sidecars with extra `kvmesh serve` flags; waits
/// until every node sees all the others.
fn mesh(sidecar_flags: &[&str]) -> Cluster {
    let specs: Vec<NodeSpec> = (0..NODES)
        .map(|i| {
            NodeSpec::new(&format!("n{i}"), &["mock-model"])
                .timing(Timing::Scaled(1.0))
                .engine_args(&[
                    "--prefill-tokens-per-s",
                    &PREFILL_TOKENS_PER_S.to_string(),
                    "--max-num-batched-tokens",
                    &STEP_TOKENS.to_string(),
                    "--seed",
                    &i.to_string(),
                ])
                .sidecar_args(sidecar_flags)
        })
        .collect();
    Cluster::start_converged(&specs)
}

/// Each engine's `vllm:num_requests_waiting`, read every [`SAMPLE_EVERY`].
#[derive(Debug, Default)]
struct QueueSamples {
    /// One row per sampling instant at which every engine answered.
    rows: Vec<Vec<f64>>,
    /// Instants at which some engine did not answer.
    missed: usize,
}

impl QueueSamples {
    /// Samples `engines` until `stop` is set.
    fn collect(engines: &[SocketAddr], stop: &AtomicBool) -> Self {
        let mut samples = QueueSamples::default();
        let mut next = Instant::now();
        while !stop.load(Ordering::Relaxed) {
            let row: Option<Vec<f64>> = engines.iter().map(|&addr| waiting(addr)).collect();
            match row {
                Some(row) => samples.rows.push(row),
                None => samples.missed += 1,
            }
            next += SAMPLE_EVERY;
            std::thread::sleep(next.saturating_duration_since(Instant::now()));
        }
        samples
    }

    /// Each engine's time-averaged queue (samples are evenly spaced).
    fn averages(&self) -> Vec<f64> {
        let n = self.rows.len().max(1) as f64;
        (0..NODES)
            .map(|engine| self.rows.iter().map(|row| row[engine]).sum::<f64>() / n)
            .collect()
    }

    /// Each engine's longest run of consecutive samples in which its queue was above
    /// `2 × the mean of that sample + slack`.
    fn longest_excess(&self, slack: f64) -> Vec<Duration> {
        let mut longest = [0usize; NODES];
        let mut current = [0usize; NODES];
        for row in &self.rows {
            let mean = row.iter().sum::<f64>() / NODES as f64;
            for engine in 0..NODES {
                current[engine] = if row[engine] > 2.0 * mean + slack {
                    current[engine] + 1
                } else {
                    0
                };
                longest[engine] = longest[engine].max(current[engine]);
            }
        }
        longest.iter().map(|&n| SAMPLE_EVERY * n as u32).collect()
    }
}

fn waiting(engine: SocketAddr) -> Option<f64> {
    let response = Request::get("/metrics")
        .timeout(Duration::from_secs(2))
        .send(engine)
        .ok()?;
    (response.status == 200)
        .then(|| prometheus_text::sum(&response.text(), "vllm:num_requests_waiting", &[]))
        .flatten()
}

/// One run on a fresh cluster: the load report and the engines' queues during it.
struct Run {
    report: Value,
    queues: QueueSamples,
}

fn run(out: &Path, prefixes: u32, sidecar_flags: &[&str]) -> Run {
    let cluster = mesh(sidecar_flags);
    let nodes = cluster.nodes();
    let engine_addrs: Vec<SocketAddr> = nodes.iter().map(|n| n.engine.addr()).collect();
    let (rate, requests, fraction) = (
        RATE.to_string(),
        REQUESTS.to_string(),
        HOT_FRACTION.to_string(),
    );
    let (system, question, output, prefixes) = (
        SYSTEM_LEN.to_string(),
        QUESTION_LEN.to_string(),
        OUTPUT_LEN.to_string(),
        prefixes.to_string(),
    );
    let args = [
        "--workload",
        "hot",
        "--hot-fraction",
        &fraction,
        "--hot-prefixes",
        &prefixes,
        "--hot-system-len",
        &system,
        "--hot-question-len",
        &question,
        "--hot-output-len",
        &output,
        "--rate",
        &rate,
        "--requests",
        &requests,
        "--stream",
        "--seed",
        "11",
    ];
    let stop = AtomicBool::new(false);
    let (report, queues) = std::thread::scope(|scope| {
        let sampler = scope.spawn(|| QueueSamples::collect(&engine_addrs, &stop));
        let report = run_load(
            &sidecar_urls(nodes),
            "random",
            &engine_urls(nodes),
            out,
            &args,
            LOAD_TIMEOUT,
        );
        stop.store(true, Ordering::Relaxed);
        (report, sampler.join().expect("queue sampler"))
    });
    if number(&report, "/requests/failed") > 0.0 {
        // What the sidecars said about the failures.
        for node in nodes {
            println!("--- {} ---\n{}", node.name(), node.sidecar.output_tail(400));
        }
    }
    Run { report, queues }
}

/// What the hot run must show, compared with the control; each violation described.
fn violations(hot: &Run, control: &Run) -> Vec<String> {
    let mut found = Vec::new();
    // Nothing is lost: on a starved machine the failure detector may misjudge a live peer,
    // but its connection (and the streams on it) is kept while it answers
    // (`tests/tests/false_death.rs`); the sidecars' logs are printed if anything fails.
    for (name, run) in [("hot", hot), ("control", control)] {
        let failed = number(&run.report, "/requests/failed");
        if failed > 0.0 {
            found.push(format!(
                "{name}: {failed} requests failed: {}",
                run.report["errors"]
            ));
        }
    }

    // Queues "stay above 2× the mean" if an engine's time-averaged queue is above twice the
    // mean of all engines' (plus a quarter request, so that a queue of nearly nothing against
    // a mean of nearly nothing is not an imbalance), or if an engine spends more than 2 s on
    // end above twice the instantaneous mean plus one request.
    let averages = hot.queues.averages();
    let mean = averages.iter().sum::<f64>() / NODES as f64;
    for (engine, &average) in averages.iter().enumerate() {
        if average > 2.0 * mean + 0.25 {
            found.push(format!(
                "engine {engine}'s queue averaged {average:.2}, above 2 × the mean {mean:.2} \
                 + 0.25"
            ));
        }
    }
    for (engine, stretch) in hot.queues.longest_excess(1.0).iter().enumerate() {
        if *stretch > Duration::from_secs(2) {
            found.push(format!(
                "engine {engine}'s queue stayed above 2 × the mean + 1 for {stretch:?}"
            ));
        }
    }
    let sampled = hot.queues.rows.len();
    if sampled < 20 || hot.queues.missed > sampled / 4 {
        found.push(format!(
            "queues sampled {sampled} times, missed {} times",
            hot.queues.missed
        ));
    }

    // Holders: in the hot run, only the hot system prompt is ever shared (questions and the
    // other 20% are each request's own), so an engine's prefix-cache hits count the requests
    // it served from the cached hot prompt, `SYSTEM_LEN` tokens each.
    let hits: Vec<f64> = (0..NODES)
        .map(|engine| number(&hot.report, &format!("/engines/{engine}/prefix_cache_hits")))
        .collect();
    let holders = hits
        .iter()
        .filter(|&&h| h >= HOLDER_HITS * f64::from(SYSTEM_LEN))
        .count();
    if holders < 2 {
        found.push(format!(
            "the hot prefix was served from cache on {holders} engine(s) (hits per engine: \
             {hits:?})"
        ));
    }

    found
}

fn describe(hot: &Run, control: &Run) {
    let hits: Vec<String> = (0..NODES)
        .map(|engine| {
            let hits = number(&hot.report, &format!("/engines/{engine}/prefix_cache_hits"));
            format!("{:.0}", hits / f64::from(SYSTEM_LEN))
        })
        .collect();
    let averages: Vec<String> = hot
        .queues
        .averages()
        .iter()
        .map(|a| format!("{a:.2}"))
        .collect();
    let control_averages: Vec<String> = control
        .queues
        .averages()
        .iter()
        .map(|a| format!("{a:.2}"))
        .collect();
    println!(
        "hot: p99 TTFT {:.0} ms (mean {:.0}), control: p99 {:.0} ms (mean {:.0}), ratio {:.2}; \
         time-averaged waiting queues hot [{}], control [{}]; longest stretch above 2 × mean \
         + 1: {:?}; hot-prompt hits per engine [{}]; placements {}",
        number(&hot.report, "/ttft_s/p99") * 1e3,
        number(&hot.report, "/ttft_s/mean") * 1e3,
        number(&control.report, "/ttft_s/p99") * 1e3,
        number(&control.report, "/ttft_s/mean") * 1e3,
        number(&hot.report, "/ttft_s/p99") / number(&control.report, "/ttft_s/p99"),
        averages.join(", "),
        control_averages.join(", "),
        hot.queues.longest_excess(1.0),
        hits.join(", "),
        hot.report["placements"],
    );
}

#[test]
fn a_hot_prefix_spreads_over_engines_without_hurting_the_tail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let control = run(&dir.path().join("control.json"), CONTROL_PREFIXES, &[]);
    let hot = run(&dir.path().join("hot.json"), 1, &[]);
    describe(&hot, &control);
    let found = violations(&hot, &control);
    assert!(found.is_empty(), "{}", found.join("\n"));
}

/// The checks above catch herding: with every spreading mechanism switched off (the load
/// bound's ε and slack huge, no queue term, no spread band, no late-binding declines, no
/// holders owed to a popular prefix), the engine that first caches the hot prompt keeps every
/// hot request. Switching off the load bound alone is not enough: the queue term, the spread
/// band, late binding and the popular prefix's owed holders still spread the hot prompt, and
/// the checks rightly pass. It shows the acceptance test can fail, so it runs with it (alone,
/// as the whole binary does: `.config/nextest.toml`).
#[test]
fn without_the_load_bound_the_hot_prefix_herds_and_the_checks_fail() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("unbounded.toml");
    std::fs::write(
        &config,
        "[route]\nload_epsilon = 1000000.0\nload_slack = 1000000.0\ngamma = 0.0\n\
         spread_margin = 0.0\nmax_declines = 0\nmax_new_prefix_declines = 0\n\
         popular_owed_holders = false\n",
    )
    .expect("config file");
    let config = config.to_str().expect("utf-8 path").to_owned();
    let flags = ["--config", config.as_str()];
    let control = run(&dir.path().join("control.json"), CONTROL_PREFIXES, &flags);
    let hot = run(&dir.path().join("hot.json"), 1, &flags);
    describe(&hot, &control);
    let found = violations(&hot, &control);
    println!("violations:\n{}", found.join("\n"));
    assert!(!found.is_empty(), "herding went unnoticed");
}
