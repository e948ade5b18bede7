//! The discrete-event loop: one cluster, one policy, one request stream.
//!
//! Events are request arrivals (from the stream, in order), engine wake-ups (each engine's
//! `next_event_time`, in a min-heap with stale entries skipped) and, for gossiping policies,
//! the publish tick (every digest interval every node publishes its digest when due and its
//! changed summary shards). All times are nanoseconds of simulated time. Ties are broken by
//! kind (engines, then arrivals, then the tick) and by node index, so a seed fixes the run.

use std::cmp::Reverse;
use std::collections::{BTreeMap, BinaryHeap};
use std::time::Instant;

use kvmesh_protocol::summary::ShardWire;
use kvmesh_protocol::{Decision, Role, RouteConfig, RouteRequest, SummaryConfig};

use super::gossip::MEMBERSHIP_ENTRY_BYTES;
use super::gossip::epidemic::{DelayDistribution, GossipParams};
use super::gossip::view::{LagClasses, Published};
use super::node::{MODEL, SimNode};
use super::policy::chwbl::Ring;
use super::policy::kvmesh::Kvmesh;
use super::policy::oracle::Oracle;
use super::policy::{PolicyKind, least_loaded, power_of_two, random, round_robin};
use super::prompt::{self, BLOCK_TOKENS};
use super::results::{GossipTraffic, Latency, PolicyResult, cdf};
use super::workload::SimRequest;
use crate::engine::model::{EngineConfig, EngineRequest, Output};
use crate::rng::SplitMix64;

/// Everything a run needs besides the requests.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub nodes: usize,
    pub engine: EngineConfig,
    pub summary: SummaryConfig,
    pub route: RouteConfig,
    pub gossip: GossipParams,
    pub digest_interval_s: f64,
    pub lag_classes: usize,
    pub chwbl_epsilon: f64,
    pub seed: u64,
}

