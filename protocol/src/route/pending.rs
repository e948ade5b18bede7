//! Optimistic accounting: requests this node sent to a peer that the peer's digest cannot yet
//! reflect. Without it, many entry nodes reading the same stale digest all pick the same idle
//! engine.

use crate::block_map::BlockMap;
use std::collections::VecDeque;

/// This node's recent assignments per peer, counted until a digest newer than them arrives.
#[derive(Debug)]
pub struct PendingLedger {
    sent: BlockMap<u64, VecDeque<u64>>,
    ttl_ms: u64,
}

impl PendingLedger {
    /// Assignments older than `ttl_ms` are forgotten even without a digest (a peer that stopped
    /// publishing must not look loaded forever on our account).
    pub fn new(ttl_ms: u64) -> Self {
        Self {
            sent: BlockMap::default(),
            ttl_ms,
        }
    }

    /// Records that a request was just sent to `node`.
    pub fn record(&mut self, node: u64, now_ms: u64) {
        self.sent.entry(node).or_default().push_back(now_ms);
    }

    /// Takes back an assignment recorded at `at_ms` that `node` declined: it never reached
    /// that engine's queue.
    pub fn withdraw(&mut self, node: u64, at_ms: u64) {
        if let Some(times) = self.sent.get_mut(&node)
            && let Some(i) = times.iter().rposition(|&t| t == at_ms)
        {
            times.remove(i);
        }
    }

    /// Assignments to `node` made after its latest digest arrived (at `digest_received_ms`)
    /// and within the time to live.
    pub fn pending(&self, node: u64, digest_received_ms: u64, now_ms: u64) -> u32 {
        let since = digest_received_ms.max(now_ms.saturating_sub(self.ttl_ms));
        self.sent.get(&node).map_or(0, |times| {
            times.iter().filter(|&&t| t >= since).count() as u32
        })
    }

    /// Drops assignments a digest has since reflected or that outlived the time to live.
    pub fn prune(&mut self, now_ms: u64, digest_received_ms: impl Fn(u64) -> u64) {
        let ttl_floor = now_ms.saturating_sub(self.ttl_ms);
        self.sent.retain(|node, times| {
            let since = digest_received_ms(*node).max(ttl_floor);
            while times.front().is_some_and(|&t| t < since) {
                times.pop_front();
            }
            !times.is_empty()
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_until_a_newer_digest_or_the_ttl() {
        let mut ledger = PendingLedger::new(1_000);
        ledger.record(1, 100);
        ledger.record(1, 200);
        ledger.record(2, 200);
        assert_eq!(ledger.pending(1, 50, 250), 2);
        assert_eq!(
            ledger.pending(1, 150, 250),
            1,
            "the digest at 150 reflects the send at 100"
        );
        assert_eq!(
            ledger.pending(1, 50, 1_150),
            1,
            "the send at 100 outlived its ttl"
        );
        ledger.prune(250, |node| if node == 1 { 150 } else { 0 });
        assert_eq!(ledger.pending(1, 0, 250), 1);
        assert_eq!(ledger.pending(2, 0, 250), 1);
        ledger.prune(5_000, |_| 0);
        assert!(ledger.sent.is_empty());
    }

    #[test]
    fn a_withdrawn_assignment_no_longer_counts() {
        let mut ledger = PendingLedger::new(1_000);
        ledger.record(1, 100);
        ledger.record(1, 200);
        ledger.withdraw(1, 200);
        ledger.withdraw(2, 200);
        assert_eq!(ledger.pending(1, 0, 250), 1);
        ledger.withdraw(1, 100);
        assert_eq!(ledger.pending(1, 0, 250), 0);
    }
}
