//! Shared fixtures of the mesh tests: a cluster CA in a tempdir, nodes on 127.0.0.1
//! ephemeral ports, bounded waits.

#![allow(dead_code)] // each test binary uses a different subset

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvmesh_node::cert::{self, DEFAULT_CA_VALIDITY, DEFAULT_NODE_VALIDITY};
use kvmesh_node::mesh::{Membership, Mesh, MeshConfig};
use kvmesh_node::tls::NodeIdentity;
use tempfile::TempDir;

/// A cluster CA and the node certificates issued by it.
pub struct TestCa {
    dir: TempDir,
}

impl TestCa {
    pub fn new() -> Self {
        let dir = tempfile::tempdir().expect("tempdir");
        cert::init_ca(dir.path(), "test", DEFAULT_CA_VALIDITY).expect("init CA");
        Self { dir }
    }

    /// Issues (once) and loads the identity of node `name`.
    pub fn identity(&self, name: &str) -> NodeIdentity {
        if !cert::node_cert_path(self.dir.path(), name).exists() {
            cert::issue_node_cert(
                self.dir.path(),
                name,
                self.dir.path(),
                &[],
                DEFAULT_NODE_VALIDITY,
            )
            .expect("issue node certificate");
        }
        NodeIdentity::load(self.dir.path(), name).expect("load identity")
    }
}

pub fn config(seeds: &[SocketAddr]) -> MeshConfig {
    MeshConfig::new(
        "127.0.0.1:0".parse().unwrap(),
        "test-cluster",
        seeds.iter().map(ToString::to_string).collect(),
    )
}

pub async fn start(ca: &TestCa, name: &str, seeds: &[SocketAddr]) -> Mesh {
    Mesh::start(config(seeds), ca.identity(name))
        .await
        .expect("start mesh node")
}

/// Waits until `node` sees exactly the peers `names` (and, for each, its `role` key equal to
/// its name when `with_roles`). Returns the time it took, or panics after `within`.
pub async fn wait_for_peers(
    node: &Mesh,
    names: &[&str],
    with_roles: bool,
    within: Duration,
) -> Duration {
    let start = Instant::now();
    let mut expected: Vec<&str> = names.to_vec();
    expected.sort();
    let done = node
        .gossip()
        .wait_for(within, |view: &Membership| {
            view.names().collect::<Vec<_>>() == expected
                && (!with_roles
                    || view
                        .peers
                        .iter()
                        .all(|peer| peer.key_values.get("role") == Some(&peer.name)))
        })
        .await;
    match done {
        Some(_) => start.elapsed(),
        None => panic!(
            "{} did not see exactly {:?} within {:?}; it sees {:?}",
            node.node_name(),
            expected,
            within,
            node.gossip().membership().names().collect::<Vec<_>>()
        ),
    }
}
