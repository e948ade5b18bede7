//! The KV transfer of a disaggregated request, as both event loops drive it: the decode
//! engine shakes hands with the prefill engine when a decode leg first arrives from it (vLLM
//! does it on arrival, before admission; concurrent first contacts wait for the one
//! handshake), and each pull the engine asks for when it admits a leg ends when the pair's
//! handshake is done plus its blocks' transfer time. The prefill engine frees the blocks
//! when they arrive (the READ notification). Nothing fails in the model: every pull loads.

use super::{Sim, Transfers};
use crate::engine::model::PullOutcome;
use crate::simulate::node::SimNode;

impl Sim<'_> {
    /// Request `id`'s decode leg, whose prefill ran on node `prefill`, reached node
    /// `decode` at `now`.
    pub(super) fn track_decode(&mut self, id: u64, prefill: u32, decode: u32, now: u64) {
        self.decode_legs.insert(id, prefill);
        let handshake = self.config.engine.timing.handshake_duration().as_nanos() as u64;
        self.handshakes
            .entry((prefill, decode))
            .or_insert(now + handshake);
    }

    /// The pulls node `node`'s engine asked for by `now`: `(arrival time, request)` of each.
    pub(super) fn start_pulls(&mut self, node: u32, now: u64) -> Vec<(u64, u64)> {
        let pulls = self.nodes[node as usize].engine.take_pulls();
        let timing = &self.config.engine.timing;
        let mut arrivals = Vec::with_capacity(pulls.len());
        for pull in pulls {
            let Some(&prefill) = self.decode_legs.get(&pull.request) else {
                continue;
            };
            let ready = self
                .handshakes
                .get(&(prefill, node))
                .copied()
                .unwrap_or(now);
            let transfer = timing.transfer_duration(pull.num_blocks).as_nanos() as u64;
            let at = now.max(ready) + transfer;
            let Transfers {
                pulls,
                handshake_waits,
                blocks,
                seconds,
            } = &mut self.transfers;
            *pulls += 1;
            *handshake_waits += u64::from(ready > now);
            *blocks += pull.num_blocks as u64;
            *seconds += (at - now) as f64 / 1e9;
            arrivals.push((at, pull.request));
        }
        arrivals
    }

    /// Request `id`'s KV arrived at node `node` at `now`: its decode leg runs and its prefill
    /// engine frees the blocks. Returns the engines to wake: `node`'s and the prefill
    /// engine's, when either changed.
    pub(super) fn pulled(&mut self, id: u64, node: u32, now: u64) -> Vec<u32> {
        let at = SimNode::now(now);
        let mut woken = Vec::with_capacity(2);
        if self.nodes[node as usize]
            .engine
            .finish_pull(id, PullOutcome::Loaded, at)
        {
            woken.push(node);
        }
        if let Some(prefill) = self.decode_legs.remove(&id)
            && self.nodes[prefill as usize].engine.release_lease(id, at)
        {
            woken.push(prefill);
        }
        woken
    }
}
