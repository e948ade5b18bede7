//! Hand-written SVG plots: the TTFT CDF of each policy, and hit rate and gossip bytes per node
//! against the cluster size.

use std::fmt::Write;

use super::run::Report;

const W: f64 = 640.0;
const H: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
const COLORS: [&str; 8] = [
    "#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];

struct Series {
    name: String,
    points: Vec<(f64, f64)>,
}

struct Axes {
    title: String,
    x_label: String,
    y_label: String,
    x_log: bool,
    y_log: bool,
}

/// TTFT CDF of every policy at the first cluster size.
pub fn ttft_cdf(report: &Report) -> Option<String> {
    let run = report.runs.first()?;
    let series: Vec<Series> = run
        .results
        .iter()
        .map(|r| Series {
            name: r.policy.clone(),
            points: r.ttft_cdf.iter().map(|&(q, t)| (t.max(1e-3), q)).collect(),
        })
        .collect();
    Some(plot(
        &Axes {
            title: format!("TTFT CDF, {} nodes, {}", run.nodes, report.workload),
            x_label: "time to first token (s, log)".into(),
            y_label: "fraction of requests".into(),
            x_log: true,
            y_log: false,
        },
        &series,
    ))
}

/// Hit rate against N, one line per policy.
pub fn hit_rate_vs_nodes(report: &Report) -> Option<String> {
    (report.runs.len() > 1).then(|| {
        plot(
            &Axes {
                title: format!("prefix-cache hit rate, {}", report.workload),
                x_label: "nodes (log)".into(),
                y_label: "hit rate (%)".into(),
                x_log: true,
                y_log: false,
            },
            &by_policy(report, |r| Some(r.hit_rate * 100.0)),
        )
    })
}

/// Gossip bytes per node per second against N, for the gossiping policies.
pub fn gossip_vs_nodes(report: &Report) -> Option<String> {
    (report.runs.len() > 1).then(|| {
        plot(
            &Axes {
                title: "gossip bytes per node per second".into(),
                x_label: "nodes (log)".into(),
                y_label: "bytes/s (log)".into(),
                x_log: true,
                y_log: true,
            },
            &by_policy(report, |r| {
                (r.gossip.total_bytes_per_node_s > 0.0).then_some(r.gossip.total_bytes_per_node_s)
            }),
        )
    })
}

fn by_policy(
    report: &Report,
    value: impl Fn(&super::results::PolicyResult) -> Option<f64>,
) -> Vec<Series> {
    let mut series: Vec<Series> = Vec::new();
    for run in &report.runs {
        for r in &run.results {
            let Some(v) = value(r) else { continue };
            match series.iter_mut().find(|s| s.name == r.policy) {
                Some(s) => s.points.push((run.nodes as f64, v)),
                None => series.push(Series {
                    name: r.policy.clone(),
                    points: vec![(run.nodes as f64, v)],
                }),
            }
        }
    }
    series
}

fn plot(axes: &Axes, series: &[Series]) -> String {
    let all = series.iter().flat_map(|s| s.points.iter());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for &(x, y) in all {
        x0 = x0.min(x);
        x1 = x1.max(x);
        y0 = y0.min(y);
        y1 = y1.max(y);
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (1.0, 10.0, 0.0, 1.0);
    }
    if !axes.y_log {
        y0 = y0.min(0.0);
    }
    let tx = |v: f64| if axes.x_log { v.max(1e-9).log10() } else { v };
    let ty = |v: f64| if axes.y_log { v.max(1e-9).log10() } else { v };
    let (a0, mut a1, b0, mut b1) = (tx(x0), tx(x1), ty(y0), ty(y1));
    if a1 - a0 < 1e-9 {
        a1 = a0 + 1.0;
    }
    if b1 - b0 < 1e-9 {
        b1 = b0 + 1.0;
    }
    let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
    let px = |v: f64| LEFT + (tx(v) - a0) / (a1 - a0) * pw;
    let py = |v: f64| TOP + ph - (ty(v) - b0) / (b1 - b0) * ph;

    let mut s = String::new();
    let _ = writeln!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(s, r#"<rect width="{W}" height="{H}" fill="white"/>"#);
    let _ = writeln!(
        s,
        r#"<text x="{}" y="18" text-anchor="middle" font-size="14">{}</text>"#,
        LEFT + pw / 2.0,
        escape(&axes.title)
    );
    let _ = writeln!(
        s,
        r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
    );
    for i in 0..=4 {
        let fx = a0 + (a1 - a0) * i as f64 / 4.0;
        let fy = b0 + (b1 - b0) * i as f64 / 4.0;
        let vx = if axes.x_log { 10f64.powf(fx) } else { fx };
        let vy = if axes.y_log { 10f64.powf(fy) } else { fy };
        let x = LEFT + pw * i as f64 / 4.0;
        let y = TOP + ph - ph * i as f64 / 4.0;
        let _ = writeln!(
            s,
            r##"<line x1="{x}" y1="{TOP}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
            TOP + ph,
            TOP + ph + 16.0,
            tick(vx)
        );
        let _ = writeln!(
            s,
            r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
            LEFT + pw,
            LEFT - 6.0,
            y + 4.0,
            tick(vy)
        );
    }
    let _ = writeln!(
        s,
        r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
        LEFT + pw / 2.0,
        H - 12.0,
        escape(&axes.x_label)
    );
    let _ = writeln!(
        s,
        r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
        TOP + ph / 2.0,
        TOP + ph / 2.0,
        escape(&axes.y_label)
    );
    for (i, series) in series.iter().enumerate() {
        let color = COLORS[i % COLORS.len()];
        let path: Vec<String> = series
            .points
            .iter()
            .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
            .collect();
        let _ = writeln!(
            s,
            r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2"/>"#,
            path.join(" ")
        );
        for &(x, y) in series.points.iter().filter(|_| series.points.len() < 20) {
            let _ = writeln!(
                s,
                r#"<circle cx="{:.1}" cy="{:.1}" r="3" fill="{color}"/>"#,
                px(x),
                py(y)
            );
        }
        let ly = TOP + 14.0 + 18.0 * i as f64;
        let _ = writeln!(
            s,
            r#"<line x1="{}" y1="{ly}" x2="{}" y2="{ly}" stroke="{color}" stroke-width="3"/><text x="{}" y="{}">{}</text>"#,
            LEFT + pw + 10.0,
            LEFT + pw + 30.0,
            LEFT + pw + 36.0,
            ly + 4.0,
            escape(&series.name)
        );
    }
    s.push_str("</svg>\n");
    s
}

fn tick(v: f64) -> String {
    match v.abs() {
        a if a >= 1e6 => format!("{:.1}M", v / 1e6),
        a if a >= 1e3 => format!("{:.1}k", v / 1e3),
        a if a >= 10.0 || a == 0.0 => format!("{v:.0}"),
        a if a >= 1.0 => format!("{v:.1}"),
        a if a >= 0.1 => format!("{v:.2}"),
        _ => format!("{v:.3}"),
    }
}

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}
