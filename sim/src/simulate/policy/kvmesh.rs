//! kvmesh: every entry node runs the real `decide` over its own view of the cluster, built
//! exactly as the sidecar builds it (`node/src/serve/routing.rs`): itself plus every peer
//! whose digest has arrived, with the digest's arrival time for staleness, `pending` from its
//! `PendingLedger`, `recent_match` from its `RecentSends`, and the peer's summary as gossip
//! delivered it. For itself, a node has its own digest and, with `--self-view summary` (the
//! default), its own summary without lag; `--self-view digest` reproduces
//! `node/src/serve/routing.rs` as of this writing, whose self candidate has no summary.
//! `kvmesh-local` is the same without summaries: an entry node knows only where it sent
//! prefixes itself (its `RecentSends`, kept longer).
//!
//! `kvmesh-zoned` is the next tier's design: nodes are split into zones of `zone_size`;
//! summaries are gossiped only inside a zone, digests everywhere. An entry node sees every
//! node's load but only its zone's caches; a prefix cached in another zone looks cold, and
//! the cold-prefix rendezvous of `decide` (over all nodes) still sends it to the node every
//! entry node agrees on.

use std::collections::HashMap;

use kvmesh_protocol::route::{DecideScratch, PendingLedger, RecentSends, RouteError, decide_with};
use kvmesh_protocol::{Candidate, Decision, RouteConfig, RouteRequest};

use crate::simulate::gossip::view::{LagClasses, Published};

/// Time to live of pending assignments (the sidecar's `PENDING_TTL_MS`).
pub const PENDING_TTL_MS: u64 = 2_000;
/// Time to live of optimistic prefix matches: long enough to cover gossip's lag.
pub const RECENT_TTL_MS: u64 = 2_000;
/// Which summaries an entry node sees.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Visibility {
    /// Every peer's (kvmesh).
    All,
    /// Its own only, if it has one (kvmesh-local).
    Local,
    /// Its zone's: nodes `i` with `i / zone_size` equal to its own (kvmesh-zoned).
    Zone(usize),
}

impl Visibility {
    fn sees(self, entry: u32, peer: u32) -> bool {
        match self {
            Visibility::All => true,
            Visibility::Local if entry == peer => true,
            Visibility::Local => false,
            Visibility::Zone(size) => entry as usize / size == peer as usize / size,
        }
    }
}

/// kvmesh-local remembers its own sends this long: that is all it knows of peers' caches.
pub const LOCAL_TTL_MS: u64 = 60_000;
const RECENT_MAX_ENTRIES: usize = 200_000;

struct Entry {
    ledger: PendingLedger,
    recent: RecentSends,
    pruned_ms: u64,
    /// Nodes this entry sent to, with the last send time: `ledger.pending` is zero for any
    /// other node, so only these are asked (the ledger is a SipHash map; asking it about all
    /// 1,000 candidates of every decision was a tenth of the simulator's time).
    sent_to: Vec<(u32, u64)>,
}

pub struct Kvmesh {
    entries: Vec<Entry>,
    visibility: Visibility,
    keys: Vec<u64>,
    index_of: HashMap<u64, u32>,
    scratch: DecideScratch,
    nodes_of: Vec<u32>,
    classes: Vec<u8>,
}

impl Kvmesh {
    pub fn new(node_keys: &[u64], visibility: Visibility) -> Self {
        let ttl = if visibility == Visibility::Local {
            LOCAL_TTL_MS
        } else {
            RECENT_TTL_MS
        };
        Self {
            entries: node_keys
                .iter()
                .map(|_| Entry {
                    ledger: PendingLedger::new(PENDING_TTL_MS),
                    recent: RecentSends::new(ttl, RECENT_MAX_ENTRIES),
                    pruned_ms: 0,
                    sent_to: Vec::new(),
                })
                .collect(),
            visibility,
            keys: node_keys.to_vec(),
            index_of: node_keys
                .iter()
                .enumerate()
                .map(|(i, &k)| (k, i as u32))
                .collect(),
            scratch: DecideScratch::default(),
            nodes_of: Vec::new(),
            classes: Vec::new(),
        }
    }

    /// Decides at entry node `entry`; returns the chosen node's index and the decision.
    pub fn decide(
        &mut self,
        entry: u32,
        published: &mut [Published],
        lags: &LagClasses,
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        now_ns: u64,
    ) -> Result<(usize, Decision), RouteError> {
        let now_ms = now_ns / 1_000_000;
        let visibility = self.visibility;
        self.classes.clear();
        for (p, view) in published.iter_mut().enumerate() {
            let class = lags.class_of(entry, p as u32);
            self.classes.push(class as u8);
            if visibility.sees(entry, p as u32) {
                view.sync(lags, class, now_ns);
            }
        }
        let me = &self.entries[entry as usize];
        let recent: Vec<(u32, u32)> = me
            .recent
            .nodes_with_first(request.chain, now_ms)
            .filter_map(|key| {
                let node = *self.index_of.get(&key)?;
                Some((node, me.recent.matched(key, request.chain, now_ms)))
            })
            .collect();
        self.nodes_of.clear();
        let mut candidates = Vec::with_capacity(published.len());
        for (p, view) in published.iter().enumerate() {
            let class = usize::from(self.classes[p]);
            let p = p as u32;
            let Some((digest, received_ns)) = view.digest(lags, class, now_ns) else {
                continue;
            };
            let received_ms = received_ns / 1_000_000;
            let node_key = self.keys[p as usize];
            candidates.push(Candidate {
                node_key,
                digest,
                summary: if visibility.sees(entry, p) {
                    view.summary(class)
                } else {
                    None
                },
                digest_received_ms: received_ms,
                pending: if me.sent_to.iter().any(|&(n, _)| n == p) {
                    me.ledger.pending(node_key, received_ms, now_ms)
                } else {
                    0
                },
                recent_match: recent.iter().find(|(n, _)| *n == p).map_or(0, |&(_, m)| m),
            });
            self.nodes_of.push(p);
        }
        let decision = decide_with(&mut self.scratch, &candidates, request, config, now_ms)?;
        Ok((self.nodes_of[decision.ranked[0]] as usize, decision))
    }

    /// Optimistic accounting of a send from `entry` to `target`.
    pub fn record(&mut self, entry: u32, target: usize, chain: &[u64], now_ns: u64) {
        let now_ms = now_ns / 1_000_000;
        let target_key = self.keys[target];
        let me = &mut self.entries[entry as usize];
        me.sent_to
            .retain(|&(n, at)| n != target as u32 && at + PENDING_TTL_MS >= now_ms);
        me.sent_to.push((target as u32, now_ms));
        me.ledger.record(target_key, now_ms);
        me.recent.record(target_key, chain, now_ms);
        if now_ms >= me.pruned_ms + 1_000 {
            // Only the time to live prunes here; `pending` already ignores sends older than
            // each peer's latest digest.
            me.ledger.prune(now_ms, |_| 0);
            me.pruned_ms = now_ms;
        }
    }
}
