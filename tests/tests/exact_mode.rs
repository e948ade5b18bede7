//! Issue 5, exact mode, over real processes: four mock engines publish vLLM KV events over ZMQ
//! (two in the positional-array shape, two in the map shape), and their sidecars run with
//! `--kv-events`. Prompts are sent straight to the engines, bypassing the sidecars, so only the
//! events can tell the mesh about them; what the mesh believes is read, without side effects,
//! from `POST /debug/match` on another node. Engines started with `--kv-offload-blocks` also
//! report a CPU offload tier, as vLLM's `OffloadingConnector` does; the mesh tracks it apart.

use std::time::{Duration, Instant};

use kvmesh_tests::openai::{chat_body, completion_body, served_by};
use kvmesh_tests::ports::free_listen_port;
use kvmesh_tests::{Cluster, Engine, NodeSpec, Request, Sidecar, wait_for, wait_until};
use serde_json::{Value, json};

const MODEL: &str = "mock-model";
const NODES: usize = 4;
/// The engines' KV capacity: 64 blocks of 16 tokens (the mock's 4-byte tokens: 4 KiB of text).
const KV_BLOCKS: usize = 64;
/// Prompts of 1,200 bytes: 300 tokens, 18 full blocks.
const PROMPT_BYTES: usize = 1_200;
const PROMPT_BLOCKS: u64 = 18;
/// How long the test waits for the mesh to learn of a change before failing: past this the
/// event path is broken. How long it did take is printed; the acceptance's 1 s is measured
/// in BENCHMARKS.md#prefix-propagation, not asserted here, where a loaded
/// machine would make it noise.
const WAIT_LIMIT: Duration = Duration::from_secs(15);

/// Node `n{i}` in exact mode: its engine publishes KV events (with replay; even nodes in the
/// positional-array shape, odd ones in the map shape) and its sidecar subscribes.
fn spec(i: usize) -> NodeSpec {
    let format = if i.is_multiple_of(2) { "array" } else { "map" };
    NodeSpec::new(&format!("n{i}"), &[MODEL])
        .kv_events(format)
        .engine_args(&[
            "--kv-blocks",
            &KV_BLOCKS.to_string(),
            "--seed",
            &i.to_string(),
        ])
}

/// A prompt of `PROMPT_BYTES` unique to `key`.
fn prompt(key: &str) -> String {
    let mut text = String::new();
    let mut i = 0;
    while text.len() < PROMPT_BYTES {
        text.push_str(&format!("{key} sentence {i} of a long shared context. "));
        i += 1;
    }
    text.truncate(PROMPT_BYTES);
    text
}

/// Sends a prompt straight to an engine (no sidecar sees it).
fn send_direct(engine: &Engine, prompt: &str) {
    let response = Request::post_json("/v1/completions", &completion_body(MODEL, prompt, 1, false))
        .send(engine.addr())
        .expect("engine answers");
    assert_eq!(response.status, 200, "{}", response.describe());
}

/// Blocks of `prompt` that `observer` believes `holder` holds.
fn believed(observer: &Sidecar, holder: &str, prompt: &str) -> Result<u64, String> {
    believed_body(observer, holder, &json!({"model": MODEL, "prompt": prompt}))
}

/// Blocks of the request `body` that `observer` believes `holder` holds.
fn believed_body(observer: &Sidecar, holder: &str, body: &Value) -> Result<u64, String> {
    let entry = match_entry(observer, holder, body)?;
    blocks(&entry, "matched_blocks")
}

/// Blocks of `prompt` that `observer` believes `holder` holds: (on the GPU, offloaded).
fn believed_tiers(observer: &Sidecar, holder: &str, prompt: &str) -> Result<(u64, u64), String> {
    let entry = match_entry(observer, holder, &json!({"model": MODEL, "prompt": prompt}))?;
    Ok((
        blocks(&entry, "matched_blocks")?,
        blocks(&entry, "offload_matched_blocks")?,
    ))
}

