//! `report.html`: one self-contained page (inline CSS and SVG, no script, no external asset).

use std::fmt::Write;

use super::results::Results;
use super::run::Run;
use super::table;
use crate::chart::bar::BarChart;
use crate::chart::line::LineChart;
use crate::chart::{self, Scale, Series, esc};

const STYLE: &str = "body{font:14px/1.45 system-ui,sans-serif;margin:2em auto;max-width:1180px;\
color:#222;padding:0 1em}h1{font-size:1.6em}h2{margin-top:2em;border-bottom:1px solid #ddd}\
table{border-collapse:collapse;margin:.5em 0}td,th{padding:.25em .7em;border-bottom:1px solid \
#eee;text-align:right}td:first-child,th:first-child{text-align:left}th{background:#f6f6f6}\
.charts{display:flex;flex-wrap:wrap;gap:1em}svg{background:#fff;border:1px solid #eee}\
svg .title{font-size:14px;font-weight:600}svg .tick,svg .legend,svg .val{font-size:11px}\
svg .label,svg .note{font-size:12px}svg .grid{stroke:#eee}svg .axis{stroke:#888}\
dl{display:grid;grid-template-columns:max-content auto;gap:.2em 1em}dt{font-weight:600}\
.cmp{font-family:ui-monospace,monospace}";

