//! Minimal inline-SVG charts (line and grouped bar), so the report is one self-contained
//! HTML file with no script and no external asset.

use std::fmt::Write;

/// Colours of series, in order (colour-blind-friendly Tableau 10).
pub const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

const W: f64 = 560.0;
const H: f64 = 300.0;
const LEFT: f64 = 64.0;
const RIGHT: f64 = 16.0;
const TOP: f64 = 34.0;
const BOTTOM: f64 = 64.0;

/// One line of a line chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// CSS colour.
    pub color: String,
    /// Points, ascending in x.
    pub points: Vec<(f64, f64)>,
}

/// Axis scaling.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scale {
    /// Linear from 0 (or the data minimum when negative).
    Linear,
    /// Base-10 logarithmic (positive values only).
    Log,
}

/// A line chart; `step` draws a staircase (for cumulative histograms).
pub struct LineChart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// Label under the x axis.
    pub x_label: &'a str,
    /// Label left of the y axis.
    pub y_label: &'a str,
    /// x scaling.
    pub x_scale: Scale,
    /// Staircase instead of straight segments.
    pub step: bool,
    /// Fixed y maximum (e.g. 1.0 for fractions), else from the data.
    pub y_max: Option<f64>,
    /// Formats y tick labels.
    pub y_fmt: fn(f64) -> String,
    /// Formats x tick labels.
    pub x_fmt: fn(f64) -> String,
}

impl LineChart<'_> {
    /// Renders the chart with its legend.
    pub fn render(&self, series: &[Series]) -> String {
        let pts = series.iter().flat_map(|s| s.points.iter().copied());
        let (mut x0, mut x1, mut y1) = (f64::INFINITY, f64::NEG_INFINITY, 0.0f64);
        for (x, y) in pts {
            if self.x_scale == Scale::Log && x <= 0.0 {
                continue;
            }
            x0 = x0.min(x);
            x1 = x1.max(x);
            y1 = y1.max(y);
        }
        let mut out = open(self.title);
        if !x0.is_finite() {
            let _ = write!(
                out,
                r#"<text x="{}" y="{}" text-anchor="middle" class="note">no data</text>"#,
                W / 2.0,
                H / 2.0
            );
            out.push_str("</svg>");
            return out;
        }
        let y1 = self.y_max.unwrap_or_else(|| nice_ceil(y1.max(1e-12)));
        let (x0, x1) = match self.x_scale {
            Scale::Linear => (x0.min(0.0), nice_ceil(x1.max(1e-12))),
            Scale::Log => (
                10f64.powf(x0.log10().floor()),
                10f64.powf(x1.log10().ceil().max(x0.log10().floor() + 1.0)),
            ),
        };
        let fx = |x: f64| -> f64 {
            let t = match self.x_scale {
                Scale::Linear => (x - x0) / (x1 - x0),
                Scale::Log => (x.log10() - x0.log10()) / (x1.log10() - x0.log10()),
            };
            LEFT + t * (W - LEFT - RIGHT)
        };
        let fy = |y: f64| -> f64 { H - BOTTOM - (y / y1) * (H - TOP - BOTTOM) };
        // Grid and ticks.
        for t in linear_ticks(0.0, y1) {
            let y = fy(t);
            let _ = write!(
                out,
                r#"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="grid"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"#,
                W - RIGHT,
                LEFT - 6.0,
                y + 4.0,
                esc(&(self.y_fmt)(t))
            );
        }
        let xt = match self.x_scale {
            Scale::Linear => linear_ticks(x0, x1),
            Scale::Log => log_ticks(x0, x1),
        };
        for t in xt {
            let x = fx(t);
            let _ = write!(
                out,
                r#"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" class="axis"/><text x="{x:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"#,
                H - BOTTOM,
                H - BOTTOM + 4.0,
                H - BOTTOM + 16.0,
                esc(&(self.x_fmt)(t))
            );
        }
        axes(&mut out, self.x_label, self.y_label);
        for s in series {
            let mut d = String::new();
            let mut prev: Option<(f64, f64)> = None;
            for &(x, y) in &s.points {
                if self.x_scale == Scale::Log && x <= 0.0 {
                    continue;
                }
                let (px, py) = (fx(x), fy(y.min(y1)));
                match prev {
                    None => {
                        let _ = write!(d, "M{px:.1},{py:.1}");
                    }
                    Some((_, qy)) if self.step => {
                        let _ = write!(d, " L{px:.1},{qy:.1} L{px:.1},{py:.1}");
                    }
                    Some(_) => {
                        let _ = write!(d, " L{px:.1},{py:.1}");
                    }
                }
                prev = Some((px, py));
            }
            let _ = write!(
                out,
                r#"<path d="{d}" fill="none" stroke="{}" stroke-width="1.8"><title>{}</title></path>"#,
                esc(&s.color),
                esc(&s.name)
            );
        }
        legend(
            &mut out,
            series.iter().map(|s| (s.name.as_str(), s.color.as_str())),
        );
        out.push_str("</svg>");
        out
    }
}

