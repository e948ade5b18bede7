//! The event loop of the gossiping policies: every request's lifecycle in simulated time, as
//! the sidecars run it (`protocol::lifecycle`).
//!
//! An arrival is ranked at its entry node over that node's view (gossiped digests and
//! summaries at their lag, its own engine read live) and attempted in rank order. An attempt
//! reaches a peer one mesh hop later, where the peer's serving state admits it (the engine gets
//! it then) or declines it; the answer or the decline, with the peer's load report, reaches the
//! entry one hop after that, and a declined request's next attempt leaves at once. A request
//! served by a peer gets its first token (and its end) one hop after the engine produced it.
//! At every digest tick each node reads its engine's gauges into its serving state and
//! publishes its digest and changed summary shards (on `threads` threads: nodes are
//! independent there).
//!
//! Events at equal times run engines first, then the tick, then attempts and replies (in the
//! order they were sent), then arrivals; the outcome is the same for any thread count.
//!
//! In a disaggregated cluster a request may run as two legs ([`legs`]): its prefill leg on a
//! prefill engine, whose answer reaches the entry one hop after the engine finished it, then
//! its decode leg on a decode engine, which pulls the prompt's KV before it decodes.

mod legs;

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use kvmesh_protocol::lifecycle::{Attempt, Outcome, Plan, Progress, ServingState, Ticket};
use kvmesh_protocol::summary::ShardWire;
use kvmesh_protocol::{Role, RouteRequest};

use super::{Gossip, Leg, Prepared, Router, Sim};
use crate::simulate::gossip::view::{LagClasses, Published};
use crate::simulate::node::{EngineEvent, MODEL, SimNode};
use crate::simulate::policy::PolicyKind;
use crate::simulate::policy::kvmesh::{Kvmesh, View};
use crate::simulate::prompt::BLOCK_TOKENS;
use crate::simulate::workload::SimRequest;

/// What happens at an instant, in the order events at one instant run.
#[derive(Copy, Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Event {
    /// An engine's next step is due.
    Engine(u32),
    /// Every node polls its engine and publishes.
    Tick,
    /// The node publishes its digest, its queue having changed (see
    /// `ClusterConfig::publish_coalesce_s`).
    Publish(u32),
    /// An attempt of request `id` reaches node `node`.
    Attempt { id: u64, node: u32 },
    /// The answer to an attempt of request `id` reaches its entry.
    Reply { id: u64 },
    /// The answer of request `id`'s prefill leg reaches its entry.
    PrefillAnswer { id: u64 },
    /// The KV of request `id`'s decode leg arrived at node `node`'s engine.
    Pulled { id: u64, node: u32 },
}

/// A request between its arrival and its end.
struct Routing {
    entry: u32,
    plan: Plan,
    /// The node of each candidate the plan refers to.
    nodes: Vec<u32>,
    chain: Vec<u64>,
    /// Taken when an engine admits it.
    prepared: Option<Prepared>,
    attempt: Option<Attempt>,
    /// The outcome on its way back to the entry.
    reply: Option<Outcome>,
    ticket: Option<Ticket>,
    /// The entry heard that it started.
    started: bool,
    /// The engine finished it (possibly before its entry heard it started).
    finished: bool,
    /// Which leg the plan places.
    leg: Leg,
    /// The node that ran its prefill leg, once admitted there.
    prefill_node: Option<u32>,
    /// Its decode leg's plan and first attempt, when chosen at arrival.
    early_decode: Option<Box<legs::EarlyDecode>>,
}

struct Loop {
    heap: BinaryHeap<Reverse<(u64, Event, u64)>>,
    seq: u64,
    routing: HashMap<u64, Routing>,
    hop_ns: u64,
    /// From a change at a node to its publication; 0: none between ticks.
    coalesce_ns: u64,
    /// Per node, whether a publication is due (one [`Event::Publish`] in the heap).
    publish_due: Vec<bool>,
}

impl Loop {
    fn push(&mut self, at: u64, event: Event) {
        self.seq += 1;
        self.heap.push(Reverse((at, event, self.seq)));
    }

    /// Node `node`'s queue changed at `now` (a request admitted, begun or ended): it publishes
    /// its digest within the coalescing delay, with whatever else changes meanwhile (the
    /// sidecar's `PublishSoon`).
    fn changed(&mut self, node: u32, now: u64) {
        let due = &mut self.publish_due[node as usize];
        if self.coalesce_ns > 0 && !*due {
            *due = true;
            self.push(now + self.coalesce_ns, Event::Publish(node));
        }
    }
}

