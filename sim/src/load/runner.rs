//! Runs a load: dispatches requests (open or closed loop), measures them, scrapes engines.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use http::HeaderValue;
use tokio::sync::mpsc;

use super::client::{LoadClient, Outcome};
use super::config::{LoadArgs, Pick};
use super::placement::Placement;
use super::records_file;
use super::render::{BodySettings, RequestSpec};
use super::report::{self, Report};
use super::scrape::{self, EngineCounters};
use crate::workload::arrivals::Poisson;
use crate::workload::{Workload, WorkloadKind, random_target};

/// One finished request.
#[derive(Debug, Clone)]
pub struct Record {
    /// The request's index in the workload.
    pub index: u64,
    /// When it was sent, after the start of the run.
    pub sent_at: Duration,
    /// Index of the target it went to.
    pub target: usize,
    /// Prompt tokens by construction.
    pub input_tokens: u64,
    /// Measurements.
    pub outcome: Outcome,
}

/// How requests are released.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Arrivals {
    /// Poisson at this rate.
    Poisson(f64),
    /// The workload's own timeline.
    Trace,
    /// This many in flight.
    Closed(usize),
}

/// The arrival process the arguments ask for.
pub fn arrivals(args: &LoadArgs) -> Arrivals {
    match (args.rate, args.concurrency, args.workload_kind()) {
        (Some(r), _, _) => Arrivals::Poisson(r.max(1e-9)),
        (None, Some(c), _) => Arrivals::Closed(c.max(1)),
        (None, None, WorkloadKind::Trace) => Arrivals::Trace,
        (None, None, _) => Arrivals::Closed(16),
    }
}

/// What a run sends, and when: request `i`'s HTTP request and, in an open loop, its release
/// time. Everything here follows from the arguments and the seed.
pub struct Plan {
    workload: Arc<dyn Workload>,
    body: BodySettings,
    arrivals: Arrivals,
    /// Multiplier on the workload's own arrival times.
    time_scale: f64,
    seed: u64,
}

impl Plan {
    /// The plan of `args` (loads the trace file of the trace workload).
    pub fn new(args: &LoadArgs) -> anyhow::Result<Self> {
        Ok(Self {
            workload: args.workload_args.build(args.workload_kind(), args.seed)?,
            body: BodySettings {
                model: args.model.clone(),
                stream: args.stream,
                api: args.api,
            },
            arrivals: arrivals(args),
            time_scale: args.time_scale,
            seed: args.seed,
        })
    }

    /// Request `index`.
    pub fn request(&self, index: u64) -> RequestSpec {
        self.body.render(&self.workload.request(index))
    }

    /// How many requests a run of at most `total` requests sends when it stops releasing at
    /// `duration`, at most `cap`: exact in an open loop, `total` in a closed one (whose pace
    /// the servers set).
    pub fn planned_requests(&self, total: u64, duration: Option<Duration>, cap: u64) -> u64 {
        let total = total.min(cap);
        match (self.release_times(), duration) {
            (Some(times), Some(d)) => times
                .take(usize::try_from(total).unwrap_or(usize::MAX))
                .take_while(|t| *t < d)
                .count() as u64,
            _ => total,
        }
    }

    /// The offline placement over the first `planned` requests (see [`Placement`]).
    pub fn placement(&self, planned: u64, targets: usize) -> Placement {
        let requests: Vec<_> = (0..planned).map(|i| self.workload.request(i)).collect();
        Placement::plan(&requests, targets)
    }

    /// Requests in one pass over the workload, if it has a natural size.
    pub fn natural_size(&self) -> Option<u64> {
        self.workload.natural_size()
    }

    /// Release times after the start of the run, in request order (none in a closed loop).
    pub fn release_times(&self) -> Option<impl Iterator<Item = Duration> + '_> {
        let mut poisson = match self.arrivals {
            Arrivals::Poisson(rate) => Some(Poisson::new(rate, self.seed)),
            Arrivals::Trace => None,
            Arrivals::Closed(_) => return None,
        };
        Some((0u64..).map(move |i| {
            let at_s = match &mut poisson {
                Some(p) => p.next().unwrap_or(0.0),
                None => self.workload.arrival_s(i).unwrap_or(0.0) * self.time_scale,
            };
            Duration::from_secs_f64(at_s.max(0.0))
        }))
    }
}

/// At most this many requests (the first of the run) deal the offline placement.
const PLACEMENT_SAMPLE: u64 = 100_000;

