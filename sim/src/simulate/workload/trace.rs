//! `--trace FILE`: Mooncake JSONL (or Azure CSV) replay, parsed by `load::workload::trace`.
//!
//! Each Mooncake hash id becomes a 512-token segment keyed by the id (so requests sharing their
//! first k ids share their first 32·k 16-token blocks); the last segment is cut to the
//! request's `input_length`. A run longer than the trace replays it again with fresh ids and
//! shifted timestamps.

use super::Generator;
use crate::load::workload::key;
use crate::load::workload::trace::{MOONCAKE_BLOCK_TOKENS, TraceEntry};
use crate::simulate::prompt::Segment;

pub struct TraceGen {
    entries: Vec<TraceEntry>,
    seed: u64,
    span_s: f64,
}

impl TraceGen {
    pub fn new(entries: Vec<TraceEntry>, seed: u64) -> Self {
        let last = entries.last().map_or(0.0, |e| e.at_s);
        let span_s = last + last / entries.len().max(1) as f64;
        Self {
            entries,
            seed,
            span_s,
        }
    }

    fn entry(&self, index: u64) -> (&TraceEntry, u64) {
        let n = self.entries.len() as u64;
        (&self.entries[(index % n) as usize], index / n)
    }
}

impl Generator for TraceGen {
    fn request(&mut self, index: u64) -> (Vec<Segment>, u32, Option<u64>) {
        let (entry, pass) = self.entry(index);
        let mut left = entry.input_len.clamp(1, u64::from(u32::MAX)) as u32;
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
        (segments, entry.output_len, None)
    }

    fn own_arrival_s(&self, index: u64) -> Option<f64> {
        let (entry, pass) = self.entry(index);
        Some(entry.at_s + pass as f64 * self.span_s)
    }
}
