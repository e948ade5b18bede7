//! Exact mode: an engine's prefix cache as its vLLM KV events describe it.
//!
//! - [`decode`]: one ZMQ payload (msgpack, both of vLLM's event shapes) into typed events;
//! - [`sequence`]: batch sequence numbers into "apply", "replay the gap" or "start over";
//! - [`cache`]: events into the set of mesh chain hashes the engine holds, per tier.
//!
//! The subscriber that owns the sockets lives in the node; everything here is pure so the
//! simulator and tests run the same code.

pub mod cache;
pub mod decode;
pub mod sequence;

pub use cache::{EventChanges, ExactCache, SkipReason, Tier, TierChanges};
pub use decode::{BlockExtraKeys, DecodeError, EventBatch, KvEvent, Medium, decode_batch};
pub use sequence::{SeqTracker, SeqVerdict};
