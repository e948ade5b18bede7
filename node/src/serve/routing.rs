//! From this node's view of the cluster to the lifecycle's peers, and from its plans back to
//! forwarding targets. All judgement is in `protocol` (`lifecycle::EntryState::route_pd` and
//! `route_decode`, which run `decide`); this only gathers their inputs, from a snapshot taken
//! when each leg is placed.

use crate::forward::entry::Target;
use crate::serve::state::{AppState, lock};
use crate::view::ClusterView;
use kvmesh_protocol::lifecycle::{PdReason, PdRoute, PeerInput, Plan};
use kvmesh_protocol::route::{
    AdapterHost, Gauges, RouteConfig, RouteError, node_key, place_adapter,
};
use kvmesh_protocol::summary::PeerSummary;
use kvmesh_protocol::{LoadDigest, RequestHashes, Role, RouteRequest};
use std::sync::Arc;

/// A planned leg: its plan, and the target of each candidate the plan refers to.
pub struct Routed {
    pub plan: Plan,
    pub targets: Vec<Target>,
}

/// How a request is to be served.
pub enum Placement {
    /// On one engine; `pd` says why it was not disaggregated (`None`: nothing to say, the
    /// cluster has no prefill engine for its model).
    Whole {
        routed: Routed,
        pd: Option<PdReason>,
    },
    /// Its prefill leg first; the decode leg is placed when that answers.
    Split { prefill: Routed },
    /// On the engine chosen to load the adapter it names, which no engine serves yet (its
    /// sidecar loads it first).
    LoadAdapter { routed: Routed },
}

pub enum RouteFailure {
    /// No live node serves the model at all; the models that are served.
    UnknownModel(Vec<String>),
    /// Some node serves it, none can take it now.
    NoTarget(String),
}

/// This node's view of the engines at one moment.
struct Snapshot {
    view: Arc<ClusterView>,
    own: Option<(Arc<LoadDigest>, u64)>,
    own_summary: Arc<PeerSummary>,
    own_offload: Arc<PeerSummary>,
    live: Gauges,
}

impl Snapshot {
    fn take(state: &AppState) -> Self {
        let (own_summary, own_offload) = {
            let prefixes = lock(&state.prefixes);
            (prefixes.own_summary(), prefixes.own_offload())
        };
        Self {
            view: state.view.load(),
            own: state.self_digest(),
            own_summary,
            own_offload,
            live: state.engine_queue.gauges(),
        }
    }

    /// Where an adapter no engine serves is to be loaded, and its base model: the same
    /// engine every entry node with this view picks (see `place_adapter`).
    fn adapter_home(&self, state: &AppState, adapter: &str, now_ms: u64) -> Option<(u64, String)> {
        let fresh =
            |received: u64| now_ms.saturating_sub(received) <= state.config.route.max_digest_age_ms;
        let own = self.own.as_ref().map(|(digest, received)| AdapterHost {
            node_key: state.node_key,
            digest,
            loadable: &state.config.lora.loadable,
            fresh: fresh(*received),
        });
        let peers = self.view.peers.iter().filter_map(|peer| {
            Some(AdapterHost {
                node_key: peer.key,
                digest: peer.digest.as_deref()?,
                loadable: &peer.loadable,
                fresh: fresh(peer.digest_received_ms),
            })
        });
        let hosts: Vec<AdapterHost<'_>> = own.into_iter().chain(peers).collect();
        let placed = place_adapter(adapter, &hosts)?;
        Some((hosts[placed.ranked[0]].node_key, placed.base))
    }

    /// The lifecycle's peers that `filter` keeps, and where each is reached.
    fn peers(&self, state: &AppState, filter: Filter) -> (Vec<PeerInput<'_>>, Vec<Target>) {
        let mut peers = Vec::with_capacity(self.view.peers.len() + 1);
        let mut targets = Vec::with_capacity(self.view.peers.len() + 1);
        if let Some((digest, received)) = &self.own
            && filter.keeps(state.node_key)
        {
            peers.push(PeerInput {
                key: state.node_key,
                digest,
                digest_received_ms: *received,
                summary: Some(&self.own_summary),
                offload: Some(&self.own_offload),
                // This node counts its own engine's queue exactly, every send included.
                live: Some(self.live),
            });
            targets.push(Target::Local);
        }
        for peer in &self.view.peers {
            let Some(digest) = &peer.digest else { continue };
            if !filter.keeps(peer.key) {
                continue;
            }
            peers.push(PeerInput {
                key: peer.key,
                digest,
                digest_received_ms: peer.digest_received_ms,
                summary: Some(&peer.summary),
                offload: Some(&peer.offload),
                live: None,
            });
            targets.push(Target::Peer {
                name: peer.name.clone(),
                addr: peer.mesh_addr,
            });
        }
        (peers, targets)
    }
}

