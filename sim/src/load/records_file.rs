//! `--records`: one JSON line per request, so that a tail can be traced to the requests (and
//! the engines and routing reasons) that make it.

use std::io::{BufWriter, Write};
use std::path::Path;

use anyhow::Context;
use serde::Serialize;

use super::runner::Record;

/// One request's line.
#[derive(Debug, Serialize)]
struct Line<'a> {
    index: u64,
    sent_at_s: f64,
    target: &'a str,
    /// `x-kvmesh-node`: the node whose engine served it (absent straight to an engine).
    node: Option<&'a str>,
    /// `x-kvmesh-reason`.
    reason: Option<&'a str>,
    /// `x-kvmesh-prefill-node`: the node whose engine ran the prefill leg (disaggregated).
    prefill_node: Option<&'a str>,
    status: Option<u16>,
    error: Option<String>,
    ttft_s: Option<f64>,
    e2e_s: f64,
    prompt_tokens: u64,
    /// `usage.prompt_tokens_details.cached_tokens`, when the engine reports it.
    cached_tokens: Option<u64>,
    output_tokens: u64,
    /// The longest gap between two text chunks, seconds (streaming, two chunks or more).
    itl_max_s: Option<f64>,
}

/// Writes `records` (sorted into send order) to `path`.
pub fn write(path: &Path, targets: &[String], records: &mut [Record]) -> anyhow::Result<()> {
    records.sort_by_key(|r| r.index);
    let file = std::fs::File::create(path)
        .with_context(|| format!("cannot create records file {}", path.display()))?;
    let mut out = BufWriter::new(file);
    for r in records.iter() {
        let o = &r.outcome;
        let line = Line {
            index: r.index,
            sent_at_s: r.sent_at.as_secs_f64(),
            target: targets.get(r.target).map_or("", String::as_str),
            node: o.node.as_deref(),
            reason: o.reason.as_deref(),
            prefill_node: o.prefill_node.as_deref(),
            status: o.status,
            error: o.error.as_ref().map(|e| e.name()),
            ttft_s: o.ttft.map(|t| t.as_secs_f64()),
            e2e_s: o.e2e.as_secs_f64(),
            prompt_tokens: r.input_tokens,
            cached_tokens: o.cached_tokens,
            output_tokens: o.output_tokens,
            itl_max_s: o.itl.iter().copied().reduce(f32::max).map(f64::from),
        };
        serde_json::to_writer(&mut out, &line)?;
        out.write_all(b"\n")?;
    }
    out.flush()
        .with_context(|| format!("cannot write records file {}", path.display()))
}
