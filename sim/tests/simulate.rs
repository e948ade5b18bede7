//! `kvmesh-sim simulate` end to end, through its command-line flags: determinism, a cluster
//! small enough to check by hand, and the policies' ordering.

mod common;

use common::simulate::{by_policy, refusal, run};
use kvmesh_sim::quantile::quantile;
use kvmesh_sim::simulate::{PolicyResult, Report};

/// A small gsp cluster where caching and load both matter.
const SMALL_GSP: &str = "--nodes 8 --gsp-groups 16 --gsp-prompts-per-group 32 \
     --gsp-system-len 1024 --gsp-question-len 64 --gsp-output-len 32 --rate 40 --kv-blocks 1024";

#[test]
fn the_same_seed_gives_the_same_results() {
    let flags = format!("{SMALL_GSP} --requests 200 --policy random,chwbl,oracle,kvmesh --seed 5");
    let strip = |report: Report| -> Vec<PolicyResult> {
        report.runs[0]
            .results
            .iter()
            .cloned()
            .map(|r| PolicyResult { wall_s: 0.0, ..r })
            .collect()
    };
    let (a, b) = (strip(run(&flags)), strip(run(&flags)));
    assert_eq!(a, b);
    let other = strip(run(&format!(
        "{SMALL_GSP} --requests 200 --policy random,chwbl,oracle,kvmesh --seed 6"
    )));
    assert_ne!(a, other, "another seed gives another run");
}

#[test]
fn the_thread_count_does_not_change_a_gossiping_run() {
    let flags = format!(
        "{SMALL_GSP} --requests 200 --policy kvmesh,kvmesh-local,kvmesh-zoned --zone-size 4 --seed 2"
    );
    let strip = |report: Report| -> Vec<PolicyResult> {
        report.runs[0]
            .results
            .iter()
            .cloned()
            .map(|r| PolicyResult { wall_s: 0.0, ..r })
            .collect()
    };
    let one = strip(run(&format!("{flags} --threads 1")));
    let three = strip(run(&format!("{flags} --threads 3")));
    assert_eq!(one, three);
}

/// Two prompts sharing a 64-token system prompt (4 blocks), 16-token questions, 4 output
/// tokens, arriving about 10 s apart on one idle engine of `profile`: checks the hit rate and
/// that TTFT and end-to-end times are `step(prefill tokens, context before)` for the two
/// prefills and `step(0, context)` for each of the 3 decode steps.
fn two_requests_by_hand(profile: &str, step: impl Fn(f64, f64) -> f64) {
    let report = run(&format!(
        "--nodes 1 --requests 2 --gsp-groups 1 --gsp-prompts-per-group 2 --gsp-system-len 64 \
         --gsp-question-len 16 --gsp-output-len 4 --rate 0.1 --policy oracle,random \
         --engine-profile {profile}"
    ));
    for r in &report.runs[0].results {
        assert_eq!((r.requests, r.completed, r.rejected), (2, 2, 0));
        // 160 prompt tokens looked up, the second prompt's 64 shared tokens found.
        assert!(
            (r.hit_rate - 64.0 / 160.0).abs() < 1e-9,
            "hit rate {}",
            r.hit_rate
        );
        assert_eq!(r.load_imbalance, 1.0);
        assert_eq!(r.preemptions, 0);
        let first = step(80.0, 0.0);
        let second = step(16.0, 64.0);
        assert!(
            (r.ttft_s.mean - (first + second) / 2.0).abs() < 1e-6,
            "{:?}",
            r.ttft_s
        );
        assert!((r.ttft_s.p99 - quantile(&[second, first], 0.99)).abs() < 1e-6);
        assert!((r.ttft_s.p50 - (first + second) / 2.0).abs() < 1e-6);
        // Then 3 decode steps of one sequence each, reading 80, 81 and 82 tokens of context.
        let decode = step(0.0, 80.0) + step(0.0, 81.0) + step(0.0, 82.0);
        assert!(
            (r.e2e_s.mean - ((first + second) / 2.0 + decode)).abs() < 1e-6,
            "{:?} vs {}",
            r.e2e_s,
            (first + second) / 2.0 + decode
        );
    }
}

