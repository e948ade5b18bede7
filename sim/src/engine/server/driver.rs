//! The task that owns the engine model and runs it in (scaled) real time.
//!
//! Handlers send commands over a channel; the driver submits requests, sleeps until the
//! model's next event, advances the model to the current time and routes each generated
//! token to its request's channel. A request whose channel is closed (the client went away)
//! is aborted. KV events the model records are forwarded to the publisher, if any.
//!
//! With the NIXL connector the driver also hands decode legs' pulls to the [`Puller`] and
//! feeds its reports back to the model, and answers the side channel's questions about
//! leases, which it keeps by the prefill legs' internal ids.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::engine::model::{
    Engine, EngineGauges, EngineRequest, EngineStats, KvCacheEvent, KvTransfer, Output, RequestId,
};
use crate::engine::nixl::params::RemoteKv;
use crate::engine::nixl::puller::{PullReport, Puller, PullerConfig};
use crate::engine::nixl::side_channel::{LeaseOp, LeaseReply};
use crate::engine::nixl::stats::TransferStats;

/// How often the driver looks for requests whose client went away.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A generated token routed to a request: the choice index and the engine output.
pub type TokenEvent = (u32, Output);

/// A request handed to the driver.
pub struct Submission {
    /// Engine requests, one per choice (index = position).
    pub requests: Vec<EngineRequest>,
    /// For a prefill leg, the engine's internal id of each request (vLLM's, which the leg
    /// reports as `remote_request_id`); empty otherwise.
    pub internal_ids: Vec<String>,
    /// For a decode leg: where its KV is.
    pub remote: Option<RemoteKv>,
    /// Where tokens go.
    pub sink: mpsc::UnboundedSender<TokenEvent>,
}

/// Engine state for `/metrics`.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// Gauges now.
    pub gauges: EngineGauges,
    /// Cumulative stats.
    pub stats: EngineStats,
    /// The decode side's transfer statistics, with the NIXL connector.
    pub transfers: Option<TransferStats>,
    /// Unix time of the model's time zero, to date the model's step times.
    pub epoch_unix_s: f64,
}

enum Command {
    Submit(Submission),
    Snapshot(oneshot::Sender<Snapshot>),
    Lease(LeaseOp, oneshot::Sender<LeaseReply>),
    Pulled(PullReport),
    /// A LoRA adapter was added at run time: load it into a GPU slot ahead of its requests.
    AddLora(String),
    /// A LoRA adapter was removed at run time: free its slot.
    RemoveLora(String),
}

/// A cloneable handle to the driver task.
#[derive(Clone)]
pub struct DriverHandle {
    tx: mpsc::UnboundedSender<Command>,
}

impl DriverHandle {
    /// Hands requests to the engine; false if the driver is gone.
    pub fn submit(&self, s: Submission) -> bool {
        self.tx.send(Command::Submit(s)).is_ok()
    }

    /// The engine's current gauges and stats.
    pub async fn snapshot(&self) -> Option<Snapshot> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::Snapshot(tx)).ok()?;
        rx.await.ok()
    }

    /// Loads a LoRA adapter into a GPU slot if one is free or idle; false if the driver is
    /// gone.
    pub fn add_lora(&self, name: &str) -> bool {
        self.tx.send(Command::AddLora(name.to_owned())).is_ok()
    }

    /// Frees a LoRA adapter's GPU slot; false if the driver is gone.
    pub fn remove_lora(&self, name: &str) -> bool {
        self.tx.send(Command::RemoveLora(name.to_owned())).is_ok()
    }

    /// Acts on a lease this engine granted as a prefill engine.
    pub async fn lease(&self, op: LeaseOp) -> Option<LeaseReply> {
        let (tx, rx) = oneshot::channel();
        self.tx.send(Command::Lease(op, tx)).ok()?;
        rx.await.ok()
    }
}

