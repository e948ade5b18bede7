//! Issue 45 §2: the mesh over real vLLM servers (vLLM's CPU build, `scripts/lib/vllm.sh`), not
//! the mock engine. What is asserted comes from vLLM itself wherever it can: its own prefix-cache
//! counters say which server met a prompt in its cache, its own gauges are what the load digest
//! must show, its own `/v1/models` cards what every node must list.
//!
//! A vLLM server takes about a minute to start on a CPU core, so one test starts two and runs
//! every check that can share them as named stages, in order (a failure names its stage): two
//! sidecars in exact mode, then two in approximate mode in front of the same servers, then one
//! server is killed under load, and an embedding server takes its core. Prefill/decode over
//! NIXL is in `real_vllm_pd.rs`.

use std::panic::{AssertUnwindSafe, catch_unwind, resume_unwind};
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use kvmesh_tests::certs::ClusterCa;
use kvmesh_tests::cluster::wait_meshed;
use kvmesh_tests::openai::{chat_body, completion_body, served_by};
use kvmesh_tests::vllm::{
    BLOCK_TOKENS, EMBEDDING_MODEL, MAX_MODEL_LEN, MODEL, VLLM_CALL_TIMEOUT, core, prepared, prompt,
    start_all,
};
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Request, Response, Sidecar, SidecarConfig, SseReader, VllmConfig,
    VllmServer, holds_during, wait_for, wait_until,
};
use serde_json::{Value, json};

/// Bound on the mesh learning something (KV events, gossip, a digest): seconds when all is
/// well; a loaded 2-core machine running vLLM servers needs margin.
const LEARN_TIMEOUT: Duration = Duration::from_secs(30);
/// The warmed prefixes: 64 blocks of vLLM's 32 tokens.
const PREFIX_TOKENS: usize = 2048;
/// The adapter `scripts/lib/vllm.sh lora` makes, by the name of its directory.
const ADAPTER: &str = "tiny-lora";
/// Requests vLLM runs at once (`--max-num-seqs`): small, so that a few long requests leave
/// some waiting and the load digest's `waiting` can be checked against vLLM's own gauge.
const MAX_NUM_SEQS: usize = 4;

/// Runs one stage; a panic inside is reported with the stage's name.
fn stage<T>(name: &str, body: impl FnOnce() -> T) -> T {
    let started = Instant::now();
    println!("stage {name}: starting");
    match catch_unwind(AssertUnwindSafe(body)) {
        Ok(value) => {
            println!("stage {name}: passed in {:?}", started.elapsed());
            value
        }
        Err(payload) => {
            let message = payload
                .downcast_ref::<String>()
                .cloned()
                .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()));
            match message {
                Some(message) => panic!("stage {name} failed: {message}"),
                None => resume_unwind(payload),
            }
        }
    }
}

/// A generative server of the tiny model: KV events published, adapters loadable at run time
/// (rank 8, what `make_tiny_model.py` makes), the Responses API's store on.
fn generative(name: &str, index: usize) -> VllmConfig {
    VllmConfig::new(name, core(index))
        .kv_events()
        .args(&["--num-gpu-blocks-override", "500"])
        .args(&["--max-num-seqs", &MAX_NUM_SEQS.to_string()])
        .args(&["--enable-lora", "--max-lora-rank", "8"])
        .env("VLLM_ENABLE_RESPONSES_API_STORE", "1")
}

/// A sidecar `name` in front of `server`, seeded with `seeds`, allowed to load the adapter
/// from the directory `scripts/lib/vllm.sh` made it in; in exact mode when `exact`.
fn sidecar(
    ca: &ClusterCa,
    name: &str,
    server: &VllmServer,
    seeds: &[&Sidecar],
    exact: bool,
) -> Sidecar {
    let adapters_dir = prepared("lora")
        .parent()
        .expect("the adapter's directory has a parent")
        .to_path_buf();
    let seeds: Vec<_> = seeds.iter().map(|seed| seed.mesh_addr()).collect();
    let mut config = SidecarConfig::new(name, &server.url(), ca)
        .seeds(&seeds)
        .arg("--lora-adapter")
        .arg(&format!("{ADAPTER}={MODEL}"))
        .arg("--lora-path-template")
        .arg(&format!("{}/{{name}}", adapters_dir.display()));
    if exact {
        let (live, replay) = server.kv_events();
        config = config
            .arg("--kv-events")
            .arg(live)
            .arg("--kv-events-replay")
            .arg(replay)
            .arg("--block-tokens")
            .arg(&BLOCK_TOKENS.to_string());
    }
    config.start()
}

