//! From this node's view of the cluster to `protocol::decide`'s candidates, and back to
//! forwarding targets. All judgement is in `decide`; this only gathers its inputs.

use crate::forward::entry::Target;
use crate::serve::state::{AppState, lock};
use kvmesh_protocol::route::{RouteError, decide, node_key};
use kvmesh_protocol::{Candidate, LoadDigest, RequestHashes, Role, RouteReason, RouteRequest};

/// A routed request: targets in rank order.
pub struct Routed {
    pub targets: Vec<Target>,
    pub target_keys: Vec<u64>,
    pub reason: RouteReason,
    pub matched_blocks: u32,
    /// No engine held the prompt's first block: a new prefix (see `serve::new_prefixes`).
    pub new_prefix: bool,
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
    let ledger = lock(&state.ledger);
    let recent = lock(&state.recent);
    // Only nodes recently sent this chain's first block can have an optimistic match.
    let recently_sent: Vec<u64> = recent.nodes_with_first(&hashes.chain, now).collect();
    let recent_match = |key: u64| {
        if recently_sent.contains(&key) {
            recent.matched(key, &hashes.chain, now)
        } else {
            0
        }
    };

    let mut candidates = Vec::with_capacity(view.peers.len() + 1);
    let mut targets = Vec::with_capacity(view.peers.len() + 1);
    if let Some((digest, received)) = &own {
        candidates.push(Candidate {
            node_key: state.node_key,
            digest,
            summary: Some(&own_summary),
            offload: Some(&own_offload),
            digest_received_ms: *received,
            pending: ledger.pending(state.node_key, *received, now),
            recent_match: recent_match(state.node_key),
        });
        targets.push(Target::Local);
    }
    for peer in &view.peers {
        let Some(digest) = &peer.digest else { continue };
        candidates.push(Candidate {
            node_key: peer.key,
            digest,
            summary: Some(&peer.summary),
            offload: Some(&peer.offload),
            digest_received_ms: peer.digest_received_ms,
            pending: ledger.pending(peer.key, peer.digest_received_ms, now),
            recent_match: recent_match(peer.key),
        });
        targets.push(Target::Peer {
            name: peer.name.clone(),
            addr: peer.mesh_addr,
        });
    }
    drop(recent);
    drop(ledger);

    let request = RouteRequest {
        model: &hashes.model,
        chain: &hashes.chain,
        prompt_tokens: hashes.prompt_tokens,
        tokens_per_block: hashes.tokens_per_block,
        session,
        role: Role::Mixed,
        spread: Some(node_key(request_id)),
    };
    match decide(&candidates, &request, &state.config.route, now) {
        Ok(decision) => Ok(Routed {
            target_keys: decision
                .ranked
                .iter()
                .map(|&i| candidates[i].node_key)
                .collect(),
            targets: decision
                .ranked
                .iter()
                .map(|&i| targets[i].clone())
                .collect(),
            reason: decision.reason,
            matched_blocks: decision.matched_blocks,
            new_prefix: decision.new_prefix,
        }),
        Err(RouteError::NoCandidate(model)) => {
            if candidates.iter().any(|c| c.digest.serves(&model)) {
                Err(RouteFailure::NoTarget(model))
            } else {
                Err(RouteFailure::UnknownModel(served_models(
                    candidates.iter().map(|c| c.digest),
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