pub(super) fn run(sim: &mut Sim<'_>, requests: impl Iterator<Item = SimRequest>) {
    let tick_ns = (sim.config.digest_interval_s * 1e9).max(1.0) as u64;
    let mut state = Loop {
        heap: BinaryHeap::new(),
        seq: 0,
        routing: HashMap::new(),
        hop_ns: sim.config.mesh_hop_ns,
        coalesce_ns: (sim.config.publish_coalesce_s * 1e9) as u64,
        publish_due: vec![false; sim.nodes.len()],
    };
    state.push(0, Event::Tick);
    let mut requests = requests.peekable();
    let mut outputs = Vec::new();
    let mut events = Vec::new();
    loop {
        let t_event = state.heap.peek().map_or(u64::MAX, |Reverse((t, ..))| *t);
        let t_arrival = requests.peek().map_or(u64::MAX, |r| r.arrival_ns);
        if t_event == u64::MAX && t_arrival == u64::MAX {
            break;
        }
        if t_arrival < t_event {
            let request = requests.next().expect("peeked");
            arrive(sim, &mut state, &request);
            continue;
        }
        let Reverse((now, event, _)) = state.heap.pop().expect("peeked");
        match event {
            Event::Engine(i) => {
                let node = &mut sim.nodes[i as usize];
                events.clear();
                if !node.wake(now, &mut outputs, &mut events) {
                    continue;
                }
                schedule(node, i, now, &mut state);
                legs::start_pulls(sim, &mut state, i, now);
                engine_events(sim, &mut state, i, &events);
                if !events.is_empty() {
                    state.changed(i, now);
                }
            }
            Event::Publish(i) => {
                state.publish_due[i as usize] = false;
                publish_digest_now(sim, i as usize, now);
            }
            Event::Tick => {
                tick(sim, now);
                let done = requests.peek().is_none()
                    && state.routing.is_empty()
                    && sim.nodes.iter().all(|node| node.engine.is_idle());
                if !done {
                    state.push(now + tick_ns, Event::Tick);
                }
            }
            Event::Attempt { id, node } => admit(sim, &mut state, id, node, now),
            Event::Reply { id } => {
                let outcome = state
                    .routing
                    .get_mut(&id)
                    .and_then(|r| r.reply.take())
                    .expect("a reply is sent with its outcome");
                reply(sim, &mut state, id, outcome, now);
            }
            Event::PrefillAnswer { id } => legs::prefill_answered(sim, &mut state, id, now),
            Event::Pulled { id, node } => legs::pulled(sim, &mut state, id, node, now),
        }
    }
}

/// Ranks an arrival at its entry node and makes its first attempt.
fn arrive(sim: &mut Sim<'_>, state: &mut Loop, request: &SimRequest) {
    let Some(prepared) = sim.prepare(request) else {
        return;
    };
    let (id, entry, now) = (prepared.id, prepared.entry, prepared.now);
    let route_request = route_request(&prepared);
    let view = view(&sim.gossip, &sim.nodes, entry, now);
    let kvmesh = kvmesh_of(&mut sim.router);
    let config = sim.config;
    let routed = match config.pd {
        None => kvmesh
            .route(entry, &route_request, view, &config.route, now)
            .map(|routed| (routed, Leg::Whole)),
        Some(pd) => {
            let placement =
                kvmesh.route_pd(entry, &route_request, view, &config.route, &pd.config, now);
            placement.map(|placement| legs::first_leg(sim, placement))
        }
    };
    let Ok((routed, leg)) = routed else {
        // Not expected: every node has its own digest from the first tick, which runs before
        // any arrival, and every modelled engine serves the model.
        *sim.reasons.entry("no-view".into()).or_default() += 1;
        sim.rejected += 1;
        return;
    };
    let reason = routed.plan.reason().as_str();
    *sim.reasons.entry(reason.to_string()).or_default() += 1;
    sim.records[id as usize].reason = Some(reason);
    state.routing.insert(
        id,
        Routing {
            entry,
            plan: routed.plan,
            nodes: routed.nodes,
            chain: prepared.chain.clone(),
            prepared: Some(prepared),
            attempt: None,
            reply: None,
            ticket: None,
            started: false,
            finished: false,
            leg,
            prefill_node: None,
            early_decode: None,
        },
    );
    if leg == Leg::Prefill {
        legs::plan_decode_at_arrival(sim, state, id, now);
    }
    next_attempt(sim, state, id, now);
}

