//! Three engines and three sidecars: every node is an entry point, requests reach an engine
//! serving their model, answers stream through, and the operator endpoints describe the
//! cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use kvmesh_tests::openai::assert_completion;
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Call, Cluster, Node, NodeSpec, Request, SseReader, Timing, call, wait_for,
};

const NODES: [&str; 3] = ["a", "b", "c"];

/// `shared` on every engine, plus `only-a` and `only-b` as aliases on two of them.
fn three_nodes() -> Cluster {
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared", "only-a"]),
        NodeSpec::new("b", &["shared", "only-b"]),
        NodeSpec::new("c", &["shared"]),
    ]);
    let formed = cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);
    println!("three nodes formed a cluster {formed:?} after the last was ready");
    cluster.wait_models(&NODES, &["only-a", "only-b", "shared"], CONVERGENCE_TIMEOUT);
    cluster
}

/// Waits until the engine of `node` has finished exactly `expected` requests (its counter may
/// trail the last answer by a moment).
fn wait_engine_finished(node: &Node, expected: f64) {
    let what = format!(
        "the engine of {} has finished {expected} requests",
        node.name()
    );
    wait_for(Duration::from_secs(10), &what, || {
        match node.engine.finished_requests() {
            finished if finished == expected => Ok(()),
            finished => Err(format!("{finished} finished")),
        }
    });
}

#[test]
fn every_entry_serves_plain_and_streamed_requests() {
    let cluster = three_nodes();
    let mut served_by: BTreeMap<String, usize> = BTreeMap::new();
    for entry in NODES {
        for round in 0..6 {
            for kind in Call::ALL {
                let prompt = format!("entry {entry} round {round} {kind:?}");
                let served = call(cluster.sidecar(entry), kind, "shared", &prompt);
                assert!(
                    NODES.contains(&served.node.as_str()),
                    "served by {served:?}"
                );
                *served_by.entry(served.node).or_default() += 1;
            }
        }
    }
    println!("72 requests for `shared` (24 per entry) were served by {served_by:?}");
    assert!(
        served_by.len() > 1,
        "a single node served everything: {served_by:?}"
    );
    // The engines agree with the headers: each served what the sidecars said it served.
    for node in cluster.nodes() {
        let claimed = served_by.get(node.name()).copied().unwrap_or(0) as f64;
        assert_eq!(
            node.engine.finished_requests(),
            claimed,
            "engine of {}",
            node.name()
        );
    }
}

#[test]
fn requests_reach_an_engine_that_serves_their_model() {
    let cluster = three_nodes();
    for entry in NODES {
        for kind in Call::ALL {
            for (model, owner) in [("only-a", "a"), ("only-b", "b")] {
                let served = call(
                    cluster.sidecar(entry),
                    kind,
                    model,
                    &format!("{entry} {kind:?}"),
                );
                assert_eq!(
                    served.node, owner,
                    "{kind:?} for {model} entering at {entry}"
                );
            }
        }
    }
    // 3 entries × 4 kinds for each model; c's engine serves neither.
    wait_engine_finished(cluster.node("a"), 12.0);
    wait_engine_finished(cluster.node("b"), 12.0);
    wait_engine_finished(cluster.node("c"), 0.0);
}

#[test]
fn models_lists_the_union_once_in_openai_shape() {
    let cluster = three_nodes();
    for entry in NODES {
        let response = cluster.sidecar(entry).get("/v1/models");
        assert_eq!(response.status, 200, "{}", response.describe());
        let list = response.json();
        assert_eq!(list["object"], "list", "{list}");
        let data = list["data"].as_array().expect("data array");
        let mut ids: Vec<&str> = data
            .iter()
            .map(|model| model["id"].as_str().expect("id"))
            .collect();
        ids.sort();
        assert_eq!(
            ids,
            ["only-a", "only-b", "shared"],
            "deduplicated union at {entry}"
        );
        for model in data {
            assert_eq!(model["object"], "model", "{model}");
        }
    }
}

