//! The side-by-side table printed at the end of the demo (also embedded in the HTML page).

use std::fmt::Write;

use super::run::RunFigures;

/// Column headers, in order.
pub const HEADERS: [&str; 10] = [
    "policy",
    "requests",
    "req/s",
    "TTFT mean",
    "TTFT p50",
    "TTFT p99",
    "ITL p50",
    "hit rate",
    "imbalance",
    "errors",
];

/// The cells of one row, formatted.
pub fn cells(f: &RunFigures) -> [String; 10] {
    [
        f.policy.clone(),
        f.requests.to_string(),
        format!("{:.1}", f.requests_per_s),
        ms(f.ttft_s.mean),
        ms(f.ttft_s.p50),
        ms(f.ttft_s.p99),
        ms(f.itl_s.p50),
        f.hit_rate
            .map_or("n/a".into(), |h| format!("{:.1}%", h * 100.0)),
        f.imbalance.map_or("n/a".into(), |x| format!("{x:.2}")),
        f.errors.to_string(),
    ]
}

/// Milliseconds with a unit, or `-`.
pub fn ms(s: Option<f64>) -> String {
    s.map_or("-".into(), |v| format!("{:.1} ms", v * 1e3))
}

/// Workloads in order of first appearance.
pub fn workloads(runs: &[RunFigures]) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    for r in runs {
        if !out.contains(&r.workload) {
            out.push(r.workload.clone());
        }
    }
    out
}

/// One block per workload, one row per policy, then how each policy compares with the
/// `baseline` policy of the same workload.
pub fn render(runs: &[RunFigures], baseline: &str) -> String {
    let mut s = String::new();
    for w in workloads(runs) {
        let rows: Vec<&RunFigures> = runs.iter().filter(|r| r.workload == w).collect();
        let table: Vec<[String; 10]> = rows.iter().map(|r| cells(r)).collect();
        let mut widths = HEADERS.map(str::len);
        for row in &table {
            for (w, c) in widths.iter_mut().zip(row) {
                *w = (*w).max(c.chars().count());
            }
        }
        let _ = writeln!(s, "workload {w}");
        let line = |s: &mut String, row: &[String]| {
            // Policy names left-aligned, figures right-aligned.
            for (i, (c, w)) in row.iter().zip(widths).enumerate() {
                if i == 0 {
                    let _ = write!(s, "  {c:<w$}");
                } else {
                    let _ = write!(s, "  {c:>w$}");
                }
            }
            s.push('\n');
        };
        line(&mut s, &HEADERS.map(String::from));
        for row in &table {
            line(&mut s, row);
        }
        if let Some(base) = rows.iter().find(|r| r.policy == baseline) {
            for r in rows.iter().filter(|r| r.policy != baseline) {
                let _ = writeln!(s, "  {}", comparison(r, base));
            }
        }
        s.push('\n');
    }
    s
}

/// "kvmesh vs round-robin: hit rate +21.3 points, mean TTFT 0.42x, p99 TTFT 0.61x".
pub fn comparison(r: &RunFigures, base: &RunFigures) -> String {
    let mut parts = Vec::new();
    if let (Some(a), Some(b)) = (r.hit_rate, base.hit_rate) {
        parts.push(format!("hit rate {:+.1} points", (a - b) * 100.0));
    }
    for (name, a, b) in [
        ("mean TTFT", r.ttft_s.mean, base.ttft_s.mean),
        ("p99 TTFT", r.ttft_s.p99, base.ttft_s.p99),
    ] {
        if let (Some(a), Some(b)) = (a, b)
            && b > 0.0
        {
            parts.push(format!("{name} {:.2}x", a / b));
        }
    }
    format!("{} vs {}: {}", r.policy, base.policy, parts.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::report::run::LoadDocSummary;
    use std::path::PathBuf;

    pub(crate) fn figures(policy: &str, hit: f64, ttft_mean: f64) -> RunFigures {
        RunFigures {
            workload: "gsp".into(),
            policy: policy.into(),
            load_json: PathBuf::from("x.json"),
            requests: 100,
            ok: 100,
            errors: 0,
            errors_by_kind: Default::default(),
            duration_s: 10.0,
            requests_per_s: 10.0,
            output_tokens_per_s: 100.0,
            ttft_s: LoadDocSummary {
                count: 100,
                mean: Some(ttft_mean),
                p50: Some(ttft_mean),
                p90: Some(ttft_mean),
                p99: Some(ttft_mean * 2.0),
                max: Some(ttft_mean * 3.0),
            },
            itl_s: LoadDocSummary::default(),
            e2e_s: LoadDocSummary::default(),
            hit_rate: Some(hit),
            engine_requests: vec![25.0; 4],
            imbalance: Some(1.0),
            placements: Default::default(),
        }
    }

    #[test]
    fn table_has_a_row_per_policy_and_a_comparison() {
        let runs = vec![
            figures("kvmesh", 0.8, 0.05),
            figures("round-robin", 0.6, 0.1),
        ];
        let t = render(&runs, "round-robin");
        assert!(t.starts_with("workload gsp\n"));
        assert!(t.contains("80.0%") && t.contains("60.0%"));
        assert!(t.contains("50.0 ms") && t.contains("100.0 ms"));
        assert!(
            t.contains(
                "kvmesh vs round-robin: hit rate +20.0 points, mean TTFT 0.50x, p99 TTFT 0.50x"
            ),
            "{t}"
        );
        // Every row of the block has the same width.
        let widths: Vec<usize> = t.lines().skip(1).take(3).map(str::len).collect();
        assert!(widths.windows(2).all(|w| w[0] == w[1]), "{t}");
    }
}