#[test]
fn one_engine_with_two_requests_matches_the_legacy_timing_model_by_hand() {
    // step = 12 ms + 0.15 ms per sequence + tokens / 12,000 per s
    //   + 1 ns × tokens × (context before + tokens / 2), or for a decode 10 ns × its context.
    two_requests_by_hand("legacy", |tokens, before| {
        let decode = if tokens == 0.0 { 10e-9 * before } else { 0.0 };
        0.012 + 0.000_15 + tokens / 12_000.0 + 1e-9 * tokens * (before + tokens / 2.0) + decode
    });
}

#[test]
fn one_engine_with_two_requests_matches_the_roofline_by_hand() {
    // step = cpu + cpu per sequence + max(weights + KV read, compute): every one of these
    // steps is memory-bound on an H100 (under 275 tokens).
    let r = kvmesh_sim::engine::model::profile::H100_8B;
    two_requests_by_hand("h100-8b", |tokens, before| {
        let (computed, read, pairs) = if tokens == 0.0 {
            (1.0, before, before)
        } else {
            (tokens, before + tokens, tokens * (before + tokens / 2.0))
        };
        let memory = r.weights_s + r.kv_s_per_token * read;
        let compute = r.token_s * computed + r.attention_s_per_token_ctx * pairs;
        assert!(memory > compute);
        r.cpu_s + r.cpu_per_seq_s + memory
    });
}

#[test]
fn the_oracle_never_caches_worse_than_random() {
    for seed in 0..3 {
        let report = run(&format!(
            "{SMALL_GSP} --requests 300 --policy random,oracle --seed {seed}"
        ));
        let (random, oracle) = (by_policy(&report, "random"), by_policy(&report, "oracle"));
        assert!(
            oracle.hit_rate >= random.hit_rate,
            "seed {seed}: oracle {} < random {}",
            oracle.hit_rate,
            random.hit_rate
        );
    }
}

#[test]
fn policies_order_as_expected_on_a_small_gsp_workload() {
    let report = run(&format!(
        "{SMALL_GSP} --requests 600 --policy random,least-loaded,oracle,kvmesh,kvmesh-local --seed 3"
    ));
    let ttft = |name| by_policy(&report, name).ttft_s.mean;
    let hit = |name| by_policy(&report, name).hit_rate;
    assert!(
        ttft("random") > ttft("least-loaded"),
        "random vs least-loaded"
    );
    assert!(
        ttft("least-loaded") > ttft("kvmesh-local"),
        "least-loaded vs kvmesh-local"
    );
    assert!(
        ttft("kvmesh-local") >= ttft("kvmesh"),
        "kvmesh-local vs kvmesh"
    );
    // Stale views cost a little at 8 nodes and 40 requests/s (about 10% here).
    assert!(
        ttft("kvmesh") <= ttft("oracle") * 1.15,
        "kvmesh near the oracle"
    );
    assert!(hit("random") < hit("kvmesh-local"));
    assert!(
        hit("kvmesh") >= hit("oracle") - 0.03,
        "kvmesh within 3 points of the oracle"
    );
    let kvmesh = by_policy(&report, "kvmesh");
    assert!(kvmesh.gossip.summary_bytes_per_node_s > 0.0);
    assert!(kvmesh.prefix_reach_50_s.unwrap() < kvmesh.prefix_reach_99_s.unwrap());
    let local = by_policy(&report, "kvmesh-local");
    assert_eq!(
        local.gossip.summary_bytes_per_node_s, 0.0,
        "kvmesh-local gossips no summary"
    );
}

