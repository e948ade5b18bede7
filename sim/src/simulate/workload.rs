//! The simulator's request stream: a workload's requests (`crate::workload`, the same the load
//! generator sends for the same seed and arguments) with their arrival times.

use std::sync::Arc;

use kvmesh_protocol::route::node_key;

use super::prompt::{self, Segment};
use crate::workload::arrivals::Poisson;
use crate::workload::{Attachment, Workload, session_id};

/// One request of a run.
#[derive(Debug, Clone, PartialEq)]
pub struct SimRequest {
    /// Arrival at its entry node, nanoseconds of simulated time.
    pub arrival_ns: u64,
    pub segments: Vec<Segment>,
    pub output_tokens: u32,
    /// Session key (chat), for soft affinity: the key a sidecar derives from the request's
    /// `x-session-id`.
    pub session: Option<u64>,
    /// Pictures in the prompt (the vision workload).
    pub attachments: Vec<Attachment>,
    /// The chain a kvmesh sidecar computes for the request's body, when the request has
    /// pictures ([`prompt::sidecar_chain`]); otherwise the router's chain is
    /// [`prompt::chain`] of the tokens.
    pub sidecar_chain: Option<Vec<u64>>,
}

impl SimRequest {
    pub fn prompt_tokens(&self) -> u32 {
        crate::workload::prompt_tokens(&self.segments, &self.attachments) as u32
    }

    /// The token ids the engine sees (pictures as their token runs).
    pub fn tokens(&self) -> Vec<u32> {
        crate::workload::tokens(&self.segments, &self.attachments)
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
    workload: Arc<dyn Workload>,
    arrivals: Arrivals,
    poisson: Poisson,
    next_index: u64,
    limit: u64,
    /// No request arrives at or after this many seconds (see [`RequestStream::until`]).
    until_s: Option<f64>,
    clock_s: f64,
}

impl RequestStream {
    pub fn new(workload: Arc<dyn Workload>, arrivals: Arrivals, limit: u64, seed: u64) -> Self {
        let rate = match arrivals {
            Arrivals::Poisson(rate) => rate,
            Arrivals::Own(_) => 1.0,
        };
        Self {
            workload,
            arrivals,
            poisson: Poisson::new(rate, seed),
            next_index: 0,
            limit,
            until_s: None,
            clock_s: 0.0,
        }
    }

    /// The stream ends at the first request that would arrive at or after `until_s` seconds
    /// (if given): the load generator's `--duration`, which sends no request released at or
    /// after its deadline.
    pub fn until(mut self, until_s: Option<f64>) -> Self {
        self.until_s = until_s;
        self
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
            Arrivals::Poisson(_) => self.poisson.next().unwrap_or(self.clock_s),
            Arrivals::Own(speedup) => self
                .workload
                .arrival_s(index)
                .map_or(self.clock_s, |s| s / speedup.max(1e-9)),
        };
        if self.until_s.is_some_and(|until| at_s >= until) {
            self.limit = index;
            return None;
        }
        self.clock_s = self.clock_s.max(at_s);
        let request = self.workload.request(index);
        let sidecar_chain =
            (!request.attachments.is_empty()).then(|| prompt::sidecar_chain(&request));
        Some(SimRequest {
            arrival_ns: (self.clock_s * 1e9) as u64,
            output_tokens: request.output_tokens,
            session: request.session.map(|s| node_key(&session_id(s))),
            segments: request.segments,
            attachments: request.attachments,
            sidecar_chain,
        })
    }
}
