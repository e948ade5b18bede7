//! The engine's side of disaggregated prefill: the leases a prefill leg's blocks are kept
//! under, and the pulls a decode leg waits on. See the module docs of [`super`].

use std::time::Duration;

use super::{Engine, Pull, register_blocks};
use crate::engine::model::block_pool::BlockId;
use crate::engine::model::config::KvLoadFailurePolicy;
use crate::engine::model::lease::ReadRefused;
use crate::engine::model::request::{Finished, Output, PullOutcome, PullRequest, RequestId};
use crate::engine::model::stats::FinishReason;

impl Engine {
    /// Pulls decode legs admitted since the last call: the driver now moves their KV.
    pub fn take_pulls(&mut self) -> Vec<PullRequest> {
        std::mem::take(&mut self.pull_requests)
    }

    /// Ends the pull of decode leg `id` at `now`. Returns false if no pull of `id` was under
    /// way (the request was aborted meanwhile).
    pub fn finish_pull(&mut self, id: RequestId, outcome: PullOutcome, now: Duration) -> bool {
        let Some(seq) = self.seqs.get_mut(&id).filter(|s| s.pull == Pull::InFlight) else {
            return false;
        };
        self.pulling.retain(|&r| r != id);
        self.pull_requests.retain(|p| p.request != id);
        seq.pull = Pull::None;
        match (outcome, self.cfg.kv_load_failure_policy) {
            (PullOutcome::Loaded, _) => {
                // The pulled KV covers the whole prompt but its last token, which the decode
                // engine computes itself to sample the first token (as vLLM does); the pulled
                // blocks join its prefix cache.
                seq.num_computed = seq.num_computed.max(seq.prompt_len - 1);
                let full = seq.num_computed / self.cfg.block_size as usize;
                register_blocks(&mut self.pool, &self.hasher, seq, full);
            }
            (PullOutcome::Failed, KvLoadFailurePolicy::Recompute) => {
                // Only the local prefix hit is valid; the rest is prefilled here. The blocks
                // stay allocated.
                seq.external_tokens = 0;
            }
            (PullOutcome::Failed, KvLoadFailurePolicy::Fail) => {
                let seq = self.seqs.remove(&id).expect("present");
                self.pool.free(seq.blocks.iter().rev().copied());
                self.lora_done(&seq);
                self.stats.count_finished(FinishReason::Error);
                self.pending_outputs.push(Output {
                    request: id,
                    token_id: 0,
                    text: "",
                    finished: Some(Finished {
                        reason: FinishReason::Error,
                        prompt_tokens: seq.prompt_len as u32,
                        completion_tokens: 0,
                        cached_tokens: 0,
                        remote_block_ids: None,
                    }),
                });
                self.wake(now);
                return true;
            }
        }
        self.waiting.push_front(id);
        self.wake(now);
        true
    }

    /// The blocks prefill leg `id` holds for a decode engine, if its lease is live.
    pub fn leased_blocks(&self, id: RequestId) -> Option<&[BlockId]> {
        self.leases.readable(id)
    }

    /// Checks that a decode engine may read `blocks` of `id`'s lease (it changes nothing:
    /// the blocks stay held until [`release_lease`](Self::release_lease)).
    pub fn check_read(&self, id: RequestId, blocks: &[BlockId]) -> Result<(), ReadRefused> {
        self.leases.check_read(id, blocks)
    }

    /// A decode engine read `id`'s blocks or gave up on them: frees them. Returns whether a
    /// lease was held.
    pub fn release_lease(&mut self, id: RequestId, now: Duration) -> bool {
        match self.leases.take(id) {
            Some(blocks) => {
                self.pool.free(blocks.into_iter().rev());
                self.wake(now);
                true
            }
            None => false,
        }
    }

    /// A decode engine's heartbeat: `id`'s lease lasts at least 2/3 of its duration from
    /// `now`. Returns whether a lease was held.
    pub fn renew_lease(&mut self, id: RequestId, now: Duration) -> bool {
        self.leases.renew(id, now)
    }

    pub(super) fn expire_leases(&mut self, now: Duration) {
        let pool = &mut self.pool;
        let expired = self
            .leases
            .expire(now, |blocks| pool.free(blocks.into_iter().rev()));
        if expired > 0 {
            self.stats.kv_expired_reqs += expired as u64;
            self.wake(now);
        }
    }
}
