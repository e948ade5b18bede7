//! The task that owns the engine model and runs it in (scaled) real time.
//!
//! Handlers send commands over a channel; the driver submits requests, sleeps until the
//! model's next event, advances the model to the current time and routes each generated
//! token to its request's channel. A request whose channel is closed (the client went away)
//! is aborted. KV events the model records are forwarded to the publisher, if any.

use std::collections::HashMap;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

use crate::engine::model::{
    Engine, EngineGauges, EngineRequest, EngineStats, KvCacheEvent, Output, RequestId,
};

/// How often the driver looks for requests whose client went away.
const SWEEP_EVERY: Duration = Duration::from_millis(100);

/// A generated token routed to a request: the choice index and the engine output.
pub type TokenEvent = (u32, Output);

/// A request handed to the driver.
pub struct Submission {
    /// Engine requests, one per choice (index = position).
    pub requests: Vec<EngineRequest>,
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
}

enum Command {
    Submit(Submission),
    Snapshot(oneshot::Sender<Snapshot>),
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
}

/// Starts the driver on the current runtime. KV events go to `events` when given.
pub fn spawn(
    engine: Engine,
    events: Option<mpsc::UnboundedSender<Vec<KvCacheEvent>>>,
) -> DriverHandle {
    let (tx, rx) = mpsc::unbounded_channel();
    tokio::spawn(run(engine, rx, events));
    DriverHandle { tx }
}

async fn run(
    mut engine: Engine,
    mut rx: mpsc::UnboundedReceiver<Command>,
    events: Option<mpsc::UnboundedSender<Vec<KvCacheEvent>>>,
) {
    let epoch = Instant::now();
    let mut sinks: HashMap<RequestId, (u32, mpsc::UnboundedSender<TokenEvent>)> = HashMap::new();
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
            handle(&mut engine, &mut sinks, cmd, now);
            // Take everything already queued so one step batches it all.
            while let Ok(cmd) = rx.try_recv() {
                handle(&mut engine, &mut sinks, cmd, now);
            }
        }
        engine.advance_into(epoch.elapsed(), &mut outputs);
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
            let delivered = match sinks.get(&id) {
                Some((index, sink)) => sink.send((*index, out)).is_ok(),
                None => false,
            };
            if done || !delivered {
                sinks.remove(&id);
            }
            if !delivered && !done {
                engine.abort(id, epoch.elapsed());
            }
        }
        // Clients that went away while their request waits produce no token to fail on:
        // look for closed channels now and then and abort those requests, as vLLM does.
        if last_sweep.elapsed() >= SWEEP_EVERY {
            last_sweep = Instant::now();
            let gone: Vec<RequestId> = sinks
                .iter()
                .filter(|(_, (_, s))| s.is_closed())
                .map(|(id, _)| *id)
                .collect();
            for id in gone {
                sinks.remove(&id);
                engine.abort(id, epoch.elapsed());
            }
        }
        if sinks.is_empty() && engine.is_idle() && rx.is_closed() {
            return;
        }
        tokio::task::yield_now().await;
    }
}

fn handle(
    engine: &mut Engine,
    sinks: &mut HashMap<RequestId, (u32, mpsc::UnboundedSender<TokenEvent>)>,
    cmd: Command,
    now: Duration,
) {
    match cmd {
        Command::Submit(s) => {
            for (index, req) in s.requests.into_iter().enumerate() {
                let id = req.id;
                match engine.submit(req, now) {
                    Ok(()) => {
                        sinks.insert(id, (index as u32, s.sink.clone()));
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
            });
        }
    }
}
