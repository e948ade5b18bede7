//! One cluster, one policy, one request stream: the simulation proper.
//!
//! [`Sim`] holds the cluster (nodes, router, gossip model, records) and routes an arriving
//! request. Two loops drive it in virtual time (nanoseconds):
//!
//! - [`sequential`]: a discrete-event loop over arrivals and engine wake-ups (a min-heap of
//!   each engine's `next_event_time`, stale entries skipped). The centralized policies read
//!   every engine's instantaneous load at each arrival, so they need it.
//! - [`lifecycle`]: for the gossiping policies, the same loop with every request's lifecycle
//!   as the sidecars run it: ranked at its entry from gossiped views, attempted, admitted or
//!   declined by the serving node's exact queue one mesh hop away, answered with a load report
//!   one hop later; digests and summaries published at every tick.

mod central_pd;
mod lifecycle;
mod measure;
mod records;
mod sequential;
mod transfer;

use std::collections::{BTreeMap, HashMap};

use kvmesh_protocol::mix64;

use kvmesh_protocol::{Decision, Role, RouteConfig, RouteRequest, SummaryConfig};

pub use records::{RequestRecord, node_name};

use super::gossip::epidemic::{DelayDistribution, GossipParams};
use super::gossip::view::{LagClasses, Published};
use super::node::{EngineEvent, MODEL, SimNode};
use super::pd::{PdSetup, Slo};
use super::policy::chwbl::Ring;
use super::policy::kvmesh::{Kvmesh, Visibility};
use super::policy::oracle::Oracle;
use super::policy::{PolicyKind, least_loaded, power_of_two, random, round_robin};
use super::prompt::{self, BLOCK_TOKENS};
use super::results::PolicyResult;
use super::workload::SimRequest;
use crate::engine::model::{EngineConfig, EngineRequest, KvTransfer, validate};
use crate::rng::SplitMix64;
use crate::workload::random_target;

/// Everything a run needs besides the requests.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub nodes: usize,
    pub engine: EngineConfig,
    pub summary: SummaryConfig,
    pub route: RouteConfig,
    pub gossip: GossipParams,
    pub digest_interval_s: f64,
    /// A node publishes its digest this long after a change to its queue (a request admitted,
    /// begun or ended), as the sidecar does; 0: only at the digest interval's tick.
    pub publish_coalesce_s: f64,
    pub lag_classes: usize,
    pub chwbl_epsilon: f64,
    /// Nodes per zone of kvmesh-zoned.
    pub zone_size: usize,
    /// Whether a node's own candidate carries its own summary (see `--self-view`).
    pub self_summary: bool,
    /// Threads publishing the nodes' digests and summaries at each tick.
    pub threads: usize,
    /// One-way delay of a message between two sidecars (an attempt, an answer's head, a
    /// decline), nanoseconds.
    pub mesh_hop_ns: u64,
    /// Requests enter at nodes `0..entry_nodes`, uniformly at random (as the load generator
    /// picks its targets: `workload::random_target`).
    pub entry_nodes: usize,
    /// Mixed into every request's spread key: a sidecar keys it by a request id that carries
    /// its clock, so a real run draws it afresh (see `--spread-seed`).
    pub spread_seed: u64,
    /// Disaggregation, if any engine prefills for others.
    pub pd: Option<PdSetup>,
    /// Nodes that join the cluster during the run, if any.
    pub join: Option<Join>,
    /// The objectives goodput counts requests against.
    pub slo: Slo,
    pub seed: u64,
}

/// The last `nodes` nodes of the cluster start at `at_ns`, as a sidecar started with the seed
/// list under load: until then they publish nothing, take no request and are no entry; from
/// then on each peer sees the new node once its first digest has reached it (the gossip lag),
/// and the central policies count it at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Join {
    pub nodes: usize,
    pub at_ns: u64,
}

impl ClusterConfig {
    /// Nodes up at `now_ns`: `0..` the returned count (joining nodes are the last ones).
    pub fn nodes_up(&self, now_ns: u64) -> usize {
        let n = self.nodes.max(1);
        match self.join {
            Some(join) if now_ns < join.at_ns => n - join.nodes.min(n - 1),
            _ => n,
        }
    }
}

fn zone_size(config: &ClusterConfig) -> usize {
    config.zone_size.clamp(1, config.nodes.max(1))
}

#[derive(Debug, Clone, Copy, Default)]
struct Record {
    arrival_ns: u64,
    first_ns: u64,
    done_ns: u64,
    output_tokens: u32,
    /// The node it entered at.
    entry: u32,
    /// The node whose engine served it (a split request's decode engine).
    node: Option<u32>,
    /// `decide`'s reason, for the policies that call it at the entry.
    reason: Option<&'static str>,
}

