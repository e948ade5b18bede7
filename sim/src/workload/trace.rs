//! `trace`: replay of a request trace.
//!
//! - Mooncake JSONL (`timestamp` ms, `input_length`, `output_length`, `hash_ids`): each hash id
//!   is a segment of [`MOONCAKE_BLOCK_TOKENS`] tokens keyed by the id (and the run seed), so
//!   requests sharing their first k ids share their first k blocks token for token; the last
//!   one is cut to make `input_length` tokens, and a prompt longer than its ids ends with text
//!   of its own.
//! - Azure LLM inference CSV (`TIMESTAMP,ContextTokens,GeneratedTokens`): arrivals and lengths
//!   only; every prompt is text of its own.
//!
//! A run longer than the trace replays it again, with fresh ids (a later pass shares nothing
//! with an earlier one) and timestamps shifted by the trace's span.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::{Form, Request, Segment, Workload, key};

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

/// The project's copy of the Mooncake synthetic trace (the default `--trace`).
pub const DEFAULT_TRACE: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/data/mooncake_synthetic_trace.jsonl"
);

/// Parameters of the `trace` workload.
#[derive(Debug, Clone, clap::Args, serde::Serialize)]
pub struct TraceArgs {
    /// Trace file: Mooncake `.jsonl` or Azure `.csv` (default: the Mooncake synthetic trace in
    /// sim/data).
    #[arg(long)]
    pub trace: Option<PathBuf>,
    /// Clip prompts to this many tokens (keeps the trace's prefix structure).
    #[arg(long)]
    pub max_input_tokens: Option<u64>,
    /// Clip outputs to this many tokens.
    #[arg(long)]
    pub max_output_tokens: Option<u32>,
}

impl TraceArgs {
    /// The trace file to replay.
    pub fn path(&self) -> PathBuf {
        self.trace.clone().unwrap_or_else(|| DEFAULT_TRACE.into())
    }
}

/// The `trace` workload.
pub struct Trace {
    entries: Vec<TraceEntry>,
    args: TraceArgs,
    seed: u64,
    /// Time from the first entry of one pass to the first of the next, seconds.
    span_s: f64,
}

impl Trace {
    /// Builds the workload from loaded entries (at least one).
    pub fn new(entries: Vec<TraceEntry>, args: TraceArgs, seed: u64) -> Self {
        assert!(!entries.is_empty(), "a trace has entries");
        let last = entries.last().map_or(0.0, |e| e.at_s);
        let span_s = last + last / entries.len() as f64;
        Self {
            entries,
            args,
            seed,
            span_s,
        }
    }

    fn entry(&self, index: u64) -> (&TraceEntry, u64) {
        let n = self.entries.len() as u64;
        (&self.entries[(index % n) as usize], index / n)
    }
}

impl Workload for Trace {
    fn natural_size(&self) -> Option<u64> {
        Some(self.entries.len() as u64)
    }

    fn request(&self, index: u64) -> Request {
        let (entry, pass) = self.entry(index);
        let len = self
            .args
            .max_input_tokens
            .map_or(entry.input_len, |m| entry.input_len.min(m));
        let mut left = len.clamp(1, u64::from(u32::MAX)) as u32;
        let mut segments = Vec::with_capacity(entry.hash_ids.len() + 1);
        for &id in &entry.hash_ids {
            if left == 0 {
                break;
            }
            let tokens = left.min(MOONCAKE_BLOCK_TOKENS as u32);
            segments.push(Segment {
                key: key(self.seed, &[10, pass, id]),
                tokens,
            });
            left -= tokens;
        }
        if left > 0 {
            segments.push(Segment {
                key: key(self.seed, &[11, index]),
                tokens: left,
            });
        }
        let output = self
            .args
            .max_output_tokens
            .map_or(entry.output_len, |m| entry.output_len.min(m));
        Request {
            segments,
            form: Form::Prompt,
            output_tokens: output.max(1),
            session: None,
            attachments: Vec::new(),
        }
    }

    fn arrival_s(&self, index: u64) -> Option<f64> {
        let (entry, pass) = self.entry(index);
        Some(entry.at_s + pass as f64 * self.span_s)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn args() -> TraceArgs {
        TraceArgs {
            trace: None,
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
        let t = Trace::new(entries, args(), 1);
        let (a, b) = (t.request(0), t.request(1));
        let lengths = |r: &Request| r.segments.iter().map(|s| s.tokens).collect::<Vec<_>>();
        assert_eq!(lengths(&a), [512, 512, 176]);
        assert_eq!(lengths(&b), [512, 512, 76]);
        assert_eq!(a.segments[..2], b.segments[..2]);
        assert_ne!(a.segments[2].key, b.segments[2].key);
        assert_eq!(a.output_tokens, 3);
        // The second pass: fresh ids, a span later (0.5 s + 0.5 s / 2 entries).
        let again = t.request(2);
        assert_eq!(lengths(&again), lengths(&a));
        assert_ne!(again.segments[0].key, a.segments[0].key);
        assert_eq!(t.arrival_s(1), Some(0.5));
        assert_eq!(t.arrival_s(3), Some(1.25));
    }

    #[test]
    fn clips_apply_and_prompts_beyond_the_ids_end_with_their_own_text() {
        let entries = parse_mooncake(
            "{\"timestamp\": 0, \"input_length\": 700, \"output_length\": 300, \"hash_ids\": [1]}\n",
            "t",
        )
        .unwrap();
        let t = Trace::new(entries.clone(), args(), 1);
        let r = t.request(0);
        assert_eq!(r.prompt_tokens(), 700);
        assert_eq!(
            r.segments[1].tokens, 188,
            "own text after the one 512-token id"
        );
        let clipped = Trace::new(
            entries,
            TraceArgs {
                max_input_tokens: Some(100),
                max_output_tokens: Some(10),
                ..args()
            },
            1,
        )
        .request(0);
        assert_eq!(
            clipped.segments,
            [Segment {
                key: r.segments[0].key,
                tokens: 100
            }]
        );
        assert_eq!(clipped.output_tokens, 10);
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
