//! The simulator's plots (`--svg-dir`): the TTFT CDF of each policy, and hit rate and gossip
//! bytes per node against the cluster size, drawn by [`crate::chart::plot`].

use super::results::PolicyResult;
use super::run::Report;
use crate::chart::plot::Plot;
use crate::chart::{self, Scale, Series};

/// TTFT CDF of every policy at the first cluster size.
pub fn ttft_cdf(report: &Report) -> Option<String> {
    let run = report.runs.first()?;
    let series: Vec<Series> = run
        .results
        .iter()
        .enumerate()
        .map(|(i, r)| Series {
            name: r.policy.clone(),
            color: chart::color(i).to_owned(),
            points: r.ttft_cdf.iter().map(|&(q, t)| (t.max(1e-3), q)).collect(),
        })
        .collect();
    let plot = Plot {
        title: format!("TTFT CDF, {} nodes, {}", run.nodes, report.workload),
        x_label: "time to first token (s, log)".into(),
        y_label: "fraction of requests".into(),
        x_scale: Scale::Log,
        y_scale: Scale::Linear,
    };
    Some(plot.render(&series))
}

/// Hit rate against N, one line per policy.
pub fn hit_rate_vs_nodes(report: &Report) -> Option<String> {
    (report.runs.len() > 1).then(|| {
        let plot = Plot {
            title: format!("prefix-cache hit rate, {}", report.workload),
            x_label: "nodes (log)".into(),
            y_label: "hit rate (%)".into(),
            x_scale: Scale::Log,
            y_scale: Scale::Linear,
        };
        plot.render(&by_policy(report, |r| Some(r.hit_rate * 100.0)))
    })
}

/// Gossip bytes per node per second against N, for the gossiping policies.
pub fn gossip_vs_nodes(report: &Report) -> Option<String> {
    (report.runs.len() > 1).then(|| {
        let plot = Plot {
            title: "gossip bytes per node per second".into(),
            x_label: "nodes (log)".into(),
            y_label: "bytes/s (log)".into(),
            x_scale: Scale::Log,
            y_scale: Scale::Log,
        };
        plot.render(&by_policy(report, |r| {
            (r.gossip.total_bytes_per_node_s > 0.0).then_some(r.gossip.total_bytes_per_node_s)
        }))
    })
}

/// One series per policy of `value` against the cluster size, skipping `None`s.
fn by_policy(report: &Report, value: impl Fn(&PolicyResult) -> Option<f64>) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for run in &report.runs {
        for r in &run.results {
            let Some(v) = value(r) else { continue };
            match series.iter_mut().find(|s| s.name == r.policy) {
                Some(s) => s.points.push((run.nodes as f64, v)),
                None => series.push(Series {
                    name: r.policy.clone(),
                    color: chart::color(series.len()).to_owned(),
                    points: vec![(run.nodes as f64, v)],
                }),
            }
        }
    }
    series
}
