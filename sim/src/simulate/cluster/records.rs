//! One line per simulated request, in the shape of the load generator's `--records` lines
//! (`crate::load::records_file`), so that a simulated run can be compared with a measured one
//! request by request: both send request `index` through the same entry node.

use serde::Serialize;

/// What one request of a run did.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct RequestRecord {
    /// The request's index in the workload.
    pub index: u64,
    /// Arrival after the run's start, seconds.
    pub sent_at_s: f64,
    /// The node it entered at (`node-1` … as the demo names its sidecars).
    pub entry: String,
    /// The node whose engine served it (a split request's decode engine); none if it was not
    /// served.
    pub node: Option<String>,
    /// Why it went where it was served, as the node's `x-kvmesh-reason` says (the policies
    /// that call `decide`): `decide`'s reason, or `declined` when an earlier attempt was
    /// declined.
    pub reason: Option<&'static str>,
    /// Time to first token, seconds (none if it was not served).
    pub ttft_s: Option<f64>,
    /// End-to-end latency, seconds.
    pub e2e_s: Option<f64>,
    pub output_tokens: u32,
}

/// The name of node `i` (0-based): `node-{i + 1}`, as the demo's sidecars are named.
pub fn node_name(i: u32) -> String {
    format!("node-{}", i + 1)
}
