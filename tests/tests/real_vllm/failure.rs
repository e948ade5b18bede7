//! A vLLM server SIGKILLed while streams run through the mesh.

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvmesh_tests::vllm::{MODEL, VLLM_CALL_TIMEOUT, prompt};
use kvmesh_tests::{Request, Sidecar, SseReader, VllmServer, wait_for, wait_until};
use serde_json::{Value, json};

use super::LEARN_TIMEOUT;

/// What became of one request of the load.
#[derive(Debug)]
enum Outcome {
    /// Answered in full by this node.
    Served(String),
    /// Failed after its 200 and some of its stream reached the client (node, what went
    /// wrong): allowed for the requests the killed server was running.
    CutMidStream(String, String),
    /// Failed before any of its answer: never allowed, another server was there to take it.
    Refused(String),
}

/// Streamed completions through both nodes, 6 at a time, until `stop`.
fn load(entries: [&Sidecar; 2], stop: &AtomicBool) -> Vec<(Instant, Outcome)> {
    std::thread::scope(|scope| {
        let clients: Vec<_> = (0..6)
            .map(|client| {
                scope.spawn(move || {
                    let mut outcomes = Vec::new();
                    for round in 0.. {
                        if stop.load(Ordering::Relaxed) {
                            break;
                        }
                        let entry = entries[(client + round) % 2];
                        let text = prompt(&format!("load {client} {round}"), 200);
                        let body = json!({"model": MODEL, "prompt": text, "max_tokens": 48,
                            "ignore_eos": true, "stream": true});
                        outcomes.push((Instant::now(), one_streamed(entry, &body)));
                    }
                    outcomes
                })
            })
            .collect();
        clients
            .into_iter()
            .flat_map(|client| client.join().expect("a client thread"))
            .collect()
    })
}

fn one_streamed(entry: &Sidecar, body: &Value) -> Outcome {
    let request = Request::post_json("/v1/completions", body).timeout(VLLM_CALL_TIMEOUT);
    let open = match entry.try_open(request) {
        Ok(open) => open,
        Err(error) => return Outcome::Refused(format!("via {}: {error}", entry.node_id())),
    };
    if open.status != 200 {
        let status = open.status;
        let mut text = String::new();
        let _ = std::io::Read::read_to_string(&mut { open }, &mut text);
        return Outcome::Refused(format!("via {}: HTTP {status}: {text}", entry.node_id()));
    }
    let node = open.header("x-kvmesh-node").unwrap_or("?").to_string();
    match SseReader::new(open).read_to_end() {
        Ok(transcript) => match transcript.check_openai_stream("text_completion") {
            Ok(_) => Outcome::Served(node),
            Err(problem) => Outcome::CutMidStream(node, problem),
        },
        Err(error) => Outcome::CutMidStream(node, error.to_string()),
    }
}

/// Server b is SIGKILLed (its whole process group) while streams run through c and d. Streams
/// b was running may be cut; no request may fail before its stream began, since a was there
/// to serve it; the mesh marks b's engine down, and d, whose engine it was, keeps serving as
/// an entry.
pub(super) fn server_killed_under_load(c: &Sidecar, d: &Sidecar, servers: &mut [VllmServer]) {
    let stop = AtomicBool::new(false);
    let (outcomes, killed_at) = std::thread::scope(|scope| {
        let load = scope.spawn(|| load([c, d], &stop));
        let stop_on_panic = StopOnDrop(&stop);
        wait_until(LEARN_TIMEOUT, "vLLM b runs requests of the load", || {
            servers[1].metric("vllm:num_requests_running", &[]) >= 1.0
        });
        let killed_at = Instant::now();
        servers[1].kill9();
        wait_for(LEARN_TIMEOUT, "the mesh marks b's engine down", || {
            let own = d.debug_cluster()?["engine"]["healthy"].clone();
            let seen = c.digest_of("d").map(|digest| digest["healthy"].clone());
            match (own, seen) {
                (Value::Bool(false), Some(Value::Bool(false))) => Ok(()),
                other => Err(format!("d's engine healthy, as d and c see it: {other:?}")),
            }
        });
        println!(
            "b's engine marked down {:?} after the kill",
            killed_at.elapsed()
        );
        // Some more load with b known to be down.
        std::thread::sleep(Duration::from_secs(3));
        drop(stop_on_panic);
        (load.join().expect("the load"), killed_at)
    });
    let refused: Vec<&String> = outcomes
        .iter()
        .filter_map(|(_, outcome)| match outcome {
            Outcome::Refused(why) => Some(why),
            _ => None,
        })
        .collect();
    let cut: Vec<(&String, &String)> = outcomes
        .iter()
        .filter_map(|(_, outcome)| match outcome {
            Outcome::CutMidStream(node, why) => Some((node, why)),
            _ => None,
        })
        .collect();
    let served_by = |node: &str, after: bool| {
        outcomes
            .iter()
            .filter(|(at, outcome)| {
                (*at >= killed_at) == after && matches!(outcome, Outcome::Served(n) if n == node)
            })
            .count()
    };
    println!(
        "{} requests: before the kill c served {}, d {}; after it c {}, d {}; {} cut \
         mid-stream (first: {:?}), {} refused",
        outcomes.len(),
        served_by("c", false),
        served_by("d", false),
        served_by("c", true),
        served_by("d", true),
        cut.len(),
        cut.first(),
        refused.len()
    );
    assert!(
        refused.is_empty(),
        "requests failed before their stream began: {refused:#?}"
    );
    // Not vacuous: b had streams of the load running (finished before the kill, or cut).
    assert!(
        served_by("d", false) + cut.len() > 0,
        "b served none of the load"
    );
    assert!(
        cut.iter().all(|(node, _)| *node == "d"),
        "a stream from another node than d was cut: {cut:?}"
    );
    assert_eq!(served_by("d", true), 0, "d answered after its engine died");
    let after: Vec<&Outcome> = outcomes
        .iter()
        .filter(|(at, _)| *at >= killed_at)
        .map(|(_, outcome)| outcome)
        .collect();
    assert!(
        after.len() >= 6,
        "too little load after the kill: {after:?}"
    );
    assert!(
        after
            .iter()
            .all(|outcome| matches!(outcome, Outcome::Served(node) if node == "c")),
        "a request sent after the kill was not served by c: {after:?}"
    );
}

/// Sets the flag when dropped, so that the load stops also when the stage panics.
struct StopOnDrop<'a>(&'a AtomicBool);

impl Drop for StopOnDrop<'_> {
    fn drop(&mut self) {
        self.0.store(true, Ordering::Relaxed);
    }
}