/// Runs the load described by `args` and returns the report (also printed by the CLI).
pub async fn run(args: &LoadArgs) -> anyhow::Result<Report> {
    anyhow::ensure!(!args.targets.is_empty(), "--targets needs at least one URL");
    let targets: Vec<String> = args
        .targets
        .iter()
        .map(|t| t.trim_end_matches('/').to_owned())
        .collect();
    let engines: Vec<String> = if args.engines.is_empty() {
        targets.clone()
    } else {
        args.engines
            .iter()
            .map(|t| t.trim_end_matches('/').to_owned())
            .collect()
    };
    let plan = Plan::new(args)?;
    let total = args
        .requests
        .unwrap_or_else(|| match (args.duration, plan.natural_size()) {
            (Some(_), _) => u64::MAX,
            (None, Some(n)) => n,
            (None, None) => 1000,
        });
    let placement = (args.pick == Pick::Placement).then(|| {
        let duration = args.duration.map(|d| Duration::from_secs_f64(d.max(0.0)));
        let planned = plan.planned_requests(total, duration, PLACEMENT_SAMPLE);
        let placement = plan.placement(planned, targets.len());
        tracing::info!(planned, keys = placement.keys(), "offline placement dealt");
        placement
    });
    let client = LoadClient::new();
    let before = if args.no_scrape {
        Vec::new()
    } else {
        scrape_all(&client, &engines).await
    };
    let started_unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let start = Instant::now();
    let (tx, mut rx) = mpsc::unbounded_channel::<Record>();
    let ctx = Arc::new(Ctx {
        client: client.clone(),
        plan,
        targets: targets.clone(),
        pick: args.pick,
        placement,
        seed: args.seed,
        stream: args.stream,
        timeout: Duration::from_secs_f64(args.timeout.max(0.001)),
    });
    let deadline = args
        .duration
        .map(|d| start + Duration::from_secs_f64(d.max(0.0)));
    tokio::spawn(dispatch(ctx, total, start, deadline, tx));
    let mut records = Vec::new();
    let mut last_done = start;
    while let Some(r) = rx.recv().await {
        records.push(r);
        last_done = Instant::now();
    }
    let elapsed = last_done.duration_since(start);
    if let Some(path) = &args.records {
        records_file::write(path, &targets, &mut records)?;
    }
    let after = if args.no_scrape {
        Vec::new()
    } else {
        scrape_all(&client, &engines).await
    };
    Ok(report::build(
        args,
        &targets,
        &engines,
        started_unix,
        elapsed,
        records,
        &before,
        &after,
    ))
}

struct Ctx {
    client: LoadClient,
    plan: Plan,
    targets: Vec<String>,
    pick: Pick,
    /// Dealt before the run under [`Pick::Placement`].
    placement: Option<Placement>,
    seed: u64,
    stream: bool,
    timeout: Duration,
}

impl Ctx {
    async fn one(&self, index: u64, start: Instant) -> Record {
        let sent_at = start.elapsed();
        let request = self.plan.workload.request(index);
        let target = match (self.pick, &self.placement) {
            (Pick::RoundRobin, _) => (index % self.targets.len() as u64) as usize,
            (Pick::Placement, Some(placement)) => placement.target(&request),
            (Pick::Random | Pick::Placement, _) => {
                random_target(self.seed, index, self.targets.len())
            }
        };
        let spec = self.plan.body.render(&request);
        let url = format!("{}{}", self.targets[target], spec.api.path());
        let mut headers = Vec::new();
        if let Some(s) = spec
            .session
            .as_deref()
            .and_then(|s| HeaderValue::from_str(s).ok())
        {
            headers.push(("x-session-id", s));
        }
        let outcome = self
            .client
            .measure(&url, spec.body, &headers, self.stream, false, self.timeout)
            .await;
        Record {
            index,
            sent_at,
            target,
            input_tokens: outcome.prompt_tokens.unwrap_or(spec.input_tokens),
            outcome,
        }
    }
}

async fn dispatch(
    ctx: Arc<Ctx>,
    total: u64,
    start: Instant,
    deadline: Option<Instant>,
    tx: mpsc::UnboundedSender<Record>,
) {
    let past_deadline = move |at: Instant| deadline.is_some_and(|d| at >= d);
    let Some(release_times) = ctx.plan.release_times() else {
        let Arrivals::Closed(c) = ctx.plan.arrivals else {
            unreachable!("only a closed loop has no release times")
        };
        let next = Arc::new(AtomicU64::new(0));
        for _ in 0..c {
            let (ctx, next, tx) = (ctx.clone(), next.clone(), tx.clone());
            tokio::spawn(async move {
                loop {
                    let i = next.fetch_add(1, Ordering::Relaxed);
                    if i >= total || past_deadline(Instant::now()) {
                        return;
                    }
                    let r = ctx.one(i, start).await;
                    if tx.send(r).is_err() {
                        return;
                    }
                }
            });
        }
        return;
    };
    for (i, offset) in (0..total).zip(release_times) {
        let at = start + offset;
        if past_deadline(at) {
            break;
        }
        tokio::time::sleep_until(at.into()).await;
        let (ctx, tx) = (ctx.clone(), tx.clone());
        tokio::spawn(async move {
            let r = ctx.one(i, start).await;
            let _ = tx.send(r);
        });
    }
}

async fn scrape_all(
    client: &LoadClient,
    engines: &[String],
) -> Vec<Result<EngineCounters, String>> {
    let futs = engines.iter().map(|e| scrape::scrape(client, e));
    futures::future::join_all(futs).await
}
