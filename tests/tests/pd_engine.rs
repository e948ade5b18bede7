//! The mock engine's NixlConnector protocol between real processes: two `kvmesh-sim engine
//! --kv-connector nixl` on ephemeral ports, driven the way vLLM's toy proxy drives vLLM (a
//! prefill leg with `max_tokens=1`, its `kv_transfer_params` copied into the decode leg), and
//! by vllm-router when it is installed.

use std::time::{Duration, Instant};

use kvmesh_tests::engine::Engine;
use kvmesh_tests::http::OpenResponse;
use kvmesh_tests::nixl::{
    CLIENT_ID, LEG_TIMEOUT, SETTLE, decode_body, nixl_engine, open, post, prefill_body,
    prefill_leg, prompt,
};
use kvmesh_tests::openai::COMPLETIONS;
use kvmesh_tests::tools::skipped_for_lack_of;
use kvmesh_tests::{EngineConfig, Request, SseReader, Timing, wait_until};
use serde_json::{Value, json};

fn usage_perc(e: &Engine) -> f64 {
    e.metric("vllm:kv_cache_usage_perc", &[])
}

fn by_source(e: &Engine, source: &str) -> f64 {
    e.metric("vllm:prompt_tokens_by_source_total", &[("source", source)])
}

#[test]
fn toy_proxy_flow_decodes_every_token_from_the_pulled_kv() {
    let p = nixl_engine(
        "prefill",
        Timing::Scaled(0.2),
        &["--nixl-handshake-ms", "100"],
    );
    let d = nixl_engine(
        "decode",
        Timing::Scaled(0.2),
        &["--nixl-handshake-ms", "100"],
    );
    let plain = EngineConfig::new("plain", &["mock"]).start();
    let body = json!({"model": "mock", "prompt": prompt(1, 2048), "max_tokens": 12,
        "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}});

    let params = prefill_leg(&p, &body);
    let keys: Vec<&str> = params
        .as_object()
        .expect("a length-capped prefill leg answers kv_transfer_params")
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(keys.len(), 8, "vLLM's fields exactly: {keys:?}");
    assert_eq!(params["do_remote_prefill"], true);
    assert_eq!(params["do_remote_decode"], false);
    assert_eq!(params["remote_block_ids"].as_array().unwrap().len(), 128);
    assert_eq!(params["tp_size"], 1);
    let internal = params["remote_request_id"].as_str().unwrap();
    assert!(
        internal != CLIENT_ID && internal.contains(CLIENT_ID),
        "the engine's internal id, not X-Request-Id: {internal}"
    );
    assert!(
        (usage_perc(&p) - 128.0 / 8192.0).abs() < 1e-9,
        "the prefill engine holds the prompt's blocks for the decode engine"
    );

    let started = Instant::now();
    let stream = SseReader::new(open(&d, &decode_body(&body, &params)))
        .read_to_end()
        .expect("decode stream");
    let chunks = stream.assert_openai_stream("text_completion");
    let text: String = chunks
        .iter()
        .filter_map(|c| c["choices"][0]["text"].as_str())
        .collect();
    let usage = &chunks.last().unwrap()["usage"];
    assert_eq!(
        usage["completion_tokens"], 12,
        "the decode engine emits every token"
    );
    assert_eq!(usage["prompt_tokens_details"]["cached_tokens"], 2047);
    assert!(started.elapsed() < Duration::from_secs(5));

    // The same tokens as one engine computing everything.
    let mut whole = body.clone();
    whole["stream"] = json!(false);
    whole.as_object_mut().unwrap().remove("stream_options");
    let r = post(&plain, &whole);
    assert_eq!(r.json()["choices"][0]["text"].as_str(), Some(text.as_str()));

    // The prefill engine freed its blocks once read; both engines count as vLLM's do.
    wait_until(SETTLE, "the prefill engine frees the read blocks", || {
        usage_perc(&p) == 0.0
    });
    assert_eq!(by_source(&p, "local_compute"), 2048.0);
    assert_eq!(
        p.metric(
            "vllm:request_success_total",
            &[("finished_reason", "length")]
        ),
        1.0
    );
    assert_eq!(p.metric("vllm:nixl_num_kv_expired_reqs_total", &[]), 0.0);
    assert_eq!(by_source(&d, "external_kv_transfer"), 2048.0);
    assert_eq!(by_source(&d, "local_compute"), 1.0);
    assert_eq!(by_source(&d, "local_cache_hit"), 0.0);
    assert_eq!(
        d.metric("vllm:external_prefix_cache_hits_total", &[]),
        2048.0
    );
    assert_eq!(d.metric("vllm:nixl_xfer_time_seconds_count", &[]), 1.0);
    assert_eq!(
        d.metric("vllm:nixl_bytes_transferred_sum", &[]),
        128.0 * 16.0 * 131_072.0
    );
    assert_eq!(d.metric("vllm:nixl_num_failed_transfers_total", &[]), 0.0);
    // The pulled blocks are now the decode engine's prefix cache.
    let mut again = whole.clone();
    again["max_tokens"] = json!(1);
    let r = post(&d, &again);
    assert_eq!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        2032
    );
}

#[test]
fn a_dead_prefill_engine_fails_the_pull_or_is_recomputed_by_policy() {
    let mut p = nixl_engine("prefill", Timing::Instant, &[]);
    let fail = nixl_engine(
        "decode-fail",
        Timing::Scaled(1.0),
        &["--nixl-handshake-ms", "0"],
    );
    // The legacy engine model's slow prefill (12,000 tokens/s) tells a local recompute from a
    // pull by a wide margin; an H100 (the default profile) prefills 4096 tokens in ~0.1 s.
    let recompute = nixl_engine(
        "decode-recompute",
        Timing::Scaled(1.0),
        &[
            "--nixl-handshake-ms",
            "0",
            "--kv-load-failure-policy",
            "recompute",
            "--engine-profile",
            "legacy",
        ],
    );
    let body = json!({"model": "mock", "prompt": prompt(2, 4096), "max_tokens": 3,
        "stream": false});
    let params = prefill_leg(&p, &body);
    p.kill9();

    let r = post(&fail, &decode_body(&body, &params));
    assert_eq!(r.status, 500, "{}", r.describe());
    assert_eq!(
        r.json(),
        json!({"error": {"message": "Internal server error", "type": "InternalServerError",
            "param": null, "code": 500}})
    );
    // Streamed, the headers are out before the pull: vLLM reports the failure in the stream.
    let mut streamed = decode_body(&body, &params);
    streamed["stream"] = json!(true);
    let response = open(&fail, &streamed);
    assert_eq!(response.status, 200);
    let events = SseReader::new(response).read_to_end().unwrap().events;
    let data: Vec<&str> = events.iter().map(|e| e.data.as_str()).collect();
    assert_eq!(data.len(), 2, "{data:?}");
    assert_eq!(
        serde_json::from_str::<Value>(data[0]).unwrap()["error"]["code"],
        500
    );
    assert_eq!(data[1], "[DONE]");
    assert_eq!(
        fail.metric("vllm:nixl_num_failed_transfers_total", &[]),
        2.0
    );
    assert_eq!(
        fail.metric(
            "vllm:request_success_total",
            &[("finished_reason", "error")]
        ),
        2.0
    );
    assert_eq!(usage_perc(&fail), 0.0);

    let started = Instant::now();
    let r = post(&recompute, &decode_body(&body, &params));
    let took = started.elapsed();
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        0
    );
    // 4096 tokens prefilled locally: ~0.35 s modelled, against ~0.05 s for a pull.
    assert!(took >= Duration::from_millis(300), "{took:?}");
    assert_eq!(
        recompute.metric("vllm:nixl_num_failed_transfers_total", &[]),
        1.0
    );
    assert_eq!(by_source(&recompute, "external_kv_transfer"), 0.0);
    assert_eq!(by_source(&recompute, "local_compute"), 4096.0);
}

