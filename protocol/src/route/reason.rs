//! Why a request went where it went; exposed in a response header and in metrics.

use rkyv::{Archive, Deserialize, Serialize};

#[derive(Archive, Serialize, Deserialize, Copy, Clone, Debug, PartialEq, Eq, Hash)]
#[rkyv(derive(Debug))]
#[repr(u8)]
pub enum RouteReason {
    /// The chosen engine holds a prefix of the prompt.
    PrefixHit,
    /// Nobody holds the prefix: rendezvous hashing of the first block picked the engine, so
    /// every entry node agrees on where a new prefix goes.
    ColdHash,
    /// The best engine was over the load bound; the next best under it was chosen.
    LoadSpill,
    /// The session's preferred engine won thanks to its affinity bonus.
    Session,
    /// Exactly one engine could take the request.
    OnlyCandidate,
    /// The prompt is shorter than one block: chosen on load alone.
    LeastLoaded,
    /// An earlier attempt failed before the response started; this is the next in rank.
    Retry,
    /// The first choice's serving node declined it (its own queue was longer than the entry
    /// believed the next candidate's); this is the next in rank.
    Declined,
}

impl RouteReason {
    pub const ALL: [RouteReason; 8] = [
        RouteReason::PrefixHit,
        RouteReason::ColdHash,
        RouteReason::LoadSpill,
        RouteReason::Session,
        RouteReason::OnlyCandidate,
        RouteReason::LeastLoaded,
        RouteReason::Retry,
        RouteReason::Declined,
    ];

    /// The stable name used in headers and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            RouteReason::PrefixHit => "prefix-hit",
            RouteReason::ColdHash => "cold-hash",
            RouteReason::LoadSpill => "load-spill",
            RouteReason::Session => "session",
            RouteReason::OnlyCandidate => "only-candidate",
            RouteReason::LeastLoaded => "least-loaded",
            RouteReason::Retry => "retry",
            RouteReason::Declined => "declined",
        }
    }
}

impl std::fmt::Display for RouteReason {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}
