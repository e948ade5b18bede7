//! `trace`: replay of a request trace.
//!
//! - Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids`): each hash id
//!   maps to a deterministic block of [`MOONCAKE_BLOCK_TOKENS`] tokens of text (seeded from the
//!   id and the run seed), so requests sharing their first k ids share their first k blocks
//!   byte for byte; the last block is cut to make `input_length` tokens.
//! - Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`): arrivals and lengths
//!   only; every prompt is fresh text.
//!
//! Arrival times come from the trace (scaled by the caller) unless a rate is given.

use std::path::Path;
use std::time::Duration;

use serde::Deserialize;

use super::{BodySettings, RequestSpec, Workload, key};
use crate::text;

/// Tokens per Mooncake hash block.
pub const MOONCAKE_BLOCK_TOKENS: u64 = 512;

/// One trace entry.
#[derive(Debug, Clone, PartialEq)]
pub struct TraceEntry {
    /// Arrival, seconds from the first entry.
    pub at_s: f64,
    /// Prompt tokens.
    pub input_len: u64,
    /// Output tokens.
    pub output_len: u32,
    /// Mooncake block ids (empty for Azure traces).
    pub hash_ids: Vec<u64>,
}

/// Failure to load a trace.
#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    /// The file could not be read.
    #[error("cannot read trace {path}: {source}")]
    Io {
        /// Path.
        path: String,
        /// Cause.
        source: std::io::Error,
    },
    /// A line is malformed.
    #[error("{path}:{line}: {message}")]
    Parse {
        /// Path.
        path: String,
        /// 1-based line.
        line: usize,
        /// What is wrong.
        message: String,
    },
    /// The trace has no entries.
    #[error("trace {0} has no requests")]
    Empty(String),
}

#[derive(Deserialize)]
struct MooncakeLine {
    timestamp: f64,
    input_length: u64,
    output_length: u64,
    #[serde(default)]
    hash_ids: Vec<u64>,
}

/// Loads a Mooncake `.jsonl` or an Azure `.csv` trace (by extension).
pub fn load(path: &Path) -> Result<Vec<TraceEntry>, TraceError> {
    let p = path.display().to_string();
    let text = std::fs::read_to_string(path).map_err(|source| TraceError::Io {
        path: p.clone(),
        source,
    })?;
    let entries = if path
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("csv"))
    {
        parse_azure(&text, &p)?
    } else {
        parse_mooncake(&text, &p)?
    };
    if entries.is_empty() {
        return Err(TraceError::Empty(p));
    }
    Ok(entries)
}

/// Parses Mooncake JSONL.
pub fn parse_mooncake(text: &str, path: &str) -> Result<Vec<TraceEntry>, TraceError> {
    let mut out = Vec::new();
    for (i, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let l: MooncakeLine = serde_json::from_str(line).map_err(|e| TraceError::Parse {
            path: path.into(),
            line: i + 1,
            message: e.to_string(),
        })?;
        out.push(TraceEntry {
            at_s: l.timestamp / 1000.0,
            input_len: l.input_length,
            output_len: l.output_length.min(u64::from(u32::MAX)) as u32,
            hash_ids: l.hash_ids,
        });
    }
    if let Some(first) = out.first().map(|e| e.at_s) {
        for e in &mut out {
            e.at_s -= first;
        }
    }
    Ok(out)
}

/// Parses the Azure LLM inference trace CSV.
pub fn parse_azure(text: &str, path: &str) -> Result<Vec<TraceEntry>, TraceError> {
    let mut out = Vec::new();
    let mut first: Option<f64> = None;
    for (i, line) in text.lines().enumerate().skip(1) {
        if line.trim().is_empty() {
            continue;
        }
        let err = |m: &str| TraceError::Parse {
            path: path.into(),
            line: i + 1,
            message: m.into(),
        };
        let mut cols = line.split(',');
        let ts = cols.next().ok_or_else(|| err("missing TIMESTAMP"))?;
        let ctx: u64 = cols
            .next()
            .and_then(|c| c.trim().parse().ok())
            .ok_or_else(|| err("bad ContextTokens"))?;
        let gen_: u32 = cols
            .next()
            .and_then(|c| c.trim().parse().ok())
            .ok_or_else(|| err("bad GeneratedTokens"))?;
        let t = parse_timestamp(ts).ok_or_else(|| err("bad TIMESTAMP"))?;
        let base = *first.get_or_insert(t);
        out.push(TraceEntry {
            at_s: t - base,
            input_len: ctx,
            output_len: gen_,
            hash_ids: Vec::new(),
        });
    }
    Ok(out)
}

/// `YYYY-MM-DD HH:MM:SS[.fraction]` to seconds since the Unix epoch.
fn parse_timestamp(s: &str) -> Option<f64> {
    let (date, time) = s.trim().split_once(' ')?;
    let mut d = date.split('-').map(|x| x.parse::<i64>());
    let (y, m, day) = (d.next()?.ok()?, d.next()?.ok()?, d.next()?.ok()?);
    let mut t = time.split(':');
    let (h, min) = (
        t.next()?.parse::<f64>().ok()?,
        t.next()?.parse::<f64>().ok()?,
    );
    let sec = t.next()?.parse::<f64>().ok()?;
    // Days from civil (Howard Hinnant's algorithm).
    let y = if m <= 2 { y - 1 } else { y };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (m + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    Some(days as f64 * 86_400.0 + h * 3600.0 + min * 60.0 + sec)
}

/// Parameters of the `trace` workload.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct TraceArgs {
    /// Trace file: Mooncake `.jsonl` or Azure `.csv`.
    #[arg(long, default_value = concat!(env!("CARGO_MANIFEST_DIR"), "/data/mooncake_synthetic_trace.jsonl"))]
    pub trace: std::path::PathBuf,
    /// Clip prompts to this many tokens (keeps the trace's prefix structure).
    #[arg(long)]
    pub max_input_tokens: Option<u64>,
    /// Clip outputs to this many tokens.
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
}

