//! Bad input at the HTTP front gets OpenAI-shaped errors with the right status, and the node
//! keeps serving afterwards: wrong or missing API key → 401, malformed JSON → 400, body over
//! the limit → 413, unknown model → 404 naming the models there are.

use kvmesh_tests::openai::{CHAT_COMPLETIONS, COMPLETIONS, assert_openai_error};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, Request, call};

const API_KEY: &str = "e2e-secret-key";
const MAX_BODY_BYTES: u64 = 4096;

/// Two nodes with an API key and a small body limit; `b` adds a model only it serves.
fn guarded_cluster() -> Cluster {
    let guard = |config: kvmesh_tests::SidecarConfig| {
        config.api_key(API_KEY).max_body_bytes(MAX_BODY_BYTES)
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
    for (what, request) in attempts {
        let response = send_raw(&cluster, request);
        assert_eq!(response.status, 401, "{what}: {}", response.describe());
        assert_openai_error(&response, 401);
    }
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
        }
    }
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