#[test]
fn an_unread_lease_expires_frees_the_blocks_and_fails_a_late_pull() {
    let p = nixl_engine("prefill", Timing::Instant, &["--kv-lease-duration-s", "1"]);
    let d = nixl_engine("decode", Timing::Instant, &[]);
    let body = json!({"model": "mock", "prompt": prompt(3, 512), "max_tokens": 2});
    let params = prefill_leg(&p, &body);
    assert!(usage_perc(&p) > 0.0);
    let took = wait_until(SETTLE, "the lease runs out", || usage_perc(&p) == 0.0);
    assert!(took >= Duration::from_millis(500), "{took:?}");
    assert_eq!(p.metric("vllm:nixl_num_kv_expired_reqs_total", &[]), 1.0);
    let r = post(&d, &decode_body(&body, &params));
    assert_eq!(r.status, 500, "{}", r.describe());
    assert_eq!(d.metric("vllm:nixl_num_failed_transfers_total", &[]), 1.0);
}

/// A decode engine of 40 blocks, 20 of them held by a local request for ~2.5 s (200 decode
/// steps): a decode leg of 400 tokens (25 blocks) waits for KV before it can pull. The local
/// request's stream is returned: dropping it ends the request.
fn busy_decode_engine(extra: &[&str]) -> (Engine, OpenResponse) {
    let mut args = vec!["--kv-blocks", "40", "--nixl-handshake-ms", "0"];
    args.extend_from_slice(extra);
    let d = nixl_engine("decode", Timing::Scaled(1.0), &args);
    let hog = json!({"model": "mock", "prompt": prompt(9, 300), "max_tokens": 200,
        "ignore_eos": true, "stream": true});
    let hog = open(&d, &hog);
    wait_until(SETTLE, "the local request runs", || {
        d.metric("vllm:num_requests_running", &[]) == 1.0
    });
    (d, hog)
}

