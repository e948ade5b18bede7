//! The frame of the report's embedded charts ([`super::line`], [`super::bar`]): size, margins,
//! title, axes, y grid and the legend underneath, styled by the page's CSS classes (`title`,
//! `grid`, `axis`, `tick`, `label`, `legend`, `note`, `val`).

use std::fmt::Write;

use super::{Axis, esc};

pub(super) const W: f64 = 560.0;
pub(super) const H: f64 = 300.0;
pub(super) const LEFT: f64 = 64.0;
pub(super) const RIGHT: f64 = 16.0;
pub(super) const TOP: f64 = 34.0;
pub(super) const BOTTOM: f64 = 64.0;

/// The x pixel of `fraction` of the plot's width.
pub(super) fn x_pixel(fraction: f64) -> f64 {
    LEFT + fraction * (W - LEFT - RIGHT)
}

/// The y pixel of `fraction` of the plot's height, from the bottom.
pub(super) fn y_pixel(fraction: f64) -> f64 {
    H - BOTTOM - fraction * (H - TOP - BOTTOM)
}

/// The opening tag and the title.
pub(super) fn open(title: &str) -> String {
    let mut out = String::new();
    let _ = write!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" viewBox="0 0 {W} {H}" width="{W}" height="{H}" role="img"><title>{t}</title><text x="{}" y="20" text-anchor="middle" class="title">{t}</text>"#,
        W / 2.0,
        t = esc(title)
    );
    out
}

/// Horizontal grid lines with their labels at `y`'s round ticks.
pub(super) fn y_grid(out: &mut String, y: &Axis, fmt: fn(f64) -> String) {
    for t in y.round_ticks() {
        let y = y_pixel(y.fraction(t));
        let _ = write!(
            out,
            r#"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" class="grid"/><text x="{}" y="{:.1}" text-anchor="end" class="tick">{}</text>"#,
            W - RIGHT,
            LEFT - 6.0,
            y + 4.0,
            esc(&fmt(t))
        );
    }
}

/// The two axis lines and their labels (no x label when empty).
pub(super) fn axes(out: &mut String, x_label: &str, y_label: &str) {
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

/// A swatch and a name per series, in a row under the plot; closes the SVG.
pub(super) fn legend_and_close<'a>(
    out: &mut String,
    items: impl Iterator<Item = (&'a str, &'a str)>,
) {
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
    out.push_str("</svg>");
}
