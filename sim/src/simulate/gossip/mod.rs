//! The gossip model: how stale each node's view of its peers is, and what it costs.
//!
//! - [`epidemic`]: the distribution of the delay with which an update reaches other nodes,
//!   from a simulated push-pull epidemic (interval, fanout, loss, per-hop delay).
//! - [`view`]: what every node sees of every peer, modelled in aggregate: each publisher keeps
//!   its recent digests and a few *lagged replicas* of its summary, one per lag class; a viewer
//!   reads the replica of its class. Delivering an update to 1,000 viewers is then a handful of
//!   replica updates, not 1,000 events.

pub mod epidemic;
pub mod view;

/// Per-hop delay (one-way, processing included) that makes [`epidemic::cold_convergence_s`]
/// match the real mesh's measured convergence (3 nodes: 0.41-0.44 s; 8 nodes: 0.82 s; 200 ms
/// interval, fanout 3; node/MESH-NOTES.md). It is large for loopback because the measurement
/// ran a debug build of 3-8 nodes in one process on a loaded 2-core machine, with QUIC
/// streams and the loopback relay per message; see `docs/scaling.md`.
pub const CALIBRATED_HOP_S: f64 = 0.085;

/// Bytes of one entry of a Scuttlebutt digest (node id, generation, heartbeat, versions): each
/// round a node sends one per known node, whatever changed. This is the part of gossip that
/// grows with N even when nothing changes.
pub const MEMBERSHIP_ENTRY_BYTES: f64 = 48.0;

/// Start-to-start delay between consecutive nodes in the real mesh's convergence test, fitted
/// together with [`CALIBRATED_HOP_S`]; used only to reproduce that test, not in the model.
pub const CALIBRATION_STAGGER_S: f64 = 0.02;