/// What the routing decisions get of a request.
fn route_request(prepared: &Prepared) -> RouteRequest<'_> {
    RouteRequest {
        model: MODEL,
        chain: &prepared.chain,
        prompt_tokens: prepared.tokens.len() as u32,
        tokens_per_block: BLOCK_TOKENS as f32,
        session: prepared.session,
        role: Role::Mixed,
        spread: Some(prepared.spread),
        popular: &[],
        prefixes_recur: true,
    }
}

/// Node `entry`'s view of the cluster at `now` (ns; from the gossip model and the nodes:
/// borrowing those alone leaves the router free to use it).
fn view<'s>(gossip: &'s Option<Gossip>, nodes: &[SimNode], entry: u32, now: u64) -> View<'s> {
    let g = gossip.as_ref().expect("gossiping policies");
    View {
        published: &g.published,
        lags: &g.lags,
        live: nodes[entry as usize].serving.gauges(now / 1_000_000),
    }
}

/// Makes the plan's next attempt: locally at once, to a peer one hop later.
fn next_attempt(sim: &mut Sim<'_>, state: &mut Loop, id: u64, now: u64) {
    let kvmesh = kvmesh_of(&mut sim.router);
    let routing = state.routing.get_mut(&id).expect("routing");
    let attempt =
        routing
            .plan
            .next_attempt(kvmesh.entry(routing.entry), &routing.chain, now / 1_000_000);
    let Some(attempt) = attempt else {
        give_up(sim, state, id);
        return;
    };
    send(sim, state, id, attempt, now);
}

/// Sends `attempt` of request `id`: locally at once, to a peer one hop later.
fn send(sim: &mut Sim<'_>, state: &mut Loop, id: u64, attempt: Attempt, now: u64) {
    let routing = state.routing.get_mut(&id).expect("routing");
    routing.attempt = Some(attempt);
    let (target, entry) = (routing.nodes[attempt.candidate], routing.entry);
    if target == entry {
        admit(sim, state, id, target, now);
    } else {
        let at = now + state.hop_ns;
        state.push(at, Event::Attempt { id, node: target });
    }
}

/// The serving side: node `node`'s sidecar admits the attempt (its engine gets the request)
/// or declines it; the outcome goes back to the entry.
fn admit(sim: &mut Sim<'_>, state: &mut Loop, id: u64, node: u32, now: u64) {
    let routing = &state.routing[&id];
    let attempt = routing.attempt.expect("an attempt in flight");
    let remote = node != routing.entry;
    // The simulated clients stream (TTFT is the first token).
    let admission = attempt.admission(true, routing.plan.prefix_samples());
    let serving = &mut sim.nodes[node as usize].serving;
    let outcome = match serving.admit(&admission, now / 1_000_000) {
        Ok(ticket) => {
            let report = remote.then(|| serving.report(now / 1_000_000));
            let routing = state.routing.get_mut(&id).expect("routing");
            routing.ticket = Some(ticket);
            let leg = routing.leg;
            let prepared = match leg {
                // The decode leg will need the prompt again.
                Leg::Prefill => {
                    routing.prefill_node = Some(node);
                    routing.prepared.clone().expect("admitted once")
                }
                Leg::Whole | Leg::Decode => routing.prepared.take().expect("admitted once"),
            };
            if leg == Leg::Decode {
                legs::track(sim, state, id, node, now);
            }
            let submission = sim.commit_leg(node as usize, prepared, leg);
            submit(sim, state, node, submission, now);
            state.changed(node, now);
            Outcome::Started(report)
        }
        Err(_) => {
            sim.declines += 1;
            Outcome::Declined(remote.then(|| serving.report(now / 1_000_000)))
        }
    };
    if remote {
        let routing = state.routing.get_mut(&id).expect("routing");
        routing.reply = Some(outcome);
        let at = now + state.hop_ns;
        state.push(at, Event::Reply { id });
    } else {
        reply(sim, state, id, outcome, now);
    }
}

