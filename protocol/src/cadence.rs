//! How often a node refreshes what it gossips and how often it gossips: the defaults of the
//! node (`kvmesh serve`) and of the simulator (`kvmesh-sim simulate`), which models the same
//! mesh. Values, not timers: the node's tasks and the simulator's clock run them.

use std::time::Duration;

/// The engine is polled, and the load digest and the prefix summary refreshed, this often.
pub const DIGEST_INTERVAL: Duration = Duration::from_millis(100);

/// A gossip round (one exchange with a few peers) starts this often.
pub const GOSSIP_INTERVAL: Duration = Duration::from_millis(200);