#[derive(Debug, Clone, Copy, Default)]
struct Record {
    arrival_ns: u64,
    first_ns: u64,
    done_ns: u64,
    output_tokens: u32,
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

/// Runs `policy` over `requests` and measures it.
pub fn run(
    config: &ClusterConfig,
    policy: PolicyKind,
    requests: impl Iterator<Item = SimRequest>,
) -> PolicyResult {
    let started = Instant::now();
    let n = config.nodes.max(1);
    let mut nodes: Vec<SimNode> = (0..n)
        .map(|i| {
            let engine = EngineConfig {
                seed: config.seed ^ (i as u64).wrapping_mul(0x9e37_79b9),
                ..config.engine.clone()
            };
            SimNode::new(i as u32, engine, config.summary)
        })
        .collect();
    let keys: Vec<u64> = nodes.iter().map(|n| n.key).collect();
    let mut router = match policy {
        PolicyKind::Chwbl => Router::Chwbl(Ring::new(&keys)),
        PolicyKind::Oracle => Router::Oracle(Box::new(Oracle::new(&mut nodes))),
        PolicyKind::Kvmesh => Router::Kvmesh(Box::new(Kvmesh::new(&keys, false))),
        PolicyKind::KvmeshLocal => Router::Kvmesh(Box::new(Kvmesh::new(&keys, true))),
        _ => Router::Simple,
    };
    let mut gossip = policy.gossips().then(|| {
        let runs = (20_000 / n).clamp(4, 400);
        let delays = DelayDistribution::simulate(&config.gossip, n, runs, config.seed);
        let lags = LagClasses::new(&delays, config.lag_classes, config.seed);
        Gossip {
            published: (0..n).map(|_| Published::new(lags.len())).collect(),
            delays,
            lags,
            digest_bytes: 0,
            summary_bytes: 0,
            unpublished_prefixes: vec![Vec::new(); n],
            publish_waits_s: Vec::new(),
        }
    });
    let tick_ns = (config.digest_interval_s * 1e9).max(1.0) as u64;

    let mut rng = SplitMix64::new(config.seed ^ 0x726f_7574_6572);
    let mut rr_counters: Vec<u64> = (0..n as u64).collect();
    let mut loads = vec![0u32; n];
    let mut records: Vec<Record> = Vec::new();
    let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
    let mut heap: BinaryHeap<Reverse<(u64, u32)>> = BinaryHeap::new();
    let mut outputs: Vec<Output> = Vec::new();
    let mut rejected = 0u64;
    let mut requests = requests.peekable();
    let mut next_tick = if gossip.is_some() { 0 } else { u64::MAX };
    let mut first_arrival = None;
    let mut last_done = 0u64;

    loop {
        let t_engine = heap.peek().map_or(u64::MAX, |Reverse((t, _))| *t);
        let t_arrival = requests.peek().map_or(u64::MAX, |r| r.arrival_ns);
        if t_engine == u64::MAX && t_arrival == u64::MAX {
            break;
        }
        if t_engine <= t_arrival && t_engine <= next_tick {
            let Reverse((now, i)) = heap.pop().expect("peeked");
            let node = &mut nodes[i as usize];
            if node.wake_ns != Some(now) {
                continue;
            }
            node.wake_ns = None;
            outputs.clear();
            node.engine.advance_into(SimNode::now(now), &mut outputs);
            for out in &outputs {
                let record = &mut records[out.request as usize];
                if record.first_ns == 0 {
                    record.first_ns = now.max(1);
                    node.observe_ttft(now.saturating_sub(record.arrival_ns) as f64 / 1e6);
                }
                if let Some(finished) = &out.finished {
                    record.done_ns = now;
                    record.output_tokens = finished.completion_tokens;
                    node.inflight -= 1;
                    loads[i as usize] -= 1;
                    last_done = last_done.max(now);
                }
            }
            schedule(node, i, now, &mut heap);
        } else if t_arrival <= next_tick {
            let request = requests.next().expect("peeked");
            let now = request.arrival_ns;
            first_arrival.get_or_insert(now);
            let id = records.len() as u64;
            records.push(Record {
                arrival_ns: now,
                ..Record::default()
            });
            let tokens = prompt::tokens(&request.segments);
            let chain = prompt::chain(config.seed, &tokens);
            let entry = rng.below(n as u64) as u32;
            let route_request = RouteRequest {
                model: MODEL,
                chain: &chain,
                prompt_tokens: tokens.len() as u32,
                tokens_per_block: BLOCK_TOKENS as f32,
                session: request.session,
                role: Role::Mixed,
            };
            let target = match &mut router {
                Router::Simple => match policy {
                    PolicyKind::RoundRobin => {
                        round_robin::pick(&mut rr_counters[entry as usize], n)
                    }
                    PolicyKind::LeastLoaded => least_loaded::pick(&loads, &mut rng),
                    PolicyKind::PowerOfTwo => power_of_two::pick(&loads, &mut rng),
                    _ => random::pick(&mut rng, n),
                },
                Router::Chwbl(ring) => {
                    let key = chain.first().copied().unwrap_or(id);
                    ring.pick(key, &loads, config.chwbl_epsilon)
                }
                Router::Oracle(oracle) => {
                    if let Some(&first) = chain.first() {
                        oracle.track(first);
                    }
                    let decision = oracle.decide(&nodes, &route_request, &config.route, now);
                    decided(decision, &mut reasons).unwrap_or_else(|| random::pick(&mut rng, n))
                }
                Router::Kvmesh(kvmesh) => {
                    let g = gossip.as_mut().expect("kvmesh gossips");
                    let decision = kvmesh.decide(
                        entry,
                        &mut g.published,
                        &g.lags,
                        &route_request,
                        &config.route,
                        now,
                    );
                    let target = match decision {
                        Ok((target, decision)) => {
                            decided(Ok(decision), &mut reasons);
                            target
                        }
                        Err(_) => {
                            *reasons.entry("no-view".into()).or_default() += 1;
                            entry as usize
                        }
                    };
                    kvmesh.record(entry, keys[target], &chain, now);
                    target
                }
            };
            let node = &mut nodes[target];
            let mut engine_request = EngineRequest::new(id, tokens, request.output_tokens.max(1));
            engine_request.ignore_eos = true;
            if node
                .engine
                .submit(engine_request, SimNode::now(now))
                .is_err()
            {
                rejected += 1;
                continue;
            }
            node.inflight += 1;
            node.served += 1;
            loads[target] += 1;
            let changes = node.index_chain(&chain);
            if let Router::Oracle(oracle) = &mut router {
                oracle.index_changed(target as u32, &changes);
            }
            if let (Some(g), Some(first)) = (gossip.as_mut(), chain.first())
                && changes.added.contains(first)
            {
                g.unpublished_prefixes[target].push(now);
            }
            schedule(node, target as u32, now, &mut heap);
        } else {
            let now = next_tick;
            next_tick += tick_ns;
            let g = gossip.as_mut().expect("ticks only when gossiping");
            publish_all(&mut nodes, g, policy == PolicyKind::Kvmesh, now);
        }
    }

    let simulated_s = last_done.saturating_sub(first_arrival.unwrap_or(0)) as f64 / 1e9;
    summarize(
        config,
        policy,
        &nodes,
        &records,
        rejected,
        reasons,
        gossip.as_ref(),
        simulated_s,
        started.elapsed().as_secs_f64(),
    )
}

fn decided(
    decision: Result<Decision, kvmesh_protocol::route::RouteError>,
    reasons: &mut BTreeMap<String, u64>,
) -> Option<usize> {
    let decision = decision.ok()?;
    *reasons.entry(decision.reason.to_string()).or_default() += 1;
    decision.ranked.first().copied()
}

fn schedule(node: &mut SimNode, index: u32, now: u64, heap: &mut BinaryHeap<Reverse<(u64, u32)>>) {
    if let Some(next) = node.engine.next_event_time() {
        let at = (next.as_nanos() as u64).max(now);
        if node.wake_ns != Some(at) {
            node.wake_ns = Some(at);
            heap.push(Reverse((at, index)));
        }
    }
}

/// Every node publishes its digest (when the sidecar would) and its changed shards.
fn publish_all(nodes: &mut [SimNode], g: &mut Gossip, summaries: bool, now: u64) {
    for (i, node) in nodes.iter_mut().enumerate() {
        let digest = node.digest(now);
        let view = &mut g.published[i];
        if node.should_gossip(&digest, now) {
            g.digest_bytes += digest.encode().len() as u64;
            view.publish_digest(now, digest);
        }
        if summaries {
            let shards: Vec<_> = node
                .summary
                .publish_dirty()
                .into_iter()
                .filter_map(|shard| {
                    g.summary_bytes += shard.bytes.len() as u64;
                    ShardWire::decode(&shard.bytes).ok()
                })
                .collect();
            view.publish_shards(now, shards);
            for at in g.unpublished_prefixes[i].drain(..) {
                g.publish_waits_s.push(now.saturating_sub(at) as f64 / 1e9);
            }
        } else {
            // kvmesh-local gossips no summary; the node still knows its own cache.
            let shards: Vec<_> = node
                .summary
                .publish_dirty()
                .into_iter()
                .filter_map(|shard| ShardWire::decode(&shard.bytes).ok())
                .collect();
            view.publish_shards(now, shards);
            g.unpublished_prefixes[i].clear();
        }
        view.sync_all_and_trim(&g.lags, now);
    }
}

#[allow(clippy::too_many_arguments)]
fn summarize(
    config: &ClusterConfig,
    policy: PolicyKind,
    nodes: &[SimNode],
    records: &[Record],
    rejected: u64,
    reasons: BTreeMap<String, u64>,
    gossip: Option<&Gossip>,
    simulated_s: f64,
    wall_s: f64,
) -> PolicyResult {
    let done: Vec<&Record> = records.iter().filter(|r| r.done_ns > 0).collect();
    let mut ttft: Vec<f64> = done
        .iter()
        .map(|r| r.first_ns.saturating_sub(r.arrival_ns) as f64 / 1e9)
        .collect();
    let mut e2e: Vec<f64> = done
        .iter()
        .map(|r| r.done_ns.saturating_sub(r.arrival_ns) as f64 / 1e9)
        .collect();
    let ttft_s = Latency::of(&mut ttft);
    let e2e_s = Latency::of(&mut e2e);
    let output_tokens: u64 = done.iter().map(|r| u64::from(r.output_tokens)).sum();
    let (queries, hits, preemptions) = nodes.iter().fold((0u64, 0u64, 0u64), |acc, node| {
        let s = node.engine.stats();
        (
            acc.0 + s.prefix_cache_queries,
            acc.1 + s.prefix_cache_hits,
            acc.2 + s.num_preemptions,
        )
    });
    let served: Vec<u64> = nodes.iter().map(|n| n.served).collect();
    let mean_served = served.iter().sum::<u64>() as f64 / served.len().max(1) as f64;
    let max_served = served.iter().copied().max().unwrap_or(0) as f64;
    let n = nodes.len() as f64;
    let span = simulated_s.max(1e-9);
    let (gossip_traffic, reach) = match gossip {
        Some(g) => {
            // Every update reaches each of the other n - 1 nodes once.
            let per_node = |bytes: u64| bytes as f64 * (n - 1.0) / n / span;
            let membership = if n > 1.0 {
                2.0 * f64::from(config.gossip.fanout) / config.gossip.interval_s
                    * n
                    * MEMBERSHIP_ENTRY_BYTES
            } else {
                0.0
            };
            let digest = per_node(g.digest_bytes);
            let summary = per_node(g.summary_bytes);
            let reach =
                (policy == PolicyKind::Kvmesh && !g.publish_waits_s.is_empty()).then(|| {
                    let wait =
                        g.publish_waits_s.iter().sum::<f64>() / g.publish_waits_s.len() as f64;
                    (
                        wait + g.delays.quantile(0.5),
                        wait + g.delays.quantile(0.99),
                    )
                });
            (
                GossipTraffic {
                    digest_bytes_per_node_s: digest,
                    summary_bytes_per_node_s: summary,
                    membership_bytes_per_node_s: membership,
                    total_bytes_per_node_s: digest + summary + membership,
                },
                reach,
            )
        }
        None => (GossipTraffic::default(), None),
    };
    let reach = reach.or((policy == PolicyKind::Oracle).then_some((0.0, 0.0)));
    PolicyResult {
        policy: policy.name().to_owned(),
        nodes: nodes.len(),
        requests: records.len() as u64,
        completed: done.len() as u64,
        rejected,
        ttft_s,
        e2e_s,
        throughput_rps: done.len() as f64 / span,
        output_tokens_per_s: output_tokens as f64 / span,
        hit_rate: if queries == 0 {
            0.0
        } else {
            hits as f64 / queries as f64
        },
        load_imbalance: if mean_served > 0.0 {
            max_served / mean_served
        } else {
            0.0
        },
        preemptions,
        gossip: gossip_traffic,
        prefix_reach_50_s: reach.map(|r| r.0),
        prefix_reach_99_s: reach.map(|r| r.1),
        reasons,
        simulated_s,
        wall_s,
        ttft_cdf: cdf(&ttft, 100),
    }
}
