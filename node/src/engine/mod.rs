//! The local engine adapter: an HTTP client to the vLLM server beside this sidecar, and the
//! poller that turns its `/metrics`, `/health` and `/v1/models` into this node's load digest.

pub mod client;
pub mod metrics;
pub mod poller;
pub mod tokenize;

pub use client::{EngineClient, EngineError};
pub use poller::{EngineState, LocalEngine};
