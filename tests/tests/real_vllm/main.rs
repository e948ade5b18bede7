//! Issue 45 §2: the mesh over real vLLM servers (vLLM's CPU build, `scripts/lib/vllm.sh`), not
//! the mock engine. What is asserted comes from vLLM itself wherever it can: its own prefix-cache
//! counters say which server met a prompt in its cache, its own gauges are what the load digest
//! must show, its own `/v1/models` cards what every node must list.
//!
//! A vLLM server takes about a minute to start on a CPU core, so one test starts two and runs
//! every check that can share them as named stages, in order (a failure names its stage): two
//! sidecars in exact mode, then two in approximate mode in front of the same servers, then one
//! server is killed under load, and an embedding server takes its core. The stages are in
//! [`routing`] (where a prompt goes: exact and approximate mode), [`api`] (what vLLM's API and
//! metrics look like through the mesh) and [`failure`] (a server killed under load).
//! Prefill/decode over NIXL is in `real_vllm_pd.rs`.

mod api;
mod failure;
mod routing;

use std::time::Duration;

use kvmesh_tests::certs::ClusterCa;
use kvmesh_tests::cluster::wait_meshed;
use kvmesh_tests::openai::served_by;
use kvmesh_tests::vllm::{BLOCK_TOKENS, MODEL, core, post_ok, prepared, start_all};
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Response, Sidecar, SidecarConfig, VllmConfig, VllmServer, stage,
};
use serde_json::Value;

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
        api::models_carry_vllms_cards(&[&a, &b], &servers, &model_dir)
    });
    stage("the load digest reads vLLM's own gauges", || {
        api::load_digest_reads_vllms_gauges(&a, &b, &servers)
    });
    stage(
        "exact mode: a completion goes where KV events say its prefix is",
        || routing::exact_completion_goes_to_its_prefix(&a, &servers),
    );
    stage("exact mode: a chat routes by its templated tokens", || {
        routing::exact_chat_routes_by_its_template(&a, &servers)
    });
    let b = stage(
        "exact mode: a new sidecar replays what vLLM cached before it subscribed",
        || routing::exact_replay_after_a_restart(&ca, &a, b, &servers),
    );
    stage("a LoRA adapter is loaded at run time and answers", || {
        api::adapter_loaded_at_run_time(&[&a, &b], &servers, &adapter_dir)
    });
    stage("the Responses API and its continuations", || {
        api::responses_continue_where_stored(&a, &b)
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
        || routing::approximate_continuation_goes_to_its_prefix(&c, &d, &servers),
    );
    stage("a server killed under load", || {
        failure::server_killed_under_load(&c, &d, &mut servers)
    });
    // b's group is gone; its core and memory go to the embedding server.
    drop(servers.pop());
    stage("a pooling model's /v1/embeddings across the mesh", || {
        api::embeddings_across_the_mesh(&ca, &c, &d)
    });
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

/// The card of `id` in a `/v1/models` answer.
fn card(list: &Value, id: &str) -> Value {
    list["data"]
        .as_array()
        .and_then(|data| data.iter().find(|card| card["id"] == id))
        .cloned()
        .unwrap_or_else(|| panic!("no card for {id} in {list}"))
}

fn counter(sidecar: &Sidecar, name: &str, labels: &[(&str, &str)]) -> f64 {
    sidecar
        .metric(name, labels)
        .expect("the sidecar's /metrics")
        .unwrap_or(0.0)
}
