//! A grouped bar chart for the report's page.

use std::fmt::Write;

use super::axis::nice_ceil;
use super::frame::{self, BOTTOM, H, LEFT, RIGHT, W, y_pixel};
use super::{Axis, Scale, esc};

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
        let mut out = frame::open(self.title);
        let max = series
            .iter()
            .flat_map(|s| s.2.iter().flatten().copied())
            .fold(0.0f64, f64::max);
        let y_axis = Axis {
            scale: Scale::Linear,
            lo: 0.0,
            hi: self.y_max.unwrap_or_else(|| nice_ceil(max.max(1e-12))),
        };
        frame::y_grid(&mut out, &y_axis, self.fmt);
        frame::axes(&mut out, "", self.y_label);
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
                let y = y_pixel(y_axis.fraction(v.min(y_axis.hi)));
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
        frame::legend_and_close(
            &mut out,
            series.iter().map(|(n, c, _)| (n.as_str(), c.as_str())),
        );
        out
    }
}

#[cfg(test)]
mod tests {
    use super::super::PALETTE;
    use super::*;

    #[test]
    fn bars_leave_gaps_and_label_values() {
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