/// The entry learns how its attempt went.
fn reply(sim: &mut Sim<'_>, state: &mut Loop, id: u64, outcome: Outcome, now: u64) {
    let kvmesh = kvmesh_of(&mut sim.router);
    let routing = state.routing.get_mut(&id).expect("routing");
    let entry = kvmesh.entry(routing.entry);
    let progress = routing
        .plan
        .on_outcome(entry, &routing.chain, outcome, now / 1_000_000);
    match progress {
        Progress::Served => {
            routing.started = true;
            // The reason the node reports with the answer: the served attempt's (`declined`
            // after a decline). A split request keeps its first leg's.
            if let (Leg::Whole, Some(attempt)) = (routing.leg, routing.attempt) {
                sim.records[id as usize].reason = Some(attempt.reason.as_str());
            }
            match (routing.leg, routing.prefill_node, routing.attempt) {
                // The prefill leg ends when its answer reaches the entry.
                (Leg::Prefill, ..) => {}
                (Leg::Decode, Some(prefill), Some(attempt)) => {
                    let decode = routing.nodes[attempt.candidate];
                    kvmesh.record_pair(routing.entry, prefill, decode, now);
                }
                _ => {}
            }
            let routing = state.routing.get_mut(&id).expect("routing");
            if routing.finished && routing.leg != Leg::Prefill {
                routing.plan.ended(kvmesh.entry(routing.entry));
                state.routing.remove(&id);
            }
        }
        Progress::TryNext => next_attempt(sim, state, id, now),
        Progress::GaveUp { .. } => give_up(sim, state, id),
    }
}

/// No attempt is left (not expected: nothing fails in the model, and a request's last attempt
/// is never declined).
fn give_up(sim: &mut Sim<'_>, state: &mut Loop, id: u64) {
    state.routing.remove(&id);
    sim.rejected += 1;
}

/// Hands a request to node `node`'s engine at `now`.
fn submit(sim: &mut Sim<'_>, state: &mut Loop, node: u32, submission: super::Submission, now: u64) {
    let target = submission.target;
    let engine = &mut sim.nodes[target];
    if engine.submit(submission.request, now) {
        schedule(engine, node, now, state);
    } else {
        sim.refused(target);
    }
}

/// What an engine step did: the serving sidecar sees first bytes and ends, the entry the
/// ends; a peer's answer reaches its client one hop later.
fn engine_events(sim: &mut Sim<'_>, state: &mut Loop, node: u32, events: &[EngineEvent]) {
    sim.apply(node as usize, events);
    for event in events {
        let (request, finished, at_ns) = match *event {
            EngineEvent::FirstToken { request, at_ns } => (request, false, at_ns),
            EngineEvent::Finished { request, at_ns, .. } => (request, true, at_ns),
        };
        let at_ms = at_ns / 1_000_000;
        let Some(routing) = state.routing.get_mut(&request) else {
            continue;
        };
        if routing.leg == Leg::Prefill && routing.prefill_node == Some(node) {
            legs::prefill_event(sim, state, request, node, finished, at_ns);
            continue;
        }
        let serving = &mut sim.nodes[node as usize].serving;
        if routing.entry != node {
            let record = &mut sim.records[request as usize];
            if finished {
                record.done_ns += state.hop_ns;
            } else {
                record.first_ns += state.hop_ns;
            }
        }
        if !served(serving, &mut sim.router, routing, finished, at_ms) {
            continue;
        }
        if routing.started {
            let kvmesh = kvmesh_of(&mut sim.router);
            routing.plan.ended(kvmesh.entry(routing.entry));
            state.routing.remove(&request);
        }
    }
}

