//! Issue 21: a burst of distinct prompts (an offline batch job: no shared prefix, all sent at
//! once through one sidecar) must spread over the engines, not herd onto one.
//!
//! Before late binding judged declines against the next candidate's load, the entry's own
//! engine declined every new prefix but the first (it was computing one) and the next
//! candidate, the request's last attempt, took all the others: 199 of 200 on one engine.
//! Asserted here: no engine serves more than 60% of the burst, and nothing fails. The burst's
//! mean TTFT against the same burst sent round-robin straight to the engines is printed (and
//! recorded in BENCHMARKS.md#burst), not asserted: timing belongs to benchmarks.

use std::time::Duration;

use kvmesh_tests::load::{engine_urls, number, run_load};
use kvmesh_tests::{Cluster, NodeSpec, Timing};

const LOAD_TIMEOUT: Duration = Duration::from_secs(240);
/// Short prompts and answers: the burst is about placement, and a thousand of them must fit
/// a debug build on a loaded 2-core machine.
const SYSTEM_LEN: &str = "96";
const QUESTION_LEN: &str = "32";
const OUTPUT_LEN: &str = "4";

/// `nodes` modelled engines (default timing) with a sidecar each, converged.
fn cluster(nodes: usize) -> Cluster {
    let specs: Vec<NodeSpec> = (0..nodes)
        .map(|i| NodeSpec::new(&format!("n{i}"), &["mock-model"]).timing(Timing::Scaled(1.0)))
        .collect();
    Cluster::start_converged(&specs)
}

/// Sends `prompts` distinct prompts at once to `targets` (round-robin) and returns the report.
fn burst(
    targets: &str,
    engines: &str,
    prompts: u64,
    seed: u64,
    out: &std::path::Path,
) -> serde_json::Value {
    let prompts = prompts.to_string();
    let seed = seed.to_string();
    let args = [
        "--workload",
        "hot",
        "--hot-fraction",
        "0",
        "--hot-system-len",
        SYSTEM_LEN,
        "--hot-question-len",
        QUESTION_LEN,
        "--hot-output-len",
        OUTPUT_LEN,
        "--requests",
        &prompts,
        "--concurrency",
        &prompts,
        "--stream",
        "--seed",
        &seed,
    ];
    run_load(targets, "round-robin", engines, out, &args, LOAD_TIMEOUT)
}

/// `prompts` distinct prompts at once through the first of `nodes` sidecars; then the same
/// number straight to the engines, round-robin, for the TTFT comparison.
fn a_burst_spreads(nodes: usize, prompts: u64) {
    let dir = tempfile::tempdir().expect("tempdir");
    let cluster = cluster(nodes);
    let engine_urls = engine_urls(cluster.nodes());

    let through = burst(
        &format!("http://{}", cluster.sidecar("n0").http_addr()),
        &engine_urls,
        prompts,
        1,
        &dir.path().join("kvmesh.json"),
    );
    // Different prompts of the same shape (another seed): nothing of the first burst is
    // cached for them.
    let direct = burst(
        &engine_urls,
        &engine_urls,
        prompts,
        2,
        &dir.path().join("direct.json"),
    );

    for (name, report) in [("kvmesh", &through), ("round-robin", &direct)] {
        assert_eq!(
            number(report, "/requests/ok"),
            prompts as f64,
            "{name}: every request answered: {}",
            report["errors"]
        );
    }
    let served: Vec<f64> = (0..nodes)
        .map(|engine| number(&through, &format!("/engines/{engine}/requests")))
        .collect();
    let total: f64 = served.iter().sum();
    // Each request finished once, unless an attempt was given up before its first byte and
    // the request retried elsewhere (on a starved machine a busy engine can miss its polls,
    // a busy peer its heartbeats): the first engine aborts it, or finishes it before it
    // hears. Only such a retry may be finished twice.
    let aborted: Vec<f64> = (0..nodes)
        .map(|engine| number(&through, &format!("/engines/{engine}/aborted")))
        .collect();
    let entry = &cluster.nodes()[0].sidecar;
    let count = |name: &str, labels: &[(&str, &str)]| {
        entry.metric(name, labels).ok().flatten().unwrap_or(0.0)
    };
    let given_up: f64 = ["peer_dead", "peer_silent", "engine_unhealthy"]
        .iter()
        .map(|reason| count("kvmesh_attempts_abandoned_total", &[("reason", reason)]))
        .sum::<f64>()
        + count("kvmesh_requests_total", &[("reason", "retry")]);
    assert!(
        total >= prompts as f64 && total <= prompts as f64 + given_up,
        "the engines counted the burst: {served:?} finished, {aborted:?} aborted, \
         {given_up} attempts given up or retried"
    );
    let ratio = number(&through, "/ttft_s/mean") / number(&direct, "/ttft_s/mean");
    println!(
        "burst of {prompts} over {nodes} engines: served {served:?}; mean TTFT {:.0} ms through \
         kvmesh, {:.0} ms round-robin straight to the engines ({ratio:.2}x)",
        number(&through, "/ttft_s/mean") * 1e3,
        number(&direct, "/ttft_s/mean") * 1e3,
    );
    // Which side turned the burst away, and why: each node's declines by reason.
    for node in cluster.nodes() {
        let declines: Vec<String> = ["new-prefix", "queue", "follows"]
            .iter()
            .map(|reason| {
                let count = node
                    .sidecar
                    .metric("kvmesh_declined_total", &[("reason", reason)])
                    .ok()
                    .flatten()
                    .unwrap_or(0.0);
                format!("{reason} {count}")
            })
            .collect();
        println!("  {} declined: {}", node.name(), declines.join(", "));
    }
    // How the entry placed them (a retry after a failed attempt also lands off its first
    // choice).
    let entry = &cluster.nodes()[0].sidecar;
    let reasons: Vec<String> = [
        "cold-hash",
        "prefix-hit",
        "least-loaded",
        "load-spill",
        "declined",
        "retry",
    ]
    .iter()
    .filter_map(|reason| {
        let count = entry
            .metric("kvmesh_requests_total", &[("reason", reason)])
            .ok()
            .flatten()?;
        (count > 0.0).then(|| format!("{reason} {count}"))
    })
    .collect();
    println!("  entry's requests by reason: {}", reasons.join(", "));
    let busiest = served.iter().copied().fold(0.0, f64::max);
    assert!(
        busiest <= 0.6 * total,
        "one engine served {busiest} of {total} ({served:?})"
    );
}

#[test]
fn two_hundred_distinct_prompts_at_once_spread_over_two_engines() {
    a_burst_spreads(2, 200);
}

#[test]
fn two_hundred_distinct_prompts_at_once_spread_over_three_engines() {
    a_burst_spreads(3, 200);
}

#[test]
fn a_thousand_distinct_prompts_at_once_spread_over_two_engines() {
    a_burst_spreads(2, 1_000);
}
