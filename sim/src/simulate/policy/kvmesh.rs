//! kvmesh: every entry node runs the protocol's lifecycle (`lifecycle::EntryState::route`,
//! which runs `decide`, then the plan's attempts) over its own view of the cluster, built as
//! the sidecar builds it (`node/src/serve/routing.rs`): itself, read live from its serving
//! state, plus every peer whose digest has arrived, with the digest's arrival time for
//! staleness, the peer's summary as gossip delivered it, and what the entry's own state adds
//! (pending sends, optimistic prefix matches, the loads peers reported back). With
//! `--self-view summary` (the default) a node's own candidate carries its own summary without
//! lag, as the sidecar's does; `--self-view digest` leaves it out.
//! `kvmesh-local` is the same without summaries: an entry node knows only where it sent
//! prefixes itself (its recent sends, kept longer).
//!
//! `kvmesh-zoned` is the next tier's design: nodes are split into zones of `zone_size`;
//! summaries are gossiped only inside a zone, digests everywhere (counted: they serve
//! cross-zone failover), and an entry node routes among its zone's nodes, so each zone
//! caches (and replicates) its own hot prefixes.

use kvmesh_protocol::lifecycle::{EntryState, PdReason, PdRoute, PeerInput, Plan};
use kvmesh_protocol::route::{Gauges, PdConfig, RouteError};
use kvmesh_protocol::{RouteConfig, RouteRequest};

use crate::simulate::gossip::view::{LagClasses, Published};

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
/// Bound on the block hashes each entry node remembers of its recent sends (the sidecar's is
/// larger; a simulated node sends less).
const RECENT_MAX_ENTRIES: usize = 200_000;
/// Entry nodes forget moot pending sends and old reports this often.
const PRUNE_EVERY_MS: u64 = 1_000;

/// A routed request: its plan, and the node of each candidate the plan refers to.
pub struct Routed {
    pub plan: Plan,
    pub nodes: Vec<u32>,
}

/// How a request in a disaggregated cluster is served.
pub enum Placement {
    /// On one engine; why it was not disaggregated, if prefill engines serve its model.
    Whole(Routed, Option<PdReason>),
    /// Its prefill leg first (this plan); the decode leg is planned by
    /// [`Kvmesh::route_decode`].
    Split(Routed),
}

/// What an entry node's view is built from: the gossip model's state and its own engine's
/// serving state (read live).
#[derive(Copy, Clone)]
pub struct View<'a> {
    pub published: &'a [Published],
    pub lags: &'a LagClasses,
    pub live: Gauges,
}

pub struct Kvmesh {
    entries: Vec<EntryState>,
    pruned_ms: Vec<u64>,
    visibility: Visibility,
    keys: Vec<u64>,
}

impl Kvmesh {
    pub fn new(node_keys: &[u64], visibility: Visibility) -> Self {
        let ttl = match visibility {
            Visibility::Local => LOCAL_TTL_MS,
            _ => kvmesh_protocol::lifecycle::RECENT_TTL_MS,
        };
        Self {
            entries: node_keys
                .iter()
                .map(|_| EntryState::new(ttl, RECENT_MAX_ENTRIES))
                .collect(),
            pruned_ms: vec![0; node_keys.len()],
            visibility,
            keys: node_keys.to_vec(),
        }
    }

    /// The entry side of node `entry`.
    pub fn entry(&mut self, entry: u32) -> &mut EntryState {
        &mut self.entries[entry as usize]
    }

    /// Ranks `request` at node `entry` from its view at `now_ns`; `live` is its own engine's
    /// serving state.
    pub fn route(
        &mut self,
        entry: u32,
        request: &RouteRequest<'_>,
        view: View<'_>,
        config: &RouteConfig,
        now_ns: u64,
    ) -> Result<Routed, RouteError> {
        let now_ms = now_ns / 1_000_000;
        let (peers, nodes) = self.peers(entry, view, now_ns);
        let plan = self.entries[entry as usize].route(&peers, request, config, now_ms)?;
        Ok(Routed { plan, nodes })
    }

