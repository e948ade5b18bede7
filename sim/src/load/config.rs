//! Command-line configuration of `kvmesh-sim load`.

use std::path::PathBuf;

use super::render::Api;
use crate::workload::{WorkloadArgs, WorkloadKind};

/// How a request's target is chosen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Pick {
    /// Uniformly at random (seeded).
    Random,
    /// In turn.
    RoundRobin,
    /// By a placement dealt before the run from the run's own requests: each shared context
    /// on one target, contexts balanced by prompt tokens (see `load::placement`). The
    /// reference for a router's hit rate.
    Placement,
}

/// `kvmesh-sim load`: an open- or closed-loop load generator for OpenAI-compatible servers.
#[derive(Debug, Clone, clap::Args)]
pub struct LoadArgs {
    /// Base URLs to send requests to (comma-separated), e.g. http://127.0.0.1:8000.
    #[arg(long, value_delimiter = ',', required = true)]
    pub targets: Vec<String>,
    /// How each request picks its target.
    #[arg(long, value_enum, default_value_t = Pick::Random)]
    pub pick: Pick,
    /// Workload (--trace FILE implies trace).
    #[arg(long, value_enum, default_value_t = WorkloadKind::Gsp)]
    pub workload: WorkloadKind,
    /// Open loop: Poisson arrivals at this many requests per second.
    #[arg(long, conflicts_with = "concurrency")]
    pub rate: Option<f64>,
    /// Closed loop: this many requests in flight. Default 16, except for the trace workload
    /// without --rate, which follows the trace's timestamps.
    #[arg(long)]
    pub concurrency: Option<usize>,
    /// Requests to send (default: one pass over gsp/trace, 1000 for the others; unbounded with
    /// --duration alone).
    #[arg(long)]
    pub requests: Option<u64>,
    /// Stop sending new requests after this many seconds.
    #[arg(long)]
    pub duration: Option<f64>,
    /// Stream responses (SSE) and measure TTFT and inter-token latency from the stream.
    #[arg(long)]
    pub stream: bool,
    /// Endpoint for prompts (the chat workload always uses chat completions).
    #[arg(long, value_enum, default_value_t = Api::Completions)]
    pub api: Api,
    /// `model` field of requests.
    #[arg(long, default_value = "mock-model")]
    pub model: String,
    /// Multiplier on trace timestamps (0.5 replays twice as fast).
    #[arg(long, default_value_t = 1.0)]
    pub time_scale: f64,
    /// Write the JSON report here.
    #[arg(long)]
    pub json: Option<PathBuf>,
    /// Write one JSON line per request here (index, send time, target, serving node, kvmesh's
    /// reason, status, TTFT, cached tokens), in send order: for finding out which requests
    /// make a tail.
    #[arg(long)]
    pub records: Option<PathBuf>,
    /// Seed of prompts, arrivals and random picks.
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Engines whose /metrics to scrape for the hit rate (comma-separated base URLs; default:
    /// the targets).
    #[arg(long, value_delimiter = ',')]
    pub engines: Vec<String>,
    /// Do not scrape /metrics.
    #[arg(long)]
    pub no_scrape: bool,
    /// Per-request timeout, seconds.
    #[arg(long, default_value_t = 600.0)]
    pub timeout: f64,
    /// Worker threads of the client runtime (default: all cores).
    #[arg(long)]
    pub threads: Option<usize>,
    #[command(flatten)]
    #[allow(missing_docs)]
    pub workload_args: WorkloadArgs,
}

impl LoadArgs {
    /// The workload to run.
    pub fn workload_kind(&self) -> WorkloadKind {
        self.workload_args.kind(self.workload)
    }
}
