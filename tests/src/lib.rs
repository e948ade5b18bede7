//! Helpers for the end-to-end tests: starting `kvmesh` and `kvmesh-sim` processes on ephemeral
//! loopback ports, bounded waits, and cleanup that leaves no process behind.
//!
//! - [`binaries`]: where the executables are.
//! - [`process`]: a child process killed on drop, with its output drained and kept.
//! - [`certs`]: a cluster CA and node certificates from `kvmesh cert`.
//! - [`engine`], [`sidecar`], [`cluster`]: the mock engine, `kvmesh serve`, and both together.
//! - [`http`], [`sse`], [`openai`]: talking to them and checking the answers (`/metrics` with
//!   `kvmesh_protocol::prometheus_text`).
//! - [`load`]: the real load generator and its JSON report.
//! - [`traffic`]: inference calls through a sidecar, checked, with who served them.
//! - [`ports`]: loopback ports for processes told which to bind.
//! - [`slow_pair`]: two nodes with slow prefills and a queue at one (late binding, declines).
//! - [`wait`]: polling with a bound instead of sleeping; [`stage`]: named steps of one long test.
//! - [`nixl`]: the mock engine's NixlConnector driven leg by leg, as a PD proxy does.
//! - [`netfault`]: partitions and datagram loss between sidecars, with nftables.
//! - [`tools`]: external tools (kubectl, promtool) and when a test may skip for lack of one.
//! - [`vllm`]: real vLLM servers (its CPU build, installed by `scripts/lib/vllm.sh`) in place of
//!   the mock engine.

pub mod binaries;
pub mod certs;
pub mod cluster;
pub mod engine;
pub mod http;
pub mod load;
pub mod netfault;
pub mod nixl;
pub mod openai;
pub mod ports;
pub mod process;
pub mod sidecar;
pub mod slow_pair;
pub mod sse;
pub mod stage;
pub mod tools;
pub mod traffic;
pub mod udp_delay;
pub mod vllm;
pub mod wait;

pub use cluster::{CONVERGENCE_TIMEOUT, Cluster, Node, NodeSpec};
pub use engine::{Engine, EngineConfig, Timing};
pub use http::{Request, Response};
pub use sidecar::{Sidecar, SidecarConfig};
pub use sse::{SseEvent, SseReader, SseTranscript};
pub use stage::stage;
pub use traffic::{Call, Served, call, every_call_served_by, try_call};
pub use vllm::{VllmConfig, VllmServer};
pub use wait::{holds_during, wait_for, wait_until};
