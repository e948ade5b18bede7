//! A peer frozen (SIGSTOP: a VM pause, a starved CPU) while requests are forwarded to it:
//! those that had not started streaming fail over to another engine once the failure
//! detector gives up on the frozen peer, and none is lost (issue 18).

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use kvmesh_tests::openai::completion_body;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Request, Timing, wait_until};

const NODES: [&str; 3] = ["a", "b", "c"];

#[test]
fn requests_forwarded_to_a_frozen_peer_fail_over_before_their_first_byte() {
    let specs: Vec<NodeSpec> = NODES
        .iter()
        .map(|n| NodeSpec::new(n, &["m"]).timing(Timing::Scaled(1.0)))
        .collect();
    let mut cluster = Cluster::start(&specs);
    cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);
    let entry = cluster.sidecar("a").http_addr();

    // 24 distinct long prompts, 12 at a time, through a; b is frozen as the first go out.
    let mut outcomes = Vec::new();
    for wave in 0..2u32 {
        let start = Arc::new(Barrier::new(13));
        let clients: Vec<_> = (0..12u32)
            .map(|i| {
                let start = start.clone();
                std::thread::spawn(move || {
                    let prompt = format!(
                        "wave {wave} request {i}: {}",
                        "a distinct prompt. ".repeat(60)
                    );
                    let request = Request::post_json(
                        "/v1/completions",
                        &completion_body("m", &prompt, 16, false),
                    )
                    .timeout(Duration::from_secs(60));
                    start.wait();
                    let began = Instant::now();
                    let answer = request.send(entry).expect("an answer");
                    (answer, began.elapsed())
                })
            })
            .collect();
        start.wait();
        if wave == 0 {
            std::thread::sleep(Duration::from_millis(20));
            cluster.node_mut("b").sidecar.process().sigstop();
        }
        for client in clients {
            outcomes.push(client.join().expect("client thread"));
        }
    }
    cluster.node_mut("b").sidecar.process().sigcont();
    let failed: Vec<String> = outcomes
        .iter()
        .filter(|(answer, _)| answer.status != 200)
        .map(|(answer, _)| answer.describe())
        .collect();
    let slowest = outcomes
        .iter()
        .map(|(_, took)| *took)
        .max()
        .unwrap_or_default();
    let abandoned = |reason: &str| {
        cluster
            .sidecar("a")
            .metric("kvmesh_attempts_abandoned_total", &[("reason", reason)])
            .expect("a's metrics")
            .unwrap_or(0.0)
    };
    let (silent, dead) = (abandoned("peer_silent"), abandoned("peer_dead"));
    println!(
        "frozen peer: {} of {} failed, slowest answer {:.2} s; attempts given up: {silent} on \
         silence, {dead} on the failure detector",
        failed.len(),
        outcomes.len(),
        slowest.as_secs_f64()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(
        silent + dead >= 1.0,
        "no request was waiting at b when it froze: the case was not exercised"
    );
    wait_until(CONVERGENCE_TIMEOUT, "b to rejoin after it thaws", || {
        cluster
            .sidecar("a")
            .peer_ids()
            .is_ok_and(|peers| peers.iter().any(|p| p == "b"))
    });
}
