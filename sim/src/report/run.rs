//! One run of the demo (a workload under a routing policy): what the load generator measured
//! (its JSON report), what the sampler saw of the engines, and the figures derived from both.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};

use super::sample::{self, Sample};

/// The parts of the load generator's JSON report (`kvmesh-sim.load.v1`) the report reads.
#[derive(Debug, Clone, Deserialize)]
pub struct LoadDoc {
    /// Schema tag.
    pub schema: String,
    /// Wall-clock start, Unix seconds.
    pub started_at_unix_s: f64,
    /// What was run.
    pub config: LoadDocConfig,
    /// First request to last completion.
    pub duration_s: f64,
    /// Request counts.
    pub requests: LoadDocRequests,
    /// Failures by kind.
    #[serde(default)]
    pub errors: BTreeMap<String, u64>,
    /// Rates.
    pub throughput: LoadDocThroughput,
    /// Time to first token.
    pub ttft_s: LoadDocSummary,
    /// Inter-token latency.
    pub itl_s: LoadDocSummary,
    /// End-to-end latency.
    pub e2e_s: LoadDocSummary,
    /// Successful requests per `x-kvmesh-node`.
    #[serde(default)]
    pub placements: BTreeMap<String, u64>,
    /// Per-engine counter deltas.
    #[serde(default)]
    pub engines: Vec<LoadDocEngine>,
    /// Cluster sums.
    pub cluster: LoadDocCluster,
}

/// `config` of the load report.
#[derive(Debug, Clone, Deserialize)]
pub struct LoadDocConfig {
    /// Workload name (`gsp`, `chat`, `rag`, `trace`).
    pub workload: String,
    /// `random` or `round-robin`.
    pub pick: String,
    /// Target base URLs.
    #[serde(default)]
    pub targets: Vec<String>,
}

/// `requests` of the load report.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct LoadDocRequests {
    /// Sent.
    pub sent: u64,
    /// Answered completely with 2xx.
    pub ok: u64,
    /// The others.
    pub failed: u64,
}

/// `throughput` of the load report.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct LoadDocThroughput {
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Generated tokens per second.
    pub output_tokens_per_s: f64,
}

/// A latency summary of the load report, seconds: the load generator's own type, read back.
pub type LoadDocSummary = crate::load::stats::Summary;

/// One engine of the load report.
#[derive(Debug, Clone, Deserialize)]
pub struct LoadDocEngine {
    /// Base URL.
    pub url: String,
    /// Scrape failure.
    pub error: Option<String>,
    /// Δ requests finished.
    pub requests: Option<f64>,
    /// Δ hits / Δ queries.
    pub hit_rate: Option<f64>,
}

/// `cluster` of the load report.
#[derive(Debug, Clone, Copy, Deserialize)]
pub struct LoadDocCluster {
    /// Σ hits / Σ queries.
    pub hit_rate: Option<f64>,
    /// Cached tokens the answers reported over their prompt tokens (older reports lack it).
    #[serde(default)]
    pub reported_hit_rate: Option<f64>,
    /// Σ Δ hits (tokens).
    pub prefix_cache_hits: f64,
    /// Σ Δ queries (tokens).
    pub prefix_cache_queries: f64,
}

/// The figures of one run, as they appear in the table and in `results.json`.
#[derive(Debug, Clone, Serialize)]
pub struct RunFigures {
    /// Workload name.
    pub workload: String,
    /// Routing policy label (`kvmesh`, `round-robin`, `vllm-router cache_aware`, ...).
    pub policy: String,
    /// The load report this came from.
    pub load_json: PathBuf,
    /// Requests sent.
    pub requests: u64,
    /// Requests answered completely.
    pub ok: u64,
    /// Failed requests.
    pub errors: u64,
    /// Failures by kind.
    pub errors_by_kind: BTreeMap<String, u64>,
    /// First request to last completion, seconds.
    pub duration_s: f64,
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Generated tokens per second.
    pub output_tokens_per_s: f64,
    /// Client-side time to first token, seconds.
    pub ttft_s: LoadDocSummary,
    /// Client-side inter-token latency, seconds.
    pub itl_s: LoadDocSummary,
    /// Client-side end-to-end latency, seconds.
    pub e2e_s: LoadDocSummary,
    /// Engines' prefix-cache hit rate over the run (Σ hits / Σ queries, tokens).
    pub hit_rate: Option<f64>,
    /// Requests finished per engine over the run (engine counters).
    pub engine_requests: Vec<f64>,
    /// Load imbalance: max / mean of `engine_requests` (1.0 is perfectly even).
    pub imbalance: Option<f64>,
    /// Successful requests per serving node (`x-kvmesh-node`), when the targets are sidecars.
    pub placements: BTreeMap<String, u64>,
}