/// Vertical bars in groups: one group per category, one bar per series.
pub struct BarChart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// Label left of the y axis.
    pub y_label: &'a str,
    /// Fixed y maximum, else from the data.
    pub y_max: Option<f64>,
    /// Formats tick and value labels.
    pub fmt: fn(f64) -> String,
}

impl BarChart<'_> {
    /// `categories[i]` labels group i; `series` are (name, colour, one value per category;
    /// `None` leaves a gap).
    pub fn render(
        &self,
        categories: &[String],
        series: &[(String, String, Vec<Option<f64>>)],
    ) -> String {
        let mut out = open(self.title);
        let max = series
            .iter()
            .flat_map(|s| s.2.iter().flatten().copied())
            .fold(0.0f64, f64::max);
        let y1 = self.y_max.unwrap_or_else(|| nice_ceil(max.max(1e-12)));
        let fy = |y: f64| -> f64 { H - BOTTOM - (y / y1) * (H - TOP - BOTTOM) };
        for t in linear_ticks(0.0, y1) {
            let y = fy(t);
            let _ = write!(
                out,
                r#"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="grid"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"#,
                W - RIGHT,
                LEFT - 6.0,
                y + 4.0,
                esc(&(self.fmt)(t))
            );
        }
        axes(&mut out, "", self.y_label);
        let n_cat = categories.len().max(1) as f64;
        let group_w = (W - LEFT - RIGHT) / n_cat;
        let bar_w = (group_w * 0.8) / series.len().max(1) as f64;
        for (ci, cat) in categories.iter().enumerate() {
            let gx = LEFT + group_w * ci as f64 + group_w * 0.1;
            for (si, (name, color, values)) in series.iter().enumerate() {
                let Some(v) = values.get(ci).copied().flatten() else {
                    continue;
                };
                let x = gx + bar_w * si as f64;
                let y = fy(v.min(y1));
                let _ = write!(
                    out,
                    r#"<rect x="{x:.1}" y="{y:.1}" width="{:.1}" height="{:.1}" fill="{}"><title>{}: {}</title></rect>"#,
                    (bar_w - 2.0).max(1.0),
                    (H - BOTTOM - y).max(0.0),
                    esc(color),
                    esc(name),
                    esc(&(self.fmt)(v))
                );
                if bar_w >= 28.0 {
                    let _ = write!(
                        out,
                        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" class="val">{}</text>"#,
                        x + bar_w / 2.0 - 1.0,
                        y - 3.0,
                        esc(&(self.fmt)(v))
                    );
                }
            }
            let _ = write!(
                out,
                r#"<text x="{:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"#,
                LEFT + group_w * (ci as f64 + 0.5),
                H - BOTTOM + 16.0,
                esc(cat)
            );
        }
        legend(
            &mut out,
            series.iter().map(|(n, c, _)| (n.as_str(), c.as_str())),
        );
        out.push_str("</svg>");
        out
    }
}

fn open(title: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img"><title>{t}</title><text x="{}" y="20" text-anchor="middle" class="title">{t}</text>"#,
        W / 2.0,
        t = esc(title)
    );
    out
}

