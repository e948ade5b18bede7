//! A fourth engine joins a mesh of three under load: where the traffic goes, and what it costs.
//!
//! A measurement, not an acceptance test (`cargo build --release --bins && cargo bench -p
//! kvmesh-tests --bench scale_out`): RAG under cache pressure (the demo's
//! rag-pressure, engines of 640 KV blocks at a real GPU's modelled pace) through the three
//! first sidecars for 60 s, the fourth joining 20 s in. It prints, for the requests sent before
//! and after the join, how many each engine served and their mean TTFT, so that a new engine
//! flooded by every entry at once (or left idle) shows. It asserts only that no request failed.
//! The simulator runs the same scenario: `kvmesh-sim simulate --nodes 4 --kv-blocks 640
//! --workload rag-pressure --seed 2 --rate 4 --duration 60 --entry-nodes 3 --join-nodes 1
//! --join-at 20` (BENCHMARKS.md#node-join).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use kvmesh_tests::load::{engine_urls, run_load, sidecar_urls};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Timing};
use serde_json::Value;

const LOAD_SECONDS: u64 = 60;
const JOIN_AFTER: Duration = Duration::from_secs(20);

fn spec(name: &str) -> NodeSpec {
    NodeSpec::new(name, &["mock-model"])
        .timing(Timing::Scaled(1.0))
        .engine_args(&["--kv-blocks", "640", "--block-size", "16"])
}

fn main() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = Cluster::start_converged(&[spec("a"), spec("b"), spec("c")]);
    let targets = sidecar_urls(cluster.nodes());
    let engines = engine_urls(cluster.nodes());
    let records = dir.path().join("records.jsonl");
    let report = dir.path().join("report.json");
    let started = Instant::now();
    let load = {
        let (records, report) = (records.clone(), report.clone());
        std::thread::spawn(move || {
            let duration = LOAD_SECONDS.to_string();
            let args = [
                "--workload",
                "rag-pressure",
                "--stream",
                "--seed",
                "2",
                "--rate",
                "4",
                "--threads",
                "1",
                "--duration",
                &duration,
                "--records",
                records.to_str().expect("utf-8 path"),
            ];
            let timeout = Duration::from_secs(LOAD_SECONDS + 120);
            run_load(&targets, "random", &engines, &report, &args, timeout)
        })
    };
    std::thread::sleep(JOIN_AFTER);
    cluster.join(&spec("d"));
    cluster.wait_membership(&["a", "b", "c", "d"], CONVERGENCE_TIMEOUT);
    let joined_s = started.elapsed().as_secs_f64();
    load.join().expect("load thread");

    let lines = std::fs::read_to_string(&records).expect("records");
    let records: Vec<Value> = lines
        .lines()
        .map(|line| serde_json::from_str(line).expect("record JSON"))
        .collect();
    let failed: Vec<&Value> = records.iter().filter(|r| r["status"] != 200).collect();
    assert!(failed.is_empty(), "failed requests: {failed:?}");
    println!("d was a member of every node's view {joined_s:.1} s after the load began");
    for (period, after) in [("before the join", false), ("after the join", true)] {
        let sent: Vec<&Value> = records
            .iter()
            .filter(|r| (r["sent_at_s"].as_f64().unwrap_or(0.0) >= joined_s) == after)
            .collect();
        let mean_ms = |of: &[&Value]| {
            let sum: f64 = of.iter().map(|r| r["ttft_s"].as_f64().unwrap_or(0.0)).sum();
            sum / of.len().max(1) as f64 * 1000.0
        };
        println!(
            "{period}: {} requests, mean TTFT {:.1} ms",
            sent.len(),
            mean_ms(&sent)
        );
        for node in ["a", "b", "c", "d"] {
            let served: Vec<&Value> = sent.iter().copied().filter(|r| r["node"] == node).collect();
            println!(
                "  {node}: {:3} requests, mean TTFT {:6.1} ms",
                served.len(),
                mean_ms(&served)
            );
        }
    }
    // How the new engine got its work: when (after the join) and why (`x-kvmesh-reason`).
    let mut reasons: BTreeMap<&str, usize> = BTreeMap::new();
    let mut sent_after_join = Vec::new();
    for r in records.iter().filter(|r| r["node"] == "d") {
        *reasons
            .entry(r["reason"].as_str().unwrap_or("-"))
            .or_default() += 1;
        let at = r["sent_at_s"].as_f64().unwrap_or(0.0) - joined_s;
        sent_after_join.push(format!("{at:.1}"));
    }
    println!("d's requests by reason: {reasons:?}");
    println!(
        "d's requests, seconds after the join: {}",
        sent_after_join.join(" ")
    );
}
