//! How long an update takes to reach the other nodes of a chitchat-style gossip mesh.
//!
//! Every node runs a gossip round every `interval`, at its own phase, and in each round
//! exchanges state with `fanout` distinct peers drawn at random (Scuttlebutt push-pull: after the
//! exchange each side holds what the other held). Each message is lost with probability
//! `loss`; a delivered message takes `hop` to arrive (the pull half takes a round trip).
//! With fanout K the informed set grows about (K+1)-fold per round, so reaching N nodes takes
//! about log_{K+1} N rounds.
//!
//! Rather than that asymptotic curve, [`DelayDistribution::simulate`] runs the epidemic itself,
//! `runs` times from random sources at random moments within a round, and keeps every node's
//! arrival delay: the empirical distribution the cluster simulator draws lags from. It is
//! O(N · rounds · K) per run, a few milliseconds even at 10,000 nodes, so every N is simulated
//! rather than extrapolated.
//!
//! Two functions reproduce measurements of the real mesh, which the hops are calibrated
//! against (see `docs/scaling.md`): [`peer_view_delay_s`], a new prefix reaching a peer's view
//! (the default `hop`), and [`cold_convergence_s`], membership convergence from a cold start
//! (nodes start knowing only the seeds; done when every node has every node's key-values).

use crate::rng::SplitMix64;

/// Gossip parameters.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct GossipParams {
    pub interval_s: f64,
    pub fanout: u32,
    pub loss: f64,
    /// One-way delivery time of a gossip message, processing included.
    pub hop_s: f64,
}

/// Sorted arrival delays (seconds) of an update at the other nodes.
#[derive(Debug, Clone)]
pub struct DelayDistribution {
    sorted: Vec<f64>,
    /// Fraction of (update, node) pairs never reached within the round limit.
    pub unreached: f64,
}

const MAX_ROUNDS: usize = 200;

impl DelayDistribution {
    /// Runs `runs` epidemics over `nodes` nodes.
    pub fn simulate(params: &GossipParams, nodes: usize, runs: usize, seed: u64) -> Self {
        let mut rng = SplitMix64::new(seed ^ 0x6570_6964_656d_6963);
        let mut sorted = Vec::new();
        let mut unreached = 0usize;
        let others = nodes.saturating_sub(1);
        if others == 0 {
            return Self {
                sorted: vec![0.0],
                unreached: 0.0,
            };
        }
        let mut epidemic = Epidemic::new(nodes);
        for _ in 0..runs.max(1) {
            let (source, start) = epidemic.run(params, &mut rng);
            for (node, &at) in epidemic.informed_at.iter().enumerate() {
                if node == source {
                    continue;
                }
                if at.is_finite() {
                    sorted.push(at - start);
                } else {
                    unreached += 1;
                }
            }
        }
        sorted.sort_by(f64::total_cmp);
        let total = sorted.len() + unreached;
        Self {
            sorted,
            unreached: unreached as f64 / total.max(1) as f64,
        }
    }

    /// The delay by which a fraction `q` of the reached nodes has the update
    /// ([`crate::quantile`]'s definition; 0 when none was reached).
    pub fn quantile(&self, q: f64) -> f64 {
        crate::quantile::quantile(&self.sorted, q)
    }

    pub fn mean(&self) -> f64 {
        self.sorted.iter().sum::<f64>() / self.sorted.len().max(1) as f64
    }
}

/// One update's spread, run again and again over the same nodes.
struct Epidemic {
    /// When each node got the update of the last run (infinite: never).
    informed_at: Vec<f64>,
    phase: Vec<f64>,
    order: Vec<usize>,
}

impl Epidemic {
    fn new(nodes: usize) -> Self {
        Self {
            informed_at: vec![f64::INFINITY; nodes],
            phase: vec![0.0; nodes],
            order: (0..nodes).collect(),
        }
    }

