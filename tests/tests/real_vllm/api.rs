//! vLLM's API and metrics through the mesh: model cards, the load digest, a LoRA adapter
//! loaded at run time, the Responses API's stored conversations, a pooling model's embeddings.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use kvmesh_tests::certs::ClusterCa;
use kvmesh_tests::cluster::wait_meshed;
use kvmesh_tests::openai::{completion_body, served_by};
use kvmesh_tests::vllm::{
    BLOCK_TOKENS, EMBEDDING_MODEL, MAX_MODEL_LEN, MODEL, core, prepared, prompt,
};
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Request, Sidecar, SidecarConfig, SseReader, VllmConfig, VllmServer,
    holds_during, wait_for, wait_until,
};
use serde_json::{Value, json};

use super::{ADAPTER, LEARN_TIMEOUT, MAX_NUM_SEQS, card, counter, post_ok};

/// Every node lists `tiny` with vLLM's own fields (its path, context, owner), not a card of its
/// own making, and the same card as time passes.
pub(super) fn models_carry_vllms_cards(
    sidecars: &[&Sidecar],
    servers: &[VllmServer],
    model_dir: &Path,
) {
    let vllm_cards: Vec<Value> = servers
        .iter()
        .map(|server| card(&server.get("/v1/models").json(), MODEL))
        .collect();
    for card in &vllm_cards {
        assert_eq!(card["owned_by"], "vllm", "{card}");
        assert_eq!(card["root"], model_dir.to_string_lossy().as_ref(), "{card}");
        assert_eq!(card["max_model_len"], MAX_MODEL_LEN, "{card}");
    }
    for sidecar in sidecars {
        let listed = wait_for(LEARN_TIMEOUT, "the node lists tiny", || {
            let response = sidecar.get("/v1/models");
            let list = response.json();
            let found = list["data"]
                .as_array()
                .is_some_and(|data| data.iter().any(|c| c["id"] == MODEL));
            found.then_some(list).ok_or_else(|| response.describe())
        })
        .0;
        let listed = card(&listed, MODEL);
        for field in ["object", "owned_by", "root", "parent", "max_model_len"] {
            assert_eq!(
                listed[field],
                vllm_cards[0][field],
                "{field} of tiny at {}: {listed}",
                sidecar.node_id()
            );
        }
        assert!(listed["created"].is_u64(), "{listed}");
    }
    // vLLM stamps each listing with its time (`created`); every node lists the same card,
    // across the nodes' polls of vLLM's `/v1/models` (one every 2 s).
    let listings = || -> Vec<Value> {
        let list = |sidecar: &&Sidecar| card(&sidecar.get("/v1/models").json(), MODEL);
        sidecars.iter().map(list).collect()
    };
    let agreed = wait_for(LEARN_TIMEOUT, "every node lists the same card", || {
        let cards = listings();
        match cards.iter().all(|card| *card == cards[0]) {
            true => Ok(cards[0].clone()),
            false => Err(format!("{cards:?}")),
        }
    })
    .0;
    holds_during(
        Duration::from_secs(3),
        "every node lists the card it listed",
        || match listings().iter().find(|card| **card != agreed) {
            Some(other) => Err(format!("{other} after {agreed}")),
            None => Ok(()),
        },
    );
}

