//! The kvmesh sidecar as a library; `main.rs` is a thin command line over it.
//!
//! Mesh layer:
//! - [`cert`]: the cluster CA and node certificates (`kvmesh cert`).
//! - [`tls`]: mutual-TLS configurations against the cluster CA, peer identification.
//! - [`mesh`]: the QUIC endpoint shared by gossip and forwarding, and gossip itself.
//!
//! Serving layer:
//! - [`engine`]: the local engine adapter (HTTP client, `/metrics` poller).
//! - [`view`]: every live peer's decoded digest, rebuilt when gossip changes.
//! - [`front`]: the client-facing HTTP server and the inference request path.
//! - [`forward`]: attempts, retries and relays; serving what peers forward.
//! - [`prefix`]: this node's own engine cache index and the summary it gossips.
//! - [`kv_events`]: exact mode, the local engine's KV events over ZMQ.
//! - [`metrics`]: the sidecar's Prometheus metrics.
//! - [`serve`]: configuration and assembly of `kvmesh serve`.
//!
//! Operators:
//! - [`status`]: `kvmesh status`'s rows and table, from a sidecar's `/debug/cluster`.

pub mod cert;
pub mod engine;
pub mod forward;
pub mod front;
pub mod kv_events;
pub mod mesh;
pub mod metrics;
pub mod prefix;
pub mod serve;
pub mod status;
pub mod tls;
pub mod view;
