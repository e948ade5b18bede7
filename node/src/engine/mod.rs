//! The local engine adapter: an HTTP client to the vLLM server beside this sidecar, and the
//! poller that turns its `/metrics`, `/health` and `/v1/models` into this node's load digest.
//! Exact mode's token ids come from its `/tokenize` ([`tokenize`]) or, for completions, from
//! the model's `tokenizer.json` loaded here ([`local_tokenizer`], the `tokenizer` feature).
//! LoRA adapters the mesh placed here are loaded into it before their requests ([`adapters`]).
//! Intent routing's static embedding model loads here too ([`static_embedding`], same feature).

pub mod adapters;
pub mod client;
pub mod local_tokenizer;
pub mod models;
pub mod poller;
pub mod progress;
pub mod static_embedding;
pub mod tokenize;

pub use client::{EngineClient, EngineError};
pub use poller::{EngineState, LocalEngine};
pub use progress::Progress;