/// Long requests sent straight to server b (no sidecar counts them): one more than it runs at
/// once, so that one waits. Every node's digest of b must then show what vLLM's own gauges say,
/// and its capacity from `vllm:cache_config_info`.
pub(super) fn load_digest_reads_vllms_gauges(a: &Sidecar, b: &Sidecar, servers: &[VllmServer]) {
    let server_b = &servers[1];
    let addr = server_b.addr();
    let stop = Arc::new(AtomicBool::new(false));
    let long_requests: Vec<_> = (0..=MAX_NUM_SEQS)
        .map(|i| {
            let body = json!({"model": MODEL, "prompt": prompt(&format!("long {i}"), 256),
                "max_tokens": 2000, "ignore_eos": true, "stream": true});
            let stop = stop.clone();
            std::thread::spawn(move || {
                // Streamed, so that the request can be ended early by hanging up.
                let open = Request::post_json("/v1/completions", &body)
                    .timeout(Duration::from_secs(180))
                    .open(addr);
                let Ok(open) = open else { return };
                let mut events = SseReader::new(open);
                while !stop.load(Ordering::Relaxed) {
                    if !matches!(events.next_event(), Ok(Some(_))) {
                        return;
                    }
                }
            })
        })
        .collect();
    let busy = (MAX_NUM_SEQS as f64, 1.0);
    wait_until(LEARN_TIMEOUT, "vLLM b runs 4 and queues 1", || {
        gauges(server_b) == busy
    });
    for observer in [a, b] {
        let what = format!("{}'s digest of b shows vLLM's gauges", observer.node_id());
        let digest = wait_for(LEARN_TIMEOUT, &what, || {
            let digest = if observer.node_id() == "b" {
                observer.debug_cluster()?["digest"].clone()
            } else {
                observer
                    .digest_of("b")
                    .ok_or_else(|| "no digest of b".to_string())?
            };
            let shown = (
                digest["running"].as_f64().unwrap_or(-1.0),
                digest["waiting"].as_f64().unwrap_or(-1.0),
            );
            let usage = digest["kv_usage"].as_f64().unwrap_or(0.0);
            match shown == busy && usage > 0.0 {
                true => Ok(digest),
                false => Err(format!("{digest}; vLLM says {:?}", gauges(server_b))),
            }
        })
        .0;
        assert_eq!(digest["kv_capacity_blocks"], 500, "{digest}");
        assert_eq!(digest["block_size"], BLOCK_TOKENS, "{digest}");
        assert_eq!(digest["healthy"], true, "{digest}");
    }
    let usage = server_b.metric("vllm:kv_cache_usage_perc", &[]);
    assert!(
        usage > 0.0,
        "vLLM b's KV usage while 4 requests run: {usage}"
    );
    stop.store(true, Ordering::Relaxed);
    for request in long_requests {
        request.join().expect("a long request's thread");
    }
    wait_until(LEARN_TIMEOUT, "a's digest of b shows it idle", || {
        a.digest_of("b")
            .is_some_and(|digest| digest["running"] == 0 && digest["waiting"] == 0)
    });
    wait_until(LEARN_TIMEOUT, "vLLM b idle", || {
        gauges(server_b) == (0.0, 0.0)
    });
}

/// vLLM's `(num_requests_running, num_requests_waiting)`.
fn gauges(server: &VllmServer) -> (f64, f64) {
    (
        server.metric("vllm:num_requests_running", &[]),
        server.metric("vllm:num_requests_waiting", &[]),
    )
}

/// A request for the adapter, which no server has: the node it is placed on loads it into its
/// vLLM through `/v1/load_lora_adapter`, vLLM answers as the adapter, and every node then lists
/// it with vLLM's card; a request entering at the other node goes to the same server.
pub(super) fn adapter_loaded_at_run_time(
    sidecars: &[&Sidecar],
    servers: &[VllmServer],
    adapter_dir: &Path,
) {
    for server in servers {
        let list = server.get("/v1/models").json();
        assert!(
            !list.to_string().contains(ADAPTER),
            "{} has the adapter already: {list}",
            server.name()
        );
    }
    let mut served = Vec::new();
    for (i, entry) in sidecars.iter().enumerate() {
        let body = completion_body(ADAPTER, &prompt(&format!("adapter {i}"), 64), 4, false);
        let response = post_ok(entry, "/v1/completions", &body);
        assert_eq!(response.json()["model"], ADAPTER, "{}", response.describe());
        served.push(served_by(&response));
    }
    assert!(
        served.windows(2).all(|pair| pair[0] == pair[1]),
        "the adapter's requests went to {served:?}"
    );
    let (home, server) = match served[0].as_str() {
        "a" => (sidecars[0], &servers[0]),
        _ => (sidecars[1], &servers[1]),
    };
    let vllm_card = card(&server.get("/v1/models").json(), ADAPTER);
    assert_eq!(vllm_card["parent"], MODEL, "{vllm_card}");
    assert_eq!(
        vllm_card["root"],
        adapter_dir.to_string_lossy().as_ref(),
        "{vllm_card}"
    );
    assert_eq!(
        counter(home, "kvmesh_lora_loads_total", &[("outcome", "loaded")]),
        1.0
    );
    for sidecar in sidecars {
        let listed = wait_for(LEARN_TIMEOUT, "every node lists the adapter", || {
            let list = sidecar.get("/v1/models").json();
            let has = list.to_string().contains(ADAPTER);
            has.then(|| card(&list, ADAPTER))
                .ok_or_else(|| format!("{} lists {list}", sidecar.node_id()))
        })
        .0;
        for field in ["parent", "root", "owned_by"] {
            assert_eq!(listed[field], vllm_card[field], "{field}: {listed}");
        }
    }
}

