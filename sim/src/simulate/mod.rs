//! `kvmesh-sim simulate`: a discrete-event simulator of a kvmesh cluster that runs the real
//! routing code at 1,000+ nodes.
//!
//! Each simulated node runs the engine model of [`crate::engine::model`] in virtual time, the
//! protocol's approximate `PrefixIndex` of its own engine and a `SummaryBuilder` over it, and
//! publishes a `LoadDigest`. What a node knows of its peers comes through [`gossip`]: digests
//! and summary shards with their real encoded sizes, delayed by a gossip propagation model
//! calibrated against the real mesh. Policies ([`policy`]) range from random to the oracle
//! (the real `decide` over an instant global view) and kvmesh itself (the real `decide` over
//! each entry node's stale view, with the sidecar's optimistic accounting).
//!
//! - [`workload`]: a workload's requests (`crate::workload`, shared with the load generator)
//!   with their arrival times; [`prompt`]: segments → token ids → prefix chain.
//! - [`cluster`]: the event loop of one run; [`results`]: what it measures.
//! - [`run`]: every policy over the same requests, at one or several cluster sizes;
//!   [`report`] and [`svg`]: the markdown table and the plots.

pub mod args;
pub mod cluster;
pub mod gossip;
pub mod histogram;
pub mod node;
pub mod pd;
pub mod policy;
pub mod prompt;
pub mod report;
pub mod results;
pub mod run;
pub mod svg;
pub mod workload;

pub use args::SimulateArgs;
pub use policy::PolicyKind;
pub use results::PolicyResult;
pub use run::{Report, SimulateError, simulate};
