//! Cluster certificates made with the real `kvmesh cert` commands, in a temporary directory.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::binaries::KVMESH;
use crate::process::run_to_completion;

const CERT_COMMAND_TIMEOUT: Duration = Duration::from_secs(30);

/// A cluster CA (`kvmesh cert init`) and the node directories issued from it.
pub struct ClusterCa {
    root: tempfile::TempDir,
    cluster_id: String,
}

impl ClusterCa {
    /// Creates a new CA for `cluster_id`.
    pub fn init(cluster_id: &str) -> Self {
        let root = tempfile::Builder::new()
            .prefix("kvmesh-e2e-certs-")
            .tempdir()
            .unwrap_or_else(|error| panic!("cannot create a temporary directory: {error}"));
        let ca = ClusterCa {
            root,
            cluster_id: cluster_id.to_string(),
        };
        let mut command = Command::new(KVMESH.path());
        command
            .args(["cert", "init", "--cluster-id", cluster_id, "--dir"])
            .arg(ca.ca_dir());
        check(command, "kvmesh cert init");
        for file in ["ca.pem", "ca.key"] {
            assert!(
                ca.ca_dir().join(file).is_file(),
                "kvmesh cert init did not write {file}"
            );
        }
        ca
    }

    pub fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    /// The directory holding `ca.pem` and `ca.key`.
    pub fn ca_dir(&self) -> PathBuf {
        self.root.path().join("ca")
    }

    /// Issues a certificate for `node` into a directory of its own that holds what a sidecar
    /// gets in production: `ca.pem`, `NODE.pem` and `NODE.key`, but not the CA's key.
    pub fn issue(&self, node: &str) -> PathBuf {
        self.issue_with(node, &[])
    }

    /// The directory [`Self::issue`] writes node `node`'s files into.
    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.root.path().join(format!("node-{node}"))
    }

    /// Like [`Self::issue`], with more `kvmesh cert issue` flags (e.g. `--hours 1`).
    pub fn issue_with(&self, node: &str, flags: &[&str]) -> PathBuf {
        let node_dir = self.node_dir(node);
        let mut command = Command::new(KVMESH.path());
        command
            .args(["cert", "issue", "--node", node, "--dir"])
            .arg(self.ca_dir())
            .arg("--out")
            .arg(&node_dir)
            .args(flags);
        check(command, "kvmesh cert issue");
        for file in [format!("{node}.pem"), format!("{node}.key")] {
            assert!(
                node_dir.join(&file).is_file(),
                "kvmesh cert issue did not write {file}"
            );
        }
        copy(&self.ca_dir().join("ca.pem"), &node_dir.join("ca.pem"));
        node_dir
    }
}

/// Runs `kvmesh cert ARGS` (e.g. `revoke`, `crl`, `trust`), which must succeed; returns what
/// it printed.
pub fn kvmesh_cert(args: &[&std::ffi::OsStr]) -> String {
    let mut command = Command::new(KVMESH.path());
    command.arg("cert").args(args);
    check(command, "kvmesh cert")
}

fn check(command: Command, what: &str) -> String {
    let finished = run_to_completion(command, CERT_COMMAND_TIMEOUT);
    assert!(
        finished.status.success(),
        "{what} failed ({}):\nstdout: {}\nstderr: {}",
        finished.status,
        finished.stdout,
        finished.stderr
    );
    finished.stdout
}

fn copy(from: &Path, to: &Path) {
    std::fs::copy(from, to).unwrap_or_else(|error| {
        panic!(
            "cannot copy {} to {}: {error}",
            from.display(),
            to.display()
        )
    });
}
