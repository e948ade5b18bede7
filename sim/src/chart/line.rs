//! A line chart for the report's page.

use std::fmt::Write;

use super::axis::nice_ceil;
use super::frame::{self, BOTTOM, H, W, x_pixel, y_pixel};
use super::{Axis, Scale, Series, esc};

/// A line chart; `step` draws a staircase (for cumulative histograms).
pub struct LineChart<'a> {
    /// Title above the plot.
    pub title: &'a str,
    /// Label under the x axis.
    pub x_label: &'a str,
    /// Label left of the y axis.
    pub y_label: &'a str,
    /// x scaling (y is linear from 0).
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
        let mut out = frame::open(self.title);
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
        let y_axis = Axis {
            scale: Scale::Linear,
            lo: 0.0,
            hi: self.y_max.unwrap_or_else(|| nice_ceil(y1.max(1e-12))),
        };
        let x_axis = match self.x_scale {
            Scale::Linear => Axis {
                scale: Scale::Linear,
                lo: x0.min(0.0),
                hi: nice_ceil(x1.max(1e-12)),
            },
            Scale::Log => Axis {
                scale: Scale::Log,
                lo: 10f64.powf(x0.log10().floor()),
                hi: 10f64.powf(x1.log10().ceil().max(x0.log10().floor() + 1.0)),
            },
        };
        frame::y_grid(&mut out, &y_axis, self.y_fmt);
        for t in x_axis.round_ticks() {
            let x = x_pixel(x_axis.fraction(t));
            let _ = write!(
                out,
                r#"<line x1="{x:.1}" x2="{x:.1}" y1="{}" y2="{}" class="axis"/><text x="{x:.1}" y="{}" text-anchor="middle" class="tick">{}</text>"#,
                H - BOTTOM,
                H - BOTTOM + 4.0,
                H - BOTTOM + 16.0,
                esc(&(self.x_fmt)(t))
            );
        }
        frame::axes(&mut out, self.x_label, self.y_label);
        for s in series {
            let mut d = String::new();
            let mut prev: Option<(f64, f64)> = None;
            for &(x, y) in &s.points {
                if self.x_scale == Scale::Log && x <= 0.0 {
                    continue;
                }
                let (px, py) = (
                    x_pixel(x_axis.fraction(x)),
                    y_pixel(y_axis.fraction(y.min(y_axis.hi))),
                );
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
        frame::legend_and_close(
            &mut out,
            series.iter().map(|s| (s.name.as_str(), s.color.as_str())),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::PALETTE;
    use super::*;

    #[test]
    fn a_line_chart_is_well_formed_and_escapes_text() {
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
    }
}
