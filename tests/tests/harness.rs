//! The harness checked against the real mock engine and the real `kvmesh cert` commands: the
//! HTTP client's framing (fixed, chunked, early error answers), SSE reading, readiness
//! failures, and that no process outlives its owner, even when a test panics.

use std::io::ErrorKind;
use std::net::{SocketAddr, TcpStream};
use std::panic::{AssertUnwindSafe, catch_unwind};
use std::process::Command;
use std::time::Duration;

use kvmesh_tests::binaries::KVMESH_SIM;
use kvmesh_tests::certs::ClusterCa;
use kvmesh_tests::openai::{CHAT_COMPLETIONS, COMPLETIONS, chat_body, completion_body};
use kvmesh_tests::process::ManagedProcess;
use kvmesh_tests::{EngineConfig, Request, SseReader, Timing, wait_until};

fn refuses_connections(addr: SocketAddr) -> bool {
    matches!(
        TcpStream::connect_timeout(&addr, Duration::from_secs(2)),
        Err(error) if error.kind() == ErrorKind::ConnectionRefused
    )
}

#[test]
fn engine_answers_plain_and_streamed_requests() {
    let engine = EngineConfig::new("engine", &["model-x", "alias-x"]).start();

    let models = engine.get("/v1/models").json();
    let ids: Vec<&str> = models["data"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["id"].as_str().unwrap())
        .collect();
    assert_eq!(ids, ["model-x", "alias-x"]);

    let plain = Request::post_json(
        COMPLETIONS,
        &completion_body("model-x", "hello there", 5, false),
    )
    .send(engine.addr())
    .expect("completion");
    assert_eq!(plain.status, 200, "{}", plain.describe());
    assert!(
        plain.header("content-length").is_some(),
        "a fixed-length answer"
    );
    assert_eq!(plain.json()["object"], "text_completion");

    for (path, body, object) in [
        (
            COMPLETIONS,
            completion_body("model-x", "hello", 7, true),
            "text_completion",
        ),
        (
            CHAT_COMPLETIONS,
            chat_body("alias-x", "hello", 7, true),
            "chat.completion.chunk",
        ),
    ] {
        let open = Request::post_json(path, &body)
            .open(engine.addr())
            .expect("stream opens");
        assert_eq!(open.status, 200);
        assert!(
            open.header("content-type")
                .unwrap_or_default()
                .starts_with("text/event-stream")
        );
        assert_eq!(
            open.header("transfer-encoding"),
            Some("chunked"),
            "a chunked stream"
        );
        let transcript = SseReader::new(open).read_to_end().expect("whole stream");
        let chunks = transcript.assert_openai_stream(object);
        assert!(
            chunks.len() >= 2,
            "one chunk per token or so, got {}",
            chunks.len()
        );
    }
}

#[test]
fn oversized_bodies_get_413_with_either_framing() {
    let engine = EngineConfig::new("engine", &["m"])
        .arg("--max-body-bytes")
        .arg("1024")
        .start();
    let big = format!(
        "{{\"model\":\"m\",\"prompt\":\"{}\"}}",
        "a".repeat(8 * 1024)
    );
    for request in [
        Request::post(COMPLETIONS, big.clone()),
        Request::post(COMPLETIONS, big.clone()).chunked(),
    ] {
        let response = request
            .send(engine.addr())
            .expect("an answer despite the unread body");
        assert_eq!(response.status, 413, "{}", response.describe());
    }
    // And a small chunked body goes through whole.
    let small = completion_body("m", "hi", 2, false).to_string();
    let response = Request::post(COMPLETIONS, small)
        .chunked()
        .send(engine.addr())
        .expect("answer");
    assert_eq!(response.status, 200, "{}", response.describe());
}