/// Two sidecars, `names.0` in front of `servers[0]` and `names.1` of `servers[1]`, meshed.
fn sidecar_pair(
    ca: &ClusterCa,
    servers: &[VllmServer],
    names: (&str, &str),
    exact: bool,
) -> (Sidecar, Sidecar) {
    let first = sidecar(ca, names.0, &servers[0], &[], exact);
    let second = sidecar(ca, names.1, &servers[1], &[&first], exact);
    wait_meshed(&[&first, &second], CONVERGENCE_TIMEOUT);
    (first, second)
}

/// Sends `body` to `path` through `entry`, bounded for real vLLM; 200 or the test fails.
fn post_ok(entry: &Sidecar, path: &str, body: &Value) -> Response {
    let response = entry.send(Request::post_json(path, body).timeout(VLLM_CALL_TIMEOUT));
    assert_eq!(
        response.status,
        200,
        "{path} via {}: {}",
        entry.node_id(),
        response.describe()
    );
    response
}

/// vLLM's own prefix-cache counters of one server, before and after something.
struct CacheCounters {
    hits: f64,
    queries: f64,
}

impl CacheCounters {
    fn of(server: &VllmServer) -> Self {
        CacheCounters {
            hits: server.prefix_cache_hits(),
            queries: server.prefix_cache_queries(),
        }
    }

    /// (hit tokens, queried tokens) since `self` was read.
    fn since(&self, server: &VllmServer) -> (f64, f64) {
        let now = CacheCounters::of(server);
        (now.hits - self.hits, now.queries - self.queries)
    }
}

/// Checks that `response` was served by `holder`'s node because of its cache, and that vLLM
/// behind it found at least `cached_tokens` of the prompt in its own cache while the other
/// server computed nothing.
fn assert_served_from_cache(
    response: &Response,
    holder: (&str, &VllmServer, &CacheCounters),
    other: (&VllmServer, &CacheCounters),
    cached_tokens: usize,
) {
    let (holder_node, holder_server, holder_before) = holder;
    assert_eq!(
        served_by(response),
        holder_node,
        "not served where the prefix is: {}",
        response.describe()
    );
    assert_eq!(
        response.header("x-kvmesh-reason"),
        Some("prefix-hit"),
        "{}",
        response.describe()
    );
    let (hits, queries) = holder_before.since(holder_server);
    assert!(
        hits >= cached_tokens as f64,
        "{} (vLLM's vllm:prefix_cache_hits_total) found {hits} of {queries} prompt tokens \
         cached, expected at least {cached_tokens}",
        holder_server.name()
    );
    let (_, other_queries) = other.1.since(other.0);
    assert_eq!(
        other_queries,
        0.0,
        "{} computed a prompt meant for {}",
        other.0.name(),
        holder_server.name()
    );
}

