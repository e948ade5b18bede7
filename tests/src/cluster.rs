//! A cluster on loopback: one mock engine and one sidecar per node, all sharing one CA, each
//! sidecar seeded with the mesh addresses of the nodes started before it.

use std::net::SocketAddr;
use std::time::Duration;

use crate::certs::ClusterCa;
use crate::engine::{Engine, EngineConfig, Timing};
use crate::sidecar::{Sidecar, SidecarConfig};
use crate::wait::wait_for;

/// Bound on membership and model lists converging after nodes start or stop. Generous: the
/// target is about 2 s, but CI machines are small and shared.
pub const CONVERGENCE_TIMEOUT: Duration = Duration::from_secs(30);

/// What one node runs.
#[derive(Debug, Clone)]
pub struct NodeSpec {
    pub name: String,
    pub models: Vec<String>,
    pub timing: Timing,
    /// Extra flags of its engine and of its sidecar.
    pub engine_args: Vec<String>,
    pub sidecar_args: Vec<String>,
    /// Exact mode: the engine publishes KV events and the sidecar subscribes to them.
    pub kv_events: bool,
}

impl NodeSpec {
    /// Node `name` whose instant engine serves `models`.
    pub fn new(name: &str, models: &[&str]) -> Self {
        NodeSpec {
            name: name.to_string(),
            models: models.iter().map(|model| model.to_string()).collect(),
            timing: Timing::Instant,
            engine_args: Vec::new(),
            sidecar_args: Vec::new(),
            kv_events: false,
        }
    }

    /// Exact mode: its engine publishes KV events in vLLM's `format` (`array` or `map`) on
    /// ephemeral ports, and its sidecar subscribes to them.
    pub fn kv_events(mut self, format: &str) -> Self {
        self.kv_events = true;
        self.engine_args(&[
            "--kv-events",
            "tcp://*:0",
            "--kv-events-replay",
            "tcp://127.0.0.1:0",
            "--kv-events-format",
            format,
        ])
    }

    /// Adds flags to its engine's command line.
    pub fn engine_args(mut self, args: &[&str]) -> Self {
        self.engine_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    /// Adds flags to its sidecar's command line.
    pub fn sidecar_args(mut self, args: &[&str]) -> Self {
        self.sidecar_args.extend(args.iter().map(|a| a.to_string()));
        self
    }

    pub fn timing(mut self, timing: Timing) -> Self {
        self.timing = timing;
        self
    }

    /// Starts its engine alone; [`Cluster::join_running`] puts a sidecar in front of it later
    /// (a test that needs the engine to work before its sidecar exists).
    pub fn start_engine(&self) -> Engine {
        let models: Vec<&str> = self.models.iter().map(String::as_str).collect();
        let mut config =
            EngineConfig::new(&format!("engine {}", self.name), &models).timing(self.timing);
        for arg in &self.engine_args {
            config = config.arg(arg);
        }
        config.start()
    }
}

/// An engine and the sidecar in front of it.
pub struct Node {
    pub engine: Engine,
    pub sidecar: Sidecar,
}

impl Node {
    pub fn name(&self) -> &str {
        self.sidecar.node_id()
    }
}

/// Nodes started in order; all processes are killed when the cluster is dropped.
pub struct Cluster {
    // Dropped after the nodes: the certificate files outlive the processes using them.
    nodes: Vec<Node>,
    ca: ClusterCa,
}

impl Cluster {
    /// A new CA and no node yet.
    pub fn empty() -> Self {
        Cluster {
            nodes: Vec::new(),
            ca: ClusterCa::init("kvmesh-e2e"),
        }
    }

    /// A new CA and one node per spec, started one after another.
    pub fn start(specs: &[NodeSpec]) -> Self {
        let mut cluster = Cluster::empty();
        for spec in specs {
            cluster.join(spec);
        }
        cluster
    }

    /// [`Self::start`], then [`Self::wait_converged`].
    pub fn start_converged(specs: &[NodeSpec]) -> Self {
        let cluster = Cluster::start(specs);
        cluster.wait_converged();
        cluster
    }

    /// Waits until every node of the cluster (all running) lists exactly the others as live
    /// peers, within [`CONVERGENCE_TIMEOUT`]; returns how long that took.
    pub fn wait_converged(&self) -> Duration {
        let names: Vec<&str> = self.nodes.iter().map(Node::name).collect();
        self.wait_membership(&names, CONVERGENCE_TIMEOUT)
    }

    /// Starts a node seeded with every sidecar started so far that is still running.
    pub fn join(&mut self, spec: &NodeSpec) -> &mut Node {
        self.join_with(spec, |config| config)
    }

