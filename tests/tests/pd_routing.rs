//! Prefill/decode disaggregation through the sidecars (issue 15), over real processes: two
//! prefill and two decode mock engines speaking the NixlConnector protocol, each behind a
//! sidecar with its role, requests sent to every node.
//!
//! What is asserted is what the engines' own counters and the answers say: where prompts were
//! computed and where transferred, the headers naming both legs, the reason, the client's
//! `cached_tokens`, and that failures of either leg lose no request.

use std::time::Duration;

use kvmesh_tests::cluster::{Cluster, NodeSpec};
use kvmesh_tests::openai::COMPLETIONS;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Request, Response, SseReader, Timing, wait_until};
use serde_json::{Value, json};

const REQUEST_TIMEOUT: Duration = Duration::from_secs(60);
const PREFILL: [&str; 2] = ["p1", "p2"];
const DECODE: [&str; 2] = ["d1", "d2"];
const ALL: [&str; 4] = ["p1", "p2", "d1", "d2"];

/// A prompt of exactly `tokens` tokens (the mock's tokenizer reads 4 bytes per token).
fn prompt(seed: u32, tokens: u32) -> String {
    (0..tokens)
        .map(|i| format!("{:04x}", (i * 7919 + seed * 104_729) % 65_536))
        .collect()
}

/// The mock engines' pace unless a test needs slower prefills.
const PACE: Timing = Timing::Scaled(0.05);

fn spec(name: &str, role: &str, engine_extra: &[&str]) -> NodeSpec {
    NodeSpec::new(name, &["mock"])
        .timing(PACE)
        .engine_args(&[
            "--kv-connector",
            "nixl",
            "--enable-prompt-tokens-details",
            "--nixl-handshake-ms",
            "20",
        ])
        .engine_args(engine_extra)
        .sidecar_args(&["--role", role])
}

/// Two prefill and two decode nodes, once every node knows every other's role.
fn cluster() -> Cluster {
    paced_cluster(PACE, PACE)
}

/// [`cluster`] with the prefill and the decode engines at the given paces.
fn paced_cluster(prefill: Timing, decode: Timing) -> Cluster {
    let mut specs: Vec<NodeSpec> = PREFILL
        .iter()
        .map(|n| spec(n, "prefill", &[]).timing(prefill))
        .collect();
    specs.extend(DECODE.iter().map(|n| spec(n, "decode", &[]).timing(decode)));
    let cluster = Cluster::start(&specs);
    wait_for_roles(&cluster);
    cluster
}

/// Waits until every node knows every other's role.
fn wait_for_roles(cluster: &Cluster) {
    cluster.wait_membership(&ALL, CONVERGENCE_TIMEOUT);
    wait_until(CONVERGENCE_TIMEOUT, "every node to know every role", || {
        ALL.iter().all(|node| {
            cluster.sidecar(node).debug_cluster().is_ok_and(|view| {
                view["peers"].as_array().is_some_and(|peers| {
                    peers.len() == 3 && peers.iter().all(|p| p["digest"]["role"].is_string())
                })
            })
        })
    });
}

/// Waits until `entry` learns through gossip that one of `nodes` holds `blocks` blocks of
/// `body`'s prompt.
fn wait_until_held(cluster: &Cluster, entry: &str, body: &Value, nodes: &[&str], blocks: u64) {
    let what = format!("{entry} to learn that one of {nodes:?} holds {blocks} blocks");
    wait_until(CONVERGENCE_TIMEOUT, &what, || {
        let answer = cluster
            .sidecar(entry)
            .try_send(Request::post_json("/debug/match", body));
        let Ok(answer) = answer else { return false };
        answer.json()["nodes"].as_array().is_some_and(|listed| {
            listed.iter().any(|node| {
                node["node"].as_str().is_some_and(|n| nodes.contains(&n))
                    && node["matched_blocks"].as_u64().unwrap_or(0) >= blocks
            })
        })
    });
}

fn body(seed: u32, tokens: u32, stream: bool) -> Value {
    let mut body = json!({"model": "mock", "prompt": prompt(seed, tokens), "max_tokens": 8,
        "ignore_eos": true, "stream": stream});
    if stream {
        body["stream_options"] = json!({"include_usage": true});
    }
    body
}

fn send(cluster: &Cluster, entry: &str, body: &Value) -> Response {
    cluster.sidecar(entry).send(
        Request::post_json(COMPLETIONS, body)
            .timeout(REQUEST_TIMEOUT)
            .header("x-request-id", &format!("pd-{entry}-{}", rand_suffix(body))),
    )
}

/// A request id unique to the body, so that both legs share one id as vLLM's proxies do.
fn rand_suffix(body: &Value) -> String {
    format!("{:x}", kvmesh_protocol::route::node_key(&body.to_string()))
}

