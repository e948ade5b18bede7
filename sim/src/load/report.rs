//! The run report: a table for people and a stable JSON document for tools.
//!
//! The JSON schema is versioned by its `schema` field (`kvmesh-sim.load.v1`) and documented in
//! `sim/README.md`; fields are only ever added within a version.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::time::Duration;

use serde::Serialize;

use super::config::{LoadArgs, Pick};
use super::render::Api;
use super::runner::{Arrivals, Record, arrivals};
use super::scrape::EngineCounters;
use super::stats::{Summary, summarize};
use crate::workload::WorkloadKind;

/// Version tag of the JSON report.
pub const SCHEMA: &str = "kvmesh-sim.load.v1";

/// The whole report.
#[derive(Debug, Clone, Serialize)]
pub struct Report {
    /// Always [`SCHEMA`].
    pub schema: &'static str,
    /// Wall-clock start, Unix seconds.
    pub started_at_unix_s: f64,
    /// What was run.
    pub config: ReportConfig,
    /// From the first request to the last completion, seconds.
    pub duration_s: f64,
    /// Request counts.
    pub requests: RequestCounts,
    /// Failed requests by kind (`connect`, `timeout`, `http_<status>`, `stream`, `body`).
    pub errors: BTreeMap<String, u64>,
    /// Token totals over successful requests.
    pub tokens: TokenCounts,
    /// Rates over `duration_s`.
    pub throughput: Throughput,
    /// How the summaries' percentiles are computed: always [`crate::quantile::METHOD`].
    pub percentile_method: &'static str,
    /// Time to first token (streaming: first text chunk; otherwise the whole response).
    pub ttft_s: Summary,
    /// Gaps between text chunks over all streamed requests (empty without `--stream`).
    pub itl_s: Summary,
    /// End-to-end latency.
    pub e2e_s: Summary,
    /// Requests per target, in `--targets` order.
    pub targets: Vec<TargetReport>,
    /// Successful requests per `x-kvmesh-node` response header value (empty when absent).
    pub placements: BTreeMap<String, u64>,
    /// Per-engine deltas of `/metrics` counters over the run.
    pub engines: Vec<EngineReport>,
    /// Sums over the engines that were scraped successfully.
    pub cluster: ClusterReport,
}

/// The run's configuration.
#[derive(Debug, Clone, Serialize)]
pub struct ReportConfig {
    /// Workload name.
    pub workload: WorkloadKind,
    /// Target base URLs.
    pub targets: Vec<String>,
    /// Scraped engine base URLs.
    pub engines: Vec<String>,
    /// Target choice.
    pub pick: Pick,
    /// `poisson`, `trace` or `closed`.
    pub arrivals: &'static str,
    /// Poisson rate, requests/s.
    pub rate: Option<f64>,
    /// Closed-loop concurrency.
    pub concurrency: Option<usize>,
    /// Trace timestamp multiplier.
    pub time_scale: f64,
    /// `--requests`.
    pub requests_limit: Option<u64>,
    /// `--duration`, seconds.
    pub duration_limit_s: Option<f64>,
    /// Streaming.
    pub stream: bool,
    /// Endpoint of prompt workloads.
    pub api: Api,
    /// Model.
    pub model: String,
    /// Seed.
    pub seed: u64,
}

/// Request counts.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct RequestCounts {
    /// Requests sent.
    pub sent: u64,
    /// Requests answered completely with a 2xx status.
    pub ok: u64,
    /// The others.
    pub failed: u64,
}

/// Token totals.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct TokenCounts {
    /// Prompt tokens (from usage when reported).
    pub input: u64,
    /// Generated tokens.
    pub output: u64,
}

/// Rates.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Throughput {
    /// Successful requests per second.
    pub requests_per_s: f64,
    /// Generated tokens per second.
    pub output_tokens_per_s: f64,
    /// Prompt plus generated tokens per second.
    pub total_tokens_per_s: f64,
}

/// One target.
#[derive(Debug, Clone, Serialize)]
pub struct TargetReport {
    /// Base URL.
    pub url: String,
    /// Requests sent there.
    pub sent: u64,
    /// Of which succeeded.
    pub ok: u64,
}

/// One engine's counter deltas.
#[derive(Debug, Clone, Serialize)]
pub struct EngineReport {
    /// Base URL.
    pub url: String,
    /// Why the scrape failed (before or after), if it did; the numbers are then null.
    pub error: Option<String>,
    /// Δ `vllm:request_success_total` less aborted ones (requests the engine finished for
    /// their client).
    pub requests: Option<f64>,
    /// Δ `vllm:request_success_total{finished_reason="abort"}`: requests withdrawn before
    /// their end (a client that hung up, or a sidecar that gave up on this engine's node and
    /// retried elsewhere).
    pub aborted: Option<f64>,
    /// Δ `vllm:prefix_cache_queries_total`.
    pub prefix_cache_queries: Option<f64>,
    /// Δ `vllm:prefix_cache_hits_total`.
    pub prefix_cache_hits: Option<f64>,
    /// hits / queries over the run.
    pub hit_rate: Option<f64>,
}

