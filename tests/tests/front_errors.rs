//! Bad input at the HTTP front gets OpenAI-shaped errors with the right status, and the node
//! keeps serving afterwards: wrong or missing API key → 401, malformed JSON → 400, body over
//! the limit → 413, unknown model → 404 naming the models there are, a body that stalls → 408,
//! a header that stalls → the connection is closed. Every refusal carries the request's id and
//! is counted as rejected.

use kvmesh_tests::openai::{CHAT_COMPLETIONS, COMPLETIONS, assert_openai_error};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, Request, call};
use std::io::{Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

const API_KEY: &str = "e2e-secret-key";
const MAX_BODY_BYTES: u64 = 4096;
/// The guarded nodes' `--client-timeout-secs`.
const CLIENT_TIMEOUT_SECS: u64 = 2;

/// Two nodes with an API key and a small body limit; `b` adds a model only it serves.
fn guarded_cluster() -> Cluster {
    let guard = |config: kvmesh_tests::SidecarConfig| {
        config
            .api_key(API_KEY)
            .max_body_bytes(MAX_BODY_BYTES)
            .arg("--client-timeout-secs")
            .arg(&CLIENT_TIMEOUT_SECS.to_string())
    };
    let mut cluster = Cluster::empty();
    cluster.join_with(&NodeSpec::new("a", &["shared"]), guard);
    cluster.join_with(&NodeSpec::new("b", &["only-b"]), guard);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    cluster.wait_models(&["a", "b"], &["only-b", "shared"], CONVERGENCE_TIMEOUT);
    cluster
}

/// Sends `request` to node a without adding the API key.
fn send_raw(cluster: &Cluster, request: Request) -> kvmesh_tests::Response {
    let addr = cluster.sidecar("a").http_addr();
    request.send(addr).unwrap_or_else(|error| panic!("{error}"))
}

#[test]
fn a_wrong_or_missing_api_key_gets_401() {
    let cluster = guarded_cluster();
    let body = Call::Completion.body("shared", "hello", 4);
    let attempts = [
        ("no key", Request::post_json(COMPLETIONS, &body)),
        (
            "wrong key",
            Request::post_json(COMPLETIONS, &body).bearer("not-the-key"),
        ),
        (
            "key as basic auth",
            Request::post_json(COMPLETIONS, &body)
                .header("authorization", &format!("Basic {API_KEY}")),
        ),
        (
            "chat, no key",
            Request::post_json(CHAT_COMPLETIONS, &Call::Chat.body("shared", "hello", 4)),
        ),
        (
            "stream, wrong key",
            Request::post_json(
                COMPLETIONS,
                &Call::StreamedCompletion.body("shared", "hello", 4),
            )
            .bearer("nope"),
        ),
        ("models, no key", Request::get("/v1/models")),
    ];
    let rejected = || {
        let metric = cluster.sidecar("a").metric(
            "kvmesh_requests_total",
            &[("reason", "none"), ("outcome", "rejected")],
        );
        metric
            .unwrap_or_else(|error| panic!("{error}"))
            .unwrap_or(0.0)
    };
    let rejected_before = rejected();
    for (what, request) in &attempts {
        let response = send_raw(&cluster, request.clone());
        assert_eq!(response.status, 401, "{what}: {}", response.describe());
        assert_openai_error(&response, 401);
    }
    assert_eq!(
        rejected() - rejected_before,
        attempts.len() as f64,
        "every 401 is counted as a rejected request"
    );
    // The key itself works, for forwarded requests too.
    let served = call(
        cluster.sidecar("a"),
        Call::Completion,
        "only-b",
        "with the key",
    );
    assert_eq!(served.node, "b");
    let with_key = send_raw(
        &cluster,
        Request::post_json(COMPLETIONS, &body).bearer(API_KEY),
    );
    assert_eq!(with_key.status, 200, "{}", with_key.describe());
}

#[test]
fn malformed_json_gets_400() {
    let cluster = guarded_cluster();
    let sidecar = cluster.sidecar("a");
    let bodies: [&[u8]; 5] = [
        b"{\"model\": \"shared\", \"prompt\": ",
        b"not json at all",
        b"",
        b"{\"model\": \"shared\", \"prompt\": \"hi\",}",
        b"\xff\xfe{}",
    ];
    for path in [COMPLETIONS, CHAT_COMPLETIONS] {
        for body in bodies {
            let response = sidecar.send(Request::post(path, body.to_vec()));
            assert_openai_error(&response, 400);
            let id = response.header("x-request-id").unwrap_or_default();
            assert!(id.starts_with("kvmesh-a-"), "a generated id: {id:?}");
        }
    }
    // A client's own id comes back on a refusal too.
    let response =
        sidecar.send(Request::post(COMPLETIONS, b"{".to_vec()).header("x-request-id", "client-7"));
    assert_openai_error(&response, 400);
    assert_eq!(response.header("x-request-id"), Some("client-7"));
    // Nothing broke.
    for kind in Call::ALL {
        call(sidecar, kind, "shared", "after the bad ones");
    }
}

#[test]
fn a_body_over_the_limit_gets_413() {
    let cluster = guarded_cluster();
    let sidecar = cluster.sidecar("a");
    let oversized = Call::Completion.body("only-b", &"x".repeat(2 * MAX_BODY_BYTES as usize), 4);
    for request in [
        Request::post_json(COMPLETIONS, &oversized),
        Request::post_json(COMPLETIONS, &oversized).chunked(),
        Request::post_json(
            CHAT_COMPLETIONS,
            &Call::Chat.body("shared", &"y".repeat(3 * MAX_BODY_BYTES as usize), 4),
        ),
    ] {
        let response = sidecar.send(request);
        assert_openai_error(&response, 413);
    }
    // Just under the limit is fine, locally and forwarded.
    let prompt = "z".repeat(MAX_BODY_BYTES as usize - 200);
    for model in ["shared", "only-b"] {
        let body = Call::Completion.body(model, &prompt, 4);
        assert!(body.to_string().len() < MAX_BODY_BYTES as usize);
        let response = sidecar.send(Request::post_json(COMPLETIONS, &body));
        assert_eq!(response.status, 200, "{model}: {}", response.describe());
    }
}

#[test]
fn an_unknown_model_gets_404_naming_the_available_ones() {
    let cluster = guarded_cluster();
    for entry in ["a", "b"] {
        for kind in Call::ALL {
            let response = cluster
                .sidecar(entry)
                .send(kind.request("no-such-model", "hi", 4));
            let error = assert_openai_error(&response, 404);
            let message = error["message"].as_str().unwrap_or_default();
            for named in ["shared", "only-b"] {
                assert!(
                    message.contains(named),
                    "{kind:?} via {entry}: {named} not in {message:?}"
                );
            }
        }
    }
}

/// Writes `bytes` on a fresh connection to node a, then reads until the server closes it (or
/// 15 s pass); returns what came back and when the connection ended.
fn stall_with(cluster: &Cluster, bytes: &[u8]) -> (String, Duration) {
    // From before the connection: the server's header timer starts when it accepts.
    let started = Instant::now();
    let mut stream = TcpStream::connect(cluster.sidecar("a").http_addr()).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(15)))
        .expect("read timeout");
    stream.write_all(bytes).expect("write");
    let mut answer = Vec::new();
    // Ends at EOF (the server closed) or at the read timeout (it did not).
    let _ = stream.read_to_end(&mut answer);
    (
        String::from_utf8_lossy(&answer).into_owned(),
        started.elapsed(),
    )
}