fn engine_metric(cluster: &Cluster, node: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    cluster.node(node).engine.metric(name, labels)
}

fn by_source(cluster: &Cluster, nodes: &[&str], source: &str) -> f64 {
    nodes
        .iter()
        .map(|n| {
            engine_metric(
                cluster,
                n,
                "vllm:prompt_tokens_by_source_total",
                &[("source", source)],
            )
        })
        .sum()
}

fn sidecar_metric(cluster: &Cluster, node: &str, name: &str, labels: &[(&str, &str)]) -> f64 {
    cluster
        .sidecar(node)
        .metric(name, labels)
        .unwrap_or_else(|e| panic!("{node} metrics: {e}"))
        .unwrap_or(0.0)
}

#[test]
fn long_prompts_prefill_on_prefill_engines_and_stream_from_decode_engines_through_every_node() {
    let cluster = cluster();
    for (i, entry) in ALL.iter().enumerate() {
        let request = body(i as u32, 2048, true);
        let open = cluster
            .sidecar(entry)
            .try_open(
                Request::post_json(COMPLETIONS, &request)
                    .timeout(REQUEST_TIMEOUT)
                    .header("x-request-id", &format!("pd-stream-{i}")),
            )
            .expect("request");
        assert_eq!(open.status, 200);
        let reason = open.headers.get("x-kvmesh-reason").map(str::to_owned);
        let prefill = open.headers.get("x-kvmesh-prefill-node").map(str::to_owned);
        let decode = open.headers.get("x-kvmesh-node").map(str::to_owned);
        let transcript = SseReader::new(open).read_to_end().expect("stream");
        let chunks = transcript.assert_openai_stream("text_completion");
        assert_eq!(reason.as_deref(), Some("pd"), "entry {entry}");
        assert!(
            prefill.as_deref().is_some_and(|p| PREFILL.contains(&p)),
            "prefill leg on {prefill:?}"
        );
        assert!(
            decode.as_deref().is_some_and(|d| DECODE.contains(&d)),
            "decode leg on {decode:?}"
        );
        let text: String = chunks
            .iter()
            .filter_map(|c| c["choices"][0]["text"].as_str())
            .collect();
        assert!(!text.is_empty(), "tokens streamed");
        let usage = chunks
            .iter()
            .find(|c| !c["usage"].is_null())
            .map(|c| c["usage"].clone())
            .expect("a usage chunk");
        assert_eq!(usage["prompt_tokens"], 2048);
        assert_eq!(
            usage["completion_tokens"], 8,
            "every token from the decode engine"
        );
        // A new prompt: the prefill engine found nothing cached, whatever the decode engine
        // counts for the blocks it pulled.
        assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 0);
    }
    let computed = by_source(&cluster, &PREFILL, "local_compute");
    let transferred = by_source(&cluster, &DECODE, "external_kv_transfer");
    assert_eq!(computed, 4.0 * 2048.0, "the prompts were computed on P");
    assert!(
        transferred >= 4.0 * 2000.0,
        "and transferred to D: {transferred}"
    );
    // vLLM computes a pulled prompt's last token on the decode engine.
    assert!(
        by_source(&cluster, &DECODE, "local_compute") <= 4.0,
        "D computed no prompt beyond its last token"
    );

    // The same prompt again: the decode engine that pulled it holds it now, so what is left
    // to compute is too short to be worth a transfer: it runs whole there.
    wait_until_held(&cluster, "p2", &body(0, 2048, false), &DECODE, 2000 / 16);
    let again = send(&cluster, "p2", &body(0, 2048, false));
    assert_eq!(again.status, 200, "{}", again.describe());
    assert_eq!(again.header("x-kvmesh-reason"), Some("pd-skip-short"));
    assert!(DECODE.contains(&again.header("x-kvmesh-node").unwrap_or("")));
    let cached = &again.json()["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert!(cached.as_u64().is_some_and(|c| c >= 2000), "{cached}");

    // Half of it and 1,024 new tokens: disaggregated, and the client's cached_tokens are what
    // the prefill engine holding the first half found, not the 2,048 the decode engine got.
    let mut half = body(0, 2048, false);
    half["prompt"] = json!(format!(
        "{}{}",
        &prompt(0, 2048)[..4 * 1024],
        prompt(77, 1024)
    ));
    wait_until_held(&cluster, "d1", &half, &PREFILL, 1024 / 16);
    let answer = send(&cluster, "d1", &half);
    assert_eq!(answer.status, 200, "{}", answer.describe());
    assert_eq!(answer.header("x-kvmesh-reason"), Some("pd"));
    let cached = &answer.json()["usage"]["prompt_tokens_details"]["cached_tokens"];
    assert_eq!(cached, 1024, "the prefill engine's hit");

    // A short prompt is not worth a transfer: it runs whole on a decode engine.
    let short = send(&cluster, "p1", &body(99, 64, false));
    assert_eq!(short.status, 200, "{}", short.describe());
    assert_eq!(short.header("x-kvmesh-reason"), Some("pd-skip-short"));
    assert_eq!(short.header("x-kvmesh-prefill-node"), None);
    assert!(DECODE.contains(&short.header("x-kvmesh-node").unwrap_or("")));
    let pd: f64 = ALL
        .iter()
        .map(|n| sidecar_metric(&cluster, n, "kvmesh_requests_total", &[("reason", "pd")]))
        .sum();
    assert_eq!(pd, 5.0, "every disaggregated request is counted as such");
    let skipped: f64 = ALL
        .iter()
        .map(|n| {
            let labels = [("reason", "pd-skip-short")];
            sidecar_metric(&cluster, n, "kvmesh_requests_total", &labels)
        })
        .sum();
    assert_eq!(skipped, 2.0);
}