    /// Like [`Self::join`], with a chance to adjust the sidecar's configuration.
    pub fn join_with(
        &mut self,
        spec: &NodeSpec,
        adjust: impl FnOnce(SidecarConfig) -> SidecarConfig,
    ) -> &mut Node {
        let engine = spec.start_engine();
        self.join_running_with(spec, engine, adjust)
    }

    /// Like [`Self::join`], in front of `engine`, already started by
    /// [`NodeSpec::start_engine`].
    pub fn join_running(&mut self, spec: &NodeSpec, engine: Engine) -> &mut Node {
        self.join_running_with(spec, engine, |config| config)
    }

    fn join_running_with(
        &mut self,
        spec: &NodeSpec,
        engine: Engine,
        adjust: impl FnOnce(SidecarConfig) -> SidecarConfig,
    ) -> &mut Node {
        let seeds = self.live_mesh_addrs();
        let mut config = SidecarConfig::new(&spec.name, &engine.url(), &self.ca).seeds(&seeds);
        for arg in &spec.sidecar_args {
            config = config.arg(arg);
        }
        if spec.kv_events {
            config = config
                .arg("--kv-events")
                .arg(&engine.printed_endpoint("kv events on "))
                .arg("--kv-events-replay")
                .arg(&engine.printed_endpoint("kv events replay on "));
        }
        let sidecar = adjust(config).start();
        self.nodes.push(Node { engine, sidecar });
        self.nodes.last_mut().expect("just pushed")
    }

    pub fn ca(&self) -> &ClusterCa {
        &self.ca
    }

    pub fn nodes(&self) -> &[Node] {
        &self.nodes
    }

    pub fn node(&self, name: &str) -> &Node {
        self.nodes
            .iter()
            .find(|node| node.name() == name)
            .unwrap_or_else(|| panic!("no node {name} in the cluster"))
    }

    pub fn node_mut(&mut self, name: &str) -> &mut Node {
        self.nodes
            .iter_mut()
            .find(|node| node.name() == name)
            .unwrap_or_else(|| panic!("no node {name} in the cluster"))
    }

    pub fn sidecar(&self, name: &str) -> &Sidecar {
        &self.node(name).sidecar
    }

    /// The mesh addresses of the sidecars still running.
    pub fn live_mesh_addrs(&mut self) -> Vec<SocketAddr> {
        self.nodes
            .iter_mut()
            .filter_map(|node| {
                node.sidecar
                    .process()
                    .is_running()
                    .then(|| node.sidecar.mesh_addr())
            })
            .collect()
    }

    /// Waits until each of `members` lists exactly the other members as live peers in
    /// `/debug/cluster`; returns how long that took.
    pub fn wait_membership(&self, members: &[&str], timeout: Duration) -> Duration {
        let sidecars: Vec<&Sidecar> = members.iter().map(|name| self.sidecar(name)).collect();
        wait_meshed(&sidecars, timeout)
    }

    /// Waits until `/v1/models` of each of `entries` lists exactly `models`.
    pub fn wait_models(&self, entries: &[&str], models: &[&str], timeout: Duration) -> Duration {
        let mut expected: Vec<String> = models.iter().map(|model| model.to_string()).collect();
        expected.sort();
        let what = format!("/v1/models of {entries:?} lists {expected:?}");
        wait_for(timeout, &what, || {
            for entry in entries {
                let listed = self.sidecar(entry).model_ids()?;
                if listed != expected {
                    return Err(format!("{entry} lists {listed:?}"));
                }
            }
            Ok(())
        })
        .1
    }
}

/// Waits until each of `sidecars` lists exactly the others as live peers in `/debug/cluster`;
/// returns how long that took. For sidecars in front of engines other than the mock's (see
/// [`crate::vllm`]), which a [`Cluster`] does not hold.
pub fn wait_meshed(sidecars: &[&Sidecar], timeout: Duration) -> Duration {
    let members: Vec<&str> = sidecars.iter().map(|sidecar| sidecar.node_id()).collect();
    let what = format!("the membership converges to {members:?}");
    wait_for(timeout, &what, || {
        for sidecar in sidecars {
            let member = sidecar.node_id();
            let mut expected: Vec<String> = members
                .iter()
                .filter(|other| **other != member)
                .map(|other| other.to_string())
                .collect();
            expected.sort();
            let peers = sidecar.peer_ids()?;
            if peers != expected {
                return Err(format!("{member} lists {peers:?}, expected {expected:?}"));
            }
        }
        Ok(())
    })
    .1
}