/// Starts the driver on the current runtime. KV events go to `events` when given; decode
/// legs pull with a [`Puller`] of `pulls` when given (the NIXL connector).
pub fn spawn(
    engine: Engine,
    events: Option<mpsc::UnboundedSender<Vec<KvCacheEvent>>>,
    pulls: Option<PullerConfig>,
) -> DriverHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    let puller = pulls.map(|cfg| {
        let tx = tx.clone();
        Puller::new(
            cfg,
            Arc::new(move |report| {
                let _ = tx.send(Command::Pulled(report));
            }),
        )
    });
    tokio::spawn(run(engine, rx, events, puller));
    DriverHandle { tx }
}

/// What the driver keeps about requests besides the model.
struct Routes {
    sinks: HashMap<RequestId, (u32, mpsc::UnboundedSender<TokenEvent>)>,
    /// Internal ids of prefill legs still running.
    prefill_names: HashMap<RequestId, String>,
    /// Prefill legs holding a lease, by internal id.
    leased: HashMap<String, RequestId>,
    puller: Option<Puller>,
}

impl Routes {
    /// The engine dropped request `id` (or never held it): forget it everywhere.
    fn forget(&mut self, id: RequestId) {
        self.sinks.remove(&id);
        self.prefill_names.remove(&id);
        if let Some(p) = &mut self.puller {
            p.forget(id);
        }
    }
}

async fn run(
    mut engine: Engine,
    mut rx: mpsc::UnboundedReceiver<Command>,
    events: Option<mpsc::UnboundedSender<Vec<KvCacheEvent>>>,
    puller: Option<Puller>,
) {
    let epoch = Instant::now();
    let epoch_unix_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0);
    let mut routes = Routes {
        sinks: HashMap::new(),
        prefill_names: HashMap::new(),
        leased: HashMap::new(),
        puller,
    };
    let mut outputs = Vec::new();
    let mut last_sweep = Instant::now();
    loop {
        let deadline = engine.next_event_time().map(|t| epoch + t);
        let cmd = match deadline {
            Some(d) if d <= Instant::now() => rx.try_recv().ok(),
            Some(d) => tokio::select! {
                biased;
                c = rx.recv() => match c { Some(c) => Some(c), None => return },
                _ = tokio::time::sleep_until(d) => None,
            },
            None => match rx.recv().await {
                Some(c) => Some(c),
                None => return,
            },
        };
        let now = epoch.elapsed();
        // Finish the steps that ended before these commands arrived, then take the commands.
        engine.advance_into(now, &mut outputs);
        if let Some(cmd) = cmd {
            handle(&mut engine, &mut routes, cmd, now, epoch_unix_s);
            // Take everything already queued so one step batches it all.
            while let Ok(cmd) = rx.try_recv() {
                handle(&mut engine, &mut routes, cmd, now, epoch_unix_s);
            }
        }
        engine.advance_into(epoch.elapsed(), &mut outputs);
        if let Some(p) = &mut routes.puller {
            for pull in engine.take_pulls() {
                p.pull(pull);
            }
        }
        // Publish the cache changes of these steps before their tokens go out, so a consumer
        // of KV events is not behind a client that reacts to the answer.
        let evs = engine.take_kv_events();
        if let Some(tx) = &events
            && !evs.is_empty()
        {
            let _ = tx.send(evs);
        }
        for out in outputs.drain(..) {
            let id = out.request;
            let done = out.finished.is_some();
            if let Some(f) = &out.finished {
                let name = routes.prefill_names.remove(&id);
                if let (Some(name), Some(_)) = (name, &f.remote_block_ids) {
                    routes.leased.insert(name, id);
                }
            }
            let delivered = match routes.sinks.get(&id) {
                Some((index, sink)) => sink.send((*index, out)).is_ok(),
                None => false,
            };
            if done || !delivered {
                routes.sinks.remove(&id);
            }
            if !delivered && !done {
                engine.abort(id, epoch.elapsed());
                routes.forget(id);
            }
        }
        // Clients that went away while their request waits produce no token to fail on:
        // look for closed channels now and then and abort those requests, as vLLM does.
        if last_sweep.elapsed() >= SWEEP_EVERY {
            last_sweep = Instant::now();
            let gone: Vec<RequestId> = routes
                .sinks
                .iter()
                .filter(|(_, (_, s))| s.is_closed())
                .map(|(id, _)| *id)
                .collect();
            for id in gone {
                engine.abort(id, epoch.elapsed());
                routes.forget(id);
            }
            // Leases that ran out in the model are gone: drop their names.
            routes
                .leased
                .retain(|_, id| engine.leased_blocks(*id).is_some());
        }
        if routes.sinks.is_empty() && engine.is_idle() && rx.is_closed() {
            return;
        }
        tokio::task::yield_now().await;
    }
}