/// Every node reads its engine's gauges and publishes.
fn tick(sim: &mut Sim<'_>, now: u64) {
    let summaries = matches!(sim.policy, PolicyKind::Kvmesh | PolicyKind::KvmeshZoned);
    let threads = sim.config.threads.max(1);
    let n = sim.nodes.len();
    let g = sim.gossip.as_mut().expect("the lifecycle loop gossips");
    let lags = &g.lags;
    let chunk = n.div_ceil(threads);
    // A node that has not joined yet publishes nothing (see `Join`).
    let up = sim.config.nodes_up(now);
    let results: Vec<TickTotals> = std::thread::scope(|scope| {
        let mut handles = Vec::new();
        let mut parts = sim
            .nodes
            .chunks_mut(chunk)
            .zip(g.published.chunks_mut(chunk))
            .zip(g.unpublished_prefixes.chunks_mut(chunk))
            .enumerate()
            .peekable();
        let mut last = None;
        while let Some((part, ((nodes, published), unpublished))) = parts.next() {
            let up_here = up.saturating_sub(part * chunk);
            let work = move || {
                let mut totals = TickTotals::default();
                let nodes = nodes.iter_mut().zip(published).zip(unpublished);
                for ((node, view), waiting) in nodes.take(up_here) {
                    node.poll(now);
                    publish(node, view, waiting, &mut totals, lags, summaries, now);
                }
                totals
            };
            if parts.peek().is_some() {
                handles.push(scope.spawn(work));
            } else {
                last = Some(work());
            }
        }
        let mut results: Vec<TickTotals> = handles
            .into_iter()
            .map(|h| h.join().expect("a publishing thread panicked"))
            .collect();
        results.extend(last);
        results
    });
    for totals in results {
        g.digest_bytes += totals.digest_bytes;
        g.summary_bytes += totals.summary_bytes;
        g.publish_waits_s.extend(totals.publish_waits_s);
    }
}

/// What the nodes of one thread published at a tick.
#[derive(Default)]
struct TickTotals {
    digest_bytes: u64,
    summary_bytes: u64,
    publish_waits_s: Vec<f64>,
}

/// Node `index` publishes its digest between ticks, without polling its engine (a node not
/// yet joined publishes nothing).
fn publish_digest_now(sim: &mut Sim<'_>, index: usize, now: u64) {
    if index >= sim.config.nodes_up(now) {
        return;
    }
    let g = sim.gossip.as_mut().expect("the lifecycle loop gossips");
    let mut totals = TickTotals::default();
    let view = &mut g.published[index];
    publish_digest(&mut sim.nodes[index], view, &mut totals, now);
    view.sync_all_and_trim(&g.lags, now);
    g.digest_bytes += totals.digest_bytes;
}

/// The node publishes its digest, when the sidecar would.
fn publish_digest(node: &mut SimNode, view: &mut Published, totals: &mut TickTotals, now: u64) {
    let digest = node.digest(now);
    if node.should_gossip(&digest, now) {
        totals.digest_bytes += digest.encode().len() as u64;
        view.publish_digest(now, digest);
    }
}

/// The node publishes its digest (when the sidecar would) and its changed shards.
fn publish(
    node: &mut SimNode,
    view: &mut Published,
    unpublished: &mut Vec<u64>,
    totals: &mut TickTotals,
    lags: &LagClasses,
    summaries: bool,
    now: u64,
) {
    publish_digest(node, view, totals, now);
    // kvmesh-local gossips no summary (and nobody reads one).
    let changed = node.summary.publish_dirty();
    if summaries {
        let shards: Vec<_> = changed
            .into_iter()
            .filter_map(|shard| {
                totals.summary_bytes += shard.bytes.len() as u64;
                ShardWire::decode(&shard.bytes).ok()
            })
            .collect();
        view.publish_shards(now, shards);
        totals.publish_waits_s.extend(
            unpublished
                .drain(..)
                .map(|at| now.saturating_sub(at) as f64 / 1e9),
        );
    } else {
        unpublished.clear();
    }
    view.sync_all_and_trim(lags, now);
}

/// The gossiping policies' router: the only one this loop runs.
/// A leg's first token (`finished` false) or its end at its serving node: its ticket in that
/// node's queue, and the entry's plan told of the first byte. Whether the leg ended.
fn served(
    serving: &mut ServingState,
    router: &mut Router,
    routing: &mut Routing,
    finished: bool,
    at_ms: u64,
) -> bool {
    if !finished {
        if let Some(ticket) = routing.ticket.as_mut() {
            serving.started(ticket, at_ms);
        }
        if routing.started {
            routing
                .plan
                .first_byte(kvmesh_of(router).entry(routing.entry));
        }
        return false;
    }
    if let Some(ticket) = routing.ticket.take() {
        serving.finished(ticket, at_ms);
    }
    routing.finished = true;
    true
}

fn kvmesh_of(router: &mut Router) -> &mut Kvmesh {
    match router {
        Router::Kvmesh(kvmesh) => kvmesh,
        _ => unreachable!("only kvmesh runs the lifecycle"),
    }
}

fn schedule(node: &mut SimNode, index: u32, now: u64, state: &mut Loop) {
    if let Some(at) = node.next_wake(now) {
        state.push(at, Event::Engine(index));
    }
}
