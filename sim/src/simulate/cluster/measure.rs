//! From a finished run to its figures.

use super::records::{RequestRecord, node_name};
use super::{Record, Sim, zone_size};
use crate::simulate::gossip::MEMBERSHIP_ENTRY_BYTES;
use crate::simulate::histogram::LogHistogram;
use crate::simulate::pd::Slo;
use crate::simulate::policy::PolicyKind;
use crate::simulate::results::{
    GOODPUT_ITL_MS, GossipTraffic, JoinFigures, Latency, PolicyResult, TransferSummary, cdf,
};

pub(super) fn summarize(sim: &Sim<'_>, wall_s: f64) -> PolicyResult {
    let (config, policy, nodes) = (sim.config, sim.policy, &sim.nodes);
    let simulated_s = sim.last_done.saturating_sub(sim.first_arrival.unwrap_or(0)) as f64 / 1e9;
    let done: Vec<_> = sim.records.iter().filter(|r| r.done_ns > 0).collect();
    let mut ttft: Vec<f64> = done
        .iter()
        .map(|r| r.first_ns.saturating_sub(r.arrival_ns) as f64 / 1e9)
        .collect();
    let mut e2e: Vec<f64> = done
        .iter()
        .map(|r| r.done_ns.saturating_sub(r.arrival_ns) as f64 / 1e9)
        .collect();
    let met_under = |slo: Slo| {
        done.iter()
            .filter(|r| {
                let ttft = r.first_ns.saturating_sub(r.arrival_ns) as f64 / 1e9;
                let decode = r.done_ns.saturating_sub(r.first_ns) as f64 / 1e9;
                slo.met(ttft, decode, r.output_tokens)
            })
            .count()
    };
    let met = met_under(config.slo);
    let ttft_s = Latency::of(&mut ttft);
    let e2e_s = Latency::of(&mut e2e);
    let mut itl = LogHistogram::default();
    for node in nodes {
        itl.merge(&node.itl);
    }
    let t = sim.transfers;
    let transfers = TransferSummary {
        pulls: t.pulls,
        handshake_waits: t.handshake_waits,
        blocks: t.blocks,
        mean_s: if t.pulls == 0 {
            0.0
        } else {
            t.seconds / t.pulls as f64
        },
    };
    let output_tokens: u64 = done.iter().map(|r| u64::from(r.output_tokens)).sum();
    let (queries, hits, preemptions) = nodes.iter().fold((0u64, 0u64, 0u64), |acc, node| {
        let s = node.engine.stats();
        (
            acc.0 + s.prefix_cache_queries,
            acc.1 + s.prefix_cache_hits,
            acc.2 + s.num_preemptions,
        )
    });
    let computed_prompt_tokens = nodes
        .iter()
        .map(|node| node.engine.stats().prompt_sources.local_compute)
        .sum();
    let served: Vec<u64> = nodes.iter().map(|n| n.served).collect();
    let mean_served = served.iter().sum::<u64>() as f64 / served.len().max(1) as f64;
    let max_served = served.iter().copied().max().unwrap_or(0) as f64;
    let n = nodes.len() as f64;
    let span = simulated_s.max(1e-9);
    let (gossip, reach) = match &sim.gossip {
        Some(g) => {
            // Every update reaches each of its receivers once: all other n - 1 nodes, or for
            // kvmesh-zoned's summaries the other members of the zone.
            let per_node = |bytes: u64, receivers: f64| bytes as f64 * receivers / n / span;
            let zoned = policy == PolicyKind::KvmeshZoned;
            let zone = if zoned { zone_size(config) as f64 } else { n };
            // Scuttlebutt digests list every node known: all n, or for a zoned mesh the zone's
            // members plus one gateway entry per other zone.
            let listed = if zoned {
                zone + (n / zone).ceil() - 1.0
            } else {
                n
            };
            let membership = if n > 1.0 {
                2.0 * f64::from(config.gossip.fanout) / config.gossip.interval_s
                    * listed
                    * MEMBERSHIP_ENTRY_BYTES
            } else {
                0.0
            };
            let digest = per_node(g.digest_bytes, n - 1.0);
            let summary = per_node(g.summary_bytes, zone - 1.0);
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
        requests: sim.records.len() as u64,
        completed: done.len() as u64,
        rejected: sim.rejected,
        ttft_s,
        e2e_s,
        itl_s: Latency::of_histogram(&itl),
        goodput_rps: met as f64 / span,
        goodput_by_itl: GOODPUT_ITL_MS
            .iter()
            .map(|&ms| {
                let slo = Slo {
                    itl_s: ms / 1e3,
                    ..config.slo
                };
                (ms / 1e3, met_under(slo) as f64 / span)
            })
            .collect(),
        slo_attainment: if done.is_empty() {
            0.0
        } else {
            met as f64 / done.len() as f64
        },
        pd_reasons: sim.pd_reasons.clone(),
        transfers,
        throughput_rps: done.len() as f64 / span,
        output_tokens_per_s: output_tokens as f64 / span,
        hit_rate: if queries == 0 {
            0.0
        } else {
            hits as f64 / queries as f64
        },
        computed_prompt_tokens,
        load_imbalance: if mean_served > 0.0 {
            max_served / mean_served
        } else {
            0.0
        },
        preemptions,
        gossip,
        prefix_reach_50_s: reach.map(|r| r.0),
        prefix_reach_99_s: reach.map(|r| r.1),
        reasons: sim.reasons.clone(),
        declines: sim.declines,
        join: join_figures(sim),
        simulated_s,
        wall_s,
        ttft_cdf: cdf(&ttft, 100),
    }
}

/// Requests before and after the join, and the joined nodes' share (none without a join).
fn join_figures(sim: &Sim<'_>) -> Option<JoinFigures> {
    let join = sim.config.join?;
    let founders = sim.config.nodes_up(0) as u32;
    let (mut before, mut after) = (Vec::new(), Vec::new());
    for r in sim.records.iter().filter(|r| r.done_ns > 0) {
        let ttft = r.first_ns.saturating_sub(r.arrival_ns) as f64 / 1e9;
        match r.arrival_ns < join.at_ns {
            true => before.push(ttft),
            false => after.push(ttft),
        }
    }
    let joined: Vec<&Record> = sim
        .records
        .iter()
        .filter(|r| r.node.is_some_and(|node| node >= founders))
        .collect();
    Some(JoinFigures {
        nodes: join.nodes,
        at_s: join.at_ns as f64 / 1e9,
        requests_after: sim
            .records
            .iter()
            .filter(|r| r.arrival_ns >= join.at_ns)
            .count() as u64,
        served_by_joined: joined.len() as u64,
        first_served_after_s: joined
            .iter()
            .map(|r| r.arrival_ns.saturating_sub(join.at_ns) as f64 / 1e9)
            .reduce(f64::min),
        ttft_before_s: Latency::of(&mut before),
        ttft_after_s: Latency::of(&mut after),
    })
}

/// Every request's own record, in arrival order.
pub(super) fn records(sim: &Sim<'_>) -> Vec<RequestRecord> {
    let seconds = |from: u64, to: u64| to.saturating_sub(from) as f64 / 1e9;
    sim.records
        .iter()
        .enumerate()
        .map(|(index, r)| {
            let done = r.done_ns > 0;
            RequestRecord {
                index: index as u64,
                sent_at_s: seconds(0, r.arrival_ns),
                entry: node_name(r.entry),
                node: r.node.map(node_name),
                reason: r.reason,
                ttft_s: done.then(|| seconds(r.arrival_ns, r.first_ns)),
                e2e_s: done.then(|| seconds(r.arrival_ns, r.done_ns)),
                output_tokens: r.output_tokens,
            }
        })
        .collect()
}
