//! A whole `simulate` invocation: every policy over the same requests, at one or several
//! cluster sizes.

use kvmesh_protocol::RouteConfig;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use super::args::SimulateArgs;
use super::cluster;
use super::pd::PdSetup;
use super::policy::PolicyKind;
use super::results::PolicyResult;
use super::workload::{Arrivals, RequestStream};
use crate::workload::{Workload, WorkloadKind, trace};

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
    #[error("writing {path}: {error}")]
    Records {
        path: PathBuf,
        error: std::io::Error,
    },
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
    /// How the latencies' percentiles are computed: always [`crate::quantile::METHOD`].
    pub percentile_method: &'static str,
    pub runs: Vec<SizeRun>,
}

/// The workload every run draws its requests from.
pub struct Inputs {
    workload: Arc<dyn Workload>,
    /// Whether it brings its own arrival times (a trace).
    own_timeline: bool,
}

impl Inputs {
    /// The workload `args` name (loads the trace file of the trace workload).
    pub fn new(args: &SimulateArgs) -> Result<Self, SimulateError> {
        let workload = args.workload_args.build(args.workload_kind(), args.seed)?;
        Ok(Self {
            own_timeline: workload.arrival_s(0).is_some(),
            workload,
        })
    }
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
    let route = args.route_config().map_err(SimulateError::Invalid)?;
    let pd = args.pd_setup().map_err(SimulateError::Invalid)?;
    check_join(args, &sizes, pd.is_some())?;
    if let Some(pd) = pd {
        check_pd(pd, &sizes, &args.policy_list())?;
    }
    let inputs = Inputs::new(args)?;
    let mut runs = Vec::new();
    for nodes in sizes {
        let results = run_size(args, &inputs, nodes, route, pd)?;
        runs.push(SizeRun { nodes, results });
    }
    Ok(Report {
        args: args.clone(),
        workload: match args.workload_kind() {
            WorkloadKind::Trace => {
                format!("trace {}", args.workload_args.trace.path().display())
            }
            kind => kind.name().to_owned(),
        },
        percentile_method: crate::quantile::METHOD,
        runs,
    })
}

/// Joining nodes need a cluster to join, and a time to; a disaggregated cluster's roles are
/// fixed from the start (refused).
fn check_join(args: &SimulateArgs, sizes: &[usize], pd: bool) -> Result<(), SimulateError> {
    if args.join_nodes == 0 {
        return Ok(());
    }
    let invalid = |why: String| Err(SimulateError::Invalid(why));
    if let Some(&nodes) = sizes.iter().find(|&&n| n <= args.join_nodes) {
        return invalid(format!(
            "--join-nodes {} leaves no node up from the start in a cluster of {nodes}",
            args.join_nodes
        ));
    }
    if !(args.join_at.is_finite() && args.join_at > 0.0) {
        return invalid(format!(
            "--join-at {}: the nodes join a number of seconds (above 0) into the run",
            args.join_at
        ));
    }
    if pd {
        return invalid("--join-nodes cannot run with --prefill-nodes".into());
    }
    Ok(())
}

/// A disaggregated cluster needs decode engines besides its prefill ones. The centralized
/// policies split every request and pick each leg's engine by their own rule; chwbl and the
/// oracle route by prefix, which has no counterpart among the central PD routers: refused.
fn check_pd(pd: PdSetup, sizes: &[usize], policies: &[PolicyKind]) -> Result<(), SimulateError> {
    if let Some(&nodes) = sizes.iter().find(|&&n| n <= pd.prefill_nodes) {
        return Err(SimulateError::Invalid(format!(
            "--prefill-nodes {} leaves no decode engine in a cluster of {nodes}",
            pd.prefill_nodes
        )));
    }
    let refused: Vec<&str> = policies
        .iter()
        .filter(|p| matches!(p, PolicyKind::Chwbl | PolicyKind::Oracle))
        .map(|p| p.name())
        .collect();
    if !refused.is_empty() {
        return Err(SimulateError::Invalid(format!(
            "--prefill-nodes: {} cannot run a disaggregated cluster; run them with \
             --prefill-nodes 0",
            refused.join(", ")
        )));
    }
    Ok(())
}