/// Which nodes a placement considers.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
enum Filter {
    All,
    Except(u64),
    Only(u64),
}

impl Filter {
    fn keeps(self, key: u64) -> bool {
        match self {
            Filter::All => true,
            Filter::Except(excluded) => key != excluded,
            Filter::Only(only) => key == only,
        }
    }
}

/// What the decision needs of a request; `request_id` keys its spread among near-equal
/// engines.
fn route_request<'a>(
    hashes: &'a RequestHashes,
    session: Option<u64>,
    request_id: &str,
) -> RouteRequest<'a> {
    RouteRequest {
        model: &hashes.model,
        chain: &hashes.chain,
        prompt_tokens: hashes.prompt_tokens,
        tokens_per_block: hashes.tokens_per_block,
        session,
        role: Role::Mixed,
        spread: Some(node_key(request_id)),
        popular: &[],
        prefixes_recur: true,
    }
}

/// Places a request as it arrives: whole, or its prefill leg when `disaggregate` allows it
/// and the cluster's state makes it worth it. `excluded`: a node not to consider (one whose
/// prefill's blocks could not be pulled).
pub fn route(
    state: &AppState,
    hashes: &RequestHashes,
    session: Option<u64>,
    request_id: &str,
    disaggregate: bool,
    excluded: Option<u64>,
) -> Result<Placement, RouteFailure> {
    let snapshot = Snapshot::take(state);
    let filter = excluded.map_or(Filter::All, Filter::Except);
    let (peers, targets) = snapshot.peers(state, filter);
    let request = route_request(hashes, session, request_id);
    let now = state.now_ms();
    if !peers.iter().any(|peer| peer.digest.serves(request.model))
        && let Some((home, base)) = snapshot.adapter_home(state, request.model, now)
    {
        // Decided on its base model, on that engine alone: it has no adapter to match.
        let (peers, targets) = snapshot.peers(state, Filter::Only(home));
        let request = RouteRequest {
            model: &base,
            ..request
        };
        let plan = lock(&state.entry).route(&peers, &request, &state.config.route, now);
        let plan = plan.map_err(|error| failure(error, &peers))?;
        return Ok(Placement::LoadAdapter {
            routed: Routed {
                plan: plan.with_retries(state.config.retries as u32),
                targets,
            },
        });
    }
    let mut entry = lock(&state.entry);
    let placed = match disaggregate {
        true => entry.route_pd(&peers, &request, &state.config.route, &state.config.pd, now),
        false => entry
            .route(&peers, &request, &state.config.route, now)
            .map(|plan| PdRoute::Whole { plan, pd: None }),
    };
    let prefixes_recur = entry.prefixes_recur();
    // The load the decision read for its first choice, for `route_load_age_seconds`.
    let load_read = placed
        .as_ref()
        .ok()
        .and_then(|placed| first_leg(placed).ranked_keys().next())
        .and_then(|key| peers.iter().find(|peer| peer.key == key))
        .map(|peer| entry.estimate(peer, now));
    drop(entry);
    state.metrics.prefixes_recur.set(i64::from(prefixes_recur));
    if let Some(load) = load_read {
        let age = now.saturating_sub(load.received_ms);
        state.metrics.route_load_read(load.source, age);
    }
    let retries = state.config.retries as u32;
    let placed = placed.map_err(|error| failure(error, &peers))?;
    if let Some(placement) = first_leg(&placed).popular() {
        state.metrics.popular_prefix_routed(placement);
    }
    match placed {
        PdRoute::Whole { plan, pd } => Ok(Placement::Whole {
            routed: Routed {
                plan: plan.with_retries(retries),
                targets,
            },
            pd,
        }),
        PdRoute::Split { prefill, .. } => Ok(Placement::Split {
            prefill: Routed {
                plan: prefill.with_retries(retries),
                targets,
            },
        }),
    }
}

