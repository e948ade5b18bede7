//! Real vLLM servers (its CPU build) in place of the mock engine.
//!
//! `scripts/lib/vllm.sh` does the Python side: it installs vLLM into a venv under the
//! repository's `.state/` (or `$KVMESH_STATE_DIR`), makes the tiny model (served as `tiny`),
//! its LoRA adapter and a tiny embedding model, and execs a server pinned to one core. This
//! module runs it: [`prepared`] for the artifacts, [`VllmConfig`] for a server, ready once its
//! `/health` answers 200.
//!
//! Nothing here skips: a test that needs vLLM fails, with the script's output, when vLLM cannot
//! be installed or started. `scripts/test.sh` installs it and makes the models before the
//! tests, so that no test pays for that (a first install takes minutes).
//!
//! A server is `python -m vllm.entrypoints.openai.api_server`, whose engine core and worker are
//! child processes (which outlive it when it alone is killed): each server runs in a process
//! group of its own, and the whole group is killed (SIGKILL) when the server is dropped or
//! killed, or, by a watchdog in the group, when the test process is gone; nothing outlives the
//! test.

use std::net::SocketAddr;
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use crate::binaries::workspace_root;
use crate::http::{Request, Response};
use crate::ports::free_listen_port;
use crate::process::{ManagedProcess, run_to_completion};
use crate::sidecar::Sidecar;
use crate::wait::wait_for;
use kvmesh_protocol::prometheus_text;

/// The name every generative server serves the tiny model as.
pub const MODEL: &str = "tiny";
/// The embedding server's model name (see [`VllmConfig::embedding`]).
pub const EMBEDDING_MODEL: &str = "tiny-embed";
/// vLLM's KV block in tokens (`scripts/lib/vllm.sh serve` passes `--block-size 32`); exact
/// mode's `--block-tokens` must equal it.
pub const BLOCK_TOKENS: u64 = 32;
/// The tiny model's context (`--max-model-len 8192` in `scripts/lib/vllm.sh serve`).
pub const MAX_MODEL_LEN: u64 = 8192;
/// Bound on a server's start-up: about 60 s alone on a core, several times that on a 2-core
/// machine shared with other servers and the build.
pub const VLLM_READY_TIMEOUT: Duration = Duration::from_secs(240);
/// Bound of one call to a real server on a shared CPU core (a prompt of a few thousand tokens
/// and a few dozen decode steps take well under a second alone).
pub const VLLM_CALL_TIMEOUT: Duration = Duration::from_secs(60);
/// Bound of `scripts/lib/vllm.sh install` (about 3.5 GB of wheels when nothing is installed).
const SCRIPT_TIMEOUT: Duration = Duration::from_secs(40 * 60);

/// Some of the load generator's word pieces (`sim/src/text.rs`), each one token of the tiny
/// model (`make_tiny_model.py` checks that), so that a text of n pieces is a prompt of n tokens
/// and its KV blocks are known in advance.
const PIECES: [&str; 16] = [
    " the", " and", " for", " you", " not", " are", " was", " but", " all", " can", " sun", " sea",
    " sky", " fox", " cat", " dog",
];

/// Sends `body` to `path` through `entry`, bounded for real vLLM; 200 or the test fails.
pub fn post_ok(entry: &Sidecar, path: &str, body: &Value) -> Response {
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

/// A completions prompt of exactly `tokens` tokens of the tiny model (its tokenizer adds no
/// BOS), the same for the same `key` and unlike any other key's from its first block on.
pub fn prompt(key: &str, tokens: usize) -> String {
    // FNV-1a of the key seeds a xorshift stream of pieces.
    let mut state = key.bytes().fold(0xcbf2_9ce4_8422_2325_u64, |hash, byte| {
        (hash ^ u64::from(byte)).wrapping_mul(0x0100_0000_01b3)
    }) | 1;
    (0..tokens)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            PIECES[(state % PIECES.len() as u64) as usize]
        })
        .collect()
}

