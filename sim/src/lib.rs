//! kvmesh-sim: a vLLM-compatible mock engine, a load generator and a cluster simulator.
//!
//! - [`workload`] defines what each request of a run asks for, at the token level, once for
//!   the load generator and the simulator.
//! - [`engine::model`] is the sans-IO engine model (tokenizer, prefix cache, scheduler,
//!   timing), reusable with virtual time.
//! - [`engine`] also holds the HTTP server and the KV-event publisher around it.
//! - [`load`] is the load generator.
//! - [`simulate`] is the discrete-event cluster simulator (`kvmesh-sim simulate`).
//! - [`report`] samples engines during a run and renders the demo's report.
//! - [`quantile`] (protocol's, re-exported) is the one percentile definition of both, and
//!   [`chart`] draws the report's and the simulator's charts.

pub mod chart;
pub mod engine;
pub mod load;
pub mod report;
pub mod rng;
pub mod simulate;
pub mod text;
pub mod workload;

pub use kvmesh_protocol::quantile;
