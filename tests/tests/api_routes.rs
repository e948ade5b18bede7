//! vLLM's endpoints beyond completions and chat through the sidecars, over real processes:
//! routed by model and load at every node, with the same errors; administrative endpoints
//! never reachable.

use kvmesh_tests::cluster::{Cluster, NodeSpec};
use kvmesh_tests::openai::assert_openai_error;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Request, wait_until};
use serde_json::json;

fn cluster() -> Cluster {
    let cluster = Cluster::start(&[
        NodeSpec::new("a", &["model-a", "alias-a"]),
        NodeSpec::new("b", &["model-b"]).engine_args(&["--lora", "sql"]),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    let all = ["alias-a", "model-a", "model-b", "sql"];
    cluster.wait_models(&["a", "b"], &all, CONVERGENCE_TIMEOUT);
    cluster
}

#[test]
fn every_node_lists_the_clusters_models_as_the_engines_describe_them() {
    let cluster = cluster();
    // The cards travel under their own gossip key: wait until both nodes have them.
    wait_until(CONVERGENCE_TIMEOUT, "the model cards to spread", || {
        ["a", "b"].iter().all(|entry| {
            let listed = cluster.sidecar(entry).get("/v1/models").json();
            listed["data"]
                .as_array()
                .is_some_and(|cards| cards.iter().all(|card| card["created"] != 0))
        })
    });
    let at_a = cluster.sidecar("a").get("/v1/models").json();
    let at_b = cluster.sidecar("b").get("/v1/models").json();
    assert_eq!(at_a, at_b, "/v1/models is the same at every node");
    let card = |id: &str| {
        at_a["data"]
            .as_array()
            .and_then(|cards| cards.iter().find(|c| c["id"] == id))
            .cloned()
            .unwrap_or_else(|| panic!("no card for {id} in {at_a}"))
    };
    let (model, alias, adapter) = (card("model-a"), card("alias-a"), card("sql"));
    assert_eq!(model["owned_by"], "vllm");
    assert!(
        model["max_model_len"].as_u64().is_some_and(|n| n > 0),
        "{model}"
    );
    assert!(
        model["root"].is_string() && model["parent"].is_null(),
        "{model}"
    );
    assert_eq!(
        alias["root"], model["root"],
        "two names of one engine's weights"
    );
    assert_eq!(adapter["parent"], "model-b", "{adapter}");
}

#[test]
fn tokenize_goes_to_an_engine_of_its_model_from_either_node() {
    let cluster = cluster();
    for entry in ["a", "b"] {
        for (model, engine) in [("model-a", "a"), ("model-b", "b")] {
            let answer = cluster
                .sidecar(entry)
                .post_json("/tokenize", &json!({"model": model, "prompt": "abcdefgh"}));
            assert_eq!(answer.status, 200, "{}", answer.describe());
            assert_eq!(answer.header("x-kvmesh-node"), Some(engine));
            assert_eq!(answer.json()["count"], 2);
        }
    }
    // Without a model, the entry's own engine's (as vLLM defaults to its served model).
    let answer = cluster
        .sidecar("b")
        .post_json("/tokenize", &json!({"prompt": "abcd"}));
    assert_eq!(answer.status, 200, "{}", answer.describe());
    assert_eq!(answer.header("x-kvmesh-node"), Some("b"));
}

#[test]
fn unknown_models_bad_bodies_and_admin_endpoints_get_clear_errors() {
    let cluster = cluster();
    let sidecar = cluster.sidecar("a");
    let unknown = sidecar.post_json("/v1/embeddings", &json!({"model": "nope", "input": "x"}));
    let error = assert_openai_error(&unknown, 404);
    let message = error["message"].as_str().unwrap_or_default();
    assert!(
        message.contains("model-a") && message.contains("model-b"),
        "{message}"
    );
    let malformed = sidecar.send(Request::post("/v1/embeddings", "{not json"));
    assert_openai_error(&malformed, 400);
    let wrong_type = sidecar.post_json("/score", &json!({"model": 7}));
    assert_openai_error(&wrong_type, 400);
    for admin in ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"] {
        let refused = sidecar.post_json(admin, &json!({"lora_name": "x", "lora_path": "/etc"}));
        assert_openai_error(&refused, 404);
    }
    let get = sidecar.get("/v1/embeddings");
    assert_openai_error(&get, 405);
}

#[test]
fn a_second_name_of_a_model_meets_the_first_names_cache() {
    let names = ["model-a", "alias-a"];
    let cluster = Cluster::start(&[NodeSpec::new("a", &names), NodeSpec::new("b", &names)]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    // Both nodes know both engines' cards (the weights' identity seeds the chains).
    wait_until(CONVERGENCE_TIMEOUT, "the model cards to spread", || {
        ["a", "b"].iter().all(|entry| {
            let listed = cluster.sidecar(entry).get("/v1/models").json();
            listed["data"].as_array().is_some_and(|cards| {
                cards.len() == 2 && cards.iter().all(|card| card["created"] != 0)
            })
        })
    });
    let prompt: String = (0..64)
        .map(|i| format!("block {i:03} of a long shared prompt. "))
        .collect();
    let first = cluster.sidecar("a").post_json(
        "/v1/completions",
        &json!({"model": "model-a", "prompt": prompt, "max_tokens": 2}),
    );
    assert_eq!(first.status, 200, "{}", first.describe());
    let holder = first.header("x-kvmesh-node").expect("served by").to_owned();
    let alias = json!({"model": "alias-a", "prompt": prompt, "max_tokens": 2});
    wait_until(
        CONVERGENCE_TIMEOUT,
        "b to learn who holds the prompt",
        || {
            let matched = cluster
                .sidecar("b")
                .post_json("/debug/match", &alias)
                .json();
            matched["nodes"].as_array().is_some_and(|nodes| {
                nodes.iter().any(|node| {
                    node["node"] == holder.as_str() && node["matched_blocks"].as_u64() > Some(10)
                })
            })
        },
    );
    let second = cluster.sidecar("b").post_json("/v1/completions", &alias);
    assert_eq!(second.status, 200, "{}", second.describe());
    assert_eq!(second.header("x-kvmesh-reason"), Some("prefix-hit"));
    assert_eq!(second.header("x-kvmesh-node"), Some(holder.as_str()));
}

#[test]
fn embeddings_and_rerank_reach_an_engine_of_their_model_from_any_node() {
    let cluster = cluster();
    for entry in ["a", "b"] {
        let embedded = cluster.sidecar(entry).post_json(
            "/v1/embeddings",
            &json!({"model": "model-b", "input": ["the fox", "the dog"]}),
        );
        assert_eq!(embedded.status, 200, "{}", embedded.describe());
        assert_eq!(embedded.header("x-kvmesh-node"), Some("b"));
        let data = embedded.json()["data"]
            .as_array()
            .cloned()
            .unwrap_or_default();
        assert_eq!(data.len(), 2, "one vector per input");
        let reranked = cluster.sidecar(entry).post_json(
            "/v1/rerank",
            &json!({"model": "model-a", "query": "fox", "documents": ["fox", "dog"]}),
        );
        assert_eq!(reranked.status, 200, "{}", reranked.describe());
        assert_eq!(reranked.header("x-kvmesh-node"), Some("a"));
        assert_eq!(
            reranked.json()["results"][0]["index"],
            0,
            "the same text ranks first"
        );
    }
}

#[test]
fn a_responses_continuation_reaches_the_engine_that_stored_it_from_any_node() {
    let nodes = ["a", "b", "c"];
    let specs: Vec<NodeSpec> = nodes.iter().map(|n| NodeSpec::new(n, &["m"])).collect();
    let cluster = Cluster::start(&specs);
    cluster.wait_membership(&nodes, CONVERGENCE_TIMEOUT);
    for (i, entry) in nodes.iter().enumerate() {
        let first = cluster.sidecar(entry).post_json(
            "/v1/responses",
            &json!({"model": "m", "input": format!("conversation {i} begins"), "max_output_tokens": 4}),
        );
        assert_eq!(first.status, 200, "{}", first.describe());
        let stored_on = first.header("x-kvmesh-node").expect("served by").to_owned();
        let id = first.json()["id"]
            .as_str()
            .expect("a response id")
            .to_owned();
        // From the entry that relayed it (which remembers where it went), then from every
        // other (which looks for it).
        for next in nodes {
            let continued = cluster.sidecar(next).post_json(
                "/v1/responses",
                &json!({"model": "m", "input": "and goes on", "previous_response_id": id,
                    "max_output_tokens": 4}),
            );
            assert_eq!(
                continued.status,
                200,
                "from {next}: {}",
                continued.describe()
            );
            assert_eq!(
                continued.header("x-kvmesh-node"),
                Some(stored_on.as_str()),
                "from {next}"
            );
        }
    }
    let unknown = cluster.sidecar("a").post_json(
        "/v1/responses",
        &json!({"model": "m", "input": "x", "previous_response_id": "resp_nowhere"}),
    );
    assert_openai_error(&unknown, 404);
}

#[test]
fn an_adapters_requests_go_to_an_engine_with_a_free_slot_not_one_busy_with_another() {
    // Two engines of one base model, both able to serve two adapters, one slot each.
    let lora = ["--lora", "sql", "--lora", "chat", "--max-loras", "1"];
    let specs = ["a", "b"].map(|n| {
        NodeSpec::new(n, &["base"])
            .timing(kvmesh_tests::Timing::Scaled(1.0))
            .engine_args(&lora)
    });
    let cluster = Cluster::start(&specs);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["base", "chat", "sql"], CONVERGENCE_TIMEOUT);
    // Another client keeps b's only slot busy with `chat` (straight to its engine).
    let b_engine = cluster.node("b").engine.addr();
    let busy = std::thread::spawn(move || {
        Request::post_json(
            "/v1/completions",
            &json!({"model": "chat", "prompt": "a long chat", "max_tokens": 400, "ignore_eos": true}),
        )
        .timeout(std::time::Duration::from_secs(60))
        .send(b_engine)
        .expect("the busy request")
    });
    wait_until(
        CONVERGENCE_TIMEOUT,
        "a to see b's slot taken by chat",
        || {
            cluster
                .sidecar("a")
                .digest_of("b")
                .is_some_and(|digest| digest["lora_use"]["running"] == json!(["chat"]))
        },
    );
    for (i, entry) in ["a", "b", "a", "b"].iter().enumerate() {
        let answer = cluster.sidecar(entry).post_json(
            "/v1/completions",
            &json!({"model": "sql", "prompt": format!("question {i}: {}", "select ".repeat(40)),
                "max_tokens": 2}),
        );
        assert_eq!(answer.status, 200, "{}", answer.describe());
        assert_eq!(
            answer.header("x-kvmesh-node"),
            Some("a"),
            "from {entry}: b would wait for its slot ({:?})",
            answer.header("x-kvmesh-reason")
        );
    }
    assert_eq!(busy.join().expect("busy thread").status, 200);
}