/// `holder`'s entry in `observer`'s `/debug/match` answer for the request `body`.
fn match_entry(observer: &Sidecar, holder: &str, body: &Value) -> Result<Value, String> {
    let response = observer
        .try_send(Request::post_json("/debug/match", body))
        .map_err(|e| e.to_string())?;
    if response.status != 200 {
        return Err(response.describe());
    }
    let body = response.json();
    body["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == holder))
        .cloned()
        .ok_or_else(|| format!("no entry for {holder} in {body}"))
}

fn blocks(entry: &Value, field: &str) -> Result<u64, String> {
    entry[field]
        .as_u64()
        .ok_or_else(|| format!("no {field} in {entry}"))
}

/// Waits until `observer` believes `holder` holds `want(blocks)`; returns how long it took.
fn time_until(
    observer: &Sidecar,
    holder: &str,
    prompt: &str,
    what: &str,
    want: impl Fn(u64) -> bool,
) -> Duration {
    let (_, took) = wait_for(WAIT_LIMIT, what, || {
        match believed(observer, holder, prompt) {
            Ok(blocks) if want(blocks) => Ok(()),
            Ok(blocks) => Err(format!("{blocks} blocks")),
            Err(error) => Err(error),
        }
    });
    took
}

fn counter(sidecar: &Sidecar, name: &str, labels: &[(&str, &str)]) -> f64 {
    sidecar.metric(name, labels).unwrap().unwrap_or(0.0)
}

#[test]
fn stored_blocks_are_advertised_and_evicted_ones_withdrawn() {
    let cluster = Cluster::start_converged(&(0..NODES).map(spec).collect::<Vec<_>>());
    let engines: Vec<&Engine> = cluster.nodes().iter().map(|n| &n.engine).collect();
    let sidecars: Vec<&Sidecar> = cluster.nodes().iter().map(|n| &n.sidecar).collect();

    // Stored: each engine caches its own prompt; every other node learns it from the events.
    let mut stored_times = Vec::new();
    for (i, engine) in engines.iter().enumerate() {
        let text = prompt(&format!("stored-{i}"));
        let holder = format!("n{i}");
        let started = Instant::now();
        send_direct(engine, &text);
        for observer in sidecars.iter().filter(|s| s.node_id() != holder) {
            time_until(
                observer,
                &holder,
                &text,
                &format!(
                    "{} learns that {holder} holds its prompt",
                    observer.node_id()
                ),
                |blocks| blocks == PROMPT_BLOCKS,
            );
        }
        stored_times.push(started.elapsed());
        // What the mesh believes is what routing uses: another node sends a continuation there.
        let entry = &sidecars[(i + 2) % NODES];
        let continued = format!("{text} and a question about it");
        let response = entry.send(Request::post_json(
            "/v1/completions",
            &completion_body(MODEL, &continued, 1, false),
        ));
        assert_eq!(response.status, 200, "{}", response.describe());
        assert_eq!(served_by(&response), holder, "{}", response.describe());
        assert_eq!(response.header("x-kvmesh-reason"), Some("prefix-hit"));
    }

    // A chat goes through the engine's chat template: entry nodes hash what `/tokenize` with
    // `messages` returns, which are the ids the engine caches.
    let chat = chat_body(MODEL, &prompt("chat"), 1, false);
    let response = Request::post_json("/v1/chat/completions", &chat)
        .send(engines[1].addr())
        .expect("engine answers");
    assert_eq!(response.status, 200, "{}", response.describe());
    let tokens = Request::post_json(
        "/tokenize",
        &json!({"model": MODEL, "messages": chat["messages"]}),
    )
    .send(engines[1].addr())
    .expect("engine tokenizes")
    .json()["count"]
        .as_u64()
        .expect("a token count");
    let chat_blocks = tokens / 16;
    assert!(chat_blocks > PROMPT_BLOCKS, "the template adds tokens");
    let chat_match = json!({"model": MODEL, "messages": chat["messages"]});
    wait_for(
        WAIT_LIMIT,
        "n3 learns that n1 holds the chat",
        || match believed_body(sidecars[3], "n1", &chat_match) {
            Ok(blocks) if blocks == chat_blocks => Ok(()),
            Ok(blocks) => Err(format!("{blocks} of {chat_blocks} blocks")),
            Err(error) => Err(error),
        },
    );

    // Evicted: engine 0 gets six more prompts of 18 blocks into its 64; the first is gone.
    let first = prompt("stored-0");
    let evicting_started = Instant::now();
    for k in 0..6 {
        send_direct(engines[0], &prompt(&format!("evictor-{k}")));
    }
    let evict_sent = evicting_started.elapsed();
    let evicted_at = Instant::now();
    for observer in &sidecars[1..] {
        time_until(
            observer,
            "n0",
            &first,
            &format!(
                "{} learns that n0 evicted its first prompt",
                observer.node_id()
            ),
            |blocks| blocks == 0,
        );
    }
    let withdrawn = evicted_at.elapsed();
    let index_blocks = counter(sidecars[0], "kvmesh_index_blocks", &[]);
    assert!(
        index_blocks <= KV_BLOCKS as f64,
        "exact mode never advertises more blocks ({index_blocks}) than the engine holds"
    );
    for sidecar in &sidecars {
        assert!(
            counter(
                sidecar,
                "kvmesh_kv_event_batches_total",
                &[("outcome", "applied")]
            ) > 0.0
        );
        assert_eq!(
            counter(
                sidecar,
                "kvmesh_kv_event_batches_total",
                &[("outcome", "lost")]
            ),
            0.0
        );
        assert_eq!(counter(sidecar, "kvmesh_tokenize_failures_total", &[]), 0.0);
    }
    println!(
        "stored -> advertised on another node: {stored_times:?}; evicted -> withdrawn: \
         {withdrawn:?} after the evicting requests ({evict_sent:?} to send), on every node"
    );
}

#[test]
fn a_late_sidecar_replays_what_its_engine_cached_before_it_started() {
    // Engine 0 caches a prompt while no sidecar listens: its events are only in the replay
    // buffer.
    let specs = [spec(0), spec(1)];
    let engine = specs[0].start_engine();
    let early = prompt("before-the-sidecar");
    send_direct(&engine, &early);
    let mut cluster = Cluster::empty();
    cluster.join_running(&specs[0], engine);
    cluster.join(&specs[1]);
    cluster.wait_converged();
    let (n0, n1) = (cluster.node("n0"), cluster.sidecar("n1"));
    // The first live batch shows the gap (its sequence number is not 0); the gap is replayed.
    send_direct(&n0.engine, &prompt("after-the-sidecar"));
    time_until(
        n1,
        "n0",
        &early,
        "n1 learns, through n0's replay, that n0 holds the early prompt",
        |blocks| blocks == PROMPT_BLOCKS,
    );
    assert!(
        counter(
            &n0.sidecar,
            "kvmesh_kv_event_batches_total",
            &[("outcome", "replayed")]
        ) > 0.0
    );
    let body: Value = n1.debug_cluster().unwrap();
    assert_eq!(body["node"], "n1");
}

#[test]
fn a_block_size_that_differs_from_vllms_is_reported_not_silently_ignored() {
    // The engine stores blocks of 16 tokens; this sidecar is told 32.
    let mut cluster = Cluster::start(&[spec(0).sidecar_args(&["--block-tokens", "32"])]);
    let node = cluster.node_mut("n0");
    let (engine, sidecar) = (&node.engine, &mut node.sidecar);
    // Keep caching new prompts until their events arrive (the subscription may take hold
    // after the first ones).
    let mut sent = 0;
    wait_until(WAIT_LIMIT, "the skipped blocks to be counted", || {
        send_direct(engine, &prompt(&format!("mismatched {sent}")));
        sent += 1;
        counter(
            sidecar,
            "kvmesh_kv_event_blocks_skipped_total",
            &[("reason", "block_size_mismatch")],
        ) >= PROMPT_BLOCKS as f64
    });
    wait_until(WAIT_LIMIT, "the operator to be told", || {
        sidecar
            .process()
            .output_contains("set --block-tokens 16 on every node")
    });
}

#[test]
fn offloaded_blocks_are_advertised_in_the_offload_tier_after_the_gpu_evicts_them() {
    // Engines with a CPU tier of 256 blocks behind their 64 GPU blocks: every block the GPU
    // caches is also reported offloaded (token-less `BlockStored`, medium CPU, in the batch of
    // its GPU store), as vLLM's OffloadingConnector does.
    let specs: Vec<NodeSpec> = (0..2)
        .map(|i| spec(i).engine_args(&["--kv-offload-blocks", "256"]))
        .collect();
    let cluster = Cluster::start_converged(&specs);
    let (n0, n1) = (cluster.node("n0"), cluster.sidecar("n1"));
    let text = prompt("offloaded");
    let wait_tiers = |what: &str, want: (u64, u64)| {
        wait_for(WAIT_LIMIT, what, || match believed_tiers(n1, "n0", &text) {
            Ok(tiers) if tiers == want => Ok(()),
            Ok((gpu, offload)) => Err(format!("{gpu} blocks on the GPU, {offload} offloaded")),
            Err(error) => Err(error),
        })
        .1
    };

    // Stored: on the GPU and, copied at once, on the CPU.
    send_direct(&n0.engine, &text);
    let stored = wait_tiers(
        "n1 learns that n0 holds the prompt on the GPU and offloaded",
        (PROMPT_BLOCKS, PROMPT_BLOCKS),
    );

    // Evicted from the GPU (six more prompts of 18 blocks into its 64, as in the eviction test
    // above), still on the CPU (7 × 18 blocks fit in 256).
    for k in 0..6 {
        send_direct(&n0.engine, &prompt(&format!("offload-evictor-{k}")));
    }
    let evicted = wait_tiers(
        "n1 learns that n0 evicted the prompt from its GPU but still holds it offloaded",
        (0, PROMPT_BLOCKS),
    );

    // Every token-less store named blocks n0 had just mapped from their GPU store.
    for reason in ["unknown_block", "unknown_parent", "block_size_mismatch"] {
        assert_eq!(
            counter(
                &n0.sidecar,
                "kvmesh_kv_event_blocks_skipped_total",
                &[("reason", reason)]
            ),
            0.0,
            "blocks skipped for {reason}"
        );
    }
    assert_eq!(
        counter(
            &n0.sidecar,
            "kvmesh_kv_event_batches_total",
            &[("outcome", "lost")]
        ),
        0.0
    );
    assert_eq!(
        counter(&n0.sidecar, "kvmesh_kv_event_bad_events_total", &[]),
        0.0
    );
    println!(
        "stored -> advertised in both tiers: {stored:?}; GPU eviction -> withdrawn from the GPU tier only: {evicted:?}"
    );
}

/// vLLM binds its KV-event publisher only on a wildcard endpoint; given a host
/// (`tcp://127.0.0.1:P`) it connects there, as the mock now does too. A sidecar with
/// `--kv-events-bind` listens on that endpoint and learns what the engine caches; one
/// without it (the configuration that used to be documented) is told why it hears nothing.
#[test]
fn an_engine_that_connects_its_publisher_reaches_a_sidecar_that_listens() {
    let events = format!("tcp://127.0.0.1:{}", free_listen_port());
    let listening = NodeSpec::new("n0", &[MODEL])
        .engine_args(&["--kv-blocks", &KV_BLOCKS.to_string()])
        .engine_args(&[
            "--kv-events",
            &events,
            "--kv-events-replay",
            "tcp://127.0.0.1:0",
        ])
        .sidecar_args(&["--kv-events", &events, "--kv-events-bind"]);
    let mut cluster = Cluster::start(&[listening, spec(1)]);
    let (n0, n1) = (cluster.node("n0"), cluster.sidecar("n1"));
    // Batches published before the subscription took hold are dropped (ZMQ) or replayed:
    // keep caching new prompts until one of the last few (the engine's cache holds three) is
    // believed, gossip's delay included.
    let mut sent: Vec<String> = Vec::new();
    wait_until(WAIT_LIMIT, "n1 to learn what n0's engine cached", || {
        let text = prompt(&format!("connected {}", sent.len()));
        send_direct(&n0.engine, &text);
        sent.push(text);
        sent.iter()
            .rev()
            .take(3)
            .any(|text| believed(n1, "n0", text).is_ok_and(|blocks| blocks == PROMPT_BLOCKS))
    });
    assert!(
        counter(
            &n0.sidecar,
            "kvmesh_kv_event_batches_total",
            &[("outcome", "applied")]
        ) > 0.0
    );

    // Both sides connecting (the configuration that used to be documented): nobody listens.
    let unheard = format!("tcp://127.0.0.1:{}", free_listen_port());
    let deaf = cluster.join(
        &NodeSpec::new("n2", &[MODEL])
            .engine_args(&["--kv-events", &unheard])
            .sidecar_args(&["--kv-events", &unheard]),
    );
    wait_until(WAIT_LIMIT, "the operator to be told", || {
        deaf.sidecar.process().output_contains("--kv-events-bind")
    });
}

/// A sidecar that cannot listen for its engine's KV events (the port is taken) says why and
/// shows it in `kvmesh_kv_events_retrying`, and listens once the port is free.
#[test]
fn a_taken_kv_event_port_is_reported_until_it_is_free() {
    let port = free_listen_port();
    let holder = std::net::TcpListener::bind(("127.0.0.1", port)).expect("the port");
    let events = format!("tcp://127.0.0.1:{port}");
    let cluster = Cluster::start(&[NodeSpec::new("n0", &[MODEL]).sidecar_args(&[
        "--kv-events",
        &events,
        "--kv-events-bind",
    ])]);
    let retrying = |sidecar: &Sidecar| {
        sidecar
            .metric("kvmesh_kv_events_retrying", &[])
            .ok()
            .flatten()
    };
    wait_until(WAIT_LIMIT, "the taken port to be reported", || {
        let n0 = cluster.sidecar("n0");
        retrying(n0) == Some(1.0) && n0.output_contains("another socket holds the port")
    });
    drop(holder);
    wait_until(
        WAIT_LIMIT,
        "the sidecar to listen once the port is free",
        || retrying(cluster.sidecar("n0")) == Some(0.0),
    );
    assert!(
        cluster
            .sidecar("n0")
            .output_contains("listening for the engine's KV events")
    );
}