/// The `trace` workload.
pub struct Trace {
    entries: Vec<TraceEntry>,
    args: TraceArgs,
    body: BodySettings,
    time_scale: f64,
}

impl Trace {
    /// Builds the workload from loaded entries; arrivals are `at_s · time_scale`.
    pub fn new(
        entries: Vec<TraceEntry>,
        args: TraceArgs,
        body: BodySettings,
        time_scale: f64,
    ) -> Self {
        Self {
            entries,
            args,
            body,
            time_scale,
        }
    }

    /// The prompt text of `entry` (see the module docs).
    pub fn prompt(&self, index: u64, entry: &TraceEntry) -> String {
        let len = self
            .args
            .max_input_tokens
            .map_or(entry.input_len, |m| entry.input_len.min(m));
        let mut out = String::with_capacity(len as usize * text::PIECE_BYTES);
        if entry.hash_ids.is_empty() {
            text::push_text(&mut out, key(self.body.seed, &[9, index]), len as usize);
            return out;
        }
        let mut left = len;
        for &id in &entry.hash_ids {
            if left == 0 {
                break;
            }
            let n = left.min(MOONCAKE_BLOCK_TOKENS);
            // Generate the whole block and cut it, so a block's first n tokens do not depend
            // on where the prompt ends.
            let block = text::text(
                key(self.body.seed, &[10, id]),
                MOONCAKE_BLOCK_TOKENS as usize,
            );
            out.push_str(&block[..n as usize * text::PIECE_BYTES]);
            left -= n;
        }
        if left > 0 {
            // The trace's ids do not cover the prompt: finish with request-private text.
            text::push_text(&mut out, key(self.body.seed, &[11, index]), left as usize);
        }
        out
    }
}

impl Workload for Trace {
    fn name(&self) -> &'static str {
        "trace"
    }

    fn natural_size(&self) -> Option<u64> {
        Some(self.entries.len() as u64)
    }

    fn request(&self, index: u64) -> RequestSpec {
        let entry = &self.entries[(index % self.entries.len() as u64) as usize];
        let prompt = self.prompt(index, entry);
        let output = self
            .args
            .max_output_tokens
            .map_or(entry.output_len, |m| entry.output_len.min(m))
            .max(1);
        RequestSpec {
            api: self.body.api,
            body: self.body.prompt_body(&prompt, output),
            session: None,
            input_tokens: prompt.len().div_ceil(text::PIECE_BYTES) as u64,
            output_tokens: output,
        }
    }

    fn arrival(&self, index: u64) -> Option<Duration> {
        let n = self.entries.len() as u64;
        let pass = index / n;
        let last = self.entries.last().map_or(0.0, |e| e.at_s);
        let at = self.entries[(index % n) as usize].at_s + pass as f64 * last;
        Some(Duration::from_secs_f64((at * self.time_scale).max(0.0)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::load::workload::Api;

    fn settings() -> BodySettings {
        BodySettings {
            model: "m".into(),
            stream: false,
            api: Api::Completions,
            seed: 1,
        }
    }

    fn args() -> TraceArgs {
        TraceArgs {
            trace: "x.jsonl".into(),
            max_input_tokens: None,
            max_output_tokens: None,
        }
    }

    #[test]
    fn shared_hash_ids_give_shared_text_prefixes() {
        let entries = parse_mooncake(
            "{\"timestamp\": 0, \"input_length\": 1200, \"output_length\": 3, \"hash_ids\": [1, 2, 3]}\n\
             {\"timestamp\": 500, \"input_length\": 1100, \"output_length\": 3, \"hash_ids\": [1, 2, 4]}\n",
            "t",
        )
        .unwrap();
        assert_eq!(entries[1].at_s, 0.5);
        let t = Trace::new(entries.clone(), args(), settings(), 2.0);
        let a = t.prompt(0, &entries[0]);
        let b = t.prompt(1, &entries[1]);
        assert_eq!(a.len(), 1200 * 4);
        assert_eq!(b.len(), 1100 * 4);
        assert_eq!(a[..1024 * 4], b[..1024 * 4]);
        assert_ne!(a[1024 * 4..1100 * 4], b[1024 * 4..1100 * 4]);
        assert_eq!(t.arrival(1), Some(Duration::from_secs(1)));
    }

    #[test]
    fn azure_csv_parses_relative_times() {
        let e = parse_azure(
            "TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 23:59:59.5000000,374,44\n2023-11-17 00:00:01.0000000,10,2\n",
            "a",
        )
        .unwrap();
        assert_eq!(e.len(), 2);
        assert!((e[1].at_s - 1.5).abs() < 1e-6);
        assert_eq!(e[0].input_len, 374);
    }

    #[test]
    fn the_projects_mooncake_copy_loads() {
        let path =
            Path::new(env!("CARGO_MANIFEST_DIR")).join("data/mooncake_synthetic_trace.jsonl");
        let e = load(&path).unwrap();
        assert_eq!(e.len(), 3993);
        let mean = e.iter().map(|x| x.input_len as f64).sum::<f64>() / e.len() as f64;
        assert!((15_000.0..16_000.0).contains(&mean), "{mean}");
    }
}