/// `scripts/lib/vllm.sh` of this repository.
pub fn script() -> PathBuf {
    workspace_root().join("scripts/lib/vllm.sh")
}

/// Runs `scripts/lib/vllm.sh what` (`install`, `model`, `lora` or `embedding`) and returns the
/// path it prints: the venv's python, or the directory it made. Fails the test, with the
/// script's output, when the script fails: these tests are not skipped for lack of vLLM.
pub fn prepared(what: &str) -> PathBuf {
    let mut command = Command::new("bash");
    command.arg(script()).arg(what);
    let finished = run_to_completion(command, SCRIPT_TIMEOUT);
    assert!(
        finished.status.success(),
        "`scripts/lib/vllm.sh {what}` failed ({}); this test needs real vLLM and does not skip \
         without it (scripts/test.sh installs it):\n{}\n{}",
        finished.status,
        finished.stdout,
        finished.stderr
    );
    let path = finished
        .stdout
        .lines()
        .rev()
        .find(|line| !line.trim().is_empty())
        .map(|line| PathBuf::from(line.trim()))
        .unwrap_or_else(|| panic!("`scripts/lib/vllm.sh {what}` printed no path"));
    assert!(
        path.exists(),
        "`scripts/lib/vllm.sh {what}` printed {}, which does not exist",
        path.display()
    );
    path
}

/// The CPU core for the `index`-th server of a test: one server per core, wrapping around on a
/// machine with fewer cores than servers.
pub fn core(index: usize) -> usize {
    let cores = std::thread::available_parallelism().map_or(1, usize::from);
    index % cores
}

/// How to start a server.
#[derive(Debug, Clone)]
pub struct VllmConfig {
    name: String,
    core: usize,
    args: Vec<String>,
    env: Vec<(String, String)>,
    kv_events: bool,
}

impl VllmConfig {
    /// A server named `name` (in messages) of the tiny model as `tiny`, pinned to `core`.
    pub fn new(name: &str, core: usize) -> Self {
        VllmConfig {
            name: name.to_string(),
            core,
            // Every sidecar polls /metrics a few times a second: without this, a failing
            // test's output would show nothing but those lines.
            args: vec!["--disable-uvicorn-access-log".to_string()],
            env: Vec::new(),
            kv_events: false,
        }
    }

    /// Any vLLM flag (later flags win over `scripts/lib/vllm.sh serve`'s own).
    pub fn arg(mut self, arg: &str) -> Self {
        self.args.push(arg.to_string());
        self
    }

    pub fn args(mut self, args: &[&str]) -> Self {
        self.args.extend(args.iter().map(|arg| arg.to_string()));
        self
    }

    /// An environment variable of the server (e.g. `VLLM_ENABLE_RESPONSES_API_STORE=1`).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// Publishes KV events over ZMQ, with a replay socket, on ephemeral ports: what a sidecar
    /// in exact mode subscribes to ([`VllmServer::kv_events`]).
    pub fn kv_events(mut self) -> Self {
        self.kv_events = true;
        self
    }

    /// The embedding model instead of the tiny one, served as [`EMBEDDING_MODEL`] by vLLM's
    /// pooling runner.
    pub fn embedding(self) -> Self {
        let model = prepared("embedding");
        self.arg("--model")
            .arg(&model.to_string_lossy())
            .args(&[
                "--served-model-name",
                EMBEDDING_MODEL,
                "--runner",
                "pooling",
            ])
            // Within a BERT encoder's positions (the script's 8192 is more than it has).
            .args(&["--max-model-len", "512"])
            // An encoder has no KV cache to share: vLLM refuses to start with prefix caching
            // on ("HybridKVCacheCoordinator requires at least one cacheable group").
            .arg("--no-enable-prefix-caching")
    }

