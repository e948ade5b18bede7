//! Shared helpers: start `kvmesh-sim engine` as a child process on ephemeral ports; run the
//! simulator ([`simulate`]).
#![allow(dead_code)]

pub mod simulate;

use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// A running engine process, killed on drop.
pub struct EngineProc {
    child: Child,
    /// `http://127.0.0.1:PORT`.
    pub url: String,
    /// KV-event PUB endpoint, when enabled.
    pub kv_events: Option<String>,
    /// KV-event replay endpoint, when enabled.
    pub kv_replay: Option<String>,
}

impl EngineProc {
    /// Starts `kvmesh-sim engine --port 0 <args>` and waits (bounded) for its addresses.
    pub fn start(args: &[&str]) -> Self {
        let mut child = Command::new(env!("CARGO_BIN_EXE_kvmesh-sim"))
            .arg("engine")
            .args(["--port", "0"])
            .args(args)
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .spawn()
            .expect("spawn kvmesh-sim engine");
        let stdout = child.stdout.take().expect("piped stdout");
        let (tx, rx) = mpsc::channel();
        std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines().map_while(Result::ok) {
                if tx.send(line).is_err() {
                    break;
                }
            }
        });
        let mut proc = EngineProc {
            child,
            url: String::new(),
            kv_events: None,
            kv_replay: None,
        };
        let wants_events = args.contains(&"--kv-events");
        let wants_replay = args.contains(&"--kv-events-replay");
        while proc.url.is_empty()
            || (wants_events && proc.kv_events.is_none())
            || (wants_replay && proc.kv_replay.is_none())
        {
            let line = rx
                .recv_timeout(Duration::from_secs(30))
                .expect("engine did not print its address within 30 s");
            if let Some(rest) = line.strip_prefix("kvmesh-sim engine listening on ") {
                proc.url = rest.trim().to_owned();
            } else if let Some(rest) = line.strip_prefix("kv events replay on ") {
                proc.kv_replay = Some(rest.trim().to_owned());
            } else if let Some(rest) = line.strip_prefix("kv events on ") {
                proc.kv_events = Some(rest.trim().to_owned());
            }
        }
        proc
    }
}

impl Drop for EngineProc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Bounded wait for a future.
pub async fn within<F: std::future::Future>(secs: u64, f: F) -> F::Output {
    tokio::time::timeout(Duration::from_secs(secs), f)
        .await
        .expect("timed out")
}

/// Reads one counter or gauge (summed over series) from `/metrics`.
pub async fn metric(client: &kvmesh_sim::load::client::LoadClient, url: &str, name: &str) -> f64 {
    let (_, text) = within(10, client.get_text(&format!("{url}/metrics")))
        .await
        .expect("scrape");
    text.lines()
        .filter(|l| !l.starts_with('#'))
        .filter(|l| l.split(['{', ' ']).next() == Some(name))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}