#[test]
fn heartbeats_keep_a_lease_alive_while_the_decode_leg_waits_for_kv() {
    let p = nixl_engine("prefill", Timing::Instant, &["--kv-lease-duration-s", "1"]);
    let (d, _hog) = busy_decode_engine(&["--kv-lease-duration-s", "1"]);
    let body = json!({"model": "mock", "prompt": prompt(4, 400), "max_tokens": 2});
    let params = prefill_leg(&p, &body);
    let started = Instant::now();
    let r = post(&d, &decode_body(&body, &params));
    assert_eq!(r.status, 200, "{}", r.describe());
    assert!(
        started.elapsed() > Duration::from_millis(1200),
        "the decode leg waited longer than the lease: {:?}",
        started.elapsed()
    );
    assert_eq!(
        r.json()["usage"]["prompt_tokens_details"]["cached_tokens"],
        399
    );
    assert_eq!(p.metric("vllm:nixl_num_kv_expired_reqs_total", &[]), 0.0);
    assert_eq!(usage_perc(&p), 0.0);
}

#[test]
fn leaving_clients_free_the_prefill_engines_blocks() {
    // A decode leg whose client leaves before the pull tells the prefill engine to free.
    let p = nixl_engine("prefill", Timing::Scaled(1.0), &[]);
    let (d, _hog) = busy_decode_engine(&[]);
    let body = json!({"model": "mock", "prompt": prompt(5, 400), "max_tokens": 2});
    let params = prefill_leg(&p, &body);
    let leg = Request::post_json(COMPLETIONS, &decode_body(&body, &params))
        .start(d.addr())
        .unwrap();
    wait_until(SETTLE, "the decode leg waits", || {
        d.metric("vllm:num_requests_waiting", &[]) == 1.0
    });
    drop(leg);
    wait_until(SETTLE, "the prefill engine frees the blocks", || {
        usage_perc(&p) == 0.0
    });
    assert_eq!(p.metric("vllm:nixl_num_kv_expired_reqs_total", &[]), 0.0);
    assert_eq!(d.metric("vllm:num_requests_waiting", &[]), 0.0);

    // A prefill leg whose client (the proxy) leaves mid-prefill lends nothing.
    let long = prefill_body(json!({"model": "mock", "prompt": prompt(6, 16_000)}));
    let leg = Request::post_json(COMPLETIONS, &long)
        .start(p.addr())
        .unwrap();
    wait_until(SETTLE, "the prefill runs", || usage_perc(&p) > 0.0);
    drop(leg);
    wait_until(SETTLE, "the aborted prefill frees its blocks", || {
        usage_perc(&p) == 0.0
    });
    assert_eq!(
        p.metric(
            "vllm:request_success_total",
            &[("finished_reason", "abort")]
        ),
        1.0
    );
}

