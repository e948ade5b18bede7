//! Token-level workloads for the simulator: what each request asks for and when it arrives.
//!
//! The generators mirror the load generator's workloads (`crate::load::workload`), with the
//! same parameters (their clap argument structs are reused) and the same seeded keys, but
//! produce prompts as [`Segment`]s of token ids instead of JSON bodies: the simulator needs
//! tokens and chains, not text, and must build hundreds of thousands of prompts quickly.

mod chat;
mod gsp;
mod hot;
mod rag;
mod trace;

pub use chat::ChatGen;
pub use gsp::GspGen;
pub use hot::HotGen;
pub use rag::RagGen;
pub use trace::TraceGen;

use super::prompt::Segment;
use crate::rng::SplitMix64;

/// One request of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Arrival at its entry node, nanoseconds of simulated time.
    pub arrival_ns: u64,
    pub segments: Vec<Segment>,
    pub output_tokens: u32,
    /// Session key (chat), for soft affinity.
    pub session: Option<u64>,
}

impl SimRequest {
    pub fn prompt_tokens(&self) -> u32 {
        self.segments.iter().map(|s| s.tokens).sum()
    }
}

/// A generator of request contents, in order; arrival times are set by [`RequestStream`].
pub trait Generator {
    /// Request `index`: its segments, output length and session.
    fn request(&mut self, index: u64) -> (Vec<Segment>, u32, Option<u64>);
    /// The arrival time the workload itself gives request `index` (traces), in seconds.
    fn own_arrival_s(&self, _index: u64) -> Option<f64> {
        None
    }
}

/// How arrival times are drawn.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Poisson arrivals at this many requests per second.
    Poisson(f64),
    /// The workload's own timestamps, divided by this speed-up factor.
    Own(f64),
}

/// A finite, deterministic stream of requests in arrival order.
pub struct RequestStream {
    generator: Box<dyn Generator + Send>,
    arrivals: Arrivals,
    rng: SplitMix64,
    next_index: u64,
    limit: u64,
    clock_s: f64,
}

impl RequestStream {
    pub fn new(
        generator: Box<dyn Generator + Send>,
        arrivals: Arrivals,
        limit: u64,
        seed: u64,
    ) -> Self {
        Self {
            generator,
            arrivals,
            rng: SplitMix64::new(seed ^ 0x6172_7269_7661_6c73),
            next_index: 0,
            limit,
            clock_s: 0.0,
        }
    }

    pub fn len(&self) -> u64 {
        self.limit
    }

    pub fn is_empty(&self) -> bool {
        self.limit == 0
    }
}

impl Iterator for RequestStream {
    type Item = SimRequest;

    fn next(&mut self) -> Option<SimRequest> {
        if self.next_index >= self.limit {
            return None;
        }
        let index = self.next_index;
        self.next_index += 1;
        let at_s = match self.arrivals {
            Arrivals::Poisson(rate) => {
                self.clock_s += self.rng.exponential(rate.max(1e-9));
                self.clock_s
            }
            Arrivals::Own(speedup) => {
                let own = self.generator.own_arrival_s(index).unwrap_or(self.clock_s);
                self.clock_s = self.clock_s.max(own / speedup.max(1e-9));
                self.clock_s
            }
        };
        let (segments, output_tokens, session) = self.generator.request(index);
        Some(SimRequest {
            arrival_ns: (at_s * 1e9) as u64,
            segments,
            output_tokens: output_tokens.max(1),
            session,
        })
    }
}
