//! The routing decision: which engine serves a request.
//!
//! [`decide`] is a pure function of the candidates (each peer's digest, summary and this node's
//! own recent assignments to it), the request's chain and `now`. It is deterministic: identical
//! inputs give the identical decision on every node, whatever order the candidates come in.
//! The node feeds it from gossip; the simulator feeds it from a model.

mod adapter;
mod cold;
mod config;
mod considered;
mod decide;
mod decode;
mod eligible;
mod load_cap;
mod owed;
mod pending;
mod popularity;
mod rank;
mod reason;
mod recent;
mod rendezvous;
mod score;
mod session;
mod spread;
#[cfg(test)]
pub(crate) mod tests;

pub use adapter::{
    AdapterHost, AdapterPlacement, AdapterRule, LoadableAdapters, glob_match, place_adapter,
};
pub use config::{
    Assumptions, BoundOn, ColdPrefixes, HitRules, LateBinding, LoadBound, PdConfig, RouteConfig,
    ScoreForm, ScoreWeights, SoftPreferences, UnknownScoreForm,
};
pub use decide::{
    Candidate, DecideScratch, Decision, Estimate, Gauges, RouteError, RouteRequest, decide,
    decide_with,
};
pub use decode::decide_decode;
pub use pending::PendingLedger;
pub(crate) use popularity::sampled_depths;
pub use popularity::{MIN_SIGHTINGS, PrefixShare, PrefixTraffic, TRAFFIC_WINDOW};
pub use reason::RouteReason;
pub use recent::RecentSends;
pub use rendezvous::{node_key, rendezvous_weight};