fn axes(out: &mut String, x_label: &str, y_label: &str) {
    let _ = write!(
        out,
        r#"<line x1="{LEFT}" x2="{LEFT}" y1="{TOP}" y2="{}" class="axis"/><line x1="{LEFT}" x2="{}" y1="{}" y2="{}" class="axis"/>"#,
        H - BOTTOM,
        W - RIGHT,
        H - BOTTOM,
        H - BOTTOM
    );
    if !x_label.is_empty() {
        let _ = write!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle" class="label">{}</text>"#,
            LEFT + (W - LEFT - RIGHT) / 2.0,
            H - BOTTOM + 32.0,
            esc(x_label)
        );
    }
    let _ = write!(
        out,
        r#"<text transform="translate(14,{}) rotate(-90)" text-anchor="middle" class="label">{}</text>"#,
        TOP + (H - TOP - BOTTOM) / 2.0,
        esc(y_label)
    );
}

fn legend<'a>(out: &mut String, items: impl Iterator<Item = (&'a str, &'a str)>) {
    let mut x = LEFT;
    let y = H - 12.0;
    for (name, color) in items {
        let _ = write!(
            out,
            r#"<rect x="{x:.1}" y="{}" width="10" height="10" fill="{}"/><text x="{:.1}" y="{y}" class="legend">{}</text>"#,
            y - 9.0,
            esc(color),
            x + 14.0,
            esc(name)
        );
        x += 24.0 + 6.5 * name.chars().count() as f64;
    }
}

/// The smallest of 1, 2, 2.5, 5 × 10^k that is ≥ `v`.
pub fn nice_ceil(v: f64) -> f64 {
    let p = 10f64.powf(v.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= v * (1.0 - 1e-9) {
            return m * p;
        }
    }
    10.0 * p
}

/// About five round ticks from `lo` to `hi`.
pub fn linear_ticks(lo: f64, hi: f64) -> Vec<f64> {
    if hi <= lo {
        return vec![lo];
    }
    let step = nice_ceil((hi - lo) / 5.0);
    let mut t = (lo / step).ceil() * step;
    let mut out = Vec::new();
    while t <= hi + step * 1e-9 {
        out.push(if t.abs() < step * 1e-9 { 0.0 } else { t });
        t += step;
    }
    out
}

/// Powers of ten from `lo` to `hi`.
pub fn log_ticks(lo: f64, hi: f64) -> Vec<f64> {
    let (a, b) = (lo.log10().round() as i32, hi.log10().round() as i32);
    (a..=b).map(|k| 10f64.powi(k)).collect()
}

/// Escapes text for SVG/HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn nice_numbers_and_ticks() {
        assert_eq!(nice_ceil(0.73), 1.0);
        assert_eq!(nice_ceil(3.1), 5.0);
        assert_eq!(nice_ceil(120.0), 200.0);
        assert_eq!(
            linear_ticks(0.0, 1.0),
            vec![0.0, 0.2, 0.4, 0.6000000000000001, 0.8, 1.0]
        );
        assert_eq!(log_ticks(0.001, 10.0).len(), 5);
    }

    #[test]
    fn charts_are_well_formed_and_escape_text() {
        let chart = LineChart {
            title: "a <b>",
            x_label: "s",
            y_label: "n",
            x_scale: Scale::Log,
            step: true,
            y_max: Some(1.0),
            y_fmt: |v| format!("{v}"),
            x_fmt: |v| format!("{v}"),
        };
        let svg = chart.render(&[Series {
            name: "k&m".into(),
            color: PALETTE[0].into(),
            points: vec![(0.01, 0.2), (0.1, 0.9), (1.0, 1.0)],
        }]);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>"));
        assert!(svg.contains("a &lt;b&gt;") && svg.contains("k&amp;m"));
        assert!(svg.contains("<path d=\"M"));
        let empty = chart.render(&[]);
        assert!(empty.contains("no data"));
        let bars = BarChart {
            title: "hit",
            y_label: "%",
            y_max: Some(1.0),
            fmt: |v| format!("{:.0}%", v * 100.0),
        }
        .render(
            &["gsp".into(), "trace".into()],
            &[("kvmesh".into(), PALETTE[0].into(), vec![Some(0.8), None])],
        );
        assert_eq!(
            bars.matches("<rect x").count(),
            2,
            "one bar, one legend swatch"
        );
        assert!(bars.contains("80%"));
    }
}