#[test]
fn a_failed_pull_runs_the_prefill_again_elsewhere_and_nothing_is_lost() {
    // p1's side channel refuses every handshake: a decode leg pulling from it answers 500
    // (vLLM's default kv_load_failure_policy=fail).
    let mut specs = vec![
        spec("p1", "prefill", &["--nixl-fault", "handshake-failure"]),
        spec("p2", "prefill", &[]),
    ];
    specs.extend(DECODE.iter().map(|n| spec(n, "decode", &[])));
    let cluster = Cluster::start(&specs);
    wait_for_roles(&cluster);
    for i in 0..8u32 {
        let entry = ALL[i as usize % 4];
        let answer = send(&cluster, entry, &body(100 + i, 1024, false));
        assert_eq!(answer.status, 200, "{}", answer.describe());
        assert_eq!(answer.header("x-kvmesh-reason"), Some("pd"));
        assert_eq!(
            answer.header("x-kvmesh-prefill-node"),
            Some("p2"),
            "the prefill that ran again did not go back to p1"
        );
        assert_eq!(answer.json()["usage"]["completion_tokens"], 8);
    }
    let reruns: f64 = ALL
        .iter()
        .map(|n| sidecar_metric(&cluster, n, "kvmesh_pd_prefill_reruns_total", &[]))
        .sum();
    let prefilled_on_p1 = engine_metric(
        &cluster,
        "p1",
        "vllm:prompt_tokens_by_source_total",
        &[("source", "local_compute")],
    );
    let failed_pulls: f64 = DECODE
        .iter()
        .map(|d| engine_metric(&cluster, d, "vllm:nixl_num_failed_transfers_total", &[]))
        .sum();
    assert!(
        prefilled_on_p1 > 0.0,
        "p1 took prefill legs (8 new prompts)"
    );
    assert_eq!(
        failed_pulls, reruns,
        "every failed pull ran the prefill again, once"
    );
    assert!(reruns >= 1.0);
}

#[test]
fn a_prefill_engine_killed_under_load_fails_no_request() {
    // At a tenth of a GPU's pace a 4,096-token prefill takes tens of milliseconds: the kill
    // lands while legs run on p1 (computing, or kept for a pull).
    let mut cluster = paced_cluster(Timing::Scaled(0.1), PACE);
    let entries: Vec<_> = ALL.iter().map(|n| cluster.sidecar(n).http_addr()).collect();
    let clients: Vec<_> = (0..16u32)
        .map(|i| {
            let entry = entries[i as usize % entries.len()];
            std::thread::spawn(move || {
                Request::post_json(COMPLETIONS, &body(200 + i, 4096, false))
                    .timeout(REQUEST_TIMEOUT)
                    .header("x-request-id", &format!("pd-kill-{i}"))
                    .send(entry)
                    .expect("an answer")
            })
        })
        .collect();
    std::thread::sleep(Duration::from_millis(60));
    cluster.node_mut("p1").engine.kill9();
    for client in clients {
        let answer = client.join().expect("client thread");
        assert_eq!(answer.status, 200, "{}", answer.describe());
        assert_eq!(answer.json()["usage"]["completion_tokens"], 8);
    }
    let counted = |name: &str| -> f64 {
        ALL.iter()
            .map(|n| sidecar_metric(&cluster, n, name, &[]))
            .sum()
    };
    println!(
        "after the kill: {} retried attempts, {} prefills run again, {} fallbacks",
        counted("kvmesh_retries_total"),
        counted("kvmesh_pd_prefill_reruns_total"),
        counted("kvmesh_pd_fallbacks_total"),
    );
}

