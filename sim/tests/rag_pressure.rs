//! `--workload rag-pressure` is a cache-pressure scenario: on its own small engines the cache
//! holds too little for round-robin to hit much, while a router that keeps each engine on a
//! few contexts hits most of every prompt.

mod common;

use common::simulate::{by_policy, run};
use kvmesh_sim::simulate::Report;

fn hit_rate(report: &Report, policy: &str) -> f64 {
    let r = by_policy(report, policy);
    assert_eq!(r.completed, 400, "{policy}: every request completes");
    r.hit_rate
}

#[test]
fn the_preset_engines_hold_too_little_for_round_robin_but_enough_for_routing() {
    let flags = "--nodes 4 --workload rag-pressure --rate 4 --requests 400 \
                 --policy round-robin,oracle --seed 3";
    let small = run(flags);
    assert_eq!(small.workload, "rag-pressure");
    assert_eq!(small.args.kv_blocks(), 640, "the preset's own engines");
    let (rr, oracle) = (hit_rate(&small, "round-robin"), hit_rate(&small, "oracle"));
    assert!(rr < 0.5, "round-robin hits {rr}");
    assert!(oracle > rr + 0.25, "oracle {oracle} vs round-robin {rr}");
    // With room for the whole workload, round-robin hits almost everything too.
    let large = run(&format!("{flags} --kv-blocks 8192"));
    let rr_large = hit_rate(&large, "round-robin");
    assert!(
        rr_large > 0.7,
        "round-robin on large engines hits {rr_large}"
    );
}