fn run_size(
    args: &SimulateArgs,
    inputs: &Inputs,
    nodes: usize,
    route: RouteConfig,
    pd: Option<PdSetup>,
) -> Result<Vec<PolicyResult>, SimulateError> {
    let config = args.cluster_config(nodes, route, pd);
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
                    let records = args.records_dir.as_deref();
                    scope.spawn(move || run_one(config, policy, stream, records))
                })
                .collect();
            for (slot, handle) in chunk_results.iter_mut().zip(handles) {
                *slot = Some(handle.join().expect("a simulation thread panicked")?);
            }
            Ok::<_, SimulateError>(())
        })?;
    }
    Ok(results.into_iter().flatten().collect())
}

fn run_one(
    config: &cluster::ClusterConfig,
    policy: PolicyKind,
    stream: RequestStream,
    records_dir: Option<&Path>,
) -> Result<PolicyResult, SimulateError> {
    let span = tracing::info_span!("simulate", policy = policy.name(), nodes = config.nodes);
    let _guard = span.enter();
    let Some(dir) = records_dir else {
        let result = cluster::run(config, policy, stream);
        tracing::info!(wall_s = result.wall_s, "policy done");
        return Ok(result);
    };
    let (result, records) = cluster::run_recorded(config, policy, stream);
    tracing::info!(wall_s = result.wall_s, "policy done");
    let path = dir.join(format!("{}-{}.records.jsonl", config.nodes, policy.name()));
    write_records(&path, &records).map_err(|error| SimulateError::Records {
        path: path.clone(),
        error,
    })?;
    Ok(result)
}

/// One JSON line per request.
fn write_records(path: &Path, records: &[cluster::RequestRecord]) -> std::io::Result<()> {
    use std::io::Write as _;
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir)?;
    }
    let mut out = std::io::BufWriter::new(std::fs::File::create(path)?);
    for record in records {
        serde_json::to_writer(&mut out, record)?;
        out.write_all(b"\n")?;
    }
    out.flush()
}

