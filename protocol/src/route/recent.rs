//! Optimistic prefix accounting: the chains this node itself just sent to each peer.
//!
//! A peer's summary shows a new prefix only after the peer served it and gossip carried the
//! changed shard back (hundreds of milliseconds). Meanwhile the entry node knows where it sent
//! it; counting that as a match keeps a burst of requests with a new prefix on the engine that
//! is computing it instead of scattering them. Entries expire after a time to live, by which
//! the peer's own summary confirms (or contradicts) them.

use crate::block_map::BlockMap;
use std::collections::VecDeque;

#[derive(Debug)]
pub struct RecentSends {
    /// Hash → the nodes it was sent to, with the send time.
    sent: BlockMap<u64, Vec<(u64, u64)>>,
    /// Sends in time order, for expiry: (time, node, chain).
    log: VecDeque<(u64, u64, Vec<u64>)>,
    ttl_ms: u64,
    /// Bound on remembered block hashes, whatever the rate.
    max_entries: usize,
    entries: usize,
}

impl RecentSends {
    pub fn new(ttl_ms: u64, max_entries: usize) -> Self {
        Self {
            sent: BlockMap::default(),
            log: VecDeque::new(),
            ttl_ms,
            max_entries,
            entries: 0,
        }
    }

    /// Records that `chain` was just sent to `node`.
    pub fn record(&mut self, node: u64, chain: &[u64], now_ms: u64) {
        if chain.is_empty() {
            return;
        }
        for &hash in chain {
            let nodes = self.sent.entry(hash).or_default();
            match nodes.iter_mut().find(|(n, _)| *n == node) {
                Some(entry) => entry.1 = now_ms,
                None => {
                    nodes.push((node, now_ms));
                    self.entries += 1;
                }
            }
        }
        self.log.push_back((now_ms, node, chain.to_vec()));
        self.expire(now_ms);
    }

    /// Takes back the send of `chain` to `node` recorded at `at_ms`: the node declined it. A
    /// later send of the same blocks to the same node stays.
    pub fn withdraw(&mut self, node: u64, chain: &[u64], at_ms: u64) {
        for hash in chain {
            if let Some(nodes) = self.sent.get_mut(hash) {
                if let Some(i) = nodes.iter().position(|&(n, t)| n == node && t == at_ms) {
                    nodes.swap_remove(i);
                    self.entries -= 1;
                }
                if nodes.is_empty() {
                    self.sent.remove(hash);
                }
            }
        }
    }

    /// Leading blocks of `chain` recently sent to `node`.
    pub fn matched(&self, node: u64, chain: &[u64], now_ms: u64) -> u32 {
        let floor = now_ms.saturating_sub(self.ttl_ms);
        let held = |hash: &u64| {
            self.sent
                .get(hash)
                .is_some_and(|nodes| nodes.iter().any(|&(n, at)| n == node && at >= floor))
        };
        // Whole chains are recorded, so holding h_i implies holding h_0..h_i: bisect.
        if chain.first().is_none_or(|h| !held(h)) {
            return 0;
        }
        let (mut lo, mut hi) = (1usize, chain.len());
        while lo < hi {
            let mid = lo + (hi - lo).div_ceil(2);
            if held(&chain[mid - 1]) {
                lo = mid
            } else {
                hi = mid - 1
            }
        }
        lo as u32
    }

    /// Nodes that were recently sent the first block of `chain`: the only ones
    /// [`Self::matched`] can give a non-zero answer for.
    pub fn nodes_with_first(&self, chain: &[u64], now_ms: u64) -> impl Iterator<Item = u64> + '_ {
        let floor = now_ms.saturating_sub(self.ttl_ms);
        chain
            .first()
            .and_then(|h| self.sent.get(h))
            .into_iter()
            .flatten()
            .filter(move |(_, at)| *at >= floor)
            .map(|(node, _)| *node)
    }

    fn expire(&mut self, now_ms: u64) {
        let floor = now_ms.saturating_sub(self.ttl_ms);
        while let Some((at, _, _)) = self.log.front() {
            if *at >= floor && self.entries <= self.max_entries {
                break;
            }
            let Some((at, node, chain)) = self.log.pop_front() else {
                break;
            };
            for hash in chain {
                if let Some(nodes) = self.sent.get_mut(&hash) {
                    // Only drop the entry if no later send refreshed it.
                    if let Some(i) = nodes.iter().position(|&(n, t)| n == node && t <= at) {
                        nodes.swap_remove(i);
                        self.entries -= 1;
                    }
                    if nodes.is_empty() {
                        self.sent.remove(&hash);
                    }
                }
            }
        }
    }

    /// Remembered block hashes (for metrics).
    pub fn len(&self) -> usize {
        self.entries
    }

    pub fn is_empty(&self) -> bool {
        self.entries == 0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_recorded_prefix_until_it_expires() {
        let mut recent = RecentSends::new(1_000, 1_000);
        recent.record(7, &[1, 2, 3, 4], 100);
        assert_eq!(recent.matched(7, &[1, 2, 3, 4, 5, 6], 200), 4);
        assert_eq!(recent.matched(7, &[1, 2, 9], 200), 2);
        assert_eq!(recent.matched(8, &[1, 2, 3], 200), 0);
        assert_eq!(
            recent.nodes_with_first(&[1], 200).collect::<Vec<_>>(),
            vec![7]
        );
        assert_eq!(recent.matched(7, &[1, 2, 3], 1_200), 0, "expired");
        recent.record(8, &[5], 5_000);
        assert_eq!(
            recent.len(),
            1,
            "expired sends are dropped on the next record"
        );
    }

    #[test]
    fn a_refreshed_send_survives_the_expiry_of_the_older_one() {
        let mut recent = RecentSends::new(1_000, 1_000);
        recent.record(7, &[1, 2], 0);
        recent.record(7, &[1, 2], 900);
        recent.record(9, &[3], 1_500);
        assert_eq!(recent.matched(7, &[1, 2], 1_500), 2);
    }

    #[test]
    fn a_withdrawn_send_no_longer_matches_but_a_later_one_does() {
        let mut recent = RecentSends::new(1_000, 1_000);
        recent.record(7, &[1, 2, 3], 100);
        recent.record(8, &[1, 2, 3], 100);
        recent.withdraw(7, &[1, 2, 3], 100);
        assert_eq!(recent.matched(7, &[1, 2, 3], 150), 0);
        assert_eq!(
            recent.matched(8, &[1, 2, 3], 150),
            3,
            "other nodes' sends stay"
        );
        assert_eq!(recent.len(), 3);
        recent.record(7, &[1, 2], 200);
        recent.withdraw(7, &[1, 2], 100);
        assert_eq!(
            recent.matched(7, &[1, 2], 250),
            2,
            "a later send is not withdrawn"
        );
        recent.record(9, &[4], 5_000);
        assert_eq!(recent.len(), 1, "withdrawn sends expire cleanly");
    }

    #[test]
    fn the_entry_bound_holds() {
        let mut recent = RecentSends::new(u64::MAX / 2, 100);
        for i in 0..50u64 {
            recent.record(1, &[i * 10, i * 10 + 1, i * 10 + 2], i);
        }
        assert!(recent.len() <= 102, "{} entries", recent.len());
    }
}
