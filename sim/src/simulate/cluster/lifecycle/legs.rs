//! The two legs of a disaggregated request, as the sidecars run them (issue 15):
//!
//! 1. At arrival the entry decides (`route_pd`); a split request's prefill leg goes to a
//!    prefill engine with `max_tokens=1`, which computes the prompt and holds its blocks.
//! 2. The prefill leg's answer reaches the entry one hop after the engine finished it. The
//!    entry then plans the decode leg on the load it knows at that instant (`route_decode`,
//!    runtime redirection), or sends the one it planned at arrival (`--pd-decode arrival`).
//! 3. The decode engine admits the leg when the whole prompt fits in its free KV, pulls the
//!    blocks it does not hold from the prefill engine (a handshake on the pair's first
//!    contact, started when the leg arrives as vLLM does, then blocks × the transfer time per
//!    block; [`super::super::transfer`]), and the prefill engine frees them at once (the READ
//!    notification). The entry records the pair (`record_pair`) when the decode leg starts,
//!    then it decodes.

use kvmesh_protocol::lifecycle::{Attempt, PdReason, Plan};
use kvmesh_protocol::route::{PdConfig, RouteError};

use super::{Event, Loop, kvmesh_of, next_attempt, route_request, schedule, send, served, view};
use crate::simulate::cluster::{Leg, Prepared, Sim};
use crate::simulate::pd::DecodeChoice;
use crate::simulate::policy::kvmesh::{Placement, Routed};

/// A decode leg planned at arrival, with its attempt already counted at its engine (as the
/// central routers count a pair's load from its selection).
pub(super) struct EarlyDecode {
    plan: Plan,
    nodes: Vec<u32>,
    attempt: Attempt,
}

/// Counts what became of disaggregation for an arrival; returns the plan of its first leg.
pub(super) fn first_leg(sim: &mut Sim<'_>, placement: Placement) -> (Routed, Leg) {
    let (routed, leg, reason) = match placement {
        Placement::Whole(routed, reason) => (routed, Leg::Whole, reason),
        Placement::Split(routed) => (routed, Leg::Prefill, Some(PdReason::Pd)),
    };
    if let Some(reason) = reason {
        *sim.pd_reasons
            .entry(reason.as_str().to_owned())
            .or_default() += 1;
    }
    (routed, leg)
}

/// Plans the decode leg of `prepared`, which entered at `entry` and prefilled on `prefill`, on
/// what `entry` knows at `now`.
fn route_decode(
    sim: &mut Sim<'_>,
    prepared: &Prepared,
    entry: u32,
    prefill: u32,
    pd: &PdConfig,
    now: u64,
) -> Result<Routed, RouteError> {
    let request = route_request(prepared);
    let view = view(&sim.gossip, &sim.nodes, entry, now);
    let route = &sim.config.route;
    kvmesh_of(&mut sim.router).route_decode(entry, &request, prefill, view, route, pd, now)
}

/// With `--pd-decode arrival`: plans request `id`'s decode leg now, beside its prefill leg's
/// first choice, and counts it at its decode engine from now on.
pub(super) fn plan_decode_at_arrival(sim: &mut Sim<'_>, state: &mut Loop, id: u64, now: u64) {
    let Some(pd) = sim
        .config
        .pd
        .filter(|pd| pd.decode_choice == DecodeChoice::Arrival)
    else {
        return;
    };
    let routing = state.routing.get_mut(&id).expect("routing");
    let Some(first) = routing.plan.ranked_keys().next() else {
        return;
    };
    let Some(&prefill) = routing
        .nodes
        .iter()
        .find(|&&node| sim.nodes[node as usize].key == first)
    else {
        return;
    };
    let prepared = routing.prepared.as_ref().expect("not admitted yet");
    let planned = route_decode(sim, prepared, routing.entry, prefill, &pd.config, now);
    // No decode engine in view: the decode leg is planned when the prefill answers instead.
    let Ok(Routed { mut plan, nodes }) = planned else {
        return;
    };
    let kvmesh = kvmesh_of(&mut sim.router);
    let Some(attempt) =
        plan.next_attempt(kvmesh.entry(routing.entry), &routing.chain, now / 1_000_000)
    else {
        return;
    };
    routing.early_decode = Some(Box::new(EarlyDecode {
        plan,
        nodes,
        attempt,
    }));
}

