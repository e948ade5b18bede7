//! Many models and LoRA adapters over real processes (issue 16's acceptance): four engines,
//! two of model A (one under two names) and two of model B (an adapter loaded on one, more
//! loadable on both). Every request lands on an engine serving what it asked for; an alias
//! meets the other name's cache; an adapter no engine has is loaded on the engine every entry
//! picks alike, and later requests for it go there; `/v1/models` is the same at every node.

use kvmesh_protocol::route::{node_key, rendezvous_weight};
use kvmesh_tests::cluster::{Cluster, NodeSpec};
use kvmesh_tests::openai::{assert_openai_error, chat_body, completion_body};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Request, wait_until};
use serde_json::{Value, json};
use std::collections::BTreeSet;

const NODES: [&str; 4] = ["a1", "a2", "b1", "b2"];
/// What the sidecars of model B's engines may load: any `chat-*`, and `sql`.
const LOADABLE: &str = "sql=model-b,chat-*=model-b";

fn cluster() -> Cluster {
    let b_engine = ["--allow-runtime-lora-updating", "--max-loras", "2"];
    let b_sidecar = [
        "--lora-adapter",
        LOADABLE,
        "--lora-path-template",
        "/adapters/{name}",
    ];
    let details = ["--enable-prompt-tokens-details"];
    let cluster = Cluster::start(&[
        NodeSpec::new("a1", &["model-a", "alias-a"]).engine_args(&details),
        NodeSpec::new("a2", &["model-a"]).engine_args(&details),
        NodeSpec::new("b1", &["model-b"])
            .engine_args(&b_engine)
            .engine_args(&["--lora", "sql"])
            .sidecar_args(&b_sidecar),
        NodeSpec::new("b2", &["model-b"])
            .engine_args(&b_engine)
            .sidecar_args(&b_sidecar),
    ]);
    cluster.wait_membership(&NODES, CONVERGENCE_TIMEOUT);
    let all = ["alias-a", "model-a", "model-b", "sql"];
    cluster.wait_models(&NODES, &all, CONVERGENCE_TIMEOUT);
    cluster
}

/// A small non-streamed completion body.
fn completion(model: &str, prompt: &str) -> Value {
    completion_body(model, prompt, 2, false)
}

/// The engine of model B every entry node should load `adapter` onto: both have a free slot,
/// so the highest rendezvous weight on its name.
fn rendezvous_choice(adapter: &str) -> &'static str {
    let key = node_key(adapter);
    ["b1", "b2"]
        .into_iter()
        .max_by_key(|node| rendezvous_weight(key, node_key(node)))
        .unwrap()
}

/// The adapter names the engine of `node` lists in its own `/v1/models`.
fn engine_adapters(cluster: &Cluster, node: &str) -> BTreeSet<String> {
    let listed = cluster.node(node).engine.get("/v1/models").json();
    listed["data"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|card| card["parent"].is_string())
        .filter_map(|card| card["id"].as_str().map(str::to_owned))
        .collect()
}

fn loads(cluster: &Cluster, node: &str, outcome: &str) -> f64 {
    let sidecar = cluster.sidecar(node);
    let value = sidecar.metric("kvmesh_lora_loads_total", &[("outcome", outcome)]);
    value.expect("metrics").unwrap_or(0.0)
}

