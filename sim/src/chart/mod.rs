//! Minimal SVG charts, self-contained (no script, no external asset, no font backend to lay
//! out labels), for the demo report and the simulator's plots.
//!
//! One [`Series`], one [`PALETTE`] and one axis model ([`axis`]) for both. Two frames draw
//! them, because the two outputs are read differently:
//! - [`line`] and [`bar`]: charts embedded in the report's HTML page, styled by its
//!   stylesheet (CSS classes), with round ticks and the legend underneath;
//! - [`plot`]: a standalone `.svg` file (`--svg-dir`), styled inline, with the legend on the
//!   right and log scales on either axis.

pub mod axis;
pub mod bar;
mod frame;
pub mod line;
pub mod plot;

pub use axis::{Axis, Scale};

/// Colours of series, in order (colour-blind-friendly Tableau 10).
pub const PALETTE: [&str; 8] = [
    "#4e79a7", "#f28e2b", "#59a14f", "#e15759", "#76b7b2", "#edc948", "#b07aa1", "#9c755f",
];

/// The palette's `i`-th colour, cycling.
pub fn color(i: usize) -> &'static str {
    PALETTE[i % PALETTE.len()]
}

/// One line of a chart.
#[derive(Debug, Clone)]
pub struct Series {
    /// Legend label.
    pub name: String,
    /// CSS colour.
    pub color: String,
    /// Points, ascending in x.
    pub points: Vec<(f64, f64)>,
}

/// Escapes text for SVG/HTML.
pub fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}
