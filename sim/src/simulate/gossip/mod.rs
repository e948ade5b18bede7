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

/// One-way delay of a gossip message, processing included, in the model of how values
/// spread ([`epidemic::DelayDistribution`]). The real mesh's peers see a new prefix a median
/// 84-87 ms (3 nodes) and 116-119 ms (8 nodes) after its request (`scripts/bench-prefix.sh
/// --part converge`, release build, 2026-12-06: the owner's publish tick, then gossip);
/// [`epidemic::peer_view_delay_s`] gives 105 and 127 ms with this hop, about the least the
/// model allows, so the staleness simulated is if anything longer than the mesh's. Until the
/// node read a peer's values as they arrived (it saw them at its own next gossip round), the
/// mesh took 198-216 and 245-249 ms, and [`MEMBERSHIP_HOP_S`] stood in here.
pub const CALIBRATED_HOP_S: f64 = 0.002;

/// Per-hop delay that makes [`epidemic::cold_convergence_s`] match the real mesh's measured
/// membership convergence (3 nodes: 0.41-0.44 s; 8 nodes: 0.82 s; 200 ms interval, fanout 3;
/// node/MESH-NOTES.md): a node joining or leaving still reaches a node's view at that node's
/// gossip rounds, when chitchat updates liveness. It is large for loopback because it holds
/// that wait, and the measurement ran a debug build of 3-8 nodes in one process on a loaded
/// 2-core machine; see `docs/scaling.md`. Used only to reproduce that test.
pub const MEMBERSHIP_HOP_S: f64 = 0.095;

/// Bytes of one entry of a Scuttlebutt digest (node id, generation, heartbeat, versions): each
/// round a node sends one per known node, whatever changed. This is the part of gossip that
/// grows with N even when nothing changes.
pub const MEMBERSHIP_ENTRY_BYTES: f64 = 48.0;

/// Start-to-start delay between consecutive nodes in the real mesh's convergence test, fitted
/// together with [`MEMBERSHIP_HOP_S`]; used only to reproduce that test, not in the model.
pub const CALIBRATION_STAGGER_S: f64 = 0.02;