#[test]
fn injected_side_channel_faults_fail_delay_or_hang_the_pull() {
    let body = json!({"model": "mock", "prompt": prompt(7, 256), "max_tokens": 2});
    let d = nixl_engine("decode", Timing::Instant, &[]);

    let refusing = nixl_engine(
        "prefill-refusing",
        Timing::Instant,
        &["--nixl-fault", "handshake-failure"],
    );
    let params = prefill_leg(&refusing, &body);
    assert_eq!(post(&d, &decode_body(&body, &params)).status, 500);

    let slow = nixl_engine(
        "prefill-slow",
        Timing::Instant,
        &["--nixl-fault", "slow-read", "--nixl-fault-delay-ms", "700"],
    );
    let params = prefill_leg(&slow, &body);
    let started = Instant::now();
    assert_eq!(post(&d, &decode_body(&body, &params)).status, 200);
    assert!(started.elapsed() >= Duration::from_millis(700));
    assert!(d.metric("vllm:nixl_post_time_seconds_sum", &[]) >= 0.7);

    let hung = nixl_engine(
        "prefill-hung",
        Timing::Instant,
        &["--nixl-fault", "hung-read"],
    );
    let params = prefill_leg(&hung, &body);
    let response = Request::post_json(COMPLETIONS, &decode_body(&body, &params))
        .timeout(Duration::from_secs(1))
        .send(d.addr());
    assert!(response.is_err(), "a hung read never answers: {response:?}");
    // The client gave up: the decode engine drops the request and its blocks.
    wait_until(SETTLE, "the decode engine drops the abandoned leg", || {
        d.metric("vllm:num_requests_waiting", &[]) == 0.0 && usage_perc(&d) == 0.0
    });
    wait_until(SETTLE, "the hung prefill engine is told to free", || {
        usage_perc(&hung) == 0.0
    });
    assert_eq!(d.metric("vllm:nixl_num_failed_transfers_total", &[]), 1.0);
}

#[test]
fn vllm_router_drives_the_engines_unchanged() {
    let Some(router) = vllm_router() else {
        if skipped_for_lack_of("vllm-router") {
            return;
        }
        panic!(
            "vllm-router not found: set VLLM_ROUTER to its path or put it on PATH \
             (`scripts/lib/vllm.sh router` installs it and prints the path; scripts/test.sh does)"
        );
    };
    let p = nixl_engine(
        "prefill",
        Timing::Scaled(0.1),
        &["--nixl-handshake-ms", "50"],
    );
    let d = nixl_engine(
        "decode",
        Timing::Scaled(0.1),
        &["--nixl-handshake-ms", "50"],
    );
    let port = std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port();
    let _router = Killed(
        std::process::Command::new(router)
            .args(["--host", "127.0.0.1", "--port", &port.to_string()])
            .args([
                "--vllm-pd-disaggregation",
                "--prefill",
                &p.url(),
                "--decode",
                &d.url(),
            ])
            .stdin(std::process::Stdio::null())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .expect("start vllm-router"),
    );
    let addr: std::net::SocketAddr = ([127, 0, 0, 1], port).into();
    wait_until(Duration::from_secs(30), "vllm-router is healthy", || {
        Request::get("/health")
            .timeout(Duration::from_secs(2))
            .send(addr)
            .is_ok_and(|r| r.status == 200)
    });
    let body = json!({"model": "mock", "prompt": prompt(8, 1024), "max_tokens": 5,
        "ignore_eos": true});
    let r = Request::post_json(COMPLETIONS, &body)
        .timeout(LEG_TIMEOUT)
        .send(addr)
        .unwrap();
    assert_eq!(r.status, 200, "{}", r.describe());
    assert_eq!(r.json()["usage"]["completion_tokens"], 5);
    // vllm-router's own X-Request-Id scheme reached the engines, and the KV moved P → D.
    let id = r.json()["id"].as_str().unwrap().to_owned();
    assert!(id.contains("___prefill_addr_"), "{id}");
    assert_eq!(d.metric("vllm:nixl_xfer_time_seconds_count", &[]), 1.0);
    assert_eq!(by_source(&d, "external_kv_transfer"), 1024.0);
    wait_until(SETTLE, "the prefill engine frees the read blocks", || {
        usage_perc(&p) == 0.0
    });
}

/// A child killed and reaped when dropped (vllm-router logs nothing on stdout to wait for).
struct Killed(std::process::Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// vllm-router from `VLLM_ROUTER` or `PATH`.
fn vllm_router() -> Option<std::path::PathBuf> {
    if let Some(path) = std::env::var_os("VLLM_ROUTER") {
        return Some(path.into());
    }
    std::env::split_paths(&std::env::var_os("PATH")?)
        .map(|dir| dir.join("vllm-router"))
        .find(|p| p.is_file())
}
