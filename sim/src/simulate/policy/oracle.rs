//! The oracle: the same `decide`, over an instant and exact view of the whole cluster (every
//! engine's load now, and what every node's prefix index holds now, and how much). What
//! kvmesh would do if gossip were free and instantaneous.

use std::collections::HashMap;

use kvmesh_protocol::index::{IndexChanges, PrefixIndex};
use kvmesh_protocol::route::{DecideScratch, PrefixShare, PrefixTraffic, RouteError, decide_with};
use kvmesh_protocol::{Candidate, Decision, LoadDigest, RouteConfig, RouteRequest};

use crate::simulate::node::SimNode;

pub struct Oracle {
    digests: Vec<LoadDigest>,
    /// First block of a prompt → the nodes whose index holds it: only they can match.
    holders: HashMap<u64, Vec<u32>>,
    /// Every request's prefixes, as an entry node counts its own (see [`PrefixTraffic`]).
    traffic: PrefixTraffic,
    shares: Vec<PrefixShare>,
    scratch: DecideScratch,
}

impl Oracle {
    pub fn new(nodes: &mut [SimNode]) -> Self {
        Self {
            // Exact, unlike a sidecar's measurement: every engine's modelled prefill speed.
            digests: nodes
                .iter_mut()
                .map(|n| LoadDigest {
                    prefill_tokens_per_s: n.engine.config().timing.prefill_tokens_per_s() as f32,
                    ..n.digest(0)
                })
                .collect(),
            holders: HashMap::new(),
            traffic: PrefixTraffic::default(),
            shares: Vec::new(),
            scratch: DecideScratch::default(),
        }
    }

    /// Starts tracking which nodes hold `first` (a prompt's first block).
    pub fn track(&mut self, first: u64) {
        self.holders.entry(first).or_default();
    }

    pub fn index_changed(&mut self, node: u32, changes: &IndexChanges) {
        for h in &changes.added {
            if let Some(v) = self.holders.get_mut(h)
                && !v.contains(&node)
            {
                v.push(node);
            }
        }
        for h in &changes.evicted {
            if let Some(v) = self.holders.get_mut(h) {
                v.retain(|&n| n != node);
            }
        }
    }

    pub fn decide(
        &mut self,
        nodes: &[SimNode],
        request: &RouteRequest<'_>,
        config: &RouteConfig,
        now_ns: u64,
    ) -> Result<Decision, RouteError> {
        let now_ms = now_ns / 1_000_000;
        for (digest, node) in self.digests.iter_mut().zip(nodes) {
            let gauges = node.engine.gauges();
            digest.running = gauges.running as u32;
            digest.waiting = gauges.waiting as u32;
            digest.kv_usage = gauges.kv_usage.clamp(0.0, 1.0) as f32;
            digest.ttft_ewma_ms = node.ttft_ewma_ms as f32;
        }
        let holders: &[u32] = request
            .chain
            .first()
            .and_then(|h| self.holders.get(h))
            .map_or(&[], Vec::as_slice);
        let candidates: Vec<Candidate<'_>> = self
            .digests
            .iter()
            .zip(nodes)
            .enumerate()
            .map(|(i, (digest, node))| Candidate {
                node_key: node.key,
                digest,
                summary: None,
                // Exact where a sidecar has its peer's summary estimate: an engine with room
                // for the prompt goes first among near-equals, as in kvmesh.
                held_blocks: Some(node.index.len() as u64),
                offload: None,
                digest_received_ms: now_ms,
                pending: 0,
                digest_pending: 0,
                recent_match: if holders.contains(&(i as u32)) {
                    index_match(&node.index, request.chain)
                } else {
                    0
                },
                fresh: None,
            })
            .collect();
        let weighed = self.traffic.weigh(request, &mut self.shares);
        let decision = decide_with(&mut self.scratch, &candidates, &weighed, config, now_ms);
        self.traffic.record(request.chain);
        decision
    }
}

/// Leading blocks of `chain` in `index`. Chains are inserted whole and evicted from the tail,
/// so the held blocks are (nearly always) a prefix: bisect.
fn index_match(index: &PrefixIndex, chain: &[u64]) -> u32 {
    if chain.first().is_none_or(|h| !index.contains(*h)) {
        return 0;
    }
    let (mut lo, mut hi) = (1usize, chain.len());
    while lo < hi {
        let mid = lo + (hi - lo).div_ceil(2);
        if index.contains(chain[mid - 1]) {
            lo = mid;
        } else {
            hi = mid - 1;
        }
    }
    lo as u32
}