enum Router {
    Simple,
    Chwbl(Ring),
    Oracle(Box<Oracle>),
    Kvmesh(Box<Kvmesh>),
}

/// The gossip model's state, for the policies that gossip.
struct Gossip {
    delays: DelayDistribution,
    lags: LagClasses,
    published: Vec<Published>,
    digest_bytes: u64,
    summary_bytes: u64,
    /// Per node: times at which a new prefix entered its index and awaits publication.
    unpublished_prefixes: Vec<Vec<u64>>,
    publish_waits_s: Vec<f64>,
}

/// An arrival, registered and hashed, before routing (kept for the decode leg of a
/// disaggregated request).
#[derive(Clone)]
struct Prepared {
    id: u64,
    entry: u32,
    tokens: Vec<u32>,
    chain: Vec<u64>,
    output_tokens: u32,
    session: Option<u64>,
    /// Its key for spreading among near-equal engines (`RouteRequest::spread`).
    spread: u64,
    now: u64,
}

/// A routed request, ready for its engine.
struct Submission {
    target: usize,
    request: EngineRequest,
    arrival_ns: u64,
}

struct Sim<'c> {
    config: &'c ClusterConfig,
    policy: PolicyKind,
    nodes: Vec<SimNode>,
    router: Router,
    gossip: Option<Gossip>,
    rng: SplitMix64,
    rr_counters: Vec<u64>,
    /// Requests in flight per engine, as the centralized policies read them.
    loads: Vec<u32>,
    records: Vec<Record>,
    reasons: BTreeMap<String, u64>,
    rejected: u64,
    /// Attempts a serving node declined (late binding).
    declines: u64,
    first_arrival: Option<u64>,
    last_done: u64,
    /// Requests per disaggregation outcome (`pd`, `pd-skip-short`, …).
    pd_reasons: BTreeMap<String, u64>,
    /// Prefill legs running, by request: their node (its events are not the client's).
    prefill_legs: HashMap<u64, u32>,
    /// KV pulls of decode legs.
    transfers: Transfers,
    /// Decode legs waiting for their KV, by request: the node of their prefill.
    decode_legs: HashMap<u64, u32>,
    /// When each (prefill, decode) pair of nodes has shaken hands (or will have).
    handshakes: HashMap<(u32, u32), u64>,
    /// The centralized policies' split requests whose prefill runs: the request, and its
    /// decode engine if chosen at arrival.
    awaiting_decode: HashMap<u64, (Prepared, Option<usize>)>,
    /// Round-robin counters of the decode pool, per entry node.
    rr_decode: Vec<u64>,
}

/// The decode legs' pulls, as the decode engines' `vllm:nixl_*` metrics would count them.
#[derive(Debug, Clone, Copy, Default)]
struct Transfers {
    pulls: u64,
    /// Pulls that waited for a handshake (the first between a pair, and any started while it
    /// was under way).
    handshake_waits: u64,
    blocks: u64,
    /// From the decode engine's pull request to the blocks' arrival (handshake included).
    seconds: f64,
}

/// What an engine is asked to run of a request.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Leg {
    /// All of it.
    Whole,
    /// Its prompt, to lend the KV to a decode engine (one token, `max_tokens=1`).
    Prefill,
    /// Its output, from KV pulled from the prefill engine.
    Decode,
}

/// Runs `policy` over `requests` and measures it.
pub fn run(
    config: &ClusterConfig,
    policy: PolicyKind,
    requests: impl Iterator<Item = SimRequest>,
) -> PolicyResult {
    run_recorded(config, policy, requests).0
}

/// [`run`], with every request's own record, in arrival order.
pub fn run_recorded(
    config: &ClusterConfig,
    policy: PolicyKind,
    requests: impl Iterator<Item = SimRequest>,
) -> (PolicyResult, Vec<RequestRecord>) {
    let started = std::time::Instant::now();
    let mut sim = Sim::new(config, policy);
    if sim.gossip.is_some() {
        lifecycle::run(&mut sim, requests);
    } else {
        sequential::run(&mut sim, requests);
    }
    let result = measure::summarize(&sim, started.elapsed().as_secs_f64());
    (result, measure::records(&sim))
}

