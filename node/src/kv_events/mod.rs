//! Exact mode's IO: subscribing to the local vLLM's KV-event publisher over ZMQ.
//!
//! Each batch is judged by its sequence number (`protocol::kv_events::SeqTracker`); a gap is
//! filled from the replay socket when one is configured; events become mesh chain hashes per
//! tier (`protocol::kv_events::ExactCache`) and the GPU tier feeds this node's summary
//! ([`crate::prefix::LocalPrefixes`]), which the publish loop gossips as usual.

mod replay;
mod subscriber;

pub use subscriber::spawn;