/// The request stream of a run: identical for every policy of the run.
pub fn stream(args: &SimulateArgs, inputs: &Inputs, nodes: usize) -> RequestStream {
    let natural = inputs
        .own_timeline
        .then(|| inputs.workload.natural_size())
        .flatten();
    let arrivals = match (args.rate, args.rate_per_node, natural) {
        (Some(rate), _, _) => Arrivals::Poisson(rate),
        (None, Some(per_node), _) => Arrivals::Poisson(per_node * nodes as f64),
        (None, None, Some(_)) => Arrivals::Own(args.trace_speedup),
        (None, None, None) => Arrivals::Poisson(DEFAULT_RATE_PER_NODE * nodes as f64),
    };
    // As the load generator: with a duration alone, as many requests as arrive within it.
    let limit = args
        .requests
        .or(args.requests_per_node.map(|r| r * nodes as u64))
        .or(args.duration.map(|_| u64::MAX))
        .or(natural)
        .unwrap_or(DEFAULT_REQUESTS);
    let until_s = args.duration.map(|d| d.max(0.0));
    RequestStream::new(inputs.workload.clone(), arrivals, limit, args.seed).until(until_s)
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;
    use crate::simulate::workload::SimRequest;

    #[derive(Parser)]
    struct Cli {
        #[command(flatten)]
        args: SimulateArgs,
    }

    /// `--duration` keeps the requests the load generator sends under its own `--duration`
    /// (those released before it), at the same times.
    #[test]
    fn a_duration_keeps_what_the_load_generator_sends() {
        use crate::load::config::LoadArgs;
        use crate::load::runner::Plan;
        #[derive(Parser)]
        struct LoadCli {
            #[command(flatten)]
            args: LoadArgs,
        }
        let flags = "--workload rag-pressure --rate 4 --duration 10 --seed 7";
        let sim = Cli::try_parse_from(["simulate"].into_iter().chain(flags.split_whitespace()))
            .expect("valid flags")
            .args;
        let load = LoadCli::try_parse_from(
            ["load", "--targets", "http://a,http://b,http://c,http://d"]
                .into_iter()
                .chain(flags.split_whitespace()),
        )
        .expect("valid flags")
        .args;
        let simulated: Vec<SimRequest> =
            stream(&sim, &Inputs::new(&sim).expect("a workload"), 4).collect();
        let plan = Plan::new(&load).expect("a plan");
        let sent: Vec<f64> = plan
            .release_times()
            .expect("an open loop")
            .map(|t| t.as_secs_f64())
            .take_while(|&t| t < 10.0)
            .collect();
        assert!(sent.len() > 20, "{} requests in 10 s at 4/s", sent.len());
        assert_eq!(simulated.len(), sent.len());
        for (request, at) in simulated.iter().zip(&sent) {
            assert!((request.arrival_ns as f64 / 1e9 - at).abs() < 1e-6);
        }
    }

    /// kvmesh over `simulate`'s `flags`, with every request's record.
    fn kvmesh_recorded(flags: &str) -> (PolicyResult, Vec<cluster::RequestRecord>) {
        recorded(flags, PolicyKind::Kvmesh)
    }

    /// `policy` over `simulate`'s `flags`, with every request's record.
    fn recorded(flags: &str, policy: PolicyKind) -> (PolicyResult, Vec<cluster::RequestRecord>) {
        let argv = std::iter::once("simulate").chain(flags.split_whitespace());
        let args = Cli::try_parse_from(argv).expect("valid flags").args;
        let inputs = Inputs::new(&args).expect("a workload");
        let nodes = args.nodes;
        let config = args.cluster_config(nodes, args.route_config().expect("defaults"), None);
        cluster::run_recorded(&config, policy, stream(&args, &inputs, nodes))
    }

    /// A node joining mid-run is no entry and serves nothing before it joins, under every
    /// policy, and takes requests after; kvmesh's entries find it only once its first digest
    /// reached them, the central policies at once.
    #[test]
    fn a_node_joining_mid_run_serves_only_after_it_joins() {
        let flags = "--nodes 4 --join-nodes 1 --join-at 2 --workload gsp --gsp-groups 64 \
             --gsp-prompts-per-group 2 --gsp-system-len 256 --gsp-question-len 32 \
             --gsp-output-len 8 --requests 128 --rate 32 --seed 4";
        let policies = [
            PolicyKind::RoundRobin,
            PolicyKind::LeastLoaded,
            PolicyKind::Chwbl,
            PolicyKind::Oracle,
            PolicyKind::Kvmesh,
        ];
        for policy in policies {
            let (result, records) = recorded(flags, policy);
            let name = policy.name();
            let joined = |node: &Option<String>| node.as_deref() == Some("node-4");
            for r in &records {
                if r.sent_at_s < 2.0 {
                    assert!(!joined(&r.node) && r.entry != "node-4", "{name}: {r:?}");
                }
            }
            let served = records.iter().filter(|r| joined(&r.node)).count() as u64;
            let join = result.join.expect("join figures");
            assert_eq!(join.served_by_joined, served, "{name}");
            assert!(served > 0, "{name}: the new node served nothing");
            let after = records.iter().filter(|r| r.sent_at_s >= 2.0).count() as u64;
            assert_eq!(join.requests_after, after, "{name}");
            assert!(after > 0 && result.completed == 128, "{name}: {result:?}");
            let first = join.first_served_after_s.expect("served");
            if policy == PolicyKind::Kvmesh {
                // Its first digest is published at the first tick from 2 s and reaches the
                // entries a gossip lag later.
                assert!(
                    first > 0.01,
                    "kvmesh found the new node {first} s after it joined"
                );
            }
        }
    }

    /// Every request's record: it entered where the load generator would have sent it, an
    /// engine served it, and the records' TTFTs are the summary's.
    #[test]
    fn records_follow_each_request_from_its_entry_to_its_engine() {
        let flags = "--nodes 4 --workload gsp --gsp-groups 4 --gsp-prompts-per-group 4 \
             --requests 16 --rate 8 --seed 3";
        let (result, records) = kvmesh_recorded(flags);
        assert_eq!(records.len(), 16);
        let mut ttft = 0.0;
        for (i, r) in records.iter().enumerate() {
            assert_eq!(r.index, i as u64);
            let entry = crate::workload::random_target(3, i as u64, 4);
            assert_eq!(r.entry, format!("node-{}", entry + 1));
            assert!(r.node.is_some() && r.reason.is_some(), "{r:?}");
            ttft += r.ttft_s.expect("served");
        }
        assert!((ttft / 16.0 - result.ttft_s.mean).abs() < 1e-9);
    }

    /// A request served after a decline is recorded as `declined`, as the node's
    /// `x-kvmesh-reason` reports it, so that a simulated run's reasons compare with a real
    /// one's: at most one such record per request, none for more requests than were declined.
    #[test]
    fn a_request_served_after_a_decline_is_recorded_as_declined() {
        let flags = "--nodes 2 --entry-nodes 1 --workload hot --hot-fraction 0 \
             --hot-system-len 96 --hot-question-len 32 --hot-output-len 4 --requests 200 \
             --rate 1000000 --seed 3";
        let (result, records) = kvmesh_recorded(flags);
        let declined = records
            .iter()
            .filter(|r| r.reason == Some("declined"))
            .count() as u64;
        assert!(result.declines > 0, "a burst through one entry is declined");
        assert!(
            declined > 0 && declined <= result.declines,
            "{declined} records say declined, of {} declines",
            result.declines
        );
        // `decide`'s own reasons stay in the summary.
        assert!(
            !result.reasons.contains_key("declined"),
            "{:?}",
            result.reasons
        );
    }

    /// `--spread-seed` draws the spread keys afresh, as a real run does, and nothing else:
    /// the requests, their times and their entries stay those of `--seed`.
    #[test]
    fn a_spread_seed_keeps_the_requests_and_their_entries() {
        let records = |spread: u64| {
            let flags = format!(
                "--nodes 4 --workload rag-pressure --requests 40 --rate 4 --seed 7 \
                 --spread-seed {spread}"
            );
            kvmesh_recorded(&flags).1
        };
        let (a, b) = (records(0), records(3));
        assert_eq!(a.len(), 40);
        for (x, y) in a.iter().zip(&b) {
            assert_eq!(
                (x.index, x.sent_at_s, &x.entry),
                (y.index, y.sent_at_s, &y.entry)
            );
            assert!(y.node.is_some());
        }
    }

    #[test]
    fn vision_routes_by_picture_and_caching_policies_hit_more() {
        // 60 pictures whose sessions cannot all stay cached on every engine of 512 blocks.
        let flags = "--nodes 4 --workload vision --vision-images 60 --vision-sessions 16 \
             --requests 240 --rate 12 --kv-blocks 512 --policy round-robin,oracle,kvmesh \
             --seed 5";
        let argv = std::iter::once("simulate").chain(flags.split_whitespace());
        let report = simulate(&Cli::try_parse_from(argv).expect("valid flags").args)
            .expect("simulation runs");
        assert_eq!(report.workload, "vision");
        let result = |name: &str| {
            report.runs[0]
                .results
                .iter()
                .find(|r| r.policy == name)
                .expect("every policy ran")
        };
        for r in &report.runs[0].results {
            assert_eq!(r.completed, 240, "{}", r.policy);
            assert!(r.ttft_s.mean > 0.0);
        }
        let (rr, oracle, kvmesh) = (result("round-robin"), result("oracle"), result("kvmesh"));
        assert!(
            oracle.hit_rate > rr.hit_rate + 0.1 && kvmesh.hit_rate > rr.hit_rate + 0.1,
            "hit rates: round-robin {}, oracle {}, kvmesh {}",
            rr.hit_rate,
            oracle.hit_rate,
            kvmesh.hit_rate
        );
    }
}