/// The plan of a placement's first leg: the whole request, or its prefill.
fn first_leg(placed: &PdRoute) -> &Plan {
    match placed {
        PdRoute::Whole { plan, .. } => plan,
        PdRoute::Split { prefill, .. } => prefill,
    }
}

/// Places a whole request on the engines that take one (after a disaggregation failed), or
/// on the prefill engines when no other exists.
pub fn route_whole(
    state: &AppState,
    hashes: &RequestHashes,
    session: Option<u64>,
    request_id: &str,
) -> Result<Routed, RouteFailure> {
    let snapshot = Snapshot::take(state);
    let (peers, targets) = snapshot.peers(state, Filter::All);
    let request = route_request(hashes, session, request_id);
    let now = state.now_ms();
    let planned = lock(&state.entry).route_whole(&peers, &request, &state.config.route, now);
    let (plan, _) = planned.map_err(|error| failure(error, &peers))?;
    Ok(Routed {
        plan: plan.with_retries(state.config.retries as u32),
        targets,
    })
}

/// Places the decode leg of a request whose prefill `prefill_key`'s engine ran, on the load
/// known now.
pub fn route_decode(
    state: &AppState,
    hashes: &RequestHashes,
    prefill_key: u64,
    request_id: &str,
) -> Result<Routed, RouteFailure> {
    let snapshot = Snapshot::take(state);
    let (peers, targets) = snapshot.peers(state, Filter::All);
    let request = route_request(hashes, None, request_id);
    let now = state.now_ms();
    let config = &state.config;
    let plan = lock(&state.entry).route_decode(
        &peers,
        &request,
        prefill_key,
        &config.route,
        &config.pd,
        now,
    );
    let plan = plan.map_err(|error| failure(error, &peers))?;
    Ok(Routed {
        plan: plan.with_retries(config.retries as u32),
        targets,
    })
}

/// Places a request continuing the stored response of the Responses API: on `home`, the
/// node whose engine answered it, when this node knows it and it can take requests; else
/// every engine serving the model is a candidate, in rank order, to be tried in turn until one
/// stores it ([`crate::forward::attempts::Leg::Continuation`]).
pub fn route_continuation(
    state: &AppState,
    hashes: &RequestHashes,
    session: Option<u64>,
    request_id: &str,
    home: Option<u64>,
) -> Result<Routed, RouteFailure> {
    let snapshot = Snapshot::take(state);
    let request = route_request(hashes, session, request_id);
    let now = state.now_ms();
    if let Some(home) = home {
        let (peers, targets) = snapshot.peers(state, Filter::Only(home));
        if let Ok(plan) = lock(&state.entry).route(&peers, &request, &state.config.route, now) {
            let retries = state.config.retries as u32;
            return Ok(Routed {
                plan: plan.with_retries(retries),
                targets,
            });
        }
    }
    let (peers, targets) = snapshot.peers(state, Filter::All);
    let every = RouteConfig {
        ranked_len: peers.len(),
        ..state.config.route
    };
    let plan = lock(&state.entry).route(&peers, &request, &every, now);
    let plan = plan.map_err(|error| failure(error, &peers))?;
    Ok(Routed {
        plan: plan.with_retries(peers.len() as u32),
        targets,
    })
}

fn failure(error: RouteError, peers: &[PeerInput<'_>]) -> RouteFailure {
    let RouteError::NoCandidate(model) = error;
    if peers.iter().any(|p| p.digest.serves(&model)) {
        RouteFailure::NoTarget(model)
    } else {
        RouteFailure::UnknownModel(served_models(peers.iter().map(|p| p.digest)))
    }
}

/// Every model and adapter any live node serves, sorted and deduplicated.
pub fn served_models<'a>(digests: impl Iterator<Item = &'a LoadDigest>) -> Vec<String> {
    let mut models: Vec<String> = digests
        .flat_map(|digest| digest.models.iter().chain(&digest.loras).cloned())
        .collect();
    models.sort();
    models.dedup();
    models
}
