//! A `kvmesh serve` process: the sidecar under test.
//!
//! The command line and the readiness line are the contract of issue 4:
//! `kvmesh serve --backend URL --listen 127.0.0.1:0 --mesh 127.0.0.1:0 --node-id NAME
//! --cluster-id ID --tls-dir DIR [--seeds A,B] [--api-key KEY] [--max-body-bytes N]` prints
//! `kvmesh listening on http://HTTP_ADDR mesh MESH_ADDR node NAME` once it serves.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use serde_json::Value;

use crate::binaries::KVMESH;
use crate::certs::ClusterCa;
use crate::http::{OpenResponse, Request, Response, SentRequest};
use crate::process::ManagedProcess;
use kvmesh_protocol::prometheus_text;

/// Bound on the sidecar's start-up (readiness line on stdout).
pub const SIDECAR_READY_TIMEOUT: Duration = Duration::from_secs(20);
const READY_PREFIX: &str = "kvmesh listening on ";

/// How to start a sidecar.
#[derive(Debug, Clone)]
pub struct SidecarConfig {
    node_id: String,
    cluster_id: String,
    backend: String,
    tls_dir: PathBuf,
    seeds: Vec<SocketAddr>,
    api_key: Option<String>,
    max_body_bytes: Option<u64>,
    extra_args: Vec<String>,
    env: Vec<(String, String)>,
    /// The mesh's UDP address and the one it advertises, when not an ephemeral port and
    /// itself.
    mesh: Option<(SocketAddr, SocketAddr)>,
}

impl SidecarConfig {
    /// A sidecar `node_id` in front of the engine at `backend`, with a certificate from `ca`.
    pub fn new(node_id: &str, backend: &str, ca: &ClusterCa) -> Self {
        Self::with_tls_dir(node_id, backend, ca, ca.issue(node_id))
    }

    /// Like [`Self::new`], with certificates already in `tls_dir` (e.g. issued with
    /// [`ClusterCa::issue_with`]) instead of new ones.
    pub fn with_tls_dir(node_id: &str, backend: &str, ca: &ClusterCa, tls_dir: PathBuf) -> Self {
        SidecarConfig {
            node_id: node_id.to_string(),
            cluster_id: ca.cluster_id().to_string(),
            backend: backend.to_string(),
            tls_dir,
            seeds: Vec::new(),
            api_key: None,
            max_body_bytes: None,
            extra_args: Vec::new(),
            env: Vec::new(),
            mesh: None,
        }
    }

    /// Binds the mesh at `bind` and advertises `advertise` (a relay in front of it).
    pub fn mesh_behind(mut self, bind: SocketAddr, advertise: SocketAddr) -> Self {
        self.mesh = Some((bind, advertise));
        self
    }

    /// Mesh addresses of nodes already running.
    pub fn seeds(mut self, seeds: &[SocketAddr]) -> Self {
        self.seeds = seeds.to_vec();
        self
    }

    pub fn api_key(mut self, key: &str) -> Self {
        self.api_key = Some(key.to_string());
        self
    }

    pub fn max_body_bytes(mut self, bytes: u64) -> Self {
        self.max_body_bytes = Some(bytes);
        self
    }

    /// Any other `kvmesh serve` flag.
    pub fn arg(mut self, arg: &str) -> Self {
        self.extra_args.push(arg.to_string());
        self
    }

    /// An environment variable of the process, e.g. a `KVMESH_*` setting (flags still win).
    pub fn env(mut self, name: &str, value: &str) -> Self {
        self.env.push((name.to_string(), value.to_string()));
        self
    }

    /// Certificates from elsewhere than this harness's CA (e.g. a deployment script's).
    pub fn tls_dir(mut self, dir: PathBuf) -> Self {
        self.tls_dir = dir;
        self
    }

    pub fn start(self) -> Sidecar {
        let mut command = Command::new(KVMESH.path());
        // `kvmesh serve` reads every flag from KVMESH_* variables too; the test's command line
        // alone must decide (KVMESH_BIN and the like are the harness's own).
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("KVMESH_") {
                command.env_remove(name);
            }
        }
        command.env("NO_COLOR", "1"); // plain logs in failure reports
        command.envs(self.env.iter().map(|(name, value)| (name, value)));
        command.args(["serve", "--backend", &self.backend]);
        command.args(["--listen", "127.0.0.1:0"]);
        match self.mesh {
            Some((bind, advertise)) => command
                .args(["--mesh", &bind.to_string()])
                .args(["--advertise", &advertise.to_string()]),
            None => command.args(["--mesh", "127.0.0.1:0"]),
        };
        command.args(["--node-id", &self.node_id, "--cluster-id", &self.cluster_id]);
        command.arg("--tls-dir").arg(&self.tls_dir);
        if !self.seeds.is_empty() {
            let seeds: Vec<String> = self.seeds.iter().map(SocketAddr::to_string).collect();
            command.args(["--seeds", &seeds.join(",")]);
        }
        if let Some(key) = &self.api_key {
            command.args(["--api-key", key]);
        }
        if let Some(bytes) = self.max_body_bytes {
            command.args(["--max-body-bytes", &bytes.to_string()]);
        }
        command.args(&self.extra_args);
        let name = format!("sidecar {}", self.node_id);
        let (mut process, line) =
            ManagedProcess::start(&name, command, READY_PREFIX, SIDECAR_READY_TIMEOUT);
        let Some((http_addr, mesh_addr, node)) = parse_ready_line(&line) else {
            process.fail(&format!("unexpected readiness line {line:?}"));
        };
        if node != self.node_id {
            process.fail(&format!(
                "readiness line names node {node:?}, not {:?}",
                self.node_id
            ));
        }
        Sidecar {
            process,
            http_addr,
            mesh_addr,
            node_id: self.node_id,
            api_key: self.api_key,
        }
    }
}