/// Renders the page.
pub fn render(results: &Results, runs: &[Run]) -> String {
    let figures: Vec<_> = runs.iter().map(|r| r.figures.clone()).collect();
    let policies = policies(runs);
    let color = |policy: &str| -> String {
        let i = policies.iter().position(|p| p == policy).unwrap_or(0);
        chart::color(i).to_owned()
    };
    let mut h = String::new();
    let _ = write!(
        h,
        "<!DOCTYPE html><html lang=\"en\"><head><meta charset=\"utf-8\"><title>kvmesh demo report</title><style>{STYLE}</style></head><body><h1>kvmesh demo report</h1>"
    );
    h.push_str("<dl>");
    for (k, v) in &results.meta {
        let _ = write!(h, "<dt>{}</dt><dd>{}</dd>", esc(k), esc(v));
    }
    h.push_str("</dl>");
    if !results.notes.is_empty() {
        h.push_str("<ul>");
        for n in &results.notes {
            let _ = write!(h, "<li>{}</li>", esc(n));
        }
        h.push_str("</ul>");
    }
    h.push_str(
        "<p>How to read it: every run starts with cold engine caches and sends the same \
         requests (same seed) under a different routing policy. <b>hit rate</b> is the share of \
         prompt tokens the engines found in their prefix cache (from their own \
         <code>vllm:prefix_cache_*</code> counters); every hit is prefill work not done, which \
         shows up as lower <b>TTFT</b>. <b>imbalance</b> is the busiest engine's request count \
         over the mean (1.00 is perfectly even). Latencies are measured by the client.</p>",
    );

    h.push_str("<h2>Summary</h2><div class=\"charts\">");
    let workloads = table::workloads(&figures);
    let hit_series: Vec<(String, String, Vec<Option<f64>>)> = policies
        .iter()
        .map(|p| {
            let vals = workloads
                .iter()
                .map(|w| {
                    figures
                        .iter()
                        .find(|f| &f.workload == w && &f.policy == p)
                        .and_then(|f| f.hit_rate)
                })
                .collect();
            (p.clone(), color(p), vals)
        })
        .collect();
    h.push_str(
        &BarChart {
            title: "Engine prefix-cache hit rate",
            y_label: "hit rate (prompt tokens)",
            y_max: Some(1.0),
            fmt: |v| format!("{:.0}%", v * 100.0),
        }
        .render(&workloads, &hit_series),
    );
    h.push_str("</div>");

    for w in &workloads {
        let _ = write!(h, "<h2>Workload {}</h2>", esc(w));
        let rows: Vec<&Run> = runs.iter().filter(|r| &r.figures.workload == w).collect();
        h.push_str("<table><tr>");
        for head in table::HEADERS {
            let _ = write!(h, "<th>{}</th>", esc(head));
        }
        h.push_str("</tr>");
        for r in &rows {
            h.push_str("<tr>");
            for c in table::cells(&r.figures) {
                let _ = write!(h, "<td>{}</td>", esc(&c));
            }
            h.push_str("</tr>");
        }
        h.push_str("</table>");
        for c in results.comparisons.iter().filter(|c| &c.workload == w) {
            let (Some(a), Some(b)) = (
                figures
                    .iter()
                    .find(|f| &f.workload == w && f.policy == c.policy),
                figures
                    .iter()
                    .find(|f| &f.workload == w && f.policy == c.baseline),
            ) else {
                continue;
            };
            let _ = write!(h, "<p class=\"cmp\">{}</p>", esc(&table::comparison(a, b)));
        }

        h.push_str("<div class=\"charts\">");
        // Client-side TTFT percentiles per policy.
        let stats = ["mean", "p50", "p90", "p99"];
        let ttft_series: Vec<(String, String, Vec<Option<f64>>)> = rows
            .iter()
            .map(|r| {
                let t = &r.figures.ttft_s;
                (
                    r.figures.policy.clone(),
                    color(&r.figures.policy),
                    vec![t.mean, t.p50, t.p90, t.p99],
                )
            })
            .collect();
        h.push_str(
            &BarChart {
                title: "Time to first token (client side)",
                y_label: "TTFT",
                y_max: None,
                fmt: |v| format!("{:.0} ms", v * 1e3),
            }
            .render(&stats.map(String::from), &ttft_series),
        );
        // Engine-side TTFT distribution from the engines' histograms.
        let cdf: Vec<Series> = rows
            .iter()
            .filter_map(|r| {
                let total = r.engine_ttft_cdf.last()?.1;
                // Stop at the first bucket that holds every request: the empty tail up to
                // vLLM's 2560 s bucket would squeeze the interesting part.
                let end = r
                    .engine_ttft_cdf
                    .iter()
                    .position(|&(_, n)| n >= total)
                    .map_or(r.engine_ttft_cdf.len(), |i| i + 1);
                (total > 0.0).then(|| Series {
                    name: r.figures.policy.clone(),
                    color: color(&r.figures.policy),
                    points: r.engine_ttft_cdf[..end]
                        .iter()
                        .map(|&(le, n)| (le, n / total))
                        .collect(),
                })
            })
            .collect();
        h.push_str(
            &LineChart {
                title: "TTFT distribution (engines' histograms, CDF)",
                x_label: "TTFT at the engine, seconds (bucket bounds)",
                y_label: "fraction of requests",
                x_scale: Scale::Log,
                step: true,
                y_max: Some(1.0),
                y_fmt: |v| format!("{:.0}%", v * 100.0),
                x_fmt: fmt_seconds,
            }
            .render(&cdf),
        );
        // Requests per engine.
        let n_engines = rows
            .iter()
            .map(|r| r.figures.engine_requests.len())
            .max()
            .unwrap_or(0);
        let engines: Vec<String> = (1..=n_engines).map(|i| format!("engine {i}")).collect();
        let per_engine: Vec<(String, String, Vec<Option<f64>>)> = rows
            .iter()
            .map(|r| {
                (
                    r.figures.policy.clone(),
                    color(&r.figures.policy),
                    (0..n_engines)
                        .map(|i| r.figures.engine_requests.get(i).copied())
                        .collect(),
                )
            })
            .collect();
        h.push_str(
            &BarChart {
                title: "Requests finished per engine",
                y_label: "requests",
                y_max: None,
                fmt: |v| format!("{v:.0}"),
            }
            .render(&engines, &per_engine),
        );
        // Per-engine load over time, one chart per policy.
        for r in &rows {
            let series: Vec<Series> = r
                .queue_series
                .iter()
                .enumerate()
                .map(|(i, pts)| Series {
                    name: format!("engine {}", i + 1),
                    color: chart::color(i + 4).to_owned(),
                    points: pts.clone(),
                })
                .collect();
            let title = format!("Load per engine over time: {}", r.figures.policy);
            h.push_str(
                &LineChart {
                    title: &title,
                    x_label: "seconds since the run started",
                    y_label: "requests running + waiting",
                    x_scale: Scale::Linear,
                    step: false,
                    y_max: None,
                    y_fmt: |v| format!("{v:.0}"),
                    x_fmt: |v| format!("{v:.0}"),
                }
                .render(&series),
            );
        }
        h.push_str("</div>");
    }
    let _ = writeln!(
        h,
        "<h2>Files</h2><p><code>results.json</code> (schema <code>{}</code>) holds these figures; \
         each run's raw load-generator report and engine samples are in <code>runs/</code>.</p></body></html>",
        esc(results.schema)
    );
    h
}

/// Policies in order of first appearance.
fn policies(runs: &[Run]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        if !out.contains(&r.figures.policy) {
            out.push(r.figures.policy.clone());
        }
    }
    out
}

fn fmt_seconds(v: f64) -> String {
    if v < 1.0 {
        format!("{:.0} ms", v * 1e3)
    } else {
        format!("{v:.0} s")
    }
}