    /// Spreads an update from a random node, made at a random moment of the first round, at
    /// random round phases: the source and the moment.
    fn run(&mut self, params: &GossipParams, rng: &mut SplitMix64) -> (usize, f64) {
        let nodes = self.informed_at.len();
        let others = nodes.saturating_sub(1);
        let (informed_at, phase, order) = (&mut self.informed_at, &mut self.phase, &mut self.order);
        let mut chosen = Vec::with_capacity(params.fanout as usize);
        informed_at.fill(f64::INFINITY);
        for p in phase.iter_mut() {
            *p = rng.next_f64() * params.interval_s;
        }
        order.sort_by(|&a, &b| phase[a].total_cmp(&phase[b]));
        let source = rng.below(nodes as u64) as usize;
        let start = rng.next_f64() * params.interval_s;
        informed_at[source] = start;
        let mut reached = 1;
        for round in 0..MAX_ROUNDS {
            for &node in order.iter() {
                let now = phase[node] + round as f64 * params.interval_s;
                // `fanout` distinct peers, as chitchat samples them: any node but this one.
                distinct_picks(rng, others, params.fanout as usize, &mut chosen);
                for &pick in chosen.iter() {
                    let peer = if pick >= node { pick + 1 } else { pick };
                    // Syn (digest) → SynAck (the peer's digest and what the initiator
                    // lacks) → Ack (what the peer lacks): pull after 2 hops, push after 3.
                    let syn_ok = rng.next_f64() >= params.loss;
                    let syn_ack_ok = syn_ok && rng.next_f64() >= params.loss;
                    let ack_ok = syn_ack_ok && rng.next_f64() >= params.loss;
                    if syn_ack_ok && informed_at[peer] <= now + params.hop_s {
                        let at = now + 2.0 * params.hop_s;
                        if at < informed_at[node] {
                            reached += usize::from(informed_at[node].is_infinite());
                            informed_at[node] = at;
                        }
                    }
                    if ack_ok && informed_at[node] <= now + 2.0 * params.hop_s {
                        let at = now + 3.0 * params.hop_s;
                        if at < informed_at[peer] {
                            reached += usize::from(informed_at[peer].is_infinite());
                            informed_at[peer] = at;
                        }
                    }
                }
            }
            // One more round settles arrival times that a later exchange improved.
            if reached == nodes && round > 0 {
                break;
            }
        }
        (source, start)
    }
}

/// Median time from a node's change of a value until another node holds it, when the node
/// publishes its values every `publish_interval_s`: the real mesh's measurement of a new
/// prefix at the nodes that neither served nor took in the request
/// (`scripts/bench-prefix.sh --part converge`), over `runs` updates.
pub fn peer_view_delay_s(
    params: &GossipParams,
    nodes: usize,
    publish_interval_s: f64,
    runs: usize,
) -> f64 {
    let mut rng = SplitMix64::new(0x7570_6461_7465 ^ nodes as u64);
    let mut epidemic = Epidemic::new(nodes);
    let mut delays = Vec::with_capacity(runs * nodes);
    for _ in 0..runs.max(1) {
        let publish_wait = rng.next_f64() * publish_interval_s;
        let (source, start) = epidemic.run(params, &mut rng);
        let arrivals = epidemic.informed_at.iter().enumerate();
        delays.extend(
            arrivals
                .filter(|&(node, at)| node != source && at.is_finite())
                .map(|(_, at)| publish_wait + at - start),
        );
    }
    delays.sort_by(f64::total_cmp);
    crate::quantile::quantile(&delays, 0.5)
}

/// Rounds to reach N nodes by the asymptotic curve, log_{K+1} N.
pub fn rounds_estimate(nodes: usize, fanout: u32) -> f64 {
    (nodes.max(1) as f64).ln() / f64::from(fanout + 1).ln()
}

/// `count` distinct indices below `len` (all of them if fewer), drawn at random into `out`.
fn distinct_picks(rng: &mut SplitMix64, len: usize, count: usize, out: &mut Vec<usize>) {
    out.clear();
    while out.len() < count.min(len) {
        let pick = rng.below(len as u64) as usize;
        if !out.contains(&pick) {
            out.push(pick);
        }
    }
}

