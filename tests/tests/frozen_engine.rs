//! An engine frozen (SIGSTOP: a hung GPU, a stuck process) while requests wait at it for
//! their first byte: once its sidecar's poller finds it unhealthy, those requests go to
//! another engine, streamed or not, whether they entered at the frozen engine's own sidecar
//! or were forwarded to it, and none is lost (issue 18). Before, they waited for the engine
//! to wake or for the request timeout.

use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use kvmesh_tests::openai::completion_body;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Request, Response, Timing};

const NODES: [&str; 3] = ["a", "b", "c"];
const CLIENTS: u32 = 12;

/// Whether `answer` is a whole, successful answer: a 200 and, for a stream, every event up
/// to `[DONE]` with no error event.
fn complete(answer: &Response, streamed: bool) -> bool {
    let text = answer.text();
    answer.status == 200
        && (!streamed || (text.contains("data: [DONE]") && !text.contains("\"error\"")))
}

#[test]
fn requests_waiting_on_a_frozen_engine_go_to_another_before_their_first_byte() {
    // b's engine prefills slowly, so that what it holds is still waiting for its first token
    // when it freezes.
    let specs: Vec<NodeSpec> = NODES
        .iter()
        .map(|n| {
            let spec = NodeSpec::new(n, &["m"]).timing(Timing::Scaled(1.0));
            match *n {
                "b" => spec.engine_args(&["--prefill-tokens-per-s", "100"]),
                _ => spec,
            }
        })
        .collect();
    let mut cluster = Cluster::start(&specs);
    cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);
    let entries = [
        cluster.sidecar("a").http_addr(),
        cluster.sidecar("b").http_addr(),
    ];

    // 12 distinct prompts at once, half streamed, through a and through b (so both b's own
    // attempts and the requests forwarded to it meet the frozen engine).
    let start = Arc::new(Barrier::new(CLIENTS as usize + 1));
    let clients: Vec<_> = (0..CLIENTS)
        .map(|i| {
            let start = start.clone();
            let entry = entries[i as usize % 2];
            let streamed = i % 4 < 2;
            std::thread::spawn(move || {
                let prompt = format!("request {i}: {}", "a distinct prompt. ".repeat(60));
                let request = Request::post_json(
                    "/v1/completions",
                    &completion_body("m", &prompt, 8, streamed),
                )
                .timeout(Duration::from_secs(30));
                start.wait();
                let began = Instant::now();
                let answer = request.send(entry);
                (i, streamed, answer, began.elapsed())
            })
        })
        .collect();
    start.wait();
    std::thread::sleep(Duration::from_millis(300));
    cluster.node_mut("b").engine.process().sigstop();
    let outcomes: Vec<_> = clients
        .into_iter()
        .map(|client| client.join().expect("client thread"))
        .collect();
    // Every client has its answer while b's engine is still frozen.
    let abandoned = cluster
        .sidecar("b")
        .metric(
            "kvmesh_attempts_abandoned_total",
            &[("reason", "engine_unhealthy")],
        )
        .expect("b's metrics")
        .unwrap_or(0.0);
    cluster.node_mut("b").engine.process().sigcont();

    let mut failed = Vec::new();
    let mut slowest = Duration::ZERO;
    for (i, streamed, answer, took) in &outcomes {
        slowest = slowest.max(*took);
        match answer {
            Ok(answer) if complete(answer, *streamed) => {}
            Ok(answer) => failed.push(format!("request {i}: {}", answer.describe())),
            Err(e) => failed.push(format!("request {i}: {e}")),
        }
    }
    println!(
        "frozen engine: {} of {CLIENTS} failed, {abandoned} attempts given back by b, slowest \
         answer {:.2} s",
        failed.len(),
        slowest.as_secs_f64()
    );
    assert!(failed.is_empty(), "{}", failed.join("\n"));
    assert!(
        abandoned >= 1.0,
        "no request was waiting at b's engine when it froze: the case was not exercised"
    );
}