#[test]
fn a_client_that_stalls_is_cut_off() {
    let cluster = guarded_cluster();
    let bound = Duration::from_secs(CLIENT_TIMEOUT_SECS);
    // A body that never arrives whole: 408 in the OpenAI shape, after the client timeout.
    let head = format!(
        "POST {COMPLETIONS} HTTP/1.1\r\nhost: a\r\nauthorization: Bearer {API_KEY}\r\n\
         content-type: application/json\r\ncontent-length: 100\r\n\r\n{{\"model\":"
    );
    let (answer, took) = stall_with(&cluster, head.as_bytes());
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer:?}");
    assert!(answer.contains("\"code\":408"), "{answer:?}");
    assert!(took >= bound && took < Duration::from_secs(12), "{took:?}");
    // A header that never ends: the connection is closed.
    let (answer, took) = stall_with(
        &cluster,
        format!("POST {COMPLETIONS} HTTP/1.1\r\nhost:").as_bytes(),
    );
    assert!(!answer.starts_with("HTTP/1.1 2"), "{answer:?}");
    assert!(took >= bound && took < Duration::from_secs(12), "{took:?}");
    // Well-behaved clients are still served.
    call(
        cluster.sidecar("a"),
        Call::Completion,
        "shared",
        "after the stalls",
    );
}
