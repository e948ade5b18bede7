//! Network faults between sidecars on loopback, with nftables: partitions and datagram loss
//! on the real QUIC mesh, without touching the processes.
//!
//! Each sidecar's mesh is one UDP socket (server and client on the same port), so a rule on
//! source and destination ports cuts or thins the traffic between two sets of nodes and
//! nothing else on the machine. Every [`LoopbackFaults`] owns an nftables table named after
//! the test process and is deleted on drop; tables left by a test process that was killed
//! are removed by the next one. Needs root and `nft` (`scripts/test.sh` installs nftables);
//! where they are missing the tests skip through [`crate::tools::skipped_for_lack_of`].

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::{AtomicU32, Ordering};

/// The name under which `scripts/test.sh` reports a missing `nft` (or no root).
pub const TOOL: &str = "nft";

const TABLE_PREFIX: &str = "kvmesh_test_";
const CHAIN: &str = "in";

/// Rules dropping traffic between sidecars' mesh ports, for as long as this lives.
pub struct LoopbackFaults {
    table: String,
}

impl LoopbackFaults {
    /// A table with an empty output chain (nothing dropped yet). Panics with a hint when
    /// nftables cannot be used here.
    pub fn new() -> Self {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        remove_orphans();
        let table = format!(
            "{TABLE_PREFIX}{}_{}",
            std::process::id(),
            NEXT.fetch_add(1, Ordering::Relaxed)
        );
        nft(&["add", "table", "inet", &table]);
        // Loopback datagrams pass the input hook once, on their way in: one chain sees all, and
        // the sender is not told (a drop on output fails its sendmsg with EPERM instead).
        nft(&[
            "add",
            "chain",
            "inet",
            &table,
            CHAIN,
            "{ type filter hook input priority 0; policy accept; }",
        ]);
        LoopbackFaults { table }
    }

    /// Drops every datagram between a node of `side_a` and a node of `side_b`, both ways.
    pub fn partition(&self, side_a: &[SocketAddr], side_b: &[SocketAddr]) {
        for (from, to) in [(side_a, side_b), (side_b, side_a)] {
            self.rule(&format!(
                "udp sport {} udp dport {} drop",
                ports(from),
                ports(to)
            ));
        }
    }

    /// Drops `percent`% of the datagrams between any two of `nodes`, at random.
    pub fn lose(&self, nodes: &[SocketAddr], percent: u32) {
        let set = ports(nodes);
        self.rule(&format!(
            "udp sport {set} udp dport {set} numgen random mod 100 < {percent} drop"
        ));
    }

    /// Removes every fault: the network is whole again.
    pub fn heal(&self) {
        nft(&["flush", "chain", "inet", &self.table, CHAIN]);
    }

    /// Datagrams the rules dropped so far (so a test can tell that its fault was applied).
    pub fn dropped(&self) -> u64 {
        let listing = nft(&["list", "chain", "inet", &self.table, CHAIN]);
        listing
            .lines()
            .filter_map(|line| {
                let rest = &line[line.find("counter packets ")? + "counter packets ".len()..];
                rest.split_whitespace().next()?.parse::<u64>().ok()
            })
            .sum()
    }

    fn rule(&self, rule: &str) {
        // `counter` before the verdict, so that `dropped` can read what the rule did.
        let rule = rule.replace(" drop", " counter drop");
        let mut args = vec!["add", "rule", "inet", &self.table, CHAIN];
        args.extend(rule.split_whitespace());
        nft(&args);
    }
}

impl Default for LoopbackFaults {
    fn default() -> Self {
        Self::new()
    }
}

impl Drop for LoopbackFaults {
    fn drop(&mut self) {
        let _ = Command::new("nft")
            .args(["delete", "table", "inet", &self.table])
            .status();
    }
}

/// Whether nftables can be used here: `nft` is installed and may change the ruleset.
pub fn available() -> bool {
    Command::new("nft")
        .args(["list", "tables"])
        .output()
        .is_ok_and(|out| out.status.success())
}

/// `{ p1, p2, … }`: the mesh ports of `nodes`, as an nftables anonymous set.
fn ports(nodes: &[SocketAddr]) -> String {
    let list: Vec<String> = nodes.iter().map(|addr| addr.port().to_string()).collect();
    format!("{{ {} }}", list.join(", "))
}

/// Runs `nft ARGS`; its standard output. Panics with nft's message on failure.
fn nft(args: &[&str]) -> String {
    let out = Command::new("nft").args(args).output().unwrap_or_else(|err| {
        panic!("cannot run nft ({err}): install nftables and run as root, or list `{TOOL}` in KVMESH_TESTS_SKIP_TOOLS")
    });
    assert!(
        out.status.success(),
        "nft {}: {}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// Deletes the tables of test processes that no longer run (killed before their drop).
fn remove_orphans() {
    let listing = nft(&["list", "tables"]);
    for table in listing
        .lines()
        .filter_map(|line| line.strip_prefix("table inet "))
    {
        let Some(pid) = table
            .strip_prefix(TABLE_PREFIX)
            .and_then(|rest| rest.split('_').next())
        else {
            continue;
        };
        if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            let _ = Command::new("nft")
                .args(["delete", "table", "inet", table])
                .status();
        }
    }
}