#[test]
fn every_request_lands_on_an_engine_serving_what_it_asked_for() {
    let cluster = cluster();
    let servers = [
        ("model-a", &["a1", "a2"][..]),
        ("alias-a", &["a1"][..]),
        ("model-b", &["b1", "b2"][..]),
        ("sql", &["b1"][..]),
    ];
    for entry in NODES {
        for (i, (model, engines)) in servers.iter().enumerate() {
            for (path, body) in [
                (
                    "/v1/completions",
                    completion(model, &format!("{entry} {i} hello")),
                ),
                (
                    "/v1/chat/completions",
                    chat_body(model, &format!("{entry} {i} hi"), 2, false),
                ),
            ] {
                let answer = cluster.sidecar(entry).post_json(path, &body);
                assert_eq!(
                    answer.status,
                    200,
                    "{model} via {entry}: {}",
                    answer.describe()
                );
                let node = answer.header("x-kvmesh-node").unwrap_or_default();
                assert!(
                    engines.contains(&node),
                    "{model} via {entry} went to {node}"
                );
                assert_eq!(answer.json()["model"], *model);
            }
        }
        // Embeddings and rerank through any node, to an engine of their model.
        let embedded = cluster.sidecar(entry).post_json(
            "/v1/embeddings",
            &json!({"model": "model-b", "input": ["the fox", "the dog"]}),
        );
        assert_eq!(embedded.status, 200, "{}", embedded.describe());
        let node = embedded.header("x-kvmesh-node").unwrap_or_default();
        assert!(["b1", "b2"].contains(&node), "embeddings went to {node}");
        assert_eq!(embedded.json()["data"].as_array().map(Vec::len), Some(2));
        let reranked = cluster.sidecar(entry).post_json(
            "/v1/rerank",
            &json!({"model": "alias-a", "query": "fox", "documents": ["dog", "fox"]}),
        );
        assert_eq!(reranked.status, 200, "{}", reranked.describe());
        assert_eq!(reranked.header("x-kvmesh-node"), Some("a1"));
        assert_eq!(reranked.json()["results"][0]["index"], 1);
    }
    // A name that is neither a model nor a loadable adapter: 404 with the list, from any node.
    for entry in NODES {
        let unknown = cluster
            .sidecar(entry)
            .post_json("/v1/completions", &completion("math", "1+1"));
        let error = assert_openai_error(&unknown, 404);
        let message = error["message"].as_str().unwrap_or_default();
        assert!(
            ["alias-a", "model-a", "model-b", "sql"]
                .iter()
                .all(|model| message.contains(model)),
            "{message}"
        );
    }
    assert_eq!(
        NODES.map(|node| loads(&cluster, node, "loaded")),
        [0.0; 4],
        "nothing was loaded for requests of served models"
    );

    // Every node lists the same models, as the engines describe them.
    wait_until(CONVERGENCE_TIMEOUT, "the model cards to spread", || {
        NODES.iter().all(|entry| {
            let listed = cluster.sidecar(entry).get("/v1/models").json();
            listed["data"]
                .as_array()
                .is_some_and(|cards| cards.len() == 4 && cards.iter().all(|c| c["created"] != 0))
        })
    });
    let first = cluster.sidecar("a1").get("/v1/models").json();
    for entry in NODES {
        assert_eq!(
            cluster.sidecar(entry).get("/v1/models").json(),
            first,
            "at {entry}"
        );
    }
}

#[test]
fn an_alias_meets_the_other_names_cache() {
    let cluster = cluster();
    let prompt: String = (0..64)
        .map(|i| format!("block {i:03} of a long shared prompt. "))
        .collect();
    // Only a1 serves the alias: the prompt is cached there.
    let first = cluster
        .sidecar("b2")
        .post_json("/v1/completions", &completion("alias-a", &prompt));
    assert_eq!(first.status, 200, "{}", first.describe());
    assert_eq!(first.header("x-kvmesh-node"), Some("a1"));
    let by_name = completion("model-a", &prompt);
    wait_until(
        CONVERGENCE_TIMEOUT,
        "every node to learn a1 holds it",
        || {
            NODES.iter().all(|entry| {
                let matched = cluster
                    .sidecar(entry)
                    .post_json("/debug/match", &by_name)
                    .json();
                matched["nodes"].as_array().is_some_and(|nodes| {
                    nodes.iter().any(|node| {
                        node["node"] == "a1" && node["matched_blocks"].as_u64() > Some(10)
                    })
                })
            })
        },
    );
    for entry in NODES {
        let second = cluster
            .sidecar(entry)
            .post_json("/v1/completions", &by_name);
        assert_eq!(second.status, 200, "{}", second.describe());
        assert_eq!(second.header("x-kvmesh-node"), Some("a1"), "via {entry}");
        let cached = second.json()["usage"]["prompt_tokens_details"]["cached_tokens"]
            .as_u64()
            .unwrap_or(0);
        assert!(cached > 0, "via {entry}: {}", second.describe());
    }
}