impl<'c> Sim<'c> {
    fn new(config: &'c ClusterConfig, policy: PolicyKind) -> Self {
        let n = config.nodes.max(1);
        let mut nodes: Vec<SimNode> = (0..n)
            .map(|i| {
                let engine = EngineConfig {
                    seed: config.seed ^ (i as u64).wrapping_mul(0x9e37_79b9),
                    ..config.engine.clone()
                };
                let assumed = config.route.assumed.default_prefill_tokens_per_s;
                let mut node = SimNode::new(i as u32, engine, config.summary, assumed);
                node.role = match config.pd {
                    None => Role::Mixed,
                    Some(pd) if i < pd.prefill_nodes => Role::Prefill,
                    Some(_) => Role::Decode,
                };
                node
            })
            .collect();
        let keys: Vec<u64> = nodes.iter().map(|n| n.key).collect();
        let router = match policy {
            PolicyKind::Chwbl => Router::Chwbl(Ring::new(&keys[..config.nodes_up(0)])),
            PolicyKind::Oracle => Router::Oracle(Box::new(Oracle::new(&mut nodes))),
            PolicyKind::Kvmesh => Router::Kvmesh(Box::new(Kvmesh::new(&keys, Visibility::All))),
            PolicyKind::KvmeshLocal => {
                Router::Kvmesh(Box::new(Kvmesh::new(&keys, Visibility::Local)))
            }
            PolicyKind::KvmeshZoned => Router::Kvmesh(Box::new(Kvmesh::new(
                &keys,
                Visibility::Zone(zone_size(config)),
            ))),
            _ => Router::Simple,
        };
        let gossip = policy.gossips().then(|| {
            let runs = (20_000 / n).clamp(4, 400);
            let delays = DelayDistribution::simulate(&config.gossip, n, runs, config.seed);
            let lags = LagClasses::new(&delays, config.lag_classes, config.seed);
            Gossip {
                published: nodes
                    .iter_mut()
                    .enumerate()
                    .map(|(i, node)| {
                        let mut published = Published::new(&lags, config.self_summary);
                        if i < config.nodes_up(0) {
                            published.publish_initial_digest(node.digest(0));
                        }
                        published
                    })
                    .collect(),
                delays,
                lags,
                digest_bytes: 0,
                summary_bytes: 0,
                unpublished_prefixes: vec![Vec::new(); n],
                publish_waits_s: Vec::new(),
            }
        });
        Self {
            config,
            policy,
            nodes,
            router,
            gossip,
            rng: SplitMix64::new(config.seed ^ 0x726f_7574_6572),
            rr_counters: (0..n as u64).collect(),
            loads: vec![0; n],
            records: Vec::new(),
            reasons: BTreeMap::new(),
            rejected: 0,
            declines: 0,
            first_arrival: None,
            last_done: 0,
            pd_reasons: BTreeMap::new(),
            prefill_legs: HashMap::new(),
            transfers: Transfers::default(),
            decode_legs: HashMap::new(),
            handshakes: HashMap::new(),
            awaiting_decode: HashMap::new(),
            rr_decode: (0..n as u64).collect(),
        }
    }

    /// Registers an arrival; returns its id, tokens, chain and entry node, or none if the
    /// prompt cannot fit the engines (counted as rejected).
    fn prepare(&mut self, request: &SimRequest) -> Option<Prepared> {
        let now = request.arrival_ns;
        self.first_arrival.get_or_insert(now);
        let id = self.records.len() as u64;
        // Entry nodes as the load generator picks its targets at random, request for request.
        let entries = self.config.entry_nodes.clamp(1, self.config.nodes_up(now));
        let entry = random_target(self.config.seed, id, entries) as u32;
        self.records.push(Record {
            arrival_ns: now,
            entry,
            ..Record::default()
        });
        let tokens = request.tokens();
        let output_tokens = request.output_tokens.max(1);
        if validate(&self.config.engine, tokens.len(), output_tokens).is_err() {
            self.rejected += 1;
            return None;
        }
        let chain = match &request.sidecar_chain {
            Some(chain) => chain.clone(),
            None => prompt::chain(self.config.seed, &tokens),
        };
        Some(Prepared {
            id,
            entry,
            tokens,
            chain,
            output_tokens,
            session: request.session,
            spread: mix64(id ^ self.config.spread_seed),
            now,
        })
    }

