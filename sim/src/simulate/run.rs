//! A whole `simulate` invocation: every policy over the same requests, at one or several
//! cluster sizes.

use crate::load::workload::trace::{self, TraceEntry};

use super::args::{SimulateArgs, WorkloadName};
use super::cluster;
use super::policy::PolicyKind;
use super::results::PolicyResult;
use super::workload::{
    Arrivals, ChatGen, Generator, GspGen, HotGen, RagGen, RequestStream, TraceGen,
};

/// Default request count of synthetic workloads.
const DEFAULT_REQUESTS: u64 = 2_000;
/// Default arrival rate per node of synthetic workloads, requests/s.
const DEFAULT_RATE_PER_NODE: f64 = 2.0;

/// Errors before any simulation starts.
#[derive(Debug, thiserror::Error)]
pub enum SimulateError {
    #[error(transparent)]
    Trace(#[from] trace::TraceError),
    #[error("{0}")]
    Invalid(String),
}

/// The results at one cluster size.
#[derive(Debug, Clone, serde::Serialize)]
pub struct SizeRun {
    pub nodes: usize,
    pub results: Vec<PolicyResult>,
}

/// The whole report.
#[derive(Debug, Clone, serde::Serialize)]
pub struct Report {
    pub args: SimulateArgs,
    pub workload: String,
    pub runs: Vec<SizeRun>,
}

/// Loaded inputs shared by every run.
pub struct Inputs {
    trace: Option<Vec<TraceEntry>>,
}

pub fn simulate(args: &SimulateArgs) -> Result<Report, SimulateError> {
    let sizes = if args.sweep_nodes.is_empty() {
        vec![args.nodes]
    } else {
        args.sweep_nodes.clone()
    };
    if sizes.contains(&0) {
        return Err(SimulateError::Invalid(
            "a cluster needs at least one node".into(),
        ));
    }
    let inputs = Inputs {
        trace: args.trace.as_deref().map(trace::load).transpose()?,
    };
    let mut runs = Vec::new();
    for nodes in sizes {
        let results = run_size(args, &inputs, nodes);
        runs.push(SizeRun { nodes, results });
    }
    Ok(Report {
        args: args.clone(),
        workload: match (&args.trace, args.workload) {
            (Some(path), _) => format!("trace {}", path.display()),
            (None, w) => format!("{w:?}").to_lowercase(),
        },
        runs,
    })
}

fn run_size(args: &SimulateArgs, inputs: &Inputs, nodes: usize) -> Vec<PolicyResult> {
    let config = args.cluster_config(nodes);
    let policies = args.policy_list();
    let jobs = args.jobs.max(1);
    let mut results: Vec<Option<PolicyResult>> = vec![None; policies.len()];
    for (chunk_policies, chunk_results) in policies.chunks(jobs).zip(results.chunks_mut(jobs)) {
        std::thread::scope(|scope| {
            let handles: Vec<_> = chunk_policies
                .iter()
                .map(|&policy| {
                    let config = &config;
                    let stream = stream(args, inputs, nodes);
                    scope.spawn(move || run_one(config, policy, stream))
                })
                .collect();
            for (slot, handle) in chunk_results.iter_mut().zip(handles) {
                *slot = Some(handle.join().expect("a simulation thread panicked"));
            }
        });
    }
    results.into_iter().flatten().collect()
}

fn run_one(
    config: &cluster::ClusterConfig,
    policy: PolicyKind,
    stream: RequestStream,
) -> PolicyResult {
    let span = tracing::info_span!("simulate", policy = policy.name(), nodes = config.nodes);
    let _guard = span.enter();
    let result = cluster::run(config, policy, stream);
    tracing::info!(wall_s = result.wall_s, "policy done");
    result
}

/// The request stream of a run: identical for every policy of the run.
pub fn stream(args: &SimulateArgs, inputs: &Inputs, nodes: usize) -> RequestStream {
    let seed = args.seed;
    let (generator, natural): (Box<dyn Generator + Send>, Option<u64>) = match &inputs.trace {
        Some(entries) => (
            Box::new(TraceGen::new(entries.clone(), seed)),
            Some(entries.len() as u64),
        ),
        None => match args.workload {
            WorkloadName::Gsp => (Box::new(GspGen::new(args.gsp.clone(), seed)), None),
            WorkloadName::Chat => (
                Box::new(ChatGen::new(args.chat.clone(), args.chat_sessions, seed)),
                None,
            ),
            WorkloadName::Rag => (Box::new(RagGen::new(args.rag.clone(), seed)), None),
            WorkloadName::Hot => (Box::new(HotGen::new(args.hot.clone(), seed)), None),
        },
    };
    let arrivals = match (args.rate, args.rate_per_node, natural) {
        (Some(rate), _, _) => Arrivals::Poisson(rate),
        (None, Some(per_node), _) => Arrivals::Poisson(per_node * nodes as f64),
        (None, None, Some(_)) => Arrivals::Own(args.trace_speedup),
        (None, None, None) => Arrivals::Poisson(DEFAULT_RATE_PER_NODE * nodes as f64),
    };
    let limit = args
        .requests
        .or(args.requests_per_node.map(|r| r * nodes as u64))
        .or(natural)
        .unwrap_or(DEFAULT_REQUESTS);
    RequestStream::new(generator, arrivals, limit, seed)
}
