//! What one policy's run measured.

use std::collections::BTreeMap;

use super::histogram::LogHistogram;
use crate::quantile::quantile;

/// Mean and percentiles of a latency, seconds ([`crate::quantile`]'s definition).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct Latency {
    pub mean: f64,
    pub p50: f64,
    pub p90: f64,
    pub p99: f64,
}

impl Latency {
    /// From a histogram's counts (percentiles within 1 % above the exact ones).
    pub fn of_histogram(histogram: &LogHistogram) -> Self {
        Self {
            mean: histogram.mean(),
            p50: histogram.percentile(0.50),
            p90: histogram.percentile(0.90),
            p99: histogram.percentile(0.99),
        }
    }

    /// From unsorted samples (sorted in place).
    pub fn of(samples: &mut [f64]) -> Self {
        if samples.is_empty() {
            return Self::default();
        }
        samples.sort_by(f64::total_cmp);
        Self {
            mean: samples.iter().sum::<f64>() / samples.len() as f64,
            p50: quantile(samples, 0.50),
            p90: quantile(samples, 0.90),
            p99: quantile(samples, 0.99),
        }
    }
}

/// ITL objectives, milliseconds, at which every run also reports goodput.
pub const GOODPUT_ITL_MS: [f64; 7] = [15.0, 20.0, 25.0, 30.0, 50.0, 100.0, 200.0];

/// KV pulls of a disaggregated run.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct TransferSummary {
    pub pulls: u64,
    /// Pulls that waited for their pair's handshake.
    pub handshake_waits: u64,
    /// KV blocks pulled (16 tokens each).
    pub blocks: u64,
    /// Mean time from the decode engine's pull request to the blocks' arrival, seconds.
    pub mean_s: f64,
}

/// Gossip traffic per node, bytes per second (received; equal to sent on average).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct GossipTraffic {
    /// Load digests of the other nodes.
    pub digest_bytes_per_node_s: f64,
    /// Summary shards of the other nodes.
    pub summary_bytes_per_node_s: f64,
    /// Scuttlebutt digests (one entry per known node per exchange), which grow with N.
    pub membership_bytes_per_node_s: f64,
    pub total_bytes_per_node_s: f64,
}

/// Requests before and after nodes joined the cluster, and what the new nodes took.
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct JoinFigures {
    /// Nodes that joined, and when (seconds into the run).
    pub nodes: usize,
    pub at_s: f64,
    /// Requests that arrived after the join.
    pub requests_after: u64,
    /// Of those, how many a joined node served.
    pub served_by_joined: u64,
    /// From the join to the arrival of the first request a joined node served, seconds.
    pub first_served_after_s: Option<f64>,
    /// TTFT of the requests that arrived before the join, and after.
    pub ttft_before_s: Latency,
    pub ttft_after_s: Latency,
}

/// One policy's figures.
#[derive(Debug, Clone, PartialEq, serde::Serialize)]
pub struct PolicyResult {
    pub policy: String,
    pub nodes: usize,
    pub requests: u64,
    pub completed: u64,
    /// Refused by the engine (prompt longer than the context window).
    pub rejected: u64,
    pub ttft_s: Latency,
    pub e2e_s: Latency,
    /// Gaps between consecutive tokens of a request (inter-token latency), over every gap of
    /// the run, as the client sees them.
    pub itl_s: Latency,
    /// Completed requests per second that met both objectives (TTFT, and the mean gap between
    /// their tokens).
    pub goodput_rps: f64,
    /// Share of completed requests that met both objectives.
    pub slo_attainment: f64,
    /// Goodput under the TTFT objective and each of [`GOODPUT_ITL_MS`] as the ITL one:
    /// `(ITL objective in seconds, requests/s)` (where disaggregation pays depends on how
    /// tight the ITL objective is).
    pub goodput_by_itl: Vec<(f64, f64)>,
    /// Requests per disaggregation outcome (`pd`, `pd-skip-short`, `pd-skip-busy`,
    /// `pd-fallback`); empty in a mixed cluster.
    pub pd_reasons: BTreeMap<String, u64>,
    /// The decode legs' KV pulls.
    pub transfers: TransferSummary,
    /// Completed requests per second of simulated time.
    pub throughput_rps: f64,
    pub output_tokens_per_s: f64,
    /// Prompt tokens served from engines' prefix caches / prompt tokens looked up, from the
    /// engine models' own counters.
    pub hit_rate: f64,
    /// Prompt tokens the engines computed, over every leg (`prompt_tokens_by_source`'s
    /// `local_compute`): unlike the hit rate, which counts a split prompt's lookup on both
    /// of its engines, comparable between mixed and disaggregated clusters.
    pub computed_prompt_tokens: u64,
    /// Max / mean of requests per engine.
    pub load_imbalance: f64,
    pub preemptions: u64,
    /// Zero for policies that do not gossip (they read loads centrally).
    pub gossip: GossipTraffic,
    /// Time from a new prefix entering a node's index until 50% / 99% of the other nodes'
    /// views hold it (kvmesh only).
    pub prefix_reach_50_s: Option<f64>,
    pub prefix_reach_99_s: Option<f64>,
    /// `decide`'s reasons, for the policies that call it.
    pub reasons: BTreeMap<String, u64>,
    /// Attempts a serving node declined (late binding; the gossiping policies).
    pub declines: u64,
    /// How the traffic met the nodes that joined during the run (`--join-nodes`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub join: Option<JoinFigures>,
    pub simulated_s: f64,
    pub wall_s: f64,
    /// TTFT CDF, 100 points (quantile, seconds), for plots.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub ttft_cdf: Vec<(f64, f64)>,
}

/// `points` + 1 evenly spaced quantiles of sorted samples, from the smallest to the largest.
pub fn cdf(sorted: &[f64], points: usize) -> Vec<(f64, f64)> {
    if sorted.is_empty() {
        return Vec::new();
    }
    (0..=points)
        .map(|i| {
            let q = i as f64 / points as f64;
            (q, quantile(sorted, q))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_sorts_then_interpolates() {
        let mut v: Vec<f64> = (1..=100).rev().map(f64::from).collect();
        assert_eq!(Latency::of(&mut []), Latency::default());
        let l = Latency::of(&mut v);
        for (got, want) in [(l.p50, 50.5), (l.p90, 90.1), (l.p99, 99.01)] {
            assert!((got - want).abs() < 1e-9, "{got} vs {want}");
        }
        assert!((l.mean - 50.5).abs() < 1e-9);
    }

    #[test]
    fn the_cdf_runs_from_the_smallest_to_the_largest() {
        let c = cdf(&[1.0, 2.0, 4.0], 4);
        assert_eq!(c.first(), Some(&(0.0, 1.0)));
        assert_eq!(c[2], (0.5, 2.0));
        assert_eq!(c.last(), Some(&(1.0, 4.0)));
        assert!(cdf(&[], 10).is_empty());
    }
}