#[test]
fn an_adapter_loaded_nowhere_is_loaded_on_the_rendezvous_choice_and_stays_there() {
    let cluster = cluster();
    let adapter = "chat-support";
    let home = rendezvous_choice(adapter);
    let other = if home == "b1" { "b2" } else { "b1" };
    assert!(!engine_adapters(&cluster, home).contains(adapter));

    // The first request, from a node of model A, loads it there.
    let first = cluster
        .sidecar("a2")
        .post_json("/v1/completions", &completion(adapter, "open a ticket"));
    assert_eq!(first.status, 200, "{}", first.describe());
    assert_eq!(first.header("x-kvmesh-node"), Some(home));
    assert_eq!(first.header("x-kvmesh-reason"), Some("lora-load"));
    assert_eq!(first.json()["model"], adapter);
    assert!(engine_adapters(&cluster, home).contains(adapter));
    assert!(!engine_adapters(&cluster, other).contains(adapter));
    assert_eq!(loads(&cluster, home, "loaded"), 1.0);
    let card = cluster.node(home).engine.get("/v1/models").json()["data"]
        .as_array()
        .and_then(|cards| cards.iter().find(|c| c["id"] == adapter).cloned())
        .expect("the adapter's card");
    assert_eq!(
        card["root"],
        format!("/adapters/{adapter}"),
        "the path template"
    );
    assert_eq!(card["parent"], "model-b");

    // Later requests, from every node, go there too: the digest shows it loaded.
    let all = ["alias-a", adapter, "model-a", "model-b", "sql"];
    cluster.wait_models(&NODES, &all, CONVERGENCE_TIMEOUT);
    for (i, entry) in NODES.iter().enumerate() {
        let later = cluster.sidecar(entry).post_json(
            "/v1/completions",
            &completion(adapter, &format!("ticket {i}")),
        );
        assert_eq!(later.status, 200, "{}", later.describe());
        assert_eq!(later.header("x-kvmesh-node"), Some(home), "via {entry}");
        assert_ne!(later.header("x-kvmesh-reason"), Some("lora-load"));
    }

    // Requests for another new adapter from every node at once: one load, one engine.
    let adapter = "chat-billing";
    let home = rendezvous_choice(adapter);
    let before = loads(&cluster, home, "loaded");
    let sent: Vec<_> = NODES
        .iter()
        .flat_map(|entry| [entry; 2])
        .enumerate()
        .map(|(i, entry)| {
            let addr = cluster.sidecar(entry).http_addr();
            let body = completion(adapter, &format!("invoice {i}"));
            std::thread::spawn(move || {
                Request::post_json("/v1/completions", &body)
                    .timeout(std::time::Duration::from_secs(30))
                    .send(addr)
                    .expect("a concurrent request")
            })
        })
        .collect();
    for answer in sent {
        let answer = answer.join().expect("request thread");
        assert_eq!(answer.status, 200, "{}", answer.describe());
        assert_eq!(answer.header("x-kvmesh-node"), Some(home));
    }
    assert_eq!(loads(&cluster, home, "loaded") - before, 1.0, "loaded once");
    for node in NODES {
        assert_eq!(loads(&cluster, node, "failed"), 0.0, "{node}");
    }
}

#[test]
fn an_adapter_the_engine_cannot_load_gets_a_clear_error() {
    // The sidecar may load anything, but its engine runs without runtime loading.
    let cluster =
        Cluster::start(&[NodeSpec::new("a", &["m"]).sidecar_args(&["--lora-adapter", "*=m"])]);
    cluster.wait_models(&["a"], &["m"], CONVERGENCE_TIMEOUT);
    let answer = cluster
        .sidecar("a")
        .post_json("/v1/completions", &completion("tuned", "hello"));
    let error = assert_openai_error(&answer, 502);
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("tuned") && message.contains("VLLM_ALLOW_RUNTIME_LORA_UPDATING"),
        "{message}"
    );
    assert_eq!(
        cluster
            .sidecar("a")
            .metric("kvmesh_lora_loads_total", &[("outcome", "failed")])
            .expect("metrics"),
        Some(1.0)
    );
}
