//! A request's routing lifecycle, sans-IO: guess at the entry, know at the target.
//!
//! The entry side ([`EntryState`], [`Plan`]) ranks the engines on a view that is always
//! somewhat stale (gossiped digests 100–600 ms old, plus its own recent sends) and attempts
//! them in rank order. The serving side ([`ServingState`]) knows its own engine's queue
//! exactly, since it hands over every request the engine gets, and may decline a request its
//! entry allowed it to decline when that queue is longer than the entry believed the next
//! candidate's to be (late binding). Every answer and every decline carries the serving
//! engine's [`LoadReport`] back, so an entry's view of the engines it talks to is as fresh as
//! its last exchange with them; gossip stays the source for the others.
//!
//! The node drives these from sockets and the simulator from its model, with time passed in:
//! a change measured in the simulator is the change the node ships.

mod entry;
mod pd;
mod plan;
mod report;
mod serving;

pub use entry::{
    EntryState, Estimated, PENDING_TTL_MS, PeerInput, RECENT_MAX_ENTRIES, RECENT_TTL_MS,
    REPORT_TTL_MS, Source,
};
pub use pd::{PAIR_TTL_MS, PdReason, PdRoute};
pub use plan::{Attempt, Failure, Outcome, Plan, PopularPlacement, Progress, tokens_bound};
pub use report::LoadReport;
pub use serving::{Admission, COPY_HOLD_MAX_MS, DeclineReason, ServingState, Ticket};
