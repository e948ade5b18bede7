//! `results.json`: the demo's figures for tools (and the end-to-end test), schema
//! `kvmesh.demo.v1`. Fields are only ever added within a version.

use std::collections::BTreeMap;

use serde::Serialize;

use super::run::RunFigures;

/// Version tag of `results.json`.
pub const SCHEMA: &str = "kvmesh.demo.v1";

/// The whole document.
#[derive(Debug, Clone, Serialize)]
pub struct Results {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// When the report was written, Unix seconds.
    pub generated_at_unix_s: f64,
    /// Free-form facts about the run (date, machine, commit, engine model), from `--meta`.
    pub meta: BTreeMap<String, String>,
    /// Remarks (e.g. why a policy was skipped), from `--note`.
    pub notes: Vec<String>,
    /// How the runs' percentiles were computed (by the load generator): always
    /// [`crate::quantile::METHOD`].
    pub percentile_method: &'static str,
    /// The policy others are compared with.
    pub baseline: String,
    /// One entry per run, in the order given.
    pub runs: Vec<RunFigures>,
    /// Every non-baseline run against the baseline run of the same workload.
    pub comparisons: Vec<Comparison>,
}

/// One policy against the baseline on one workload.
#[derive(Debug, Clone, Serialize)]
pub struct Comparison {
    /// Workload.
    pub workload: String,
    /// Policy compared.
    pub policy: String,
    /// Baseline policy.
    pub baseline: String,
    /// Hit rate minus the baseline's (fraction, not points).
    pub hit_rate_delta: Option<f64>,
    /// Mean TTFT / the baseline's.
    pub ttft_mean_ratio: Option<f64>,
    /// p99 TTFT / the baseline's.
    pub ttft_p99_ratio: Option<f64>,
    /// Higher hit rate and lower mean TTFT than the baseline.
    pub beats_baseline: bool,
}

/// Pairs every run with the baseline run of its workload.
pub fn comparisons(runs: &[RunFigures], baseline: &str) -> Vec<Comparison> {
    let ratio = |a: Option<f64>, b: Option<f64>| match (a, b) {
        (Some(a), Some(b)) if b > 0.0 => Some(a / b),
        _ => None,
    };
    runs.iter()
        .filter(|r| r.policy != baseline)
        .filter_map(|r| {
            let base = runs
                .iter()
                .find(|b| b.workload == r.workload && b.policy == baseline)?;
            let hit_rate_delta = match (r.hit_rate, base.hit_rate) {
                (Some(a), Some(b)) => Some(a - b),
                _ => None,
            };
            let ttft_mean_ratio = ratio(r.ttft_s.mean, base.ttft_s.mean);
            Some(Comparison {
                workload: r.workload.clone(),
                policy: r.policy.clone(),
                baseline: baseline.to_owned(),
                hit_rate_delta,
                ttft_mean_ratio,
                ttft_p99_ratio: ratio(r.ttft_s.p99, base.ttft_s.p99),
                beats_baseline: hit_rate_delta.is_some_and(|d| d > 0.0)
                    && ttft_mean_ratio.is_some_and(|x| x < 1.0),
            })
        })
        .collect()
}
