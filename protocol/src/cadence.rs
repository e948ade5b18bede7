//! How often a node refreshes what it gossips, how often it gossips, and which of its digests
//! it gossips: the node (`kvmesh serve`) and the simulator (`kvmesh-sim simulate`), which models
//! the same mesh, both read them here. Values and decisions, not timers: the node's tasks and
//! the simulator's clock run them.

use crate::digest::LoadDigest;
use std::time::Duration;

/// The engine is polled, and the load digest and the prefix summary refreshed, this often.
pub const DIGEST_INTERVAL: Duration = Duration::from_millis(100);

/// A node publishes its load digest this long after a change to its queue, at most, rather
/// than at the next [`DIGEST_INTERVAL`]: changes within it go out together.
pub const PUBLISH_COALESCE: Duration = Duration::from_millis(10);

/// A gossip round (one exchange with a few peers) starts this often.
pub const GOSSIP_INTERVAL: Duration = Duration::from_millis(200);

/// A quiet node re-gossips its digest this often, so peers can tell a quiet node from a stuck
/// one (they treat a digest older than the routing config's `max_digest_age_ms` as stale).
pub const REPUBLISH_EVERY: Duration = Duration::from_secs(1);

/// Numbers a node's digests and says which it gossips: one whose load differs from the last
/// gossiped ([`LoadDigest::same_load`]), or any once [`REPUBLISH_EVERY`] passed since. The
/// digest is built every [`DIGEST_INTERVAL`] either way, for the node's own routing.
#[derive(Debug, Default)]
pub struct DigestPublisher {
    version: u64,
    gossiped: Option<(LoadDigest, u64)>,
}

impl DigestPublisher {
    pub fn new() -> Self {
        Self::default()
    }

    /// The next digest's version: 1, 2, … (0 is left for a digest built outside the sequence,
    /// before it starts).
    pub fn next_version(&mut self) -> u64 {
        self.version += 1;
        self.version
    }

    /// Whether `digest`, built at `now_ms` (any monotonic clock), is gossiped; if so, it is
    /// the one later digests are compared with.
    pub fn should_gossip(&mut self, digest: &LoadDigest, now_ms: u64) -> bool {
        let due = match &self.gossiped {
            None => true,
            Some((last, at)) => {
                !last.same_load(digest)
                    || now_ms.saturating_sub(*at) >= REPUBLISH_EVERY.as_millis() as u64
            }
        };
        if due {
            self.gossiped = Some((digest.clone(), now_ms));
        }
        due
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::digest::sample_digest;

    #[test]
    fn versions_count_from_one() {
        let mut publisher = DigestPublisher::new();
        assert_eq!(publisher.next_version(), 1);
        assert_eq!(publisher.next_version(), 2);
    }

    #[test]
    fn gossips_a_changed_load_at_once_and_a_quiet_one_once_a_second() {
        let mut publisher = DigestPublisher::new();
        let mut digest = sample_digest();
        assert!(publisher.should_gossip(&digest, 0), "the first is gossiped");
        // Only the number and the time moved: not yet.
        digest.version += 1;
        digest.timestamp_ms += 100;
        assert!(!publisher.should_gossip(&digest, 100));
        assert!(!publisher.should_gossip(&digest, 999));
        assert!(
            publisher.should_gossip(&digest, 1_000),
            "a quiet node republishes"
        );
        assert!(!publisher.should_gossip(&digest, 1_100));
        // Any reported figure moving is news, not only the queue.
        for change in [
            (|d: &mut LoadDigest| d.waiting += 1) as fn(&mut LoadDigest),
            |d| d.ttft_ewma_ms += 1.0,
            |d| d.healthy = !d.healthy,
            |d| d.models.push("another".into()),
            |d| d.inflight_forwarded += 1,
        ] {
            let mut changed = digest.clone();
            change(&mut changed);
            assert!(publisher.should_gossip(&changed, 1_200));
            digest = changed;
        }
    }
}