/// A run with its time series, ready to chart.
#[derive(Debug, Clone)]
pub struct Run {
    /// Table figures.
    pub figures: RunFigures,
    /// Per engine: (seconds since the load started, running + waiting requests).
    pub queue_series: Vec<Vec<(f64, f64)>>,
    /// Engine-side TTFT histogram over the run, all engines: (upper bound s, cumulative count).
    pub engine_ttft_cdf: Vec<(f64, f64)>,
}

/// Reads a load report and, when present, its samples file (`X.json` → `X.samples.jsonl`).
pub fn load(policy: &str, load_json: &Path) -> anyhow::Result<Run> {
    let text = std::fs::read_to_string(load_json)
        .map_err(|e| anyhow::anyhow!("cannot read {}: {e}", load_json.display()))?;
    let doc: LoadDoc = serde_json::from_str(&text)
        .map_err(|e| anyhow::anyhow!("{} is not a load report: {e}", load_json.display()))?;
    anyhow::ensure!(
        doc.schema.starts_with("kvmesh-sim.load."),
        "{}: unexpected schema {:?}",
        load_json.display(),
        doc.schema
    );
    let samples_path = samples_path(load_json);
    let samples = if samples_path.exists() {
        sample::read(&samples_path)?
    } else {
        Vec::new()
    };
    Ok(from_parts(policy, load_json, &doc, &samples))
}

/// Where the samples of a load report live.
pub fn samples_path(load_json: &Path) -> PathBuf {
    let stem = load_json
        .file_stem()
        .map(|s| s.to_string_lossy().into_owned())
        .unwrap_or_default();
    load_json.with_file_name(format!("{stem}.samples.jsonl"))
}

/// Derives a run's figures and series.
pub fn from_parts(policy: &str, load_json: &Path, doc: &LoadDoc, samples: &[Sample]) -> Run {
    let engine_requests: Vec<f64> = doc.engines.iter().filter_map(|e| e.requests).collect();
    let figures = RunFigures {
        workload: doc.config.workload.clone(),
        policy: policy.to_owned(),
        load_json: load_json.to_path_buf(),
        requests: doc.requests.sent,
        ok: doc.requests.ok,
        errors: doc.requests.failed,
        errors_by_kind: doc.errors.clone(),
        duration_s: doc.duration_s,
        requests_per_s: doc.throughput.requests_per_s,
        output_tokens_per_s: doc.throughput.output_tokens_per_s,
        ttft_s: doc.ttft_s,
        itl_s: doc.itl_s,
        e2e_s: doc.e2e_s,
        // Without the engines' counters (not scraped), what the answers said.
        hit_rate: doc.cluster.hit_rate.or(doc.cluster.reported_hit_rate),
        imbalance: imbalance(&engine_requests),
        engine_requests,
        placements: doc.placements.clone(),
    };
    Run {
        figures,
        queue_series: queue_series(doc.started_at_unix_s, samples),
        engine_ttft_cdf: engine_ttft_cdf(samples),
    }
}

/// max / mean of per-engine request counts.
pub fn imbalance(per_engine: &[f64]) -> Option<f64> {
    if per_engine.is_empty() {
        return None;
    }
    let mean = per_engine.iter().sum::<f64>() / per_engine.len() as f64;
    let max = per_engine.iter().copied().fold(f64::MIN, f64::max);
    (mean > 0.0).then(|| max / mean)
}

/// Running + waiting per engine over time, from the samples.
fn queue_series(start_unix_s: f64, samples: &[Sample]) -> Vec<Vec<(f64, f64)>> {
    let n = samples.iter().map(|s| s.engines.len()).max().unwrap_or(0);
    let mut out = vec![Vec::new(); n];
    for s in samples {
        for (i, e) in s.engines.iter().enumerate() {
            if let Some(m) = &e.metrics {
                out[i].push((s.t - start_unix_s, m.running + m.waiting));
            }
        }
    }
    out
}

/// The engines' TTFT histogram accumulated between the first and the last sample, summed
/// over engines. Empty without at least two samples.
fn engine_ttft_cdf(samples: &[Sample]) -> Vec<(f64, f64)> {
    let (Some(first), Some(last)) = (samples.first(), samples.last()) else {
        return Vec::new();
    };
    if samples.len() < 2 {
        return Vec::new();
    }
    let mut sum: BTreeMap<u64, (f64, f64)> = BTreeMap::new();
    for (i, e) in last.engines.iter().enumerate() {
        let Some(after) = &e.metrics else { continue };
        let before = first.engines.get(i).and_then(|b| b.metrics.as_ref());
        for &(le, n) in &after.ttft_buckets {
            let n0 = before
                .and_then(|b| b.ttft_buckets.iter().find(|(l, _)| *l == le))
                .map_or(0.0, |&(_, n)| n);
            sum.entry(le.to_bits()).or_insert((le, 0.0)).1 += n - n0;
        }
    }
    let mut v: Vec<(f64, f64)> = sum.into_values().collect();
    v.sort_by(|a, b| a.0.total_cmp(&b.0));
    v
}

