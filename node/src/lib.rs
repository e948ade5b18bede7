//! The kvmesh sidecar as a library; `main.rs` is a thin command line over it.
//!
//! Mesh layer:
//! - [`cert`]: the cluster CA and node certificates (`kvmesh cert`).
//! - [`tls`]: mutual-TLS configurations against the cluster CA, peer identification.
//! - [`mesh`]: the QUIC endpoint shared by gossip and forwarding, and gossip itself.

pub mod cert;
pub mod mesh;
pub mod tls;
