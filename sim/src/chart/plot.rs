//! A line plot as a standalone `.svg` file (the simulator's `--svg-dir`): styled inline, a
//! white background, the legend on the right, a marker on every point of short series, and
//! either axis linear or logarithmic, with five evenly spaced ticks.

use std::fmt::Write;

use super::axis::short_number;
use super::{Axis, Scale, Series, esc};

const W: f64 = 640.0;
const H: f64 = 400.0;
const LEFT: f64 = 70.0;
const RIGHT: f64 = 160.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 50.0;
/// Series shorter than this get a marker on each point.
const MARKED_BELOW: usize = 20;

/// Titles and scales of a plot.
pub struct Plot {
    pub title: String,
    pub x_label: String,
    pub y_label: String,
    pub x_scale: Scale,
    pub y_scale: Scale,
}

impl Plot {
    /// The whole SVG document.
    pub fn render(&self, series: &[Series]) -> String {
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
        if self.y_scale == Scale::Linear {
            y0 = y0.min(0.0);
        }
        let x_axis = Axis::spanning(self.x_scale, x0, x1);
        let y_axis = Axis::spanning(self.y_scale, y0, y1);
        let (pw, ph) = (W - LEFT - RIGHT, H - TOP - BOTTOM);
        let px = |v: f64| LEFT + x_axis.fraction(v) * pw;
        let py = |v: f64| TOP + ph - y_axis.fraction(v) * ph;

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
            esc(&self.title)
        );
        let _ = writeln!(
            s,
            r#"<rect x="{LEFT}" y="{TOP}" width="{pw}" height="{ph}" fill="none" stroke="black"/>"#
        );
        let ticks = x_axis.even_ticks(4).into_iter().zip(y_axis.even_ticks(4));
        for (i, (vx, vy)) in ticks.enumerate() {
            let x = LEFT + pw * i as f64 / 4.0;
            let y = TOP + ph - ph * i as f64 / 4.0;
            let _ = writeln!(
                s,
                r##"<line x1="{x}" y1="{TOP}" x2="{x}" y2="{}" stroke="#ddd"/><text x="{x}" y="{}" text-anchor="middle">{}</text>"##,
                TOP + ph,
                TOP + ph + 16.0,
                short_number(vx)
            );
            let _ = writeln!(
                s,
                r##"<line x1="{LEFT}" y1="{y}" x2="{}" y2="{y}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                LEFT + pw,
                LEFT - 6.0,
                y + 4.0,
                short_number(vy)
            );
        }
        let _ = writeln!(
            s,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            LEFT + pw / 2.0,
            H - 12.0,
            esc(&self.x_label)
        );
        let _ = writeln!(
            s,
            r#"<text x="16" y="{}" text-anchor="middle" transform="rotate(-90 16 {})">{}</text>"#,
            TOP + ph / 2.0,
            TOP + ph / 2.0,
            esc(&self.y_label)
        );
        for (i, series) in series.iter().enumerate() {
            let color = esc(&series.color);
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
            for &(x, y) in series
                .points
                .iter()
                .filter(|_| series.points.len() < MARKED_BELOW)
            {
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
                esc(&series.name)
            );
        }
        s.push_str("</svg>\n");
        s
    }
}

#[cfg(test)]
mod tests {
    use super::super::color;
    use super::*;

    #[test]
    fn a_plot_is_a_whole_document_with_a_legend_entry_per_series() {
        let plot = Plot {
            title: "bytes <n>".into(),
            x_label: "nodes".into(),
            y_label: "B/s".into(),
            x_scale: Scale::Log,
            y_scale: Scale::Log,
        };
        let series: Vec<Series> = ["a", "b"]
            .iter()
            .enumerate()
            .map(|(i, name)| Series {
                name: (*name).into(),
                color: color(i).into(),
                points: vec![(8.0, 100.0 * (i + 1) as f64), (64.0, 900.0)],
            })
            .collect();
        let svg = plot.render(&series);
        assert!(svg.starts_with("<svg") && svg.ends_with("</svg>\n"));
        assert!(svg.contains("bytes &lt;n&gt;"));
        assert_eq!(svg.matches("<polyline").count(), 2);
        assert_eq!(svg.matches("<circle").count(), 4);
        assert!(
            plot.render(&[]).contains("<rect x=\"70\""),
            "an empty frame"
        );
    }
}
