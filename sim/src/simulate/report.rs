//! The markdown table of a report.

use std::fmt::Write;

use super::results::PolicyResult;
use super::run::Report;

/// One table per cluster size, then (with several sizes) the scaling summary.
pub fn markdown(report: &Report) -> String {
    let mut out = String::new();
    for run in &report.runs {
        let _ = writeln!(
            out,
            "## {} nodes, {} ({} requests)\n",
            run.nodes,
            report.workload,
            run.results.first().map_or(0, |r| r.requests)
        );
        out.push_str(
            "| policy | TTFT mean s | p50 | p90 | p99 | E2E mean s | p99 | req/s | hit rate | \
             imbalance | preempt | gossip B/node/s | prefix 50% s | 99% s | wall s |\n",
        );
        out.push_str(
            "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n",
        );
        for r in &run.results {
            let _ = writeln!(
                out,
                "| {} | {:.3} | {:.3} | {:.3} | {:.3} | {:.2} | {:.2} | {:.2} | {:.1}% | {:.2} | {} | {} | {} | {} | {:.1} |",
                r.policy,
                r.ttft_s.mean,
                r.ttft_s.p50,
                r.ttft_s.p90,
                r.ttft_s.p99,
                r.e2e_s.mean,
                r.e2e_s.p99,
                r.throughput_rps,
                r.hit_rate * 100.0,
                r.load_imbalance,
                r.preemptions,
                bytes(r.gossip.total_bytes_per_node_s),
                opt(r.prefix_reach_50_s),
                opt(r.prefix_reach_99_s),
                r.wall_s,
            );
        }
        out.push('\n');
        objectives(&mut out, report, &run.results);
        joins(&mut out, &run.results);
    }
    if report.runs.len() > 1 {
        out.push_str("## Scaling\n\n| nodes | policy | hit rate | TTFT mean s | digest B/node/s | summary B/node/s | membership B/node/s | total B/node/s |\n|---:|---|---:|---:|---:|---:|---:|---:|\n");
        for run in &report.runs {
            for r in &run.results {
                let _ = writeln!(
                    out,
                    "| {} | {} | {:.1}% | {:.3} | {} | {} | {} | {} |",
                    run.nodes,
                    r.policy,
                    r.hit_rate * 100.0,
                    r.ttft_s.mean,
                    bytes(r.gossip.digest_bytes_per_node_s),
                    bytes(r.gossip.summary_bytes_per_node_s),
                    bytes(r.gossip.membership_bytes_per_node_s),
                    bytes(r.gossip.total_bytes_per_node_s),
                );
            }
        }
        out.push('\n');
    }
    out
}

/// With nodes joining during the run: the requests before and after, and the new nodes' share.
fn joins(out: &mut String, results: &[PolicyResult]) {
    let Some(first) = results.iter().find_map(|r| r.join) else {
        return;
    };
    let _ = writeln!(
        out,
        "{} node(s) joined at {:.1} s:\n\n| policy | requests after | served by the new | share | \
         first served after s | TTFT mean before s | after | p99 after |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|",
        first.nodes, first.at_s
    );
    for r in results {
        let Some(j) = r.join else { continue };
        let _ = writeln!(
            out,
            "| {} | {} | {} | {:.1}% | {} | {:.3} | {:.3} | {:.3} |",
            r.policy,
            j.requests_after,
            j.served_by_joined,
            j.served_by_joined as f64 * 100.0 / j.requests_after.max(1) as f64,
            opt(j.first_served_after_s),
            j.ttft_before_s.mean,
            j.ttft_after_s.mean,
            j.ttft_after_s.p99,
        );
    }
    out.push('\n');
}

/// Inter-token latency, goodput and, in a disaggregated cluster, what became of
/// disaggregation and the transfers.
fn objectives(out: &mut String, report: &Report, results: &[PolicyResult]) {
    let args = &report.args;
    let _ = writeln!(
        out,
        "| policy | ITL p50 ms | ITL p99 ms | goodput req/s (TTFT ≤ {} ms, ITL ≤ {} ms) | met | \
         pd | pd-skip-short | pd-skip-busy | pd-fallback | pulls | handshake waits | mean pull s |",
        args.slo_ttft_ms, args.slo_itl_ms
    );
    out.push_str("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|\n");
    for r in results {
        let reason = |name: &str| r.pd_reasons.get(name).copied().unwrap_or(0);
        let _ = writeln!(
            out,
            "| {} | {:.1} | {:.1} | {:.2} | {:.1}% | {} | {} | {} | {} | {} | {} | {:.3} |",
            r.policy,
            r.itl_s.p50 * 1e3,
            r.itl_s.p99 * 1e3,
            r.goodput_rps,
            r.slo_attainment * 100.0,
            reason("pd"),
            reason("pd-skip-short"),
            reason("pd-skip-busy"),
            reason("pd-fallback"),
            r.transfers.pulls,
            r.transfers.handshake_waits,
            r.transfers.mean_s,
        );
    }
    out.push('\n');
}

fn opt(v: Option<f64>) -> String {
    v.map_or_else(|| "-".into(), |v| format!("{v:.2}"))
}

/// Bytes with a binary-ish unit, "-" for zero.
pub fn bytes(v: f64) -> String {
    match v {
        v if v <= 0.0 => "-".into(),
        v if v < 1e3 => format!("{v:.0}"),
        v if v < 1e6 => format!("{:.1}k", v / 1e3),
        v => format!("{:.2}M", v / 1e6),
    }
}