    /// vLLM's NixlConnector, its KV buffer in CPU memory, its side channel on an ephemeral
    /// port (two servers on one host must not share the default one).
    pub fn nixl(self) -> Self {
        let side_channel = free_listen_port().to_string();
        self.args(&[
            "--kv-transfer-config",
            r#"{"kv_connector":"NixlConnector","kv_role":"kv_both","kv_buffer_device":"cpu"}"#,
        ])
        .env("VLLM_NIXL_SIDE_CHANNEL_HOST", "127.0.0.1")
        .env("VLLM_NIXL_SIDE_CHANNEL_PORT", &side_channel)
    }

    /// Starts the server and waits until it is ready.
    pub fn start(self) -> VllmServer {
        let mut server = self.spawn();
        server.wait_ready(VLLM_READY_TIMEOUT);
        server
    }

    /// Starts the server without waiting; [`start_all`] waits for several at once.
    fn spawn(self) -> VllmServer {
        let port = free_listen_port();
        let mut args = self.args;
        let kv_events = self.kv_events.then(|| {
            let (live, replay) = (free_listen_port(), free_listen_port());
            let replay = format!("tcp://127.0.0.1:{replay}");
            args.push("--kv-events-config".to_string());
            args.push(
                serde_json::json!({
                    "enable_kv_cache_events": true,
                    "publisher": "zmq",
                    // vLLM binds its PUB socket only to an endpoint with `*` (or ipc://); to
                    // `tcp://127.0.0.1:PORT` it connects, expecting the subscriber to bind,
                    // and a sidecar waits for a publisher that never comes.
                    "endpoint": format!("tcp://*:{live}"),
                    "replay_endpoint": replay,
                    "topic": "kv-events",
                })
                .to_string(),
            );
            (format!("tcp://127.0.0.1:{live}"), replay)
        });
        let mut command = Command::new("bash");
        command
            .args(["-c", WATCHDOG, "kvmesh-vllm-watchdog"])
            .arg(std::process::id().to_string())
            .arg("bash")
            .arg(script())
            .args(["serve", &self.core.to_string(), &port.to_string()])
            .args(&args)
            .envs(self.env.iter().map(|(name, value)| (name, value)))
            // Its own process group, which drop kills whole (see the module's doc).
            .process_group(0);
        VllmServer {
            process: ManagedProcess::spawn(&self.name, command),
            addr: SocketAddr::from(([127, 0, 0, 1], port)),
            kv_events,
            name: self.name,
            killed: false,
        }
    }
}

/// The leader of a server's process group: runs the server (`$@`) and kills the whole group
/// once the test process (`$1`) is gone or the server has exited. A test killed outright
/// (a nextest timeout, SIGKILL) runs no destructor, and vLLM's engine core outlives its API
/// server: without this, they would run on, holding a core and 3 GB each.
const WATCHDOG: &str = r#"test_pid=$1
shift
"$@" &
server=$!
while kill -0 "$test_pid" 2>/dev/null && kill -0 "$server" 2>/dev/null; do sleep 1; done
kill -KILL 0"#;

/// Starts every server of `configs` at once (each on its own core, their minute of start-up
/// overlaps) and waits until all are ready.
pub fn start_all(configs: Vec<VllmConfig>) -> Vec<VllmServer> {
    let mut servers: Vec<VllmServer> = configs.into_iter().map(VllmConfig::spawn).collect();
    let started = Instant::now();
    for server in &mut servers {
        let left = VLLM_READY_TIMEOUT.saturating_sub(started.elapsed());
        server.wait_ready(left.max(Duration::from_secs(1)));
    }
    servers
}

/// A running vLLM server; its process group is killed when it is dropped.
pub struct VllmServer {
    process: ManagedProcess,
    addr: SocketAddr,
    /// (live, replay) KV-event endpoints, when it publishes them.
    kv_events: Option<(String, String)>,
    name: String,
    /// Set once its group was killed: the group's id may be reused after that.
    killed: bool,
}

