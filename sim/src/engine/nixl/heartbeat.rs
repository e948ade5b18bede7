//! The decode side's heartbeats: every sixth of the lease, one batched heartbeat per prefill
//! engine naming every lease this engine still waits on there (vLLM's `HB:` notification),
//! once the handshake with that engine is done.

use std::collections::HashMap;
use std::sync::{Arc, Weak};
use std::time::Duration;

use super::params::RemoteKv;
use super::puller::Shared;
use super::wire::SideRequest;

/// Starts the heartbeat loop; it ends when the puller is dropped.
pub(super) fn spawn(shared: Weak<Shared>, interval: Duration) {
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let Some(shared) = shared.upgrade() else {
                return;
            };
            for (remote, request_ids) in batches(&shared) {
                let shared = shared.clone();
                tokio::spawn(async move {
                    let req = SideRequest::Heartbeat {
                        engine_id: remote.engine_id.clone(),
                        request_ids,
                    };
                    shared.notify(&remote, req).await;
                });
            }
        }
    });
}

/// The tracked leases grouped by prefill engine.
fn batches(shared: &Arc<Shared>) -> Vec<(RemoteKv, Vec<String>)> {
    let mut by_engine: HashMap<(String, String, u16), (RemoteKv, Vec<String>)> = HashMap::new();
    for remote in shared.tracked().values() {
        // NIXL notifications need the remote agent: no heartbeat before the handshake (vLLM
        // defers it to the step after the early handshake completes).
        if !shared.handshakes.is_done(&remote.engine_id) {
            continue;
        }
        let key = (remote.engine_id.clone(), remote.host.clone(), remote.port);
        by_engine
            .entry(key)
            .or_insert_with(|| (remote.clone(), Vec::new()))
            .1
            .push(remote.request_id.clone());
    }
    by_engine.into_values().collect()
}