#[test]
fn a_mesh_of_sidecars_over_two_real_vllm_servers() {
    let model_dir = prepared("model");
    let adapter_dir = prepared("lora");
    let ca = ClusterCa::init("kvmesh-vllm");
    let mut servers = start_all(vec![generative("vllm a", 0), generative("vllm b", 1)]);

    let (a, b) = stage("exact mode: sidecars a and b mesh", || {
        sidecar_pair(&ca, &servers, ("a", "b"), true)
    });
    stage("/v1/models at every node carries vLLM's cards", || {
        models_carry_vllms_cards(&[&a, &b], &servers, &model_dir)
    });
    stage("the load digest reads vLLM's own gauges", || {
        load_digest_reads_vllms_gauges(&a, &b, &servers)
    });
    stage(
        "exact mode: a completion goes where KV events say its prefix is",
        || exact_completion_goes_to_its_prefix(&a, &servers),
    );
    stage("exact mode: a chat routes by its templated tokens", || {
        exact_chat_routes_by_its_template(&a, &servers)
    });
    let b = stage(
        "exact mode: a new sidecar replays what vLLM cached before it subscribed",
        || exact_replay_after_a_restart(&ca, &a, b, &servers),
    );
    stage("a LoRA adapter is loaded at run time and answers", || {
        adapter_loaded_at_run_time(&[&a, &b], &servers, &adapter_dir)
    });
    stage("the Responses API and its continuations", || {
        responses_continue_where_stored(&a, &b)
    });
    for sidecar in [a, b] {
        drop(sidecar);
    }

    let (c, d) = stage("approximate mode: sidecars c and d mesh", || {
        for server in &servers {
            server.reset_prefix_cache();
        }
        sidecar_pair(&ca, &servers, ("c", "d"), false)
    });
    stage(
        "approximate mode: a continuation goes where its prefix was served",
        || approximate_continuation_goes_to_its_prefix(&c, &d, &servers),
    );
    stage("a server killed under load", || {
        server_killed_under_load(&c, &d, &mut servers)
    });
    drop(servers.pop());
    stage("a pooling model's /v1/embeddings across the mesh", || {
        embeddings_across_the_mesh(&ca, &c, &d)
    });
}