impl VllmServer {
    fn wait_ready(&mut self, timeout: Duration) {
        let started = Instant::now();
        loop {
            if !self.process.is_running() {
                // The readers may still hold the last lines: give them a moment.
                std::thread::sleep(Duration::from_millis(500));
                self.process.fail("exited before its /health answered 200");
            }
            let health = Request::get("/health")
                .timeout(Duration::from_secs(5))
                .send(self.addr);
            if health.is_ok_and(|response| response.status == 200) {
                println!("{}: ready after {:?}", self.name, started.elapsed());
                return;
            }
            if started.elapsed() >= timeout {
                self.kill9();
                self.process
                    .fail(&format!("/health did not answer 200 within {timeout:?}"));
            }
            std::thread::sleep(Duration::from_millis(500));
        }
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the sidecar's `--backend`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// The KV-event publisher and its replay socket, for a sidecar's `--kv-events` and
    /// `--kv-events-replay`; panics unless started with [`VllmConfig::kv_events`].
    pub fn kv_events(&self) -> (&str, &str) {
        let (live, replay) = self
            .kv_events
            .as_ref()
            .unwrap_or_else(|| panic!("{} publishes no KV events", self.name));
        (live, replay)
    }

    pub fn process(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    /// Kills the server abruptly: SIGKILL to its whole process group (API server, engine core,
    /// worker), then reaps it. Idempotent.
    pub fn kill9(&mut self) {
        if std::mem::replace(&mut self.killed, true) {
            return;
        }
        // The group's id is the leader's pid, not reused while any member lives (and the
        // leader is not reaped before `process.kill9` below unless it exited by itself).
        let _ = Command::new("kill")
            .args(["-KILL", "--", &format!("-{}", self.process.pid())])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status();
        self.process.kill9();
    }

    /// Sends `request` to the server, bounded by [`VLLM_CALL_TIMEOUT`].
    pub fn send(&self, request: Request) -> Response {
        let description = format!("{request:?}");
        request
            .timeout(VLLM_CALL_TIMEOUT)
            .send(self.addr)
            .unwrap_or_else(|error| panic!("{}: {description} failed: {error}", self.name))
    }

    pub fn get(&self, path: &str) -> Response {
        self.send(Request::get(path))
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Response {
        self.send(Request::post_json(path, body))
    }

    /// The sum of the server's metric `name` over samples with `labels`; panics if it exposes
    /// no such sample (a renamed series must fail the test, not read as zero).
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let response = self.get("/metrics");
        assert_eq!(
            response.status,
            200,
            "{} /metrics: {}",
            self.name,
            response.describe()
        );
        prometheus_text::sum(&response.text(), name, labels)
            .unwrap_or_else(|| panic!("{} exposes no {name} with {labels:?}", self.name))
    }

    /// Prompt tokens vLLM found in its prefix cache so far (`vllm:prefix_cache_hits_total`).
    pub fn prefix_cache_hits(&self) -> f64 {
        self.metric("vllm:prefix_cache_hits_total", &[])
    }

    /// Prompt tokens vLLM looked up in its prefix cache so far
    /// (`vllm:prefix_cache_queries_total`): every prompt token it was asked to compute.
    pub fn prefix_cache_queries(&self) -> f64 {
        self.metric("vllm:prefix_cache_queries_total", &[])
    }

    /// Empties the prefix cache (`POST /reset_prefix_cache`, a dev endpoint the script
    /// enables), so that a stage starts cold. vLLM answers `{"success": false}` while a
    /// request still holds blocks (a stage's last streams may be finishing): retried for up
    /// to 30 s, then a panic.
    pub fn reset_prefix_cache(&self) {
        let what = format!("{}: /reset_prefix_cache to succeed", self.name);
        wait_for(Duration::from_secs(30), &what, || {
            let response = self.send(Request::post("/reset_prefix_cache", ""));
            if response.status != 200 {
                return Err(response.describe());
            }
            match response.json().get("success").and_then(Value::as_bool) {
                Some(false) => Err("success: false (blocks still held)".to_owned()),
                _ => Ok(()),
            }
        });
    }
}

impl Drop for VllmServer {
    fn drop(&mut self) {
        self.kill9();
    }
}