/// `kvmesh listening on http://HTTP_ADDR mesh MESH_ADDR node NAME` → its three values.
fn parse_ready_line(line: &str) -> Option<(SocketAddr, SocketAddr, String)> {
    let words: Vec<&str> = line.split_whitespace().collect();
    let after = |marker: &str| {
        let at = words.iter().position(|word| *word == marker)?;
        words.get(at + 1).copied()
    };
    let http_addr = after("on")?
        .strip_prefix("http://")?
        .trim_end_matches('/')
        .parse()
        .ok()?;
    let mesh_addr = after("mesh")?.parse().ok()?;
    let node = after("node")?.to_string();
    Some((http_addr, mesh_addr, node))
}

/// A running sidecar, killed when dropped.
pub struct Sidecar {
    process: ManagedProcess,
    http_addr: SocketAddr,
    mesh_addr: SocketAddr,
    node_id: String,
    api_key: Option<String>,
}

impl Sidecar {
    pub fn node_id(&self) -> &str {
        &self.node_id
    }

    pub fn http_addr(&self) -> SocketAddr {
        self.http_addr
    }

    pub fn mesh_addr(&self) -> SocketAddr {
        self.mesh_addr
    }

    pub fn process(&mut self) -> &mut ManagedProcess {
        &mut self.process
    }

    pub fn kill9(&mut self) {
        self.process.kill9();
    }

    /// Whether any line the sidecar printed so far contains `needle`.
    pub fn output_contains(&self, needle: &str) -> bool {
        self.process.output_contains(needle)
    }

    /// The last `lines` lines it printed, both pipes.
    pub fn output_tail(&self, lines: usize) -> String {
        self.process.output_tail(lines)
    }

    pub fn sigterm(&mut self) {
        self.process.sigterm();
    }

    /// `request` with this sidecar's API key, if it has one.
    fn authorized(&self, request: Request) -> Request {
        match &self.api_key {
            Some(key) => request.bearer(key),
            None => request,
        }
    }

    /// Sends `request` to this sidecar, with its API key if it has one; transport errors
    /// (not HTTP error statuses) come back as `Err`.
    pub fn try_send(&self, request: Request) -> std::io::Result<Response> {
        self.authorized(request).send(self.http_addr)
    }

    /// Opens `request` on this sidecar (with its API key), returning once the head arrived.
    pub fn try_open(&self, request: Request) -> std::io::Result<OpenResponse> {
        self.authorized(request).open(self.http_addr)
    }

    /// Sends `request` (with its API key) without reading the answer; see [`SentRequest`].
    pub fn try_start(&self, request: Request) -> std::io::Result<SentRequest> {
        self.authorized(request).start(self.http_addr)
    }

    /// Like [`Self::try_send`], but a transport error fails the test.
    pub fn send(&self, request: Request) -> Response {
        let description = format!("{request:?}");
        self.try_send(request).unwrap_or_else(|error| {
            panic!("sidecar {}: {description} failed: {error}", self.node_id)
        })
    }

    pub fn get(&self, path: &str) -> Response {
        self.send(Request::get(path))
    }

    pub fn post_json(&self, path: &str, body: &Value) -> Response {
        self.send(Request::post_json(path, body))
    }

    /// `GET /debug/cluster` as JSON; `Err` describes what came back instead.
    pub fn debug_cluster(&self) -> Result<Value, String> {
        let response = self
            .try_send(Request::get("/debug/cluster"))
            .map_err(|e| e.to_string())?;
        if response.status != 200 {
            return Err(response.describe());
        }
        serde_json::from_slice(&response.body)
            .map_err(|error| format!("{error}: {}", response.describe()))
    }

