//! The sans-IO heart of kvmesh: everything every node (and the simulator) must compute
//! identically.
//!
//! - [`hashing`]: a request is reduced to a chain of 64-bit block hashes, where each hash names
//!   the whole prefix up to and including its block.
//! - [`digest`]: the compact load report each node gossips about its engine; [`cadence`]: how
//!   often it is refreshed and gossiped.
//! - [`gossip_keys`]: the key each published fact goes under, and how binary values are
//!   written as gossip values.
//! - [`engine_metrics`]: what kvmesh reads of vLLM's `/metrics`, in the text format
//!   [`prometheus_text`] reads.
//! - [`index`]: the approximate LRU index of a node's own engine cache.
//! - [`kv_events`]: the exact state of an engine's cache, from vLLM's KV events.
//! - [`summary`]: a bounded-size, sharded encoding of the set of chain hashes an engine holds.
//! - [`wire`]: the framed, validated messages sidecars exchange when forwarding a request.
//! - [`route`]: the routing decision, a pure function of a view of the cluster and `now`.
//! - [`intent`]: `model: "auto"` resolved to a real model by rules and by similarity to
//!   example prompts.
//! - [`lifecycle`]: a request's attempts around that decision: the entry ranks and attempts,
//!   the serving node admits or declines, and every answer carries the engine's load back.
//! - [`mix`]: the one 64-bit integer mixer, shared with the simulator; [`quantile`]: the one
//!   percentile definition.
//!
//! Nothing here does IO or reads a clock: time is always an argument, so the cluster simulator
//! runs exactly the code the sidecar runs.

pub mod block_map;
pub mod cadence;
pub mod codec;
pub mod digest;
pub mod engine_metrics;
pub mod gossip_keys;
pub mod hashing;
pub mod index;
pub mod intent;
pub mod kv_events;
pub mod lifecycle;
pub mod mix;
pub mod prometheus_text;
pub mod quantile;
pub mod route;
pub mod summary;
pub mod wire;

pub use digest::{EngineFacts, LoadDigest, LoraReadiness, LoraUse, Role, UnknownRole};
pub use hashing::{BlockHash, HashConfig, HashMode, RequestHashes};
pub use mix::mix64;
pub use route::{Candidate, Decision, RouteConfig, RouteReason, RouteRequest, decide};
pub use summary::{PeerSummary, SummaryBuilder, SummaryConfig};
