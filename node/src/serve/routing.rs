//! From this node's view of the cluster to the lifecycle's peers, and from its plan back to
//! forwarding targets. All judgement is in `protocol` (`lifecycle::EntryState::route`, which
//! runs `decide`); this only gathers its inputs.

use crate::forward::entry::Target;
use crate::serve::state::{AppState, lock};
use kvmesh_protocol::lifecycle::{PeerInput, Plan};
use kvmesh_protocol::route::{RouteError, node_key};
use kvmesh_protocol::{LoadDigest, RequestHashes, Role, RouteRequest};

/// A routed request: its plan, and the target of each candidate the plan refers to.
pub struct Routed {
    pub plan: Plan,
    pub targets: Vec<Target>,
}

pub enum RouteFailure {
    /// No live node serves the model at all; the models that are served.
    UnknownModel(Vec<String>),
    /// Some node serves it, none can take it now.
    NoTarget(String),
}

/// `request_id` keys the spread of this request among near-equal engines.
pub fn route(
    state: &AppState,
    hashes: &RequestHashes,
    session: Option<u64>,
    request_id: &str,
) -> Result<Routed, RouteFailure> {
    let now = state.now_ms();
    let view = state.view.load();
    let own = state.self_digest();
    let (own_summary, own_offload) = {
        let prefixes = lock(&state.prefixes);
        (prefixes.own_summary(), prefixes.own_offload())
    };
    let mut peers = Vec::with_capacity(view.peers.len() + 1);
    let mut targets = Vec::with_capacity(view.peers.len() + 1);
    if let Some((digest, received)) = &own {
        peers.push(PeerInput {
            key: state.node_key,
            digest,
            digest_received_ms: *received,
            summary: Some(&own_summary),
            offload: Some(&own_offload),
            // This node counts its own engine's queue exactly, every send included.
            live: Some(state.engine_queue.gauges()),
        });
        targets.push(Target::Local);
    }
    for peer in &view.peers {
        let Some(digest) = &peer.digest else { continue };
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
    let request = RouteRequest {
        model: &hashes.model,
        chain: &hashes.chain,
        prompt_tokens: hashes.prompt_tokens,
        tokens_per_block: hashes.tokens_per_block,
        session,
        role: Role::Mixed,
        spread: Some(node_key(request_id)),
    };
    let planned = lock(&state.entry).route(&peers, &request, &state.config.route, now);
    match planned {
        Ok(plan) => Ok(Routed {
            plan: plan.with_retries(state.config.retries as u32),
            targets,
        }),
        Err(RouteError::NoCandidate(model)) => {
            if peers.iter().any(|p| p.digest.serves(&model)) {
                Err(RouteFailure::NoTarget(model))
            } else {
                Err(RouteFailure::UnknownModel(served_models(
                    peers.iter().map(|p| p.digest),
                )))
            }
        }
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