    /// How this node would judge `peer`'s load now (the `estimate` of its `/debug/cluster`
    /// entry: gauges, pending sends, their source, the last load report), or `None` while it
    /// has no digest of `peer`.
    pub fn estimate_of(&self, peer: &str) -> Option<Value> {
        let cluster = self.debug_cluster().ok()?;
        let estimate = peer_entry(&cluster, peer)?.get("estimate")?;
        (!estimate.is_null()).then(|| estimate.clone())
    }

    /// The load digest this node holds of `peer` (its `/debug/cluster` entry's `digest`), or
    /// `None` while it has none.
    pub fn digest_of(&self, peer: &str) -> Option<Value> {
        let cluster = self.debug_cluster().ok()?;
        let digest = peer_entry(&cluster, peer)?.get("digest")?;
        (!digest.is_null()).then(|| digest.clone())
    }

    /// `POST /debug/match` with `body`: the blocks of its chain each node holds, and the
    /// chain's length in blocks.
    pub fn debug_match(&self, body: &Value) -> Result<(Vec<(String, u64)>, u64), String> {
        let response = self
            .try_send(Request::post_json("/debug/match", body))
            .map_err(|e| e.to_string())?;
        if response.status != 200 {
            return Err(response.describe());
        }
        let answer = response.json();
        let blocks = answer["blocks"]
            .as_u64()
            .ok_or_else(|| format!("no blocks in {answer}"))?;
        let nodes = answer["nodes"]
            .as_array()
            .ok_or_else(|| format!("no nodes in {answer}"))?
            .iter()
            .map(|node| {
                let name = node["node"].as_str().unwrap_or_default().to_owned();
                (name, node["matched_blocks"].as_u64().unwrap_or(u64::MAX))
            })
            .collect();
        Ok((nodes, blocks))
    }

    /// Whether this node's view lists `owner` as holding every block of `body`'s chain; the
    /// blocks each node holds when it does.
    pub fn sees_whole_prefix_at(
        &self,
        body: &Value,
        owner: &str,
    ) -> Result<Vec<(String, u64)>, String> {
        let (nodes, blocks) = self.debug_match(body)?;
        match nodes
            .iter()
            .any(|(node, matched)| node == owner && *matched == blocks)
        {
            true => Ok(nodes),
            false => Err(format!(
                "{} sees {nodes:?} of {blocks} blocks, not all at {owner}",
                self.node_id()
            )),
        }
    }

    /// The node ids of the live peers listed by `/debug/cluster`, sorted.
    pub fn peer_ids(&self) -> Result<Vec<String>, String> {
        let cluster = self.debug_cluster()?;
        let peers = cluster["peers"]
            .as_array()
            .ok_or_else(|| format!("no peers array in {cluster}"))?;
        let mut ids = peers
            .iter()
            .map(|peer| {
                peer["node"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("peer without node: {peer}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        ids.sort();
        Ok(ids)
    }

    /// The ids of `GET /v1/models`, sorted.
    pub fn model_ids(&self) -> Result<Vec<String>, String> {
        let response = self
            .try_send(Request::get("/v1/models"))
            .map_err(|e| e.to_string())?;
        if response.status != 200 {
            return Err(response.describe());
        }
        let list: Value = serde_json::from_slice(&response.body)
            .map_err(|error| format!("{error}: {}", response.describe()))?;
        let data = list["data"]
            .as_array()
            .ok_or_else(|| format!("no data array in {list}"))?;
        let mut ids = data
            .iter()
            .map(|model| {
                model["id"]
                    .as_str()
                    .map(str::to_string)
                    .ok_or_else(|| format!("model without id: {model}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        ids.sort();
        Ok(ids)
    }

    /// The sum of this sidecar's metric `name` over samples with `labels`.
    pub fn metric(&self, name: &str, labels: &[(&str, &str)]) -> Result<Option<f64>, String> {
        let response = self
            .try_send(Request::get("/metrics"))
            .map_err(|e| e.to_string())?;
        if response.status != 200 {
            return Err(response.describe());
        }
        Ok(prometheus_text::sum(&response.text(), name, labels))
    }
}

/// `peer`'s entry in a `/debug/cluster` answer, if it lists it.
pub fn peer_entry<'a>(cluster: &'a Value, peer: &str) -> Option<&'a Value> {
    cluster["peers"]
        .as_array()?
        .iter()
        .find(|p| p["node"] == peer)
}

#[cfg(test)]
mod tests {
    use super::parse_ready_line;

    #[test]
    fn parses_the_readiness_line() {
        let line = "kvmesh listening on http://127.0.0.1:4100 mesh 127.0.0.1:4200 node a-1";
        let (http, mesh, node) = parse_ready_line(line).expect("a valid line");
        assert_eq!(http.to_string(), "127.0.0.1:4100");
        assert_eq!(mesh.to_string(), "127.0.0.1:4200");
        assert_eq!(node, "a-1");
        assert!(parse_ready_line("kvmesh listening on 127.0.0.1:4100").is_none());
    }
}