/// Cluster-wide figures.
#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    /// Σ Δ queries.
    pub prefix_cache_queries: f64,
    /// Σ Δ hits.
    pub prefix_cache_hits: f64,
    /// Σ hits / Σ queries (null when nothing was queried or nothing scraped).
    pub hit_rate: Option<f64>,
    /// The answers' own hit rate: their `usage.prompt_tokens_details.cached_tokens` over the
    /// prompt tokens of the requests whose answer reported it (null when none did). Unlike
    /// `hit_rate` it counts only this run's requests, not whatever else the engines served
    /// meanwhile: the figure for one model of several sharing engines.
    pub reported_hit_rate: Option<f64>,
    /// Σ Δ requests finished by the engines.
    pub requests: f64,
    /// Spread of Δ requests over engines.
    pub request_spread: Spread,
}

/// Spread of per-engine request counts.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spread {
    /// Fewest requests on one engine.
    pub min: Option<f64>,
    /// Most requests on one engine.
    pub max: Option<f64>,
    /// Coefficient of variation (stddev / mean).
    pub cv: Option<f64>,
}

/// Assembles the report.
#[allow(clippy::too_many_arguments)]
pub fn build(
    args: &LoadArgs,
    targets: &[String],
    engines: &[String],
    started_at_unix_s: f64,
    elapsed: Duration,
    records: Vec<Record>,
    before: &[Result<EngineCounters, String>],
    after: &[Result<EngineCounters, String>],
) -> Report {
    let arr = arrivals(args);
    let duration_s = elapsed.as_secs_f64();
    let mut errors = BTreeMap::new();
    let mut placements = BTreeMap::new();
    let mut per_target: Vec<TargetReport> = targets
        .iter()
        .map(|u| TargetReport {
            url: u.clone(),
            sent: 0,
            ok: 0,
        })
        .collect();
    let (mut ttft, mut itl, mut e2e) = (Vec::new(), Vec::new(), Vec::new());
    let (mut ok, mut input, mut output) = (0u64, 0u64, 0u64);
    let (mut reported_cached, mut reported_prompt) = (0u64, 0u64);
    for r in &records {
        per_target[r.target].sent += 1;
        if let Some(e) = &r.outcome.error {
            *errors.entry(e.name()).or_insert(0) += 1;
            continue;
        }
        ok += 1;
        per_target[r.target].ok += 1;
        if let Some(cached) = r.outcome.cached_tokens {
            reported_cached += cached;
            reported_prompt += r.input_tokens;
        }
        input += r.input_tokens;
        output += r.outcome.output_tokens;
        if let Some(t) = r.outcome.ttft {
            ttft.push(t.as_secs_f64());
        }
        itl.extend(r.outcome.itl.iter().map(|&x| f64::from(x)));
        e2e.push(r.outcome.e2e.as_secs_f64());
        if let Some(n) = &r.outcome.node {
            *placements.entry(n.clone()).or_insert(0) += 1;
        }
    }
    let sent = records.len() as u64;
    let rate = |x: f64| {
        if duration_s > 0.0 {
            x / duration_s
        } else {
            0.0
        }
    };
    let engine_reports: Vec<EngineReport> = engines
        .iter()
        .enumerate()
        .map(|(i, url)| match (before.get(i), after.get(i)) {
            (Some(Ok(b)), Some(Ok(a))) => {
                let q = a.prefix_cache_queries - b.prefix_cache_queries;
                let h = a.prefix_cache_hits - b.prefix_cache_hits;
                EngineReport {
                    url: url.clone(),
                    error: None,
                    requests: Some(a.requests - b.requests),
                    aborted: Some(a.aborted - b.aborted),
                    prefix_cache_queries: Some(q),
                    prefix_cache_hits: Some(h),
                    hit_rate: (q > 0.0).then(|| h / q),
                }
            }
            (b, a) => EngineReport {
                url: url.clone(),
                error: Some(match (b, a) {
                    (Some(Err(e)), _) | (_, Some(Err(e))) => e.clone(),
                    _ => "not scraped".into(),
                }),
                requests: None,
                aborted: None,
                prefix_cache_queries: None,
                prefix_cache_hits: None,
                hit_rate: None,
            },
        })
        .collect();
    let scraped: Vec<&EngineReport> = engine_reports
        .iter()
        .filter(|e| e.error.is_none())
        .collect();
    let q: f64 = scraped.iter().filter_map(|e| e.prefix_cache_queries).sum();
    let h: f64 = scraped.iter().filter_map(|e| e.prefix_cache_hits).sum();
    let reqs: Vec<f64> = scraped.iter().filter_map(|e| e.requests).collect();
    Report {
        schema: SCHEMA,
        started_at_unix_s,
        config: ReportConfig {
            workload: args.workload_kind(),
            targets: targets.to_vec(),
            engines: engines.to_vec(),
            pick: args.pick,
            arrivals: match arr {
                Arrivals::Poisson(_) => "poisson",
                Arrivals::Trace => "trace",
                Arrivals::Closed(_) => "closed",
            },
            rate: match arr {
                Arrivals::Poisson(r) => Some(r),
                _ => None,
            },
            concurrency: match arr {
                Arrivals::Closed(c) => Some(c),
                _ => None,
            },
            time_scale: args.time_scale,
            requests_limit: args.requests,
            duration_limit_s: args.duration,
            stream: args.stream,
            api: args.api,
            model: args.model.clone(),
            seed: args.seed,
        },
        duration_s,
        requests: RequestCounts {
            sent,
            ok,
            failed: sent - ok,
        },
        errors,
        tokens: TokenCounts { input, output },
        throughput: Throughput {
            requests_per_s: rate(ok as f64),
            output_tokens_per_s: rate(output as f64),
            total_tokens_per_s: rate((input + output) as f64),
        },
        percentile_method: crate::quantile::METHOD,
        ttft_s: summarize(&mut ttft),
        itl_s: summarize(&mut itl),
        e2e_s: summarize(&mut e2e),
        targets: per_target,
        placements,
        engines: engine_reports,
        cluster: ClusterReport {
            prefix_cache_queries: q,
            prefix_cache_hits: h,
            hit_rate: (q > 0.0).then(|| h / q),
            reported_hit_rate: (reported_prompt > 0)
                .then(|| (reported_cached as f64 / reported_prompt as f64).min(1.0)),
            requests: reqs.iter().sum(),
            request_spread: spread(&reqs),
        },
    }
}