#[test]
fn engine_notices_a_client_that_hangs_up_mid_stream() {
    // Real-time pace: 2000 tokens would take ~24 s, so the request is still running when the
    // client leaves.
    let engine = EngineConfig::new("engine", &["m"])
        .timing(Timing::Scaled(1.0))
        .start();
    let mut body = completion_body("m", "tell me", 2000, true);
    body["ignore_eos"] = true.into(); // no natural stop before the client leaves
    let open = Request::post_json(COMPLETIONS, &body)
        .open(engine.addr())
        .expect("stream opens");
    let mut events = SseReader::new(open);
    assert!(events.next_event().expect("first event").is_some());
    assert_eq!(engine.metric("vllm:num_requests_running", &[]), 1.0);
    drop(events);
    wait_until(
        Duration::from_secs(10),
        "the engine aborts the abandoned request",
        || engine.metric("vllm:num_requests_running", &[]) == 0.0,
    );
    assert_eq!(
        engine.metric(
            "vllm:request_success_total",
            &[("finished_reason", "abort")]
        ),
        1.0
    );
}

#[test]
fn processes_die_with_their_owner_even_on_panic() {
    let engine = EngineConfig::new("engine", &["m"]).start();
    let addr = engine.addr();
    drop(engine);
    assert!(
        refuses_connections(addr),
        "engine still listening after drop"
    );

    let (sender, receiver) = std::sync::mpsc::channel();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        let engine = EngineConfig::new("engine", &["m"]).start();
        sender.send(engine.addr()).unwrap();
        panic!("a test failing while its engine runs");
    }));
    assert!(outcome.is_err());
    let addr = receiver.recv().unwrap();
    assert!(
        refuses_connections(addr),
        "engine still listening after a panic"
    );
}

#[test]
fn kill9_and_sigterm_stop_the_process() {
    let mut engine = EngineConfig::new("engine", &["m"]).start();
    let addr = engine.addr();
    engine.process().sigterm();
    let exited = engine.process().wait_exit(Duration::from_secs(10));
    assert!(exited.is_some(), "still running 10 s after SIGTERM");
    assert!(refuses_connections(addr));

    let mut engine = EngineConfig::new("engine", &["m"]).start();
    let addr = engine.addr();
    engine.kill9();
    assert!(!engine.process().is_running());
    assert!(refuses_connections(addr));
}

#[test]
fn a_process_that_exits_before_ready_fails_with_its_stderr() {
    let mut command = Command::new(KVMESH_SIM.path());
    command.args(["engine", "--no-such-flag"]);
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        ManagedProcess::start(
            "bad engine",
            command,
            "never printed",
            Duration::from_secs(20),
        )
    }));
    let message = match outcome {
        Ok(_) => panic!("a process that exits cannot become ready"),
        Err(payload) => payload
            .downcast_ref::<String>()
            .cloned()
            .unwrap_or_default(),
    };
    assert!(message.contains("exited"), "{message}");
    assert!(
        message.contains("--no-such-flag"),
        "stderr missing from: {message}"
    );
}

#[test]
fn a_silent_process_fails_after_the_ready_timeout() {
    let mut command = Command::new("sleep");
    command.arg("30");
    let started = std::time::Instant::now();
    let outcome = catch_unwind(AssertUnwindSafe(|| {
        ManagedProcess::start("sleeper", command, "ready", Duration::from_millis(300))
    }));
    assert!(outcome.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(10),
        "the wait was not bounded"
    );
}

#[test]
fn cert_commands_issue_node_directories() {
    let ca = ClusterCa::init("harness");
    let first = ca.issue("node-a");
    let second = ca.issue("node-b");
    for (dir, node) in [(&first, "node-a"), (&second, "node-b")] {
        for file in [
            "ca.pem".to_string(),
            format!("{node}.pem"),
            format!("{node}.key"),
        ] {
            let text = std::fs::read_to_string(dir.join(&file)).unwrap();
            assert!(text.contains("-----BEGIN"), "{file} is not PEM");
        }
        assert!(
            !dir.join("ca.key").exists(),
            "a node must not get the CA key"
        );
    }
    assert_eq!(
        std::fs::read(first.join("ca.pem")).unwrap(),
        std::fs::read(ca.ca_dir().join("ca.pem")).unwrap()
    );
}