    /// Decides at node `entry` whether `request` is disaggregated, and plans its first leg.
    pub fn route_pd(
        &mut self,
        entry: u32,
        request: &RouteRequest<'_>,
        view: View<'_>,
        config: &RouteConfig,
        pd: &PdConfig,
        now_ns: u64,
    ) -> Result<Placement, RouteError> {
        let now_ms = now_ns / 1_000_000;
        let (peers, nodes) = self.peers(entry, view, now_ns);
        let route = self.entries[entry as usize].route_pd(&peers, request, config, pd, now_ms)?;
        Ok(match route {
            PdRoute::Whole { plan, pd } => Placement::Whole(Routed { plan, nodes }, pd),
            PdRoute::Split { prefill, .. } => Placement::Split(Routed {
                plan: prefill,
                nodes,
            }),
        })
    }

    /// Plans at node `entry` the decode leg of `request`, whose prefill ran on node
    /// `prefill`, on the view at `now_ns`.
    #[allow(clippy::too_many_arguments)]
    pub fn route_decode(
        &mut self,
        entry: u32,
        request: &RouteRequest<'_>,
        prefill: u32,
        view: View<'_>,
        config: &RouteConfig,
        pd: &PdConfig,
        now_ns: u64,
    ) -> Result<Routed, RouteError> {
        let now_ms = now_ns / 1_000_000;
        let (peers, nodes) = self.peers(entry, view, now_ns);
        let prefill_key = self.keys[prefill as usize];
        let plan = self.entries[entry as usize].route_decode(
            &peers,
            request,
            prefill_key,
            config,
            pd,
            now_ms,
        )?;
        Ok(Routed { plan, nodes })
    }

    /// Node `entry` learns that node `decode` started a decode leg pulled from node
    /// `prefill`.
    pub fn record_pair(&mut self, entry: u32, prefill: u32, decode: u32, now_ns: u64) {
        let (prefill, decode) = (self.keys[prefill as usize], self.keys[decode as usize]);
        self.entries[entry as usize].record_pair(prefill, decode, now_ns / 1_000_000);
    }

    /// Node `entry`'s view at `now_ns`, as the sidecar builds its candidates, and the node of
    /// each peer; prunes the entry's state now and then.
    fn peers<'v>(
        &mut self,
        entry: u32,
        view: View<'v>,
        now_ns: u64,
    ) -> (Vec<PeerInput<'v>>, Vec<u32>) {
        let View {
            published,
            lags,
            live,
        } = view;
        let now_ms = now_ns / 1_000_000;
        // A zoned entry node routes within its zone: it sees only its zone's summaries, and
        // with other zones' nodes as candidates every prefix cached elsewhere would look cold
        // and be sent by rendezvous to one home node by all zones at once (measured: imbalance
        // 33-42 at 4,096-10,000 nodes, see docs/scaling.md).
        let range = match self.visibility {
            Visibility::Zone(size) => {
                let start = entry as usize / size * size;
                start..(start + size).min(published.len())
            }
            _ => 0..published.len(),
        };
        let mut peers = Vec::with_capacity(range.len());
        let mut nodes = Vec::with_capacity(range.len());
        for (offset, view) in published[range.clone()].iter().enumerate() {
            let p = (range.start + offset) as u32;
            let class = lags.class_of(entry, p);
            let Some((digest, received_ns)) = view.digest(lags, class, now_ns) else {
                continue;
            };
            peers.push(PeerInput {
                key: self.keys[p as usize],
                digest,
                digest_received_ms: received_ns / 1_000_000,
                summary: if self.visibility.sees(entry, p) {
                    view.summary(class)
                } else {
                    None
                },
                // The modelled engines have no offload tier.
                offload: None,
                live: (p == entry).then_some(live),
            });
            nodes.push(p);
        }
        let me = entry as usize;
        if now_ms >= self.pruned_ms[me] + PRUNE_EVERY_MS {
            // Only the time to live prunes here: `pending` already ignores sends older than
            // each peer's latest digest.
            self.entries[me].prune(now_ms, |_| 0);
            self.pruned_ms[me] = now_ms;
        }
        (peers, nodes)
    }
}