/// A response stored by one vLLM (`VLLM_ENABLE_RESPONSES_API_STORE=1`) is continued through
/// every node; only that vLLM knows it, and its answer counts the stored turn's tokens. The
/// first turn both plain and streamed (the node learns the id from `response.created`).
pub(super) fn responses_continue_where_stored(a: &Sidecar, b: &Sidecar) {
    for (first_entry, stream) in [(a, false), (b, true)] {
        let body = json!({"model": MODEL, "input": "Hello, world! Please explain prefix caching.",
            "max_output_tokens": 4, "stream": stream});
        let response = post_ok(first_entry, "/v1/responses", &body);
        let home = served_by(&response);
        let (id, input_tokens) = if stream {
            let events = response.text();
            let created = events
                .lines()
                .filter_map(|line| line.strip_prefix("data: "))
                .filter_map(|data| serde_json::from_str::<Value>(data).ok())
                .find(|event| event["type"] == "response.created")
                .unwrap_or_else(|| panic!("no response.created event in {events}"));
            (created["response"]["id"].as_str().map(str::to_owned), None)
        } else {
            let answer = response.json();
            assert_eq!(answer["object"], "response", "{answer}");
            let used = answer["usage"]["input_tokens"].as_u64();
            let total = answer["usage"]["total_tokens"].as_u64();
            (answer["id"].as_str().map(str::to_owned), used.zip(total))
        };
        let id = id.unwrap_or_else(|| panic!("no response id: {}", response.describe()));
        for next in [a, b] {
            let body = json!({"model": MODEL, "input": "And then?", "max_output_tokens": 4,
                "previous_response_id": id});
            let continued = post_ok(next, "/v1/responses", &body);
            assert_eq!(
                served_by(&continued),
                home,
                "a continuation entering at {} went elsewhere than where {id} is stored",
                next.node_id()
            );
            let answer = continued.json();
            assert_eq!(answer["previous_response_id"], id.as_str(), "{answer}");
            if let Some((_, first_total)) = input_tokens {
                let input = answer["usage"]["input_tokens"].as_u64().unwrap_or(0);
                assert!(
                    input > first_total,
                    "the continuation read {input} input tokens, not the stored turn's \
                     {first_total} and more"
                );
            }
        }
    }
    let unknown = a.send(Request::post_json(
        "/v1/responses",
        &json!({"model": MODEL, "input": "x", "previous_response_id": "resp_nowhere"}),
    ));
    assert_eq!(unknown.status, 404, "{}", unknown.describe());
}

/// An embedding server takes the killed server's core, its sidecar e joins; `/v1/embeddings`
/// for its model, entering at c or d, goes to e and comes back with vLLM's vectors.
pub(super) fn embeddings_across_the_mesh(ca: &ClusterCa, c: &Sidecar, d: &Sidecar) {
    let embedding_dir: PathBuf = prepared("embedding");
    let hidden = std::fs::read_to_string(embedding_dir.join("config.json"))
        .ok()
        .and_then(|text| serde_json::from_str::<Value>(&text).ok())
        .and_then(|config| config["hidden_size"].as_u64())
        .expect("the embedding model's hidden_size");
    let server = VllmConfig::new("vllm embedding", core(1))
        .embedding()
        .start();
    let e = SidecarConfig::new("e", &server.url(), ca)
        .seeds(&[c.mesh_addr()])
        .start();
    wait_meshed(&[c, d, &e], CONVERGENCE_TIMEOUT);
    let before = server.metric("vllm:request_success_total", &[]);
    for entry in [c, d] {
        wait_until(LEARN_TIMEOUT, "the entry lists the embedding model", || {
            entry
                .model_ids()
                .is_ok_and(|ids| ids.iter().any(|id| id == EMBEDDING_MODEL))
        });
        let body = json!({"model": EMBEDDING_MODEL, "input": ["the fox", "the dog"]});
        let response = post_ok(entry, "/v1/embeddings", &body);
        assert_eq!(served_by(&response), "e", "{}", response.describe());
        let answer = response.json();
        let vectors = answer["data"].as_array().cloned().unwrap_or_default();
        assert_eq!(vectors.len(), 2, "{answer}");
        for vector in &vectors {
            let length = vector["embedding"].as_array().map_or(0, Vec::len);
            assert_eq!(length as u64, hidden, "{vector}");
        }
    }
    // vLLM counts each input of a call as a request of its own: two calls of two inputs.
    let served = server.metric("vllm:request_success_total", &[]) - before;
    assert_eq!(served, 4.0, "vLLM's own count of the embedded inputs");
}