/// Request `id`'s prefill leg on node `node` produced its token (`finished`: and ended).
pub(super) fn prefill_event(
    sim: &mut Sim<'_>,
    state: &mut Loop,
    id: u64,
    node: u32,
    finished: bool,
    at_ns: u64,
) {
    let at_ms = at_ns / 1_000_000;
    let routing = state.routing.get_mut(&id).expect("routing");
    let serving = &mut sim.nodes[node as usize].serving;
    if !served(serving, &mut sim.router, routing, finished, at_ms) {
        return;
    }
    sim.prefill_legs.remove(&id);
    // The answer (a non-streamed body with `kv_transfer_params`) goes back to the entry.
    if routing.entry == node {
        prefill_answered(sim, state, id, at_ns);
    } else {
        let at = at_ns + state.hop_ns;
        state.push(at, Event::PrefillAnswer { id });
    }
}

/// The entry has request `id`'s prefill answer: its decode leg goes out.
pub(super) fn prefill_answered(sim: &mut Sim<'_>, state: &mut Loop, id: u64, now: u64) {
    let kvmesh = kvmesh_of(&mut sim.router);
    let routing = state.routing.get_mut(&id).expect("routing");
    routing.plan.ended(kvmesh.entry(routing.entry));
    let prefill = routing.prefill_node.expect("answered after its admission");
    let (plan, nodes, attempt) = match routing.early_decode.take() {
        Some(early) => (early.plan, early.nodes, Some(early.attempt)),
        None => {
            let pd = sim.config.pd.expect("split in a disaggregated cluster");
            let prepared = routing.prepared.as_ref().expect("kept for the decode leg");
            let planned = route_decode(sim, prepared, routing.entry, prefill, &pd.config, now);
            match planned {
                Ok(Routed { plan, nodes }) => (plan, nodes, None),
                Err(_) => {
                    // Not expected: every decode engine's digest is known from the start.
                    *sim.reasons.entry("no-decode".into()).or_default() += 1;
                    super::give_up(sim, state, id);
                    return;
                }
            }
        }
    };
    let routing = state.routing.get_mut(&id).expect("routing");
    routing.plan = plan;
    routing.nodes = nodes;
    routing.leg = Leg::Decode;
    routing.attempt = None;
    routing.ticket = None;
    routing.started = false;
    routing.finished = false;
    match attempt {
        Some(attempt) => send(sim, state, id, attempt, now),
        None => next_attempt(sim, state, id, now),
    }
}

/// Request `id`'s decode leg reached node `node`'s engine (see [`Sim::track_decode`]).
pub(super) fn track(sim: &mut Sim<'_>, state: &Loop, id: u64, node: u32, now: u64) {
    if let Some(prefill) = state.routing.get(&id).and_then(|r| r.prefill_node) {
        sim.track_decode(id, prefill, node, now);
    }
}

/// The pulls node `node`'s engine asked for: each ends at its arrival.
pub(super) fn start_pulls(sim: &mut Sim<'_>, state: &mut Loop, node: u32, now: u64) {
    for (at, id) in sim.start_pulls(node, now) {
        state.push(at, Event::Pulled { id, node });
    }
}

/// Request `id`'s KV arrived at node `node`.
pub(super) fn pulled(sim: &mut Sim<'_>, state: &mut Loop, id: u64, node: u32, now: u64) {
    for woken in sim.pulled(id, node, now) {
        schedule(&mut sim.nodes[woken as usize], woken, now, state);
    }
}
