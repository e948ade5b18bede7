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
//! Decisions are made a tick interval at a time ([`Kvmesh::decide_batch`]): within one
//! interval the views are fixed (summary replicas advance at ticks; digests are looked up at
//! each request's own time), and what one entry node decides depends only on its own ledgers,
//! so entry nodes are split over threads, each deciding its own requests in arrival order.
//!
//! `kvmesh-zoned` is the next tier's design: nodes are split into zones of `zone_size`;
//! summaries are gossiped only inside a zone, digests everywhere (counted: they serve
//! cross-zone failover), and an entry node routes among its zone's nodes, so each zone
//! caches (and replicates) its own hot prefixes.

use std::collections::HashMap;

use kvmesh_protocol::route::{DecideScratch, PendingLedger, RecentSends, RouteError, decide_with};
use kvmesh_protocol::{Candidate, Decision, Role, RouteConfig, RouteRequest};

use crate::simulate::gossip::view::{LagClasses, Published};
use crate::simulate::node::MODEL;
use crate::simulate::prompt::BLOCK_TOKENS;

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

/// What is the same for every entry node.
struct Shared {
    visibility: Visibility,
    keys: Vec<u64>,
    index_of: HashMap<u64, u32>,
}

/// Per-thread buffers.
#[derive(Default)]
struct Scratch {
    decide: DecideScratch,
    nodes_of: Vec<u32>,
}

/// The chosen node's index and the decision, or why there was none.
pub type Routed = Result<(usize, Decision), RouteError>;

/// A request to route, as the entry node sees it.
pub struct Pending<'a> {
    pub entry: u32,
    pub chain: &'a [u64],
    pub prompt_tokens: u32,
    pub session: Option<u64>,
    /// The request's own key, for the spread among near-equal candidates.
    pub spread: u64,
    pub now_ns: u64,
}

pub struct Kvmesh {
    entries: Vec<Entry>,
    shared: Shared,
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
            shared: Shared {
                visibility,
                keys: node_keys.to_vec(),
                index_of: node_keys
                    .iter()
                    .enumerate()
                    .map(|(i, &k)| (k, i as u32))
                    .collect(),
            },
        }
    }

    /// Decides every request of `batch` (in arrival order) and does each entry node's
    /// optimistic accounting; returns, per request, the chosen node and the decision.
    pub fn decide_batch(
        &mut self,
        batch: &[Pending<'_>],
        published: &[Published],
        lags: &LagClasses,
        config: &RouteConfig,
        threads: usize,
    ) -> Vec<Routed> {
        let n = self.entries.len().max(1);
        let chunk = n.div_ceil(threads.clamp(1, n));
        let shared = &self.shared;
        let mut parts: Vec<Vec<(usize, Routed)>> = Vec::new();
        std::thread::scope(|scope| {
            let mut handles = Vec::new();
            let mut chunks = self.entries.chunks_mut(chunk).enumerate().peekable();
            while let Some((part, entries)) = chunks.next() {
                let first = (part * chunk) as u32;
                let mut work = move || {
                    let mut scratch = Scratch::default();
                    let mut out = Vec::new();
                    let range = first..first + entries.len() as u32;
                    for (i, request) in batch.iter().enumerate() {
                        if !range.contains(&request.entry) {
                            continue;
                        }
                        let me = &mut entries[(request.entry - first) as usize];
                        let decided =
                            decide_one(shared, me, &mut scratch, request, published, lags, config);
                        if let Ok((target, _)) = &decided {
                            record(shared, me, *target, request.chain, request.now_ns);
                        }
                        out.push((i, decided));
                    }
                    out
                };
                if chunks.peek().is_some() {
                    handles.push(scope.spawn(work));
                } else {
                    parts.push(work());
                }
            }
            for handle in handles {
                parts.push(handle.join().expect("a routing thread panicked"));
            }
        });
        let mut results: Vec<Option<Routed>> = (0..batch.len()).map(|_| None).collect();
        for (i, decided) in parts.into_iter().flatten() {
            results[i] = Some(decided);
        }
        results
            .into_iter()
            .map(|r| r.expect("every request belongs to one entry range"))
            .collect()
    }
}

/// One decision at `request.entry`, from its view at `request.now_ns`.
fn decide_one(
    shared: &Shared,
    me: &Entry,
    scratch: &mut Scratch,
    request: &Pending<'_>,
    published: &[Published],
    lags: &LagClasses,
    config: &RouteConfig,
) -> Routed {
    let (entry, now_ns) = (request.entry, request.now_ns);
    let now_ms = now_ns / 1_000_000;
    let chain = request.chain;
    let recent: Vec<(u32, u32)> = me
        .recent
        .nodes_with_first(chain, now_ms)
        .filter_map(|key| {
            let node = *shared.index_of.get(&key)?;
            Some((node, me.recent.matched(key, chain, now_ms)))
        })
        .collect();
    scratch.nodes_of.clear();
    let mut candidates = Vec::with_capacity(published.len());
    // A zoned entry node routes within its zone: it sees only its zone's summaries, and with
    // other zones' nodes as candidates every prefix cached elsewhere would look cold and be
    // sent by rendezvous to one home node by all zones at once (measured: imbalance 33-42 at
    // 4,096-10,000 nodes, see docs/scaling.md).
    let range = match shared.visibility {
        Visibility::Zone(size) => {
            let start = entry as usize / size * size;
            start..(start + size).min(published.len())
        }
        _ => 0..published.len(),
    };
    for (p, view) in published[range.clone()].iter().enumerate() {
        let p = (range.start + p) as u32;
        let class = lags.class_of(entry, p);
        let Some((digest, received_ns)) = view.digest(lags, class, now_ns) else {
            continue;
        };
        let received_ms = received_ns / 1_000_000;
        let node_key = shared.keys[p as usize];
        candidates.push(Candidate {
            node_key,
            digest,
            summary: if shared.visibility.sees(entry, p) {
                view.summary(class)
            } else {
                None
            },
            // The modelled engines have no offload tier.
            offload: None,
            digest_received_ms: received_ms,
            pending: if me.sent_to.iter().any(|&(n, _)| n == p) {
                me.ledger.pending(node_key, received_ms, now_ms)
            } else {
                0
            },
            recent_match: recent.iter().find(|(n, _)| *n == p).map_or(0, |&(_, m)| m),
            fresh: None,
        });
        scratch.nodes_of.push(p);
    }
    let route_request = RouteRequest {
        model: MODEL,
        chain,
        prompt_tokens: request.prompt_tokens,
        tokens_per_block: BLOCK_TOKENS as f32,
        session: request.session,
        role: Role::Mixed,
        spread: Some(request.spread),
    };
    let decision = decide_with(
        &mut scratch.decide,
        &candidates,
        &route_request,
        config,
        now_ms,
    )?;
    Ok((scratch.nodes_of[decision.ranked[0]] as usize, decision))
}

/// Optimistic accounting of a send from this entry node to `target`.
fn record(shared: &Shared, me: &mut Entry, target: usize, chain: &[u64], now_ns: u64) {
    let now_ms = now_ns / 1_000_000;
    let target_key = shared.keys[target];
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
