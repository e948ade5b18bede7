//! Routing policies compared by the simulator, one per file.
//!
//! The simple baselines are pure functions of the loads (and a seeded RNG or counter): they see
//! the true, instantaneous number of requests in flight on every engine, like a centralized
//! load balancer would. [`oracle`] and [`kvmesh`] run the protocol's real `decide`: the oracle
//! over an instant global view, kvmesh over each entry node's gossiped view.

pub mod chwbl;
pub mod kvmesh;
pub mod least_loaded;
pub mod oracle;
pub mod power_of_two;
pub mod random;
pub mod round_robin;

/// A routing policy.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PolicyKind {
    /// Uniformly random engine.
    Random,
    /// Each entry node cycles over the engines.
    RoundRobin,
    /// Fewest requests in flight (true instantaneous load).
    LeastLoaded,
    /// The less loaded of two random engines.
    PowerOfTwo,
    /// Consistent hashing with bounded loads on the first prefix block (ε = 0.25).
    Chwbl,
    /// `decide` over an instant, exact global view.
    Oracle,
    /// `decide` over gossiped, stale views, with optimistic accounting.
    Kvmesh,
    /// `decide` with gossiped digests but no summaries: each entry node knows only where it
    /// sent prefixes itself.
    KvmeshLocal,
    /// kvmesh with summaries gossiped only inside zones of `--zone-size` nodes (digests
    /// everywhere): the next tier's design.
    KvmeshZoned,
}

impl PolicyKind {
    /// The default comparison (kvmesh-zoned only on request).
    pub const ALL: [PolicyKind; 8] = [
        PolicyKind::Random,
        PolicyKind::RoundRobin,
        PolicyKind::LeastLoaded,
        PolicyKind::PowerOfTwo,
        PolicyKind::Chwbl,
        PolicyKind::Oracle,
        PolicyKind::Kvmesh,
        PolicyKind::KvmeshLocal,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PolicyKind::Random => "random",
            PolicyKind::RoundRobin => "round-robin",
            PolicyKind::LeastLoaded => "least-loaded",
            PolicyKind::PowerOfTwo => "power-of-two",
            PolicyKind::Chwbl => "chwbl",
            PolicyKind::Oracle => "oracle",
            PolicyKind::Kvmesh => "kvmesh",
            PolicyKind::KvmeshLocal => "kvmesh-local",
            PolicyKind::KvmeshZoned => "kvmesh-zoned",
        }
    }

    /// Whether the policy needs the gossip model (digests, and summaries for kvmesh).
    pub fn gossips(self) -> bool {
        matches!(
            self,
            PolicyKind::Kvmesh | PolicyKind::KvmeshLocal | PolicyKind::KvmeshZoned
        )
    }
}