/// Every node lists `tiny` with vLLM's own fields (its path, context, owner), not a card of its
/// own making, and the same card as time passes.
fn models_carry_vllms_cards(sidecars: &[&Sidecar], servers: &[VllmServer], model_dir: &Path) {
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

/// The card of `id` in a `/v1/models` answer.
fn card(list: &Value, id: &str) -> Value {
    list["data"]
        .as_array()
        .and_then(|data| data.iter().find(|card| card["id"] == id))
        .cloned()
        .unwrap_or_else(|| panic!("no card for {id} in {list}"))
}

/// Long requests sent straight to server b (no sidecar counts them): one more than it runs at
/// once, so that one waits. Every node's digest of b must then show what vLLM's own gauges say,
/// and its capacity from `vllm:cache_config_info`.
fn load_digest_reads_vllms_gauges(a: &Sidecar, b: &Sidecar, servers: &[VllmServer]) {
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

/// A prefix cached on server b behind every sidecar's back (sent to vLLM directly): only b's
/// KV events can tell a about it. A continuation entering at a goes to b, and vLLM b finds the
/// prefix in its cache.
fn exact_completion_goes_to_its_prefix(a: &Sidecar, servers: &[VllmServer]) {
    let (server_a, server_b) = (&servers[0], &servers[1]);
    let prefix = prompt("exact completions", PREFIX_TOKENS);
    let warmed = server_b.post_json(
        "/v1/completions",
        &completion_body(MODEL, &prefix, 1, false),
    );
    assert_eq!(warmed.status, 200, "{}", warmed.describe());
    let blocks = (PREFIX_TOKENS as u64) / BLOCK_TOKENS;
    wait_for(LEARN_TIMEOUT, "a learns from b's KV events", || {
        let (nodes, chain) = a.debug_match(&json!({"model": MODEL, "prompt": prefix}))?;
        let at_b = nodes.iter().find(|(node, _)| node == "b").map(|n| n.1);
        match (chain, at_b) {
            (c, Some(held)) if c == blocks && held == blocks => Ok(()),
            _ => Err(format!("{nodes:?} of {chain} blocks")),
        }
    });
    let (before_a, before_b) = (CacheCounters::of(server_a), CacheCounters::of(server_b));
    let continued = format!("{prefix}{}", prompt("exact question", 40));
    let response = post_ok(
        a,
        "/v1/completions",
        &completion_body(MODEL, &continued, 4, false),
    );
    assert_served_from_cache(
        &response,
        ("b", server_b, &before_b),
        (server_a, &before_a),
        PREFIX_TOKENS,
    );
    assert_eq!(counter(a, "kvmesh_tokenize_failures_total", &[]), 0.0);
    assert_eq!(
        counter(a, "kvmesh_kv_event_batches_total", &[("outcome", "lost")]),
        0.0
    );
}

/// A chat with a long system message cached on b (sent to vLLM directly); another chat with the
/// same system message and another question enters at a. Only the tokens of vLLM's chat
/// template (from its `/tokenize` with `messages`) make the two share their first blocks: a
/// routes by those, and vLLM b finds them in its cache.
fn exact_chat_routes_by_its_template(a: &Sidecar, servers: &[VllmServer]) {
    let (server_a, server_b) = (&servers[0], &servers[1]);
    let system = prompt("exact chat system", 1500);
    let messages = |question: &str| json!([{"role": "system", "content": system}, {"role": "user", "content": question}]);
    let (first, second) = (
        messages("Hello, world!"),
        messages("Translate this sentence."),
    );
    let tokens = |messages: &Value| -> Vec<u64> {
        let answer = server_a
            .post_json("/tokenize", &json!({"model": MODEL, "messages": messages}))
            .json();
        answer["tokens"]
            .as_array()
            .unwrap_or_else(|| panic!("no tokens in {answer}"))
            .iter()
            .filter_map(Value::as_u64)
            .collect()
    };
    let (first_tokens, second_tokens) = (tokens(&first), tokens(&second));
    let common = first_tokens
        .iter()
        .zip(&second_tokens)
        .take_while(|(x, y)| x == y)
        .count();
    let shared_blocks = common as u64 / BLOCK_TOKENS;
    assert!(
        shared_blocks >= 40,
        "the two chats share {common} tokens only"
    );
    let mut warm = chat_body(MODEL, "", 1, false);
    warm["messages"] = first;
    let warmed = server_b.post_json("/v1/chat/completions", &warm);
    assert_eq!(warmed.status, 200, "{}", warmed.describe());
    let mut body = chat_body(MODEL, "", 4, false);
    body["messages"] = second.clone();
    wait_for(
        LEARN_TIMEOUT,
        "a sees b hold the chat's shared blocks",
        || {
            let (nodes, _) = a.debug_match(&json!({"model": MODEL, "messages": second}))?;
            match nodes.iter().find(|(node, _)| node == "b") {
                Some((_, held)) if *held == shared_blocks => Ok(()),
                _ => Err(format!("{nodes:?}, want {shared_blocks} at b")),
            }
        },
    );
    let (before_a, before_b) = (CacheCounters::of(server_a), CacheCounters::of(server_b));
    let response = post_ok(a, "/v1/chat/completions", &body);
    assert_eq!(response.json()["object"], "chat.completion");
    assert_served_from_cache(
        &response,
        ("b", server_b, &before_b),
        (server_a, &before_a),
        (shared_blocks * BLOCK_TOKENS) as usize,
    );
    assert_eq!(counter(a, "kvmesh_tokenize_failures_total", &[]), 0.0);
}

/// Sidecar b stops; vLLM b caches a prefix meanwhile, its KV events lost to nobody listening.
/// A new sidecar, b2, subscribes: the first batch it receives is numbered past 0, so it asks
/// vLLM's replay socket for the ones before, and a learns of the prefix cached while b2 did not
/// exist. Returns b2, in b's place.
fn exact_replay_after_a_restart(
    ca: &ClusterCa,
    a: &Sidecar,
    b: Sidecar,
    servers: &[VllmServer],
) -> Sidecar {
    let server_b = &servers[1];
    drop(b);
    let early = prompt("cached while no sidecar listened", PREFIX_TOKENS);
    let warmed = server_b.post_json("/v1/completions", &completion_body(MODEL, &early, 1, false));
    assert_eq!(warmed.status, 200, "{}", warmed.describe());
    let b2 = sidecar(ca, "b2", server_b, &[a], true);
    wait_meshed(&[a, &b2], CONVERGENCE_TIMEOUT);
    let blocks = (PREFIX_TOKENS as u64) / BLOCK_TOKENS;
    let body = json!({"model": MODEL, "prompt": early});
    let mut sent = 0;
    wait_for(
        LEARN_TIMEOUT,
        "a learns of the early prefix from b2's replay",
        || {
            // Live events show b2 the gap; more of them until one arrives after it subscribed.
            let live = prompt(&format!("after b2 subscribed {sent}"), 64);
            sent += 1;
            let response =
                server_b.post_json("/v1/completions", &completion_body(MODEL, &live, 1, false));
            assert_eq!(response.status, 200, "{}", response.describe());
            let (nodes, _) = a.debug_match(&body)?;
            match nodes.iter().find(|(node, _)| node == "b2") {
                Some((_, held)) if *held == blocks => Ok(()),
                _ => Err(format!("{nodes:?}, want {blocks} at b2")),
            }
        },
    );
    let replayed = counter(
        &b2,
        "kvmesh_kv_event_batches_total",
        &[("outcome", "replayed")],
    );
    assert!(replayed > 0.0, "b2 replayed no batch");
    for outcome in ["lost", "malformed"] {
        let batches = counter(
            &b2,
            "kvmesh_kv_event_batches_total",
            &[("outcome", outcome)],
        );
        assert_eq!(batches, 0.0, "{outcome} batches");
    }
    b2
}

/// A request for the adapter, which no server has: the node it is placed on loads it into its
/// vLLM through `/v1/load_lora_adapter`, vLLM answers as the adapter, and every node then lists
/// it with vLLM's card; a request entering at the other node goes to the same server.
fn adapter_loaded_at_run_time(sidecars: &[&Sidecar], servers: &[VllmServer], adapter_dir: &Path) {
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
fn responses_continue_where_stored(a: &Sidecar, b: &Sidecar) {
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

/// Approximate mode: a node learns its engine's cache from what it serves. A prefix sent
/// through c lands on one server; once the other node's view shows it there (gossip), a
/// continuation entering there goes to it, and that vLLM finds the prefix cached.
fn approximate_continuation_goes_to_its_prefix(c: &Sidecar, d: &Sidecar, servers: &[VllmServer]) {
    let prefix = prompt("approximate", PREFIX_TOKENS);
    let warmed = post_ok(
        c,
        "/v1/completions",
        &completion_body(MODEL, &prefix, 1, false),
    );
    let holder = served_by(&warmed);
    let (other, holder_index) = match holder.as_str() {
        "c" => (d, 0),
        _ => (c, 1),
    };
    let match_body = json!({"model": MODEL, "prompt": prefix});
    wait_for(LEARN_TIMEOUT, "the other node sees the prefix", || {
        other.sees_whole_prefix_at(&match_body, &holder)
    });
    let (holder_server, other_server) = (&servers[holder_index], &servers[1 - holder_index]);
    let before = (
        CacheCounters::of(holder_server),
        CacheCounters::of(other_server),
    );
    let continued = format!("{prefix}{}", prompt("approximate question", 40));
    let response = post_ok(
        other,
        "/v1/completions",
        &completion_body(MODEL, &continued, 4, false),
    );
    assert_served_from_cache(
        &response,
        (&holder, holder_server, &before.0),
        (other_server, &before.1),
        PREFIX_TOKENS,
    );
}

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
fn server_killed_under_load(c: &Sidecar, d: &Sidecar, servers: &mut [VllmServer]) {
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

/// An embedding server takes the killed server's core, its sidecar e joins; `/v1/embeddings`
/// for its model, entering at c or d, goes to e and comes back with vLLM's vectors.
fn embeddings_across_the_mesh(ca: &ClusterCa, c: &Sidecar, d: &Sidecar) {
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

fn counter(sidecar: &Sidecar, name: &str, labels: &[(&str, &str)]) -> f64 {
    sidecar
        .metric(name, labels)
        .expect("the sidecar's /metrics")
        .unwrap_or(0.0)
}