fn handle(
    engine: &mut Engine,
    routes: &mut Routes,
    cmd: Command,
    now: Duration,
    epoch_unix_s: f64,
) {
    match cmd {
        Command::Submit(s) => {
            let names = s
                .internal_ids
                .into_iter()
                .map(Some)
                .chain(std::iter::repeat(None));
            for ((index, req), name) in s.requests.into_iter().enumerate().zip(names) {
                let id = req.id;
                let leg = req.kv_transfer.clone();
                match engine.submit(req, now) {
                    Ok(()) => {
                        routes.sinks.insert(id, (index as u32, s.sink.clone()));
                        match (leg, name, &mut routes.puller, &s.remote) {
                            (KvTransfer::RemoteDecode, Some(name), _, _) => {
                                routes.prefill_names.insert(id, name);
                            }
                            (KvTransfer::RemotePrefill { .. }, _, Some(p), Some(remote)) => {
                                p.track(id, remote.clone());
                            }
                            _ => {}
                        }
                    }
                    // Handlers validate first; ids are unique. Dropping the sink's clone
                    // ends the response if this ever happens.
                    Err(e) => tracing::warn!(request_id = id, error = %e, "engine refused request"),
                }
            }
        }
        Command::Snapshot(reply) => {
            let _ = reply.send(Snapshot {
                gauges: engine.gauges(),
                stats: engine.stats().clone(),
                transfers: routes.puller.as_ref().map(Puller::stats),
                epoch_unix_s,
            });
        }
        Command::AddLora(name) => {
            engine.add_lora(&name, now);
        }
        Command::RemoveLora(name) => {
            engine.remove_lora(&name);
        }
        Command::Pulled(report) => {
            engine.finish_pull(report.request, report.outcome, now);
            if let Some(p) = &mut routes.puller {
                p.settle(report.request);
            }
        }
        Command::Lease(op, reply) => {
            let _ = reply.send(lease(engine, &mut routes.leased, op, now));
        }
    }
}

/// Acts on the leases this engine granted, named by the prefill legs' internal ids.
fn lease(
    engine: &mut Engine,
    leased: &mut HashMap<String, RequestId>,
    op: LeaseOp,
    now: Duration,
) -> LeaseReply {
    // The loop advanced the model to `now` before taking commands: leases that ran out by
    // then are gone already.
    match op {
        LeaseOp::Read {
            request_id,
            block_ids,
        } => LeaseReply::Read(match leased.get(&request_id) {
            Some(&id) => engine.check_read(id, &block_ids).map_err(|e| e.to_string()),
            None => Err(format!(
                "no KV blocks are held for request {request_id} (unknown, already read or expired)"
            )),
        }),
        LeaseOp::Release { request_id } => LeaseReply::Released(
            leased
                .remove(&request_id)
                .is_some_and(|id| engine.release_lease(id, now)),
        ),
        LeaseOp::Renew { request_ids } => LeaseReply::Renewed(
            request_ids
                .iter()
                .filter_map(|r| leased.get(r))
                .filter(|&&id| engine.renew_lease(id, now))
                .count(),
        ),
    }
}
