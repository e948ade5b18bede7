//! A `kvmesh-sim engine` process: the mock vLLM server behind each sidecar.

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use crate::binaries::KVMESH_SIM;
use crate::http::{Request, Response};
use crate::process::ManagedProcess;
use kvmesh_protocol::prometheus_text;

/// Bound on the engine's start-up (readiness line on stdout).
pub const ENGINE_READY_TIMEOUT: Duration = Duration::from_secs(20);
const READY_PREFIX: &str = "kvmesh-sim engine listening on http://";

/// How fast the mock engine answers.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Timing {
    /// No modelled delay at all.
    Instant,
    /// Modelled delays multiplied by this factor (1.0 = a real GPU's pace).
    Scaled(f64),
}

/// How to start an engine.
#[derive(Debug, Clone)]
pub struct EngineConfig {
    name: String,
    models: Vec<String>,
    timing: Timing,
    extra_args: Vec<String>,
    /// A fixed port (to restart an engine where its sidecar expects it); ephemeral if `None`.
    port: Option<u16>,
}

impl EngineConfig {
    /// An instant engine named `name` (in messages) serving `models` (aliases of one model).
    pub fn new(name: &str, models: &[&str]) -> Self {
        assert!(
            !models.is_empty(),
            "an engine serves at least one model name"
        );
        EngineConfig {
            name: name.to_string(),
            models: models.iter().map(|model| model.to_string()).collect(),
            timing: Timing::Instant,
            extra_args: Vec::new(),
            port: None,
        }
    }

    /// Listens on `port` rather than an ephemeral one.
    pub fn port(mut self, port: u16) -> Self {
        self.port = Some(port);
        self
    }

    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// Any other `kvmesh-sim engine` flag.
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_string());
        self
    }

    pub fn start(self) -> Engine {
        let mut command = Command::new(KVMESH_SIM.path());
        command.env("NO_COLOR", "1"); // plain logs in failure reports
        let port = self.port.unwrap_or(0).to_string();
        command.args(["engine", "--host", "127.0.0.1", "--port", &port]);
        for model in &self.models {
            command.args(["--model", model]);
        }
        match self.timing {
            Timing::Instant => {
                command.arg("--instant");
            }
            Timing::Scaled(scale) => {
                command.args(["--time-scale", &scale.to_string()]);
            }
        }
        command.args(&self.extra_args);
        let (process, line) =
            ManagedProcess::start(&self.name, command, READY_PREFIX, ENGINE_READY_TIMEOUT);
        let addr = line[READY_PREFIX.len()..]
            .trim()
            .parse()
            .unwrap_or_else(|error| panic!("{}: bad readiness line {line:?}: {error}", self.name));
        Engine {
            process,
            addr,
            models: self.models,
        }
    }
}

/// A running mock engine, killed when dropped.
pub struct Engine {
    process: ManagedProcess,
    addr: SocketAddr,
    models: Vec<String>,
}

impl Engine {
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// `http://ADDR`, the sidecar's `--backend`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    pub fn models(&self) -> &[String] {
        &self.models
    }

    pub fn process(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    /// The endpoint the engine printed after `prefix` (e.g. `kv events on `), waiting briefly:
    /// it prints its optional endpoints right after its readiness line.
    pub fn printed_endpoint(&self, prefix: &str) -> String {
        let (line, _) = crate::wait::wait_for(
            Duration::from_secs(5),
            &format!(
                "{} prints a line starting with {prefix:?}",
                self.process.name()
            ),
            || self.process.output_line(prefix).ok_or_else(String::new),
        );
        line[prefix.len()..].trim().to_owned()
    }

    /// Stops the engine abruptly (SIGKILL).
    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    pub fn get(&self, path: &str) -> Response {
        Request::get(path)
            .send(self.addr)
            .unwrap_or_else(|error| panic!("GET {path} on engine {}: {error}", self.process.name()))
    }

    /// The sum of the engine's metric `name` over samples with `labels`, 0 if absent.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> f64 {
        let response = self.get("/metrics");
        assert_eq!(
            response.status,
            200,
            "engine /metrics: {}",
            response.describe()
        );
        prometheus_text::sum(&response.text(), name, labels).unwrap_or(0.0)
    }

    /// Requests the engine finished, by any reason (vLLM's `request_success_total`).
    pub fn finished_requests(&self) -> f64 {
        self.metric("vllm:request_success_total", &[])
    }
}
