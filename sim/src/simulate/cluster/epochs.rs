//! The epoch loop of the gossiping policies.
//!
//! A gossiping entry node reads engines only through what was published at a tick (digests,
//! summary shards) and its own ledgers, so within one tick interval routing needs nothing from
//! the engines. Each epoch therefore (1) routes every arrival up to the next tick, in arrival
//! order, then (2) runs every engine through its submissions up to the tick and lets it
//! publish: engines are independent, so (2) runs on `threads` threads over disjoint slices of
//! nodes, each result merged back in node order. The outcome does not depend on the thread
//! count.

use kvmesh_protocol::summary::ShardWire;

use super::{Sim, Submission};
use crate::engine::model::Output;
use crate::simulate::gossip::view::{LagClasses, Published};
use crate::simulate::node::{EngineEvent, SimNode};
use crate::simulate::policy::PolicyKind;
use crate::simulate::workload::SimRequest;

/// What one node did during an epoch.
#[derive(Default)]
struct NodeEpoch {
    submissions: Vec<Submission>,
    events: Vec<EngineEvent>,
    refused: Vec<usize>,
    digest_bytes: u64,
    summary_bytes: u64,
    publish_waits_s: Vec<f64>,
}

pub(super) fn run(sim: &mut Sim<'_>, requests: impl Iterator<Item = SimRequest>) {
    let tick_ns = (sim.config.digest_interval_s * 1e9).max(1.0) as u64;
    let summaries = matches!(sim.policy, PolicyKind::Kvmesh | PolicyKind::KvmeshZoned);
    let threads = sim.config.threads.max(1);
    let n = sim.nodes.len();
    let mut epochs: Vec<NodeEpoch> = (0..n).map(|_| NodeEpoch::default()).collect();
    let mut requests = requests.peekable();
    let mut tick = 0u64;
    loop {
        // 1. Route.
        let mut arrivals = Vec::new();
        while let Some(request) = requests.next_if(|r| r.arrival_ns <= tick) {
            arrivals.push(request);
        }
        for submission in sim.arrive_batch(arrivals) {
            epochs[submission.target].submissions.push(submission);
        }
        // 2. Run engines and publish, in parallel.
        let g = sim.gossip.as_mut().expect("the epoch loop gossips");
        let lags = &g.lags;
        let chunk = n.div_ceil(threads);
        let mut parts: Vec<_> = sim
            .nodes
            .chunks_mut(chunk)
            .zip(g.published.chunks_mut(chunk))
            .zip(g.unpublished_prefixes.chunks_mut(chunk))
            .zip(epochs.chunks_mut(chunk))
            .enumerate()
            .map(|(part, (((nodes, published), unpublished), epochs))| Part {
                base: part * chunk,
                nodes,
                published,
                unpublished,
                epochs,
            })
            .collect();
        let last = parts.pop();
        std::thread::scope(|scope| {
            for part in parts {
                scope.spawn(move || part.run(lags, summaries, tick));
            }
            if let Some(part) = last {
                part.run(lags, summaries, tick);
            }
        });
        // 3. Merge, in node order.
        for (i, epoch) in epochs.iter_mut().enumerate() {
            for &target in &epoch.refused {
                sim.refused(target);
            }
            epoch.refused.clear();
            let events = std::mem::take(&mut epoch.events);
            sim.apply(i, &events);
            epoch.events = events;
            epoch.events.clear();
            let g = sim.gossip.as_mut().expect("gossiping");
            g.digest_bytes += std::mem::take(&mut epoch.digest_bytes);
            g.summary_bytes += std::mem::take(&mut epoch.summary_bytes);
            g.publish_waits_s.append(&mut epoch.publish_waits_s);
        }
        if requests.peek().is_none() && sim.nodes.iter().all(|node| node.engine.is_idle()) {
            break;
        }
        tick += tick_ns;
    }
}

/// A slice of the nodes, run by one thread.
struct Part<'a> {
    base: usize,
    nodes: &'a mut [SimNode],
    published: &'a mut [Published],
    unpublished: &'a mut [Vec<u64>],
    epochs: &'a mut [NodeEpoch],
}

impl Part<'_> {
    fn run(self, lags: &LagClasses, summaries: bool, tick: u64) {
        let mut outputs = Vec::new();
        for (i, node) in self.nodes.iter_mut().enumerate() {
            let epoch = &mut self.epochs[i];
            run_node(node, self.base + i, epoch, tick, &mut outputs);
            let (view, unpublished) = (&mut self.published[i], &mut self.unpublished[i]);
            publish(node, view, unpublished, epoch, lags, summaries, tick);
        }
    }
}

/// Runs one engine through its epoch's submissions and up to the tick.
fn run_node(
    node: &mut SimNode,
    index: usize,
    epoch: &mut NodeEpoch,
    tick: u64,
    outputs: &mut Vec<Output>,
) {
    for submission in epoch.submissions.drain(..) {
        node.advance_to(submission.arrival_ns, outputs, &mut epoch.events);
        if !node.submit(submission.request, submission.arrival_ns) {
            epoch.refused.push(index);
        }
    }
    node.advance_to(tick, outputs, &mut epoch.events);
}

/// The node publishes its digest (when the sidecar would) and its changed shards.
fn publish(
    node: &mut SimNode,
    view: &mut Published,
    unpublished: &mut Vec<u64>,
    epoch: &mut NodeEpoch,
    lags: &LagClasses,
    summaries: bool,
    now: u64,
) {
    let digest = node.digest(now);
    if node.should_gossip(&digest, now) {
        epoch.digest_bytes += digest.encode().len() as u64;
        view.publish_digest(now, digest);
    }
    // kvmesh-local gossips no summary (and nobody reads one).
    let changed = node.summary.publish_dirty();
    if summaries {
        let shards: Vec<_> = changed
            .into_iter()
            .filter_map(|shard| {
                epoch.summary_bytes += shard.bytes.len() as u64;
                ShardWire::decode(&shard.bytes).ok()
            })
            .collect();
        view.publish_shards(now, shards);
        epoch.publish_waits_s.extend(
            unpublished
                .drain(..)
                .map(|at| now.saturating_sub(at) as f64 / 1e9),
        );
    } else {
        unpublished.clear();
    }
    view.sync_all_and_trim(lags, now);
}
