//! `kvmesh-sim load`: the load generator.
//!
//! [`render`] turns a workload's requests (`crate::workload`) into HTTP requests, [`runner`]
//! releases them (Poisson, trace timestamps or a
//! closed loop) through [`client`], which measures TTFT, inter-token latency and end-to-end
//! latency from the byte stream ([`sse`]); [`scrape`] reads engine counters before and after;
//! [`report`] turns it all into a table and a JSON document; [`records_file`] keeps every
//! request's own line; [`placement`] is the offline placement a router is held against.

pub mod client;
pub mod config;
pub mod placement;
pub mod records_file;
pub mod render;
pub mod report;
pub mod runner;
pub mod scrape;
pub mod sse;
pub mod stats;
