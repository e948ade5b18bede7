//! The decode side: pulls a decode leg's KV from the prefill engine named in its
//! `kv_transfer_params`, heartbeats the leases it waits on, and tells the prefill engine to
//! free them when the decode leg gives up.
//!
//! The driver owns the [`Puller`] and calls it from its loop; the exchanges themselves run as
//! tasks that report back through a callback. A pull is: handshake (first contact with that
//! engine only), post the read (the prefill engine checks the lease and the blocks), wait the
//! modelled transfer time (bytes over bandwidth), then report the read done (the prefill
//! engine frees the blocks, and refuses if its lease ran out meanwhile). Any failure fails the
//! pull; the engine's load-failure policy decides what that means for the request.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio::task::AbortHandle;
use tokio::time::Instant;

use super::handshake::Handshakes;
use super::heartbeat;
use super::params::RemoteKv;
use super::stats::TransferStats;
use super::wire::{self, SideError, SideRequest};
use crate::engine::model::{PullOutcome, PullRequest, RequestId, TimingModel};

/// Bound on a notification's exchange (read done, abort, heartbeat).
pub const NOTIFY_TIMEOUT: Duration = Duration::from_secs(5);

/// What the puller needs to know of its engine.
#[derive(Debug, Clone)]
pub struct PullerConfig {
    /// Tokens per block (a prefill engine must have the same).
    pub block_size: u32,
    /// Bytes of KV per block.
    pub bytes_per_block: u64,
    /// Modelled handshake and transfer durations.
    pub timing: TimingModel,
    /// This engine's lease duration: it heartbeats every sixth of it, as vLLM does.
    pub lease: Duration,
}

/// A finished pull, for the driver.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PullReport {
    /// The decode leg.
    pub request: RequestId,
    /// How the pull ended.
    pub outcome: PullOutcome,
}

/// Where finished pulls go.
pub type Report = Arc<dyn Fn(PullReport) + Send + Sync>;

/// State shared with the pull and heartbeat tasks.
pub(super) struct Shared {
    pub(super) cfg: PullerConfig,
    pub(super) handshakes: Handshakes,
    /// Decode legs whose leases this engine heartbeats: admitted or waiting, not pulled yet.
    pub(super) tracked: Mutex<HashMap<RequestId, RemoteKv>>,
    pub(super) stats: Mutex<TransferStats>,
}

impl Shared {
    pub(super) fn tracked(&self) -> MutexGuard<'_, HashMap<RequestId, RemoteKv>> {
        self.tracked.lock().unwrap_or_else(PoisonError::into_inner)
    }

    pub(super) fn stats(&self) -> MutexGuard<'_, TransferStats> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Sends a notification, counting one that does not arrive (a refusal did arrive).
    pub(super) async fn notify(&self, remote: &RemoteKv, req: SideRequest) {
        match wire::exchange(&remote.host, remote.port, &req, Some(NOTIFY_TIMEOUT)).await {
            Ok(_) | Err(SideError::Refused { .. }) => {}
            Err(e) => {
                tracing::debug!(error = %e, "notification lost");
                self.stats().failed_notifications += 1;
            }
        }
    }
}

/// The decode side of the connector. See the module docs.
pub struct Puller {
    shared: Arc<Shared>,
    pulls: HashMap<RequestId, AbortHandle>,
    report: Report,
}

impl Puller {
    /// A puller reporting to `report`; starts its heartbeat task on the current runtime.
    pub fn new(cfg: PullerConfig, report: Report) -> Self {
        let interval = (cfg.lease / 6).max(Duration::from_millis(10));
        let shared = Arc::new(Shared {
            cfg,
            handshakes: Handshakes::default(),
            tracked: Mutex::new(HashMap::new()),
            stats: Mutex::new(TransferStats::default()),
        });
        heartbeat::spawn(Arc::downgrade(&shared), interval);
        Self {
            shared,
            pulls: HashMap::new(),
            report,
        }
    }

    /// A decode leg arrived: heartbeat its lease from now on and, as vLLM does, shake hands
    /// with its prefill engine early so the pull does not wait for it.
    pub fn track(&mut self, id: RequestId, remote: RemoteKv) {
        if !self.shared.handshakes.is_done(&remote.engine_id) {
            let shared = self.shared.clone();
            let early = remote.clone();
            tokio::spawn(async move {
                let cost = shared.cfg.timing.handshake_duration();
                if let Err(e) = shared
                    .handshakes
                    .ensure(&early, shared.cfg.block_size, cost)
                    .await
                {
                    tracing::debug!(error = %e, "early handshake failed");
                }
            });
        }
        self.shared.tracked().insert(id, remote);
    }