#[test]
fn a_decode_engine_loaded_while_prefills_run_gets_no_decode_leg() {
    // Prefills of 8,192 tokens take about two seconds at three times a GPU's pace: long
    // enough for a burst to load d1, and for gossip to say so, before any of them answers.
    let cluster = paced_cluster(Timing::Scaled(3.0), Timing::Scaled(1.0));
    let entries: Vec<_> = ALL.iter().map(|n| cluster.sidecar(n).http_addr()).collect();
    let requests: Vec<_> = (0..4u32)
        .map(|i| {
            let entry = entries[i as usize];
            std::thread::spawn(move || {
                Request::post_json(COMPLETIONS, &body(300 + i, 8192, false))
                    .timeout(REQUEST_TIMEOUT)
                    .header("x-request-id", &format!("pd-redirect-{i}"))
                    .send(entry)
                    .expect("an answer")
            })
        })
        .collect();
    // Another client's burst of long generations lands on d1's engine directly while the
    // prefills run (it is not routed: only d1's gauges, gossiped, show it).
    let d1 = cluster.node("d1").engine.addr();
    let burst: Vec<_> = (0..8u32)
        .map(|i| {
            std::thread::spawn(move || {
                let long = json!({"model": "mock", "prompt": prompt(400 + i, 64),
                    "max_tokens": 600, "ignore_eos": true});
                Request::post_json(COMPLETIONS, &long)
                    .timeout(REQUEST_TIMEOUT)
                    .send(d1)
                    .expect("a burst answer")
            })
        })
        .collect();
    let decoded_on: Vec<String> = requests
        .into_iter()
        .map(|request| {
            let answer = request.join().expect("client thread");
            assert_eq!(answer.status, 200, "{}", answer.describe());
            assert_eq!(answer.header("x-kvmesh-reason"), Some("pd"));
            answer.header("x-kvmesh-node").unwrap_or("").to_owned()
        })
        .collect();
    // Still decoding: the decode legs were placed while d1 was loaded.
    let running = cluster
        .node("d1")
        .engine
        .metric("vllm:num_requests_running", &[]);
    assert!(running >= 8.0, "the burst still runs on d1: {running}");
    assert_eq!(
        decoded_on,
        vec!["d2"; 4],
        "every decode leg went to the engine under the bound"
    );
    for answer in burst {
        assert_eq!(answer.join().expect("burst thread").status, 200);
    }
}

#[test]
fn a_prefill_leg_counts_in_its_prefill_nodes_queue_until_it_answers() {
    // An 8,192-token prefill takes about two seconds at three times a GPU's pace: many polls
    // of the engine, which shows the leg running, not waiting, once its prefill starts.
    let cluster = paced_cluster(Timing::Scaled(3.0), PACE);
    let entry = cluster.sidecar("d1").http_addr();
    let request = std::thread::spawn(move || {
        Request::post_json(COMPLETIONS, &body(500, 8192, false))
            .timeout(REQUEST_TIMEOUT)
            .header("x-request-id", "pd-queued-leg")
            .send(entry)
            .expect("an answer")
    });
    let prefilling = || {
        PREFILL
            .iter()
            .map(|n| engine_metric(&cluster, n, "vllm:num_requests_running", &[]))
            .sum::<f64>()
    };
    let queued = || {
        PREFILL
            .iter()
            .map(|n| sidecar_metric(&cluster, n, "kvmesh_engine_queued", &[]))
            .sum::<f64>()
    };
    // Samples of the prefill sidecars' queue taken while the engine ran the leg before and
    // after (so that it was running in between).
    let mut samples = Vec::new();
    let started = std::time::Instant::now();
    while !request.is_finished() && started.elapsed() < REQUEST_TIMEOUT {
        let before = prefilling();
        let sample = queued();
        if before == 1.0 && prefilling() == 1.0 {
            samples.push((started.elapsed(), sample));
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let answer = request.join().expect("client thread");
    assert_eq!(answer.status, 200, "{}", answer.describe());
    assert_eq!(answer.header("x-kvmesh-reason"), Some("pd"));
    let span = match (samples.first(), samples.last()) {
        (Some(first), Some(last)) => last.0 - first.0,
        _ => Duration::ZERO,
    };
    assert!(
        samples.len() >= 5 && span >= Duration::from_millis(500),
        "the prefill was watched for long enough: {} samples over {span:?}",
        samples.len()
    );
    assert!(
        samples.iter().all(|&(_, queued)| queued == 1.0),
        "the leg was counted queued at its prefill node all along: {samples:?}"
    );
    wait_until(Duration::from_secs(10), "the queue to empty", || {
        queued() == 0.0
    });
}