#[test]
fn operator_endpoints_describe_the_cluster() {
    let cluster = three_nodes();
    for entry in NODES {
        let sidecar = cluster.sidecar(entry);
        let health = sidecar.get("/health");
        assert_eq!(health.status, 200, "{}", health.describe());

        let described = sidecar.debug_cluster().expect("/debug/cluster");
        assert_eq!(described["node"], entry, "{described}");
        let peers = described["peers"].as_array().expect("peers");
        assert_eq!(peers.len(), 2, "{described}");
        for peer in peers {
            let name = peer["node"].as_str().expect("peer node");
            assert_ne!(name, entry, "a node lists itself: {described}");
            let mesh_addr = cluster.sidecar(name).mesh_addr().to_string();
            assert_eq!(peer["mesh_addr"], mesh_addr.as_str(), "{peer}");
            let age_ms = peer["age_ms"].as_f64().expect("age_ms");
            assert!((0.0..30_000.0).contains(&age_ms), "stale peer: {peer}");
            assert!(peer["digest"].is_object(), "{peer}");
        }
    }

    // Requests are counted where they enter, and each node sees its two peers alive.
    for entry in NODES {
        call(
            cluster.sidecar(entry),
            Call::Completion,
            "shared",
            "count me",
        );
    }
    for entry in NODES {
        let sidecar = cluster.sidecar(entry);
        let response = sidecar.send(Request::get("/metrics"));
        assert_eq!(response.status, 200, "{}", response.describe());
        let text = response.text();
        for family in ["kvmesh_requests_total", "kvmesh_mesh_peers_alive"] {
            assert!(
                text.contains(family),
                "{family} missing from /metrics of {entry}:\n{text}"
            );
        }
        wait_for(
            CONVERGENCE_TIMEOUT,
            "metrics count the request and both peers",
            || {
                let requests = sidecar.metric("kvmesh_requests_total", &[])?.unwrap_or(0.0);
                let peers = sidecar
                    .metric("kvmesh_mesh_peers_alive", &[])?
                    .unwrap_or(0.0);
                if requests >= 1.0 && peers == 2.0 {
                    Ok(())
                } else {
                    Err(format!(
                        "{entry}: kvmesh_requests_total {requests}, kvmesh_mesh_peers_alive {peers}"
                    ))
                }
            },
        );
    }
}

#[test]
fn concurrent_requests_from_one_entry_spread_over_the_engines() {
    // Real-time engines: each answer takes ~0.6 s, so the requests overlap and an entry that
    // counts its own recent assignments sends them to different engines.
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared"]).timing(Timing::Scaled(1.0)),
        NodeSpec::new("b", &["shared"]).timing(Timing::Scaled(1.0)),
        NodeSpec::new("c", &["shared"]).timing(Timing::Scaled(1.0)),
    ]);
    cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);
    const REQUESTS: usize = 12;
    let entry = cluster.sidecar("a");
    let served: Vec<String> = std::thread::scope(|scope| {
        let calls: Vec<_> = (0..REQUESTS)
            .map(|index| {
                scope.spawn(move || {
                    let request = Call::StreamedCompletion.request(
                        "shared",
                        &format!("concurrent {index}"),
                        50,
                    );
                    let open = entry.try_open(request).expect("stream opens");
                    assert_eq!(open.status, 200);
                    let node = open
                        .header("x-kvmesh-node")
                        .expect("x-kvmesh-node")
                        .to_string();
                    let transcript = SseReader::new(open).read_to_end().expect("whole stream");
                    transcript.assert_openai_stream("text_completion");
                    node
                })
            })
            .collect();
        calls
            .into_iter()
            .map(|call| call.join().expect("call thread"))
            .collect()
    });
    let mut served_by: BTreeMap<String, usize> = BTreeMap::new();
    for node in served {
        *served_by.entry(node).or_default() += 1;
    }
    println!("{REQUESTS} concurrent streams entering at a were served by {served_by:?}");
    assert!(
        served_by.len() > 1,
        "one engine got every concurrent request: {served_by:?}"
    );
    let busiest = served_by.values().copied().max().unwrap_or(0);
    assert!(
        busiest <= REQUESTS * 2 / 3,
        "routing piles onto one engine: {served_by:?}"
    );
}

#[test]
fn request_ids_travel_to_the_engine_and_back() {
    // The mock engine, like vLLM, names its answer after the X-Request-Id it received
    // (`cmpl-ID`, `chatcmpl-ID`), so the body shows what reached the engine.
    let cluster = three_nodes();
    let entry = cluster.sidecar("a");
    let mut generated = Vec::new();
    for (model, owner) in [("only-a", "a"), ("only-b", "b")] {
        for kind in [Call::Completion, Call::Chat] {
            let given = format!("e2e-{model}-{kind:?}");
            let request = kind.request(model, "ids", 4).header("x-request-id", &given);
            let response = entry.send(request);
            let body = assert_completion(&response, kind.object(), model);
            assert_eq!(response.header("x-kvmesh-node"), Some(owner));
            assert_eq!(
                response.header("x-request-id"),
                Some(given.as_str()),
                "{}",
                response.describe()
            );
            let answer_id = body["id"].as_str().unwrap_or_default();
            assert!(
                answer_id.ends_with(&given),
                "the engine got another id: {answer_id}"
            );

            // Without one, the entry makes one up, and the engine gets that.
            let response = entry.send(kind.request(model, "ids", 4));
            let body = assert_completion(&response, kind.object(), model);
            let made_up = response
                .header("x-request-id")
                .unwrap_or_default()
                .to_string();
            assert!(
                !made_up.is_empty(),
                "no x-request-id generated: {}",
                response.describe()
            );
            let answer_id = body["id"].as_str().unwrap_or_default();
            assert!(
                answer_id.ends_with(&made_up),
                "engine used {answer_id}, entry said {made_up}"
            );
            generated.push(made_up);
        }
    }
    generated.sort();
    generated.dedup();
    assert_eq!(
        generated.len(),
        4,
        "generated request ids repeat: {generated:?}"
    );
}
