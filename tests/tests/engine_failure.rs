//! When an engine stops, its sidecar stays in the mesh as an entry point but stops being a
//! target; when no engine is left, clients get 503 with `Retry-After`; a node that says it is
//! ready serves its own engine's model.

use std::time::Instant;

use kvmesh_tests::openai::assert_openai_error;
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, call, every_call_served_by, try_call, wait_for,
};

const NODES: [&str; 3] = ["a", "b", "c"];

#[test]
fn a_sidecar_whose_engine_stopped_still_forwards_elsewhere() {
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared"]),
        NodeSpec::new("b", &["shared"]),
        NodeSpec::new("c", &["shared"]),
    ]);
    cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);
    for entry in NODES {
        call(cluster.sidecar(entry), Call::Completion, "shared", "before");
    }

    let stopped_at = Instant::now();
    cluster.node_mut("c").engine.kill9();

    // Until c's digest says its engine is gone, failures are recorded (and printed), not
    // judged; the transition ends with a full round in which c serves nothing.
    let mut transition_failures = Vec::new();
    let what = "a full round of requests succeeds without c's engine";
    wait_for(CONVERGENCE_TIMEOUT, what, || {
        for entry in NODES {
            for kind in Call::ALL {
                match try_call(cluster.sidecar(entry), kind, "shared", "transition") {
                    Ok(served) if served.node != "c" => {}
                    Ok(served) => return Err(format!("c still serves: {served:?}")),
                    Err(problem) => {
                        transition_failures.push(problem.clone());
                        return Err(problem);
                    }
                }
            }
        }
        Ok(())
    });
    println!(
        "c's engine out of rotation {:?} after it stopped; {} requests failed meanwhile{}",
        stopped_at.elapsed(),
        transition_failures.len(),
        transition_failures
            .first()
            .map(|first| format!(", first: {first}"))
            .unwrap_or_default()
    );

    // Now every request through every entry, c included, succeeds, served by a or b.
    let entries = NODES.map(|entry| cluster.sidecar(entry));
    let served_by = every_call_served_by(&entries, "shared", 3, &["a", "b"]);
    println!("36 requests after c's engine stopped served by {served_by:?}");
    // c is still a member: an entry point, no longer a target.
    for (member, others) in [("a", ["b", "c"]), ("b", ["a", "c"])] {
        let peers = cluster.sidecar(member).peer_ids().expect("/debug/cluster");
        assert_eq!(peers, others, "{member} must still list c");
    }
}

#[test]
fn no_live_target_gets_503_with_retry_after() {
    let mut cluster = Cluster::start(&[NodeSpec::new("solo", &["shared"])]);
    // Ready means listening; the engine's models arrive with its first poll.
    cluster.wait_models(&["solo"], &["shared"], CONVERGENCE_TIMEOUT);
    call(
        cluster.sidecar("solo"),
        Call::Completion,
        "shared",
        "while the engine lives",
    );
    cluster.node_mut("solo").engine.kill9();
    let sidecar = cluster.sidecar("solo");

    let (response, after) = wait_for(CONVERGENCE_TIMEOUT, "the sidecar answers 503", || {
        let response = sidecar.send(Call::Completion.request("shared", "anyone?", 4));
        match response.status {
            503 => Ok(response),
            _ => Err(response.describe()),
        }
    });
    println!("503 {after:?} after the only engine stopped");
    for response in std::iter::once(response).chain(
        [Call::Chat, Call::StreamedCompletion, Call::StreamedChat]
            .map(|kind| sidecar.send(kind.request("shared", "anyone?", 4))),
    ) {
        assert_openai_error(&response, 503);
        let retry_after = response
            .header("retry-after")
            .unwrap_or_else(|| panic!("503 without Retry-After: {}", response.describe()));
        assert!(
            retry_after.parse::<u64>().is_ok(),
            "Retry-After is not a number of seconds: {}",
            response.describe()
        );
    }
}

#[test]
fn a_node_serves_its_own_engine_as_soon_as_it_is_ready() {
    // The readiness line is what an orchestrator waits for; a request sent right after it,
    // for the model of the node's own healthy engine, must not be turned away.
    let cluster = Cluster::start(&[NodeSpec::new("solo", &["shared"])]);
    let response = cluster
        .sidecar("solo")
        .send(Call::Completion.request("shared", "first", 4));
    assert_eq!(
        response.status,
        200,
        "the first request after the readiness line: {}",
        response.describe()
    );
}