fn spread(v: &[f64]) -> Spread {
    if v.is_empty() {
        return Spread {
            min: None,
            max: None,
            cv: None,
        };
    }
    let mean = v.iter().sum::<f64>() / v.len() as f64;
    let var = v.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / v.len() as f64;
    Spread {
        min: v.iter().copied().reduce(f64::min),
        max: v.iter().copied().reduce(f64::max),
        cv: (mean > 0.0).then(|| var.sqrt() / mean),
    }
}

/// The human-readable table.
pub fn table(r: &Report) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "workload {:?}, {} target(s), {} arrivals, stream={}",
        r.config.workload,
        r.config.targets.len(),
        r.config.arrivals,
        r.config.stream
    );
    let _ = writeln!(
        s,
        "requests: {} sent, {} ok, {} failed in {:.2} s  ->  {:.1} req/s, {:.1} output tok/s",
        r.requests.sent,
        r.requests.ok,
        r.requests.failed,
        r.duration_s,
        r.throughput.requests_per_s,
        r.throughput.output_tokens_per_s
    );
    for (k, v) in &r.errors {
        let _ = writeln!(s, "  error {k}: {v}");
    }
    let _ = writeln!(
        s,
        "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10}",
        "ms", "mean", "p50", "p90", "p99", "max"
    );
    for (name, sum) in [("TTFT", &r.ttft_s), ("ITL", &r.itl_s), ("E2E", &r.e2e_s)] {
        let f = |x: Option<f64>| x.map_or("-".to_owned(), |v| format!("{:.2}", v * 1e3));
        let _ = writeln!(
            s,
            "{:<10} {:>10} {:>10} {:>10} {:>10} {:>10}",
            name,
            f(sum.mean),
            f(sum.p50),
            f(sum.p90),
            f(sum.p99),
            f(sum.max)
        );
    }
    match r.cluster.hit_rate {
        Some(h) => {
            let _ = writeln!(
                s,
                "cluster prefix-cache hit rate: {:.1}% ({:.0} of {:.0} prompt tokens)",
                h * 100.0,
                r.cluster.prefix_cache_hits,
                r.cluster.prefix_cache_queries
            );
        }
        None => {
            let _ = writeln!(s, "cluster prefix-cache hit rate: n/a");
        }
    }
    if let Some(h) = r.cluster.reported_hit_rate {
        let _ = writeln!(
            s,
            "hit rate the answers reported (cached_tokens): {:.1}%",
            h * 100.0
        );
    }
    for e in &r.engines {
        match (&e.error, e.requests, e.hit_rate) {
            (Some(err), _, _) => {
                let _ = writeln!(s, "  engine {}: scrape failed: {err}", e.url);
            }
            (None, reqs, hit) => {
                let hit = hit.map_or("n/a".to_owned(), |h| format!("{:.1}%", h * 100.0));
                let aborted = e
                    .aborted
                    .filter(|&n| n > 0.0)
                    .map_or(String::new(), |n| format!(" (and {n} aborted)"));
                let _ = writeln!(
                    s,
                    "  engine {}: {} requests{aborted}, hit rate {hit}",
                    e.url,
                    reqs.unwrap_or(0.0)
                );
            }
        }
    }
    if !r.placements.is_empty() {
        let _ = writeln!(s, "placements (x-kvmesh-node):");
        for (k, v) in &r.placements {
            let _ = writeln!(s, "  {k}: {v}");
        }
    }
    s
}