    /// The engine admitted decode leg `req.request`: pull its KV.
    pub fn pull(&mut self, req: PullRequest) {
        let remote = self.shared.tracked().get(&req.request).cloned();
        let (shared, report) = (self.shared.clone(), self.report.clone());
        let task = tokio::spawn(async move {
            let outcome = match remote {
                Some(remote) => pull(&shared, req, &remote).await,
                None => PullOutcome::Failed, // never tracked: nothing to pull from
            };
            report(PullReport {
                request: req.request,
                outcome,
            });
        });
        self.pulls.insert(req.request, task.abort_handle());
    }

    /// The engine took decode leg `id`'s pull report: stop heartbeating it.
    pub fn settle(&mut self, id: RequestId) {
        self.pulls.remove(&id);
        self.shared.tracked().remove(&id);
    }

    /// Decode leg `id` ended (client gone, refused): stop its pull and tell the prefill
    /// engine to free the blocks, as vLLM's abort notification does. No-op for other requests.
    pub fn forget(&mut self, id: RequestId) {
        let remote = self.shared.tracked().remove(&id);
        let unread = match self.pulls.remove(&id) {
            Some(task) => {
                task.abort();
                !task.is_finished()
            }
            None => true,
        };
        if let (Some(remote), true) = (remote, unread) {
            let shared = self.shared.clone();
            tokio::spawn(async move {
                let req = SideRequest::Abort {
                    engine_id: remote.engine_id.clone(),
                    request_id: remote.request_id.clone(),
                };
                shared.notify(&remote, req).await;
            });
        }
    }

    /// Transfer statistics so far.
    pub fn stats(&self) -> TransferStats {
        self.shared.stats().clone()
    }
}

async fn pull(shared: &Shared, req: PullRequest, remote: &RemoteKv) -> PullOutcome {
    match try_pull(shared, req, remote).await {
        Ok(()) => PullOutcome::Loaded,
        Err(e) => {
            tracing::warn!(
                request_id = %remote.request_id,
                peer = %format!("{}:{}", remote.host, remote.port),
                reason = %e,
                "KV pull failed"
            );
            shared.stats().failed_transfers += 1;
            PullOutcome::Failed
        }
    }
}

async fn try_pull(shared: &Shared, req: PullRequest, remote: &RemoteKv) -> Result<(), String> {
    let cfg = &shared.cfg;
    let prompt_blocks = req.first_block + req.num_blocks;
    if remote.block_ids.len() != prompt_blocks {
        return Err(format!(
            "the prefill engine offered {} blocks for a prompt of {prompt_blocks}",
            remote.block_ids.len()
        ));
    }
    let cost = cfg.timing.handshake_duration();
    shared
        .handshakes
        .ensure(remote, cfg.block_size, cost)
        .await?;
    let posted = Instant::now();
    let read = SideRequest::Read {
        engine_id: remote.engine_id.clone(),
        request_id: remote.request_id.clone(),
        block_ids: remote.block_ids[req.first_block..].to_vec(),
    };
    // No bound: a posted read takes what it takes (a hung prefill engine hangs the decode
    // leg until its client gives up, as a hung NIXL transfer does).
    wire::exchange(&remote.host, remote.port, &read, None)
        .await
        .map_err(|e| e.to_string())?;
    let post = posted.elapsed();
    tokio::time::sleep(cfg.timing.transfer_duration(req.num_blocks)).await;
    let done = SideRequest::Done {
        engine_id: remote.engine_id.clone(),
        request_id: remote.request_id.clone(),
    };
    // A refusal here means the lease ran out while the blocks were read: they may have been
    // overwritten, so the pulled KV cannot be trusted.
    wire::exchange(&remote.host, remote.port, &done, Some(NOTIFY_TIMEOUT))
        .await
        .map_err(|e| e.to_string())?;
    let bytes = cfg.bytes_per_block * req.num_blocks as u64;
    shared
        .stats()
        .record_transfer(posted.elapsed(), post, bytes, req.num_blocks);
    Ok(())
}