#[test]
fn chat_rag_and_trace_workloads_run() {
    for flags in [
        "--workload chat --chat-sessions 16",
        "--workload rag --rag-docs 50",
        "--trace data/mooncake_synthetic_trace.jsonl --trace-speedup 20 --kv-blocks 16384",
    ] {
        let report = run(&format!(
            "--nodes 4 --requests 60 --policy random,kvmesh {flags}"
        ));
        for r in &report.runs[0].results {
            assert_eq!(r.completed + r.rejected, 60, "{flags}: {}", r.policy);
            assert!(r.ttft_s.mean > 0.0);
        }
        let (random, kvmesh) = (by_policy(&report, "random"), by_policy(&report, "kvmesh"));
        assert!(kvmesh.hit_rate >= random.hit_rate, "{flags}");
    }
}

#[test]
fn a_sweep_reports_every_size_and_gossip_grows_with_n() {
    let report = run(
        "--sweep-nodes 4,32 --requests 200 --rate-per-node 1 --policy kvmesh \
         --gsp-system-len 256 --gsp-output-len 8",
    );
    assert_eq!(report.runs.len(), 2);
    let bytes: Vec<f64> = report
        .runs
        .iter()
        .map(|r| r.results[0].gossip.membership_bytes_per_node_s)
        .collect();
    assert!(bytes[1] > bytes[0] * 4.0, "{bytes:?}");
    let md = kvmesh_sim::simulate::report::markdown(&report);
    assert!(md.contains("## Scaling"));
    let svg = kvmesh_sim::simulate::svg::gossip_vs_nodes(&report).expect("a sweep plots");
    assert!(svg.starts_with("<svg") && svg.contains("kvmesh"));
}

/// Issue 21 in the model: a burst of distinct prompts sent at once to one entry node spreads
/// over the engines (late binding declines against the next candidate's load, and a declined
/// request counts as pending where it goes), and serving nodes do decline some of it.
#[test]
fn a_burst_of_distinct_prompts_through_one_entry_spreads() {
    // All at one instant (the entry's pending sends and the load bound spread them), and
    // within a few milliseconds, as a client firing them on many connections sends them (the
    // serving nodes decline what their queues cannot take soon: admission at work).
    for rate in [1_000_000, 5_000] {
        for (nodes, requests) in [(2, 200), (3, 200), (2, 1_000)] {
            let report = run(&format!(
                "--nodes {nodes} --entry-nodes 1 --workload hot --hot-fraction 0 \
                 --hot-system-len 96 --hot-question-len 32 --hot-output-len 4 \
                 --requests {requests} --rate {rate} --policy kvmesh,round-robin --seed 3"
            ));
            let kvmesh = by_policy(&report, "kvmesh");
            let round_robin = by_policy(&report, "round-robin");
            assert_eq!(kvmesh.completed, requests);
            let share = kvmesh.load_imbalance / nodes as f64;
            assert!(
                share <= 0.6,
                "{nodes} nodes, {requests} prompts at {rate}/s: the busiest engine served \
                 {:.0}% ({} declines)",
                share * 100.0,
                kvmesh.declines
            );
            assert!(kvmesh.declines > 0, "the entry's own engine declined some");
            println!(
                "{nodes} nodes, {requests} prompts at {rate}/s: busiest {:.0}%, {} declines, \
                 mean TTFT {:.3} s against round-robin's {:.3} s",
                share * 100.0,
                kvmesh.declines,
                kvmesh.ttft_s.mean,
                round_robin.ttft_s.mean
            );
        }
    }
}

/// Nodes joining mid-run need a node up from the start and a time; disaggregation is refused.
#[test]
fn a_join_without_a_cluster_to_join_is_refused() {
    let all = refusal("--nodes 2 --join-nodes 2 --join-at 1 --requests 1");
    assert!(all.is_some_and(|e| e.contains("no node up from the start")));
    let never = refusal("--nodes 2 --join-nodes 1 --requests 1");
    assert!(never.is_some_and(|e| e.contains("--join-at")));
    let pd = refusal("--nodes 4 --join-nodes 1 --join-at 1 --prefill-nodes 1 --requests 1");
    assert!(pd.is_some_and(|e| e.contains("--prefill-nodes")));
    let sweep = refusal("--sweep-nodes 1,4 --join-nodes 1 --join-at 1 --requests 1");
    assert!(sweep.is_some_and(|e| e.contains("cluster of 1")));
}
