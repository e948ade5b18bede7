//! `--log-format json`: every stderr line of the sidecar is one JSON object, and the events of
//! a request carry its request_id, the node, the routing reason and the peer it went to, on
//! the entry node and on the node that served it alike.

use kvmesh_tests::process::Pipe;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Request, wait_for};
use serde_json::{Value, json};
use std::time::Duration;

#[test]
fn json_logs_carry_request_id_node_reason_and_peer() {
    // b also serves `only-b`: a request for it goes from a to b whatever the loads (an idle
    // entry's own engine leads near-equal candidates, so `m` would stay on a).
    let json_logs = |config: kvmesh_tests::SidecarConfig| {
        config
            .arg("--log-format")
            .arg("json")
            // The per-attempt "forwarded" and the serving side's "engine answered" events are
            // debug ones.
            .env("RUST_LOG", "info,kvmesh_node=debug")
    };
    let mut cluster = Cluster::empty();
    cluster.join_with(&NodeSpec::new("b", &["m", "only-b"]), json_logs);
    cluster.join_with(&NodeSpec::new("a", &["m"]), json_logs);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);

    // Requests through a until one is served by its peer b.
    let mut attempt = 0;
    let (served, _) = wait_for(CONVERGENCE_TIMEOUT, "a request served by b", || {
        attempt += 1;
        let request_id = format!("log-test-{attempt}");
        let body =
            json!({"model": "only-b", "prompt": format!("prompt {attempt}"), "max_tokens": 4});
        let response = cluster
            .sidecar("a")
            .try_send(
                Request::post_json("/v1/completions", &body).header("x-request-id", &request_id),
            )
            .map_err(|e| e.to_string())?;
        let header = |name: &str| response.header(name).unwrap_or_default().to_string();
        match (response.status, header("x-kvmesh-node").as_str()) {
            (200, "b") => Ok((request_id, header("x-kvmesh-reason"))),
            (status, node) => Err(format!("{status} from {node}")),
        }
    });
    let (request_id, reason) = served;

    // The harness reads each process's stderr on a thread of its own, which a loaded machine
    // may run after the answer is back (a clean clone's CI once found no `forwarded` event
    // yet): wait for the events.
    let forwarded = logged_event(&mut cluster, "a", |e| {
        e["message"] == "forwarded" && e["span"]["request_id"] == request_id.as_str()
    });
    let lines = cluster
        .node_mut("a")
        .sidecar
        .process()
        .output_lines(Pipe::Stderr);
    let events: Vec<Value> = lines
        .iter()
        .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("not JSON ({e}): {line}")))
        .collect();
    // The node's own start-up carries its name.
    assert!(
        events.iter().any(|e| e["span"]["node"] == "a"),
        "no event names node a: {lines:#?}"
    );
    let span = &forwarded["span"];
    assert_eq!(span["name"], "request", "{forwarded}");
    assert_eq!(span["node"], "a", "{forwarded}");
    assert_eq!(span["peer"], "b", "{forwarded}");
    assert_eq!(span["reason"], reason.as_str(), "{forwarded}");
    assert_eq!(forwarded["level"], "DEBUG", "{forwarded}");

    // The serving node's events carry the same request id, with its own name and the entry's.
    let answered = logged_event(&mut cluster, "b", |e| {
        e["message"] == "engine answered" && e["span"]["request_id"] == request_id.as_str()
    });
    let span = &answered["span"];
    assert_eq!(span["name"], "forwarded", "{answered}");
    assert_eq!(span["node"], "b", "{answered}");
    assert_eq!(span["peer"], "a", "{answered}");
    assert_eq!(span["reason"], reason.as_str(), "{answered}");
}

/// The first JSON event on `node`'s stderr that `matches`, waiting for the harness to read it.
fn logged_event(cluster: &mut Cluster, node: &str, matches: impl Fn(&Value) -> bool) -> Value {
    wait_for(
        Duration::from_secs(10),
        &format!("the event at {node}"),
        || {
            let lines = cluster
                .node_mut(node)
                .sidecar
                .process()
                .output_lines(Pipe::Stderr);
            lines
                .iter()
                .filter_map(|line| serde_json::from_str::<Value>(line).ok())
                .find(|e| matches(e))
                .ok_or_else(|| format!("not among {} lines: {lines:#?}", lines.len()))
        },
    )
    .0
}
