//! The mesh across real processes: `kvmesh mesh-probe` nodes find each other, and a node
//! killed with SIGKILL (no goodbye of any kind) is detected dead by the others.

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, mpsc};
use std::time::{Duration, Instant};

use kvmesh_node::cert::{self, DEFAULT_CA_VALIDITY, DEFAULT_NODE_VALIDITY};
use serde_json::Value;

const BOUND: Duration = Duration::from_secs(30);
const DETECT_BOUND: Duration = Duration::from_secs(6);

/// A `kvmesh mesh-probe` process, killed on drop, with its stdout lines on a channel.
struct Probe {
    child: Child,
    lines: Mutex<mpsc::Receiver<Value>>,
    addr: String,
}

impl Drop for Probe {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Probe {
    fn start(tls_dir: &Path, node: &str, seeds: &[&str]) -> Probe {
        let mut command = Command::new(env!("CARGO_BIN_EXE_kvmesh"));
        command
            .args([
                "mesh-probe",
                "--node",
                node,
                "--mesh",
                "127.0.0.1:0",
                "--cluster-id",
                "t",
            ])
            .arg("--tls-dir")
            .arg(tls_dir)
            .args(["--set", &format!("role={node}")])
            .env("RUST_LOG", "warn")
            .stdout(Stdio::piped())
            .stderr(Stdio::null());
        if !seeds.is_empty() {
            command.args(["--seeds", &seeds.join(",")]);
        }
        let mut child = command.spawn().expect("spawn kvmesh mesh-probe");
        let stdout = child.stdout.take().expect("stdout");
        let (tx, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let Ok(line) = line else { return };
                let Ok(value) = serde_json::from_str::<Value>(&line) else {
                    continue;
                };
                if tx.send(value).is_err() {
                    return;
                }
            }
        });
        let mut probe = Probe {
            child,
            lines: Mutex::new(lines),
            addr: String::new(),
        };
        let started = probe
            .next_matching(BOUND, |line| line["event"] == "started")
            .expect("probe started");
        probe.addr = started["addr"].as_str().expect("addr").to_owned();
        probe
    }

    fn next_matching(&self, within: Duration, want: impl Fn(&Value) -> bool) -> Option<Value> {
        let deadline = Instant::now() + within;
        let lines = self.lines.lock().unwrap();
        loop {
            let left = deadline.checked_duration_since(Instant::now())?;
            match lines.recv_timeout(left) {
                Ok(line) if want(&line) => return Some(line),
                Ok(_) => continue,
                Err(_) => return None,
            }
        }
    }

    /// Waits for a membership line listing exactly `names`, each with its role key.
    fn wait_for_peers(&self, names: &[&str], within: Duration) -> Option<Value> {
        self.next_matching(within, |line| {
            let Some(peers) = line["peers"].as_array() else {
                return false;
            };
            let mut seen: Vec<&str> = peers.iter().filter_map(|p| p["name"].as_str()).collect();
            seen.sort();
            seen == names && peers.iter().all(|p| p["keys"]["role"] == p["name"])
        })
    }
}

#[test]
fn processes_converge_and_a_killed_process_is_detected_dead() {
    let dir = tempfile::tempdir().unwrap();
    cert::init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
    for node in ["p1", "p2", "p3"] {
        cert::issue_node_cert(dir.path(), node, dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap();
    }
    let p1 = Probe::start(dir.path(), "p1", &[]);
    let p2 = Probe::start(dir.path(), "p2", &[&p1.addr]);
    let mut p3 = Probe::start(dir.path(), "p3", &[&p1.addr]);
    assert!(
        p1.wait_for_peers(&["p2", "p3"], BOUND).is_some(),
        "p1 did not converge"
    );
    assert!(
        p2.wait_for_peers(&["p1", "p3"], BOUND).is_some(),
        "p2 did not converge"
    );
    assert!(
        p3.wait_for_peers(&["p1", "p2"], BOUND).is_some(),
        "p3 did not converge"
    );
    // A running cluster: the detector has seen some heartbeats.
    std::thread::sleep(Duration::from_secs(2));

    p3.child.kill().expect("SIGKILL p3");
    let killed_at = Instant::now();
    // Both survivors are watched at once, each timed from the kill.
    let (d1, d2) = std::thread::scope(|scope| {
        let w1 = scope.spawn(|| {
            p1.wait_for_peers(&["p2"], DETECT_BOUND)
                .map(|_| killed_at.elapsed())
        });
        let w2 = scope.spawn(|| {
            p2.wait_for_peers(&["p1"], DETECT_BOUND)
                .map(|_| killed_at.elapsed())
        });
        (w1.join().unwrap(), w2.join().unwrap())
    });
    eprintln!(
        "MEASURE kill9_detection_ms p1={:?} p2={:?}",
        d1.map(|d| d.as_millis()),
        d2.map(|d| d.as_millis()),
    );
    assert!(
        d1.is_some() && d2.is_some(),
        "killed node not detected within {DETECT_BOUND:?}"
    );
}