/// Time from the first node's start until every node holds every node's state, when node `i`
/// starts `i × stagger_s` after the first knowing only the first `seeds` nodes (the real
/// mesh's convergence test starts nodes one after another): mean over `runs`.
pub fn cold_convergence_s(
    params: &GossipParams,
    nodes: usize,
    seeds: usize,
    stagger_s: f64,
    runs: usize,
) -> f64 {
    let mut rng = SplitMix64::new(0x636f_6c64 ^ nodes as u64);
    let mut total = 0.0;
    for _ in 0..runs.max(1) {
        // knows[a][b]: time at which a holds b's state (and so knows b exists).
        let mut knows = vec![vec![f64::INFINITY; nodes]; nodes];
        let start = |a: usize| a as f64 * stagger_s;
        let phase: Vec<f64> = (0..nodes)
            .map(|a| start(a) + rng.next_f64() * params.interval_s)
            .collect();
        for (a, row) in knows.iter_mut().enumerate() {
            row[a] = start(a);
        }
        let mut done_at = f64::INFINITY;
        let mut chosen = Vec::with_capacity(params.fanout as usize);
        for round in 0..MAX_ROUNDS {
            let mut order: Vec<usize> = (0..nodes).collect();
            order.sort_by(|&a, &b| phase[a].total_cmp(&phase[b]));
            for &a in &order {
                let now = phase[a] + round as f64 * params.interval_s;
                // A node gossips only with started nodes it knows of (the seeds from the start).
                let known: Vec<usize> = (0..nodes)
                    .filter(|&b| b != a && start(b) <= now && (b < seeds || knows[a][b] <= now))
                    .collect();
                if known.is_empty() {
                    continue;
                }
                // `fanout` distinct peers, as chitchat samples them (and as `Epidemic::run`).
                distinct_picks(&mut rng, known.len(), params.fanout as usize, &mut chosen);
                for &pick in &chosen {
                    let b = known[pick];
                    if rng.next_f64() < params.loss {
                        continue;
                    }
                    let (row_a, row_b) = if a < b {
                        let (low, high) = knows.split_at_mut(b);
                        (&mut low[a], &mut high[0])
                    } else {
                        let (low, high) = knows.split_at_mut(a);
                        (&mut high[0], &mut low[b])
                    };
                    for (ka, kb) in row_a.iter_mut().zip(row_b.iter_mut()) {
                        if *kb <= now + params.hop_s {
                            *ka = ka.min(now + 2.0 * params.hop_s);
                        }
                        if *ka <= now + 2.0 * params.hop_s {
                            *kb = kb.min(now + 3.0 * params.hop_s);
                        }
                    }
                }
            }
            let latest = knows.iter().flatten().copied().fold(0.0f64, f64::max);
            if latest.is_finite() {
                done_at = latest;
                break;
            }
        }
        total += done_at;
    }
    total / runs.max(1) as f64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(hop_s: f64) -> GossipParams {
        GossipParams {
            interval_s: 0.2,
            fanout: 3,
            loss: 0.0,
            hop_s,
        }
    }

    #[test]
    fn delay_grows_like_log_n_rounds() {
        let p = params(0.001);
        let small = DelayDistribution::simulate(&p, 16, 200, 1);
        let middle = DelayDistribution::simulate(&p, 256, 40, 1);
        let large = DelayDistribution::simulate(&p, 4096, 4, 1);
        assert_eq!(small.unreached, 0.0);
        assert!(small.quantile(0.5) < middle.quantile(0.5));
        assert!(middle.quantile(0.5) < large.quantile(0.5));
        // log_4 16 = 2 rounds, log_4 4096 = 6 rounds. Push-pull with unsynchronized rounds
        // spreads faster than (K+1)^r (a node informed early in a round is pulled from later
        // in the same round), so the 99th percentile grows by only 0.5-4 rounds of 0.2 s.
        let grown = large.quantile(0.99) - small.quantile(0.99);
        assert!((0.1..0.8).contains(&grown), "grew by {grown} s");
        assert!(small.quantile(0.5) < small.quantile(0.99));
    }

    #[test]
    fn loss_slows_propagation() {
        let clean = DelayDistribution::simulate(&params(0.001), 256, 20, 2);
        let lossy = DelayDistribution::simulate(
            &GossipParams {
                loss: 0.3,
                ..params(0.001)
            },
            256,
            20,
            2,
        );
        assert!(
            lossy.mean() > clean.mean() * 1.1,
            "{} vs {}",
            lossy.mean(),
            clean.mean()
        );
    }

    #[test]
    fn calibrated_hop_reproduces_the_real_mesh_convergence() {
        // node/MESH-NOTES.md: 0.41-0.44 s at 3 nodes, 0.82-0.83 s at 8 nodes (200 ms, fanout 3).
        let p = params(super::super::MEMBERSHIP_HOP_S);
        let three = cold_convergence_s(&p, 3, 2, super::super::CALIBRATION_STAGGER_S, 200);
        let eight = cold_convergence_s(&p, 8, 2, super::super::CALIBRATION_STAGGER_S, 200);
        assert!((0.38..0.48).contains(&three), "3 nodes: {three} s");
        assert!((0.74..0.90).contains(&eight), "8 nodes: {eight} s");
    }

    #[test]
    fn calibrated_hop_spreads_a_new_prefix_no_faster_than_the_real_mesh() {
        // scripts/bench-prefix.sh --part converge, 2026-12-06: a peer's view of a new prefix
        // a median 84-87 ms (3 nodes) and 116-119 ms (8 nodes) after the request; the owner
        // publishes every 100 ms.
        let p = params(super::super::CALIBRATED_HOP_S);
        let three = peer_view_delay_s(&p, 3, 0.1, 4000);
        let eight = peer_view_delay_s(&p, 8, 0.1, 4000);
        assert!((0.084..0.115).contains(&three), "3 nodes: {three} s");
        assert!((0.116..0.140).contains(&eight), "8 nodes: {eight} s");
    }
}