/// A small load report, for tests of this module and of the page.
#[cfg(test)]
pub(crate) fn tests_doc() -> &'static str {
    tests::DOC
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::sample::EngineSample;
    use crate::report::snapshot::EngineSnapshot;

    pub(crate) const DOC: &str = r#"{
      "schema": "kvmesh-sim.load.v1", "started_at_unix_s": 100.0,
      "config": {"workload": "gsp", "pick": "random", "targets": ["http://a"]},
      "duration_s": 10.0,
      "requests": {"sent": 10, "ok": 9, "failed": 1},
      "errors": {"timeout": 1},
      "tokens": {"input": 1, "output": 2},
      "throughput": {"requests_per_s": 0.9, "output_tokens_per_s": 20.0, "total_tokens_per_s": 30.0},
      "ttft_s": {"count": 9, "mean": 0.1, "p50": 0.08, "p90": 0.2, "p99": 0.3, "max": 0.31},
      "itl_s": {"count": 0, "mean": null, "p50": null, "p90": null, "p99": null, "max": null},
      "e2e_s": {"count": 9, "mean": 1.0, "p50": 1.0, "p90": 1.0, "p99": 1.0, "max": 1.0},
      "targets": [], "placements": {"n1": 9},
      "engines": [{"url": "http://e1", "error": null, "requests": 6.0, "hit_rate": 0.5},
                  {"url": "http://e2", "error": null, "requests": 3.0, "hit_rate": 0.5}],
      "cluster": {"prefix_cache_queries": 100.0, "prefix_cache_hits": 50.0, "hit_rate": 0.5,
                  "requests": 9.0, "request_spread": {"min": 3.0, "max": 6.0, "cv": 0.3}}
    }"#;

    fn snap(running: f64, buckets: &[(f64, f64)]) -> EngineSample {
        EngineSample {
            url: "http://e".into(),
            error: None,
            metrics: Some(EngineSnapshot {
                running,
                ttft_buckets: buckets.to_vec(),
                ..Default::default()
            }),
        }
    }

    #[test]
    fn figures_come_from_the_load_report() {
        let doc: LoadDoc = serde_json::from_str(DOC).unwrap();
        let run = from_parts("kvmesh", Path::new("x.json"), &doc, &[]);
        let f = &run.figures;
        assert_eq!((f.requests, f.ok, f.errors), (10, 9, 1));
        assert_eq!(f.hit_rate, Some(0.5));
        assert_eq!(f.engine_requests, vec![6.0, 3.0]);
        assert!((f.imbalance.unwrap() - 6.0 / 4.5).abs() < 1e-12);
        assert_eq!(f.ttft_s.p99, Some(0.3));
        assert!(run.queue_series.is_empty() && run.engine_ttft_cdf.is_empty());
    }

    #[test]
    fn series_are_relative_to_the_load_start_and_histograms_are_deltas() {
        let doc: LoadDoc = serde_json::from_str(DOC).unwrap();
        let samples = vec![
            Sample {
                t: 100.5,
                engines: vec![snap(1.0, &[(0.1, 2.0), (1.0, 3.0)]), snap(0.0, &[])],
            },
            Sample {
                t: 101.5,
                engines: vec![
                    snap(4.0, &[(0.1, 5.0), (1.0, 9.0)]),
                    snap(2.0, &[(0.1, 1.0)]),
                ],
            },
        ];
        let run = from_parts("kvmesh", Path::new("x.json"), &doc, &samples);
        assert_eq!(run.queue_series[0], vec![(0.5, 1.0), (1.5, 4.0)]);
        assert_eq!(run.queue_series[1], vec![(0.5, 0.0), (1.5, 2.0)]);
        assert_eq!(run.engine_ttft_cdf, vec![(0.1, 4.0), (1.0, 6.0)]);
    }

    #[test]
    fn imbalance_of_even_load_is_one() {
        assert_eq!(imbalance(&[3.0, 3.0, 3.0]), Some(1.0));
        assert_eq!(imbalance(&[]), None);
        assert_eq!(imbalance(&[0.0, 0.0]), None);
    }

    #[test]
    fn samples_path_sits_next_to_the_load_report() {
        assert_eq!(
            samples_path(Path::new("/d/gsp-kvmesh.json")),
            PathBuf::from("/d/gsp-kvmesh.samples.jsonl")
        );
    }
}