    /// Routes one request at its arrival (the centralized policies).
    fn arrive(&mut self, request: SimRequest) -> Option<Submission> {
        let prepared = self.prepare(&request)?;
        if let Some(pd) = self.config.pd {
            return Some(self.arrive_split(prepared, pd));
        }
        let (id, entry, now) = (prepared.id, prepared.entry, prepared.now);
        let n = self.config.nodes_up(now);
        let chain = &prepared.chain;
        let route_request = RouteRequest {
            model: MODEL,
            chain,
            prompt_tokens: prepared.tokens.len() as u32,
            tokens_per_block: BLOCK_TOKENS as f32,
            session: prepared.session,
            role: Role::Mixed,
            spread: Some(prepared.spread),
            popular: &[],
            prefixes_recur: true,
        };
        let config = self.config;
        let target = match &mut self.router {
            Router::Simple => match self.policy {
                PolicyKind::RoundRobin => {
                    round_robin::pick(&mut self.rr_counters[entry as usize], n)
                }
                PolicyKind::LeastLoaded => least_loaded::pick(&self.loads[..n], &mut self.rng),
                PolicyKind::PowerOfTwo => power_of_two::pick(&self.loads[..n], &mut self.rng),
                _ => random::pick(&mut self.rng, n),
            },
            Router::Chwbl(ring) => {
                if ring.nodes() != n {
                    let keys: Vec<u64> = self.nodes[..n].iter().map(|node| node.key).collect();
                    *ring = Ring::new(&keys);
                }
                let key = chain.first().copied().unwrap_or(id);
                ring.pick(key, &self.loads[..n], config.chwbl_epsilon)
            }
            Router::Oracle(oracle) => {
                if let Some(&first) = chain.first() {
                    oracle.track(first);
                }
                let up = &self.nodes[..n];
                let decision = oracle.decide(up, &route_request, &config.route, now);
                count_reason(decision.ok(), &mut self.reasons)
                    .unwrap_or_else(|| random::pick(&mut self.rng, n))
            }
            Router::Kvmesh(_) => unreachable!("kvmesh runs the lifecycle loop"),
        };
        Some(self.commit(target, prepared))
    }

    /// The target's side of a routed request: its index learns the chain.
    fn commit(&mut self, target: usize, prepared: Prepared) -> Submission {
        self.commit_leg(target, prepared, Leg::Whole)
    }

    /// The target's side of one leg of a request: its index learns the chain (a prefill
    /// engine computed it, a decode engine pulled it into its prefix cache).
    fn commit_leg(&mut self, target: usize, prepared: Prepared, leg: Leg) -> Submission {
        let Prepared {
            id,
            tokens,
            chain,
            output_tokens,
            now,
            ..
        } = prepared;
        self.loads[target] += 1;
        if leg != Leg::Prefill {
            self.records[id as usize].node = Some(target as u32);
        }
        let changes = self.nodes[target].index_chain(&chain);
        if let Router::Oracle(oracle) = &mut self.router {
            oracle.index_changed(target as u32, &changes);
        }
        if let (Some(g), Some(first)) = (self.gossip.as_mut(), chain.first())
            && changes.added.contains(first)
        {
            g.unpublished_prefixes[target].push(now);
        }
        let mut request = match leg {
            Leg::Whole => EngineRequest::new(id, tokens, output_tokens),
            Leg::Prefill => {
                self.prefill_legs.insert(id, target as u32);
                let mut request = EngineRequest::new(id, tokens, 1);
                request.kv_transfer = KvTransfer::RemoteDecode;
                request
            }
            Leg::Decode => {
                let remote_blocks = tokens
                    .len()
                    .div_ceil(self.config.engine.block_size as usize);
                let mut request = EngineRequest::new(id, tokens, output_tokens);
                request.kv_transfer = KvTransfer::RemotePrefill { remote_blocks };
                request
            }
        };
        request.ignore_eos = true;
        Submission {
            target,
            request,
            arrival_ns: now,
        }
    }

    /// Whether `request`'s events on `node` are its prefill leg's.
    fn is_prefill_leg(&self, node: usize, request: u64) -> bool {
        self.prefill_legs.get(&request) == Some(&(node as u32))
    }

    /// Applies what engine `node` did to the records (a prefill leg's token is not the
    /// client's: the decode engine's first token is).
    fn apply(&mut self, node: usize, events: &[EngineEvent]) {
        for event in events {
            match *event {
                EngineEvent::FirstToken { request, at_ns } => {
                    if !self.is_prefill_leg(node, request) {
                        self.records[request as usize].first_ns = at_ns.max(1);
                    }
                }
                EngineEvent::Finished { request, .. } if self.is_prefill_leg(node, request) => {
                    self.loads[node] -= 1;
                }
                EngineEvent::Finished {
                    request,
                    at_ns,
                    completion_tokens,
                } => {
                    let record = &mut self.records[request as usize];
                    record.done_ns = at_ns.max(1);
                    record.output_tokens = completion_tokens;
                    self.loads[node] -= 1;
                    self.last_done = self.last_done.max(at_ns);
                }
            }
        }
    }

    /// A submission the engine refused (after validation: not expected).
    fn refused(&mut self, target: usize) {
        self.rejected += 1;
        self.loads[target] -= 1;
    }
}

fn count_reason(decision: Option<Decision>, reasons: &mut BTreeMap<String, u64>) -> Option<usize> {
    let decision = decision?;
    *reasons.entry(decision.reason.to_string()).or_default() += 1;
    decision.ranked.first().copied()
}
