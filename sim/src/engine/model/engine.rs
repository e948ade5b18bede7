//! The engine state machine: waiting queue, continuous batching, chunked prefill, prefix-cache
//! bookkeeping and preemption, with time passed in.
//!
//! The engine executes one *step* at a time, like vLLM V1's busy loop. A step is planned from
//! the running sequences first (one token for each decoding sequence, the next chunk for each
//! sequence still in prefill), then from the waiting queue while a sequence slot
//! (`max_num_seqs`), token budget (`max_num_batched_tokens`) and KV blocks remain. A running
//! sequence that needs a block when none is free preempts the most recently admitted running
//! sequence (its blocks are freed and it is recomputed later). The step's duration comes from
//! the [`TimingModel`]; when it ends, every sequence that has caught up with its tokens emits
//! one token, newly filled blocks enter the prefix cache, and finished sequences release their
//! blocks (tail first, so their last blocks are evicted first).
//!
//! Driving it: call [`Engine::submit`] when a request arrives, [`Engine::next_event_time`] to
//! learn when something happens next, and [`Engine::advance`] with the current time to run
//! every step that completes by then. Same inputs, same seed: same outputs, same timings.
//!
//! Disaggregation (vLLM's NixlConnector) adds two exchanges with the driver. A prefill leg
//! that finishes by length keeps its blocks under a lease ([`super::lease`]) that the driver
//! ends with [`Engine::release_lease`] once a decode engine read them, renews with
//! [`Engine::renew_lease`], or lets run out. A decode leg is admitted with blocks for the whole
//! prompt and waits while the driver pulls the KV: [`Engine::take_pulls`] says what to pull,
//! [`Engine::finish_pull`] says how it went.

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use super::block_hash::{BlockHash, BlockHasher, CacheKey};
use super::block_pool::{BlockId, BlockPool, KvCacheEvent};
use super::config::{EngineConfig, EngineGauges};
use super::lease::Leases;
use super::lora_slots::LoraSlots;
use super::media::uncached_media_tokens;
use super::offload_tier::OffloadTier;
use super::request::{
    EngineRequest, Finished, KvTransfer, Output, PullRequest, RequestId, SubmitError, validate,
};
use super::stats::{EngineStats, FinishReason};
use super::timing::StepShape;
use super::tokenizer::token_id;
use crate::text;
use kvmesh_protocol::mix64;

mod disagg;
mod lora;

#[derive(Debug)]
struct Seq {
    req: EngineRequest,
    key: CacheKey,
    tokens: Vec<u32>,
    prompt_len: usize,
    hashes: Vec<BlockHash>,
    blocks: Vec<BlockId>,
    num_computed: usize,
    num_registered: usize,
    num_output: u32,
    natural_len: u32,
    output_key: u64,
    arrival: Duration,
    /// When a step first scheduled it (vLLM's `scheduled_ts`): its prefill time runs from
    /// here to its first token, its queue time before.
    scheduled_at: Option<Duration>,
    first_token_at: Option<Duration>,
    cached_tokens: Option<u32>,
    /// Prompt tokens whose KV came from a prefill engine (vLLM's
    /// `num_external_computed_tokens`).
    external_tokens: u32,
    pull: Pull,
}

/// Where a decode leg is with its remote KV.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Pull {
    /// Not a decode leg, or its one pull is over (vLLM pulls at most once: a decode leg
    /// preempted later recomputes its prompt locally).
    None,
    /// A decode leg not admitted yet.
    Pending,
    /// Blocks allocated, waiting for the driver's [`Engine::finish_pull`].
    InFlight,
}

#[derive(Debug)]
struct InFlight {
    end: Duration,
    plan: Vec<(RequestId, usize)>,
}

/// The sans-IO engine model. See the module docs.
#[derive(Debug)]
pub struct Engine {
    cfg: EngineConfig,
    hasher: BlockHasher,
    pool: BlockPool,
    offload: OffloadTier,
    seqs: HashMap<RequestId, Seq>,
    waiting: VecDeque<RequestId>,
    running: Vec<RequestId>,
    /// Decode legs waiting for their KV (`WAITING_FOR_REMOTE_KVS`).
    pulling: Vec<RequestId>,
    /// Pulls the driver has not taken yet.
    pull_requests: Vec<PullRequest>,
    /// Outputs produced outside a step (failed pulls), handed out by the next advance.
    pending_outputs: Vec<Output>,
    leases: Leases,
    in_flight: Option<InFlight>,
    clock: Duration,
    stalled: bool,
    stats: EngineStats,
    /// The GPU's LoRA adapter slots (used when `max_loras` > 0).
    slots: LoraSlots,
    /// When an adapter a waiting request needs finishes loading: a stalled engine wakes then.
    lora_wake: Option<Duration>,
    /// Requests held that run with an adapter (0 skips the per-step adapter lists).
    lora_seqs: usize,
}

impl Engine {
    /// An idle engine with an empty cache. `max_model_len` is capped at the KV capacity.
    pub fn new(mut cfg: EngineConfig) -> Self {
        assert!(cfg.block_size > 0 && cfg.num_gpu_blocks > 0 && cfg.max_num_seqs > 0);
        cfg.max_model_len = cfg
            .max_model_len
            .min(cfg.num_gpu_blocks.saturating_mul(cfg.block_size));
        cfg.max_num_batched_tokens = cfg.max_num_batched_tokens.max(1);
        Self {
            hasher: BlockHasher::new(cfg.seed, cfg.block_size as usize),
            pool: BlockPool::new(cfg.num_gpu_blocks),
            offload: OffloadTier::new(cfg.num_offload_blocks),
            seqs: HashMap::new(),
            waiting: VecDeque::new(),
            running: Vec::new(),
            pulling: Vec::new(),
            pull_requests: Vec::new(),
            pending_outputs: Vec::new(),
            leases: Leases::new(cfg.kv_lease),
            in_flight: None,
            clock: Duration::ZERO,
            stalled: false,
            stats: EngineStats::default(),
            slots: LoraSlots::new(cfg.max_loras, cfg.timing.lora_load_duration()),
            lora_wake: None,
            lora_seqs: 0,
            cfg,
        }
    }

    /// The configuration in force (with `max_model_len` capped).
    pub fn config(&self) -> &EngineConfig {
        &self.cfg
    }

    /// Cumulative statistics.
    pub fn stats(&self) -> &EngineStats {
        &self.stats
    }

    /// Current gauges.
    pub fn gauges(&self) -> EngineGauges {
        EngineGauges {
            running: self.running.len(),
            waiting: self.waiting.len() + self.pulling.len(),
            kv_usage: self.pool.usage(),
        }
    }

    /// The block pool (read-only), e.g. to compare KV events with the cache state.
    pub fn pool(&self) -> &BlockPool {
        &self.pool
    }

    /// The CPU offload tier (read-only): the blocks its KV events say are offloaded.
    pub fn offload(&self) -> &OffloadTier {
        &self.offload
    }

    /// The chained block hashes the engine would use for `tokens` under `key`.
    pub fn block_hashes(&self, tokens: &[u32], key: &CacheKey) -> Vec<BlockHash> {
        let mut v = Vec::new();
        self.hasher.extend_chain(&mut v, tokens, key);
        v
    }

    /// Prompt tokens of `tokens` a request would find cached right now (the longest cached
    /// chain of full blocks, at most `(len - 1) / block_size` blocks, as admission counts it).
    /// An oracle for the cluster simulator; it changes nothing.
    pub fn cached_prefix_tokens(&self, tokens: &[u32], key: &CacheKey) -> usize {
        let bs = self.cfg.block_size as usize;
        let max_hit = tokens.len().saturating_sub(1) / bs;
        let hashes = self.block_hashes(&tokens[..max_hit * bs], key);
        hashes
            .iter()
            .take_while(|&&h| self.pool.contains(h))
            .count()
            * bs
    }

    /// Takes the KV cache events recorded since the last call, in order: the GPU's, each
    /// store followed by the offload tier's events when there is one.
    pub fn take_kv_events(&mut self) -> Vec<KvCacheEvent> {
        self.offload.follow(self.pool.take_events())
    }

    /// Whether the engine holds no request.
    pub fn is_idle(&self) -> bool {
        self.seqs.is_empty()
    }

    /// Clears the prefix cache if no request holds blocks. Returns whether it did.
    pub fn reset_prefix_cache(&mut self) -> bool {
        self.pool.reset_prefix_cache()
    }

    /// Accepts a request arriving at `now`.
    pub fn submit(&mut self, req: EngineRequest, now: Duration) -> Result<(), SubmitError> {
        validate(&self.cfg, req.prompt.len(), req.max_tokens)?;
        if self.seqs.contains_key(&req.id) {
            return Err(SubmitError::DuplicateId(req.id));
        }
        let key = CacheKey {
            lora: req.lora.as_ref().map(|l| l.name.clone()),
            cache_salt: req.cache_salt.clone(),
            media: req.media.clone(),
        };
        let prompt_key = req
            .prompt
            .iter()
            .fold(self.cfg.seed, |h, &t| mix64(h ^ u64::from(t)));
        let natural_len = 16 + (mix64(prompt_key ^ 0x006e_6174_7572_616c) % 497) as u32;
        let mut hashes = Vec::with_capacity(req.prompt.len() / self.cfg.block_size as usize + 1);
        self.hasher.extend_chain(&mut hashes, &req.prompt, &key);
        let id = req.id;
        let tokens = req.prompt.clone();
        self.lora_seqs += usize::from(req.lora.is_some());
        self.seqs.insert(
            id,
            Seq {
                prompt_len: tokens.len(),
                tokens,
                key,
                hashes,
                blocks: Vec::new(),
                num_computed: 0,
                num_registered: 0,
                num_output: 0,
                natural_len,
                output_key: prompt_key,
                arrival: now,
                scheduled_at: None,
                first_token_at: None,
                cached_tokens: None,
                external_tokens: 0,
                pull: if matches!(req.kv_transfer, KvTransfer::RemotePrefill { .. }) {
                    Pull::Pending
                } else {
                    Pull::None
                },
                req,
            },
        );
        self.waiting.push_back(id);
        self.wake(now);
        Ok(())
    }

    /// Drops a request (the client went away). Returns whether the engine held it.
    pub fn abort(&mut self, id: RequestId, now: Duration) -> bool {
        let Some(seq) = self.seqs.remove(&id) else {
            return false;
        };
        self.waiting.retain(|&r| r != id);
        self.running.retain(|&r| r != id);
        self.pulling.retain(|&r| r != id);
        self.pull_requests.retain(|p| p.request != id);
        self.pool.free(seq.blocks.iter().rev().copied());
        self.lora_done(&seq);
        self.stats.count_finished(FinishReason::Abort);
        self.wake(now);
        true
    }

    /// When the engine next has something to do: the end of the step in flight, `now`-ish
    /// (the engine's clock) when idle with schedulable work or outputs to hand out, the
    /// earliest lease expiry, or `None` when there is nothing to do until a request arrives
    /// or a pull ends.
    pub fn next_event_time(&self) -> Option<Duration> {
        let work = if let Some(step) = &self.in_flight {
            Some(step.end)
        } else if !self.pending_outputs.is_empty()
            || (!self.stalled && (!self.running.is_empty() || !self.waiting.is_empty()))
        {
            Some(self.clock)
        } else {
            // Stalled: only an adapter load finishing can unblock the waiting queue.
            self.lora_wake.map(|t| t.max(self.clock))
        };
        match (work, self.leases.next_expiry()) {
            (Some(w), Some(l)) => Some(w.min(l.max(self.clock))),
            (w, l) => w.or(l.map(|l| l.max(self.clock))),
        }
    }

    /// Runs every step that completes by `now` and returns the tokens they generated.
    pub fn advance(&mut self, now: Duration) -> Vec<Output> {
        let mut out = Vec::new();
        self.advance_into(now, &mut out);
        out
    }

    /// Like [`advance`](Self::advance), appending to `out`.
    pub fn advance_into(&mut self, now: Duration, out: &mut Vec<Output>) {
        self.expire_leases(now);
        out.append(&mut self.pending_outputs);
        if let Some(t) = self.lora_wake.filter(|&t| t <= now) {
            self.lora_wake = None;
            if self.stalled {
                self.stalled = false;
                self.clock = self.clock.max(t);
            }
        }
        loop {
            if let Some(step) = &self.in_flight {
                if step.end > now {
                    return;
                }
                let step = self.in_flight.take().expect("checked above");
                self.clock = self.clock.max(step.end);
                self.complete_step(step, out);
                continue;
            }
            if self.stalled || (self.running.is_empty() && self.waiting.is_empty()) {
                return;
            }
            if self.clock > now {
                return;
            }
            let (plan, shape, preempted) = self.schedule();
            if plan.is_empty() {
                // After preempting everything the next plan admits from the waiting queue;
                // otherwise nothing can run until a request arrives, leaves or transfers.
                self.stalled = !preempted;
                continue;
            }
            // A step cannot start before the requests in it arrived (a caller may submit a
            // request at a time later than the end of a step it has not advanced past yet).
            let latest_arrival = plan.iter().map(|(id, _)| self.seqs[id].arrival).max();
            self.clock = self.clock.max(latest_arrival.unwrap_or_default());
            for (id, _) in &plan {
                if let Some(seq) = self.seqs.get_mut(id) {
                    seq.scheduled_at.get_or_insert(self.clock);
                }
            }
            let end = self.clock + self.cfg.timing.step_duration(&shape);
            self.in_flight = Some(InFlight { end, plan });
        }
    }

    fn wake(&mut self, now: Duration) {
        self.stalled = false;
        if self.in_flight.is_none() && self.running.is_empty() {
            self.clock = self.clock.max(now);
        }
    }

    fn schedule(&mut self) -> (Vec<(RequestId, usize)>, StepShape, bool) {
        let mut budget = self.cfg.max_num_batched_tokens as usize;
        let mut plan = Vec::new();
        let mut preempted = false;
        let mut i = 0;
        while i < self.running.len() && budget > 0 {
            let id = self.running[i];
            let seq = &self.seqs[&id];
            let num_new = (seq.tokens.len() - seq.num_computed).min(budget);
            if num_new == 0 {
                i += 1;
                continue;
            }
            loop {
                if self.try_allocate(id, num_new) {
                    self.cache_scheduled(id, num_new);
                    plan.push((id, num_new));
                    budget -= num_new;
                    i += 1;
                    break;
                }
                let victim = self.running.pop().expect("running holds at least `id`");
                self.preempt(victim);
                preempted = true;
                if victim == id {
                    break;
                }
            }
        }
        // Adapters in this step's batch, listed on the first waiting request with an adapter.
        let mut batch_loras = None;
        let mut encoder_tokens = 0;
        let mut i = 0;
        while !preempted
            && budget > 0
            && self.running.len() < self.cfg.max_num_seqs as usize
            && let Some(&id) = self.waiting.get(i)
        {
            if !self.lora_admissible(id, &plan, &mut batch_loras) {
                // vLLM's scheduler skips such a request; it keeps its place in the queue.
                i += 1;
                continue;
            }
            match self.admit(id, budget) {
                Admission::Scheduled { tokens, encoder } => {
                    self.cache_scheduled(id, tokens);
                    self.waiting.remove(i);
                    self.running.push(id);
                    plan.push((id, tokens));
                    budget -= tokens;
                    encoder_tokens += encoder;
                }
                Admission::Transferring => {
                    self.waiting.remove(i);
                }
                Admission::NoRoom => break,
            }
        }
        let shape = self.step_shape(&plan, encoder_tokens);
        (plan, shape, preempted)
    }

    /// What the planned step computes, for its duration: decodes and prefill chunks apart, and
    /// the requests it schedules for the first time (their front-end work, where it counts).
    fn step_shape(&self, plan: &[(RequestId, usize)], encoder_tokens: u64) -> StepShape {
        let mut shape = StepShape {
            seqs: plan.len() as u32,
            encoder_tokens,
            ..Default::default()
        };
        for &(id, n) in plan {
            let seq = &self.seqs[&id];
            let k = seq.num_computed;
            if n == 1 && k + 1 == seq.tokens.len() && seq.num_output > 0 {
                shape.decode_seqs += 1;
                shape.decode_context_tokens += k as u64;
            } else {
                shape.prefill_tokens += n as u64;
                shape.attention_work += n as f64 * (k as f64 + n as f64 / 2.0);
                shape.prefill_kv_tokens += (k + n) as u64;
            }
            if seq.scheduled_at.is_none() {
                shape.admitted += 1;
                shape.admitted_prompt_tokens += seq.prompt_len as u64;
            }
        }
        shape
    }

    /// Tries to start a waiting request with at most `budget` new tokens.
    fn admit(&mut self, id: RequestId, budget: usize) -> Admission {
        let bs = self.cfg.block_size as usize;
        let seq = self.seqs.get_mut(&id).expect("waiting ids are live");
        if !seq.blocks.is_empty() {
            // Resumed after a pull: blocks are held already. Like vLLM, the cached tokens it
            // reports are what it holds when first scheduled.
            seq.cached_tokens.get_or_insert(seq.num_computed as u32);
            let num_new = (seq.tokens.len() - seq.num_computed).min(budget);
            // The pulled KV holds its media: only items past it are encoded (none after a
            // whole pull; those past the local hit when a failed pull is recomputed).
            let encoder = uncached_media_tokens(&seq.req.media, seq.num_computed);
            return if self.try_allocate(id, num_new) {
                self.stats.media_encoder_tokens += encoder;
                Admission::Scheduled {
                    tokens: num_new,
                    encoder,
                }
            } else {
                Admission::NoRoom
            };
        }
        // Prefix-cache lookup. The last token is always recomputed (its logits are needed),
        // so at most (len - 1) / block_size blocks can hit.
        let max_hit = (seq.tokens.len() - 1) / bs;
        let mut hit_blocks = Vec::new();
        let mut revived = 0u32;
        for &h in seq.hashes.iter().take(max_hit) {
            match self.pool.lookup(h) {
                Some(b) => {
                    if self.pool.is_free(b) {
                        revived += 1;
                    }
                    hit_blocks.push(b);
                }
                None => break,
            }
        }
        let hit_tokens = hit_blocks.len() * bs;
        // A decode leg allocates blocks for its whole prompt at once, so it may wait for KV.
        let remote = seq.pull == Pull::Pending;
        let target_tokens = if remote {
            seq.tokens.len()
        } else {
            hit_tokens + (seq.tokens.len() - hit_tokens).min(budget)
        };
        let new_blocks = target_tokens.div_ceil(bs) - hit_blocks.len();
        if new_blocks as u64 + u64::from(revived) > u64::from(self.pool.num_free()) {
            return Admission::NoRoom;
        }
        for &b in &hit_blocks {
            self.pool.touch(b);
        }
        seq.blocks = hit_blocks;
        for _ in 0..new_blocks {
            seq.blocks
                .push(self.pool.allocate().expect("free count checked"));
        }
        seq.num_computed = hit_tokens;
        seq.num_registered = seq.blocks.len().min(hit_tokens / bs);
        self.stats.prefix_cache_queries += seq.tokens.len() as u64;
        self.stats.prefix_cache_hits += hit_tokens as u64;
        if remote {
            // Every prompt token past the local hit is external (vLLM's NixlConnector
            // `get_num_new_matched_tokens`), pulled asynchronously.
            let external = (seq.tokens.len() - hit_tokens) as u64;
            self.stats.external_prefix_cache_queries += external;
            self.stats.external_prefix_cache_hits += external;
            seq.external_tokens = external as u32;
            seq.pull = Pull::InFlight;
            self.pull_requests.push(PullRequest {
                request: id,
                first_block: hit_tokens / bs,
                num_blocks: new_blocks,
            });
            self.pulling.push(id);
            return Admission::Transferring;
        }
        seq.cached_tokens.get_or_insert(hit_tokens as u32);
        // The encoder runs once, at admission, over every item not wholly cached (vLLM encodes
        // an item when its first placeholder is scheduled and keeps the output in its encoder
        // cache for the later chunks; the mock charges it all to the admitting step). A
        // preempted request encodes again, as vLLM does once its encoder cache let go.
        let encoder = uncached_media_tokens(&seq.req.media, hit_tokens);
        self.stats.media_encoder_tokens += encoder;
        Admission::Scheduled {
            tokens: target_tokens - hit_tokens,
            encoder,
        }
    }

    /// Caches the blocks that `id`'s `num_new` scheduled tokens fill, as the step is planned:
    /// vLLM V1 caches a block once a step is scheduled to fill it (`KVCacheManager::
    /// allocate_slots`), not when the step ends, "so that the block can be reused by other
    /// requests in the same batch" (vLLM, docs/design/prefix_caching.md). Copies of a new
    /// prompt admitted in one step therefore compute it once. (The forward pass writes a
    /// layer's keys and values before that layer's attention reads them, so a request may
    /// attend to blocks another request computes in the same step.)
    fn cache_scheduled(&mut self, id: RequestId, num_new: usize) {
        let bs = self.cfg.block_size as usize;
        let seq = self.seqs.get_mut(&id).expect("planned ids are live");
        let full = (seq.num_computed + num_new) / bs;
        register_blocks(&mut self.pool, &self.hasher, seq, full);
    }

    /// Makes sure `id` has blocks for `num_new` more tokens; all or nothing.
    fn try_allocate(&mut self, id: RequestId, num_new: usize) -> bool {
        let bs = self.cfg.block_size as usize;
        let seq = self.seqs.get_mut(&id).expect("live id");
        let need = (seq.num_computed + num_new)
            .div_ceil(bs)
            .saturating_sub(seq.blocks.len());
        if need as u64 > u64::from(self.pool.num_free()) {
            return false;
        }
        for _ in 0..need {
            seq.blocks
                .push(self.pool.allocate().expect("free count checked"));
        }
        true
    }

    fn preempt(&mut self, id: RequestId) {
        let seq = self.seqs.get_mut(&id).expect("live id");
        self.pool.free(seq.blocks.drain(..).rev());
        seq.num_computed = 0;
        seq.num_registered = 0;
        self.waiting.push_front(id);
        self.stats.num_preemptions += 1;
    }

    fn complete_step(&mut self, step: InFlight, out: &mut Vec<Output>) {
        let now = step.end;
        self.stalled = false;
        for (id, n) in step.plan {
            let Some(seq) = self.seqs.get_mut(&id) else {
                continue;
            };
            if seq.blocks.is_empty() {
                continue; // preempted after planning; cannot happen today, kept for safety
            }
            // Its full blocks were cached when the step was planned (`cache_scheduled`).
            seq.num_computed += n;
            if seq.num_computed < seq.tokens.len() {
                continue; // prefill continues next step
            }
            let piece = text::piece(seq.output_key ^ self.cfg.seed, u64::from(seq.num_output));
            let tid = token_id(piece.as_bytes());
            seq.tokens.push(tid);
            seq.num_output += 1;
            self.stats.generation_tokens += 1;
            if seq.first_token_at.is_none() {
                seq.first_token_at = Some(now);
                self.stats
                    .ttft
                    .observe(now.saturating_sub(seq.arrival).as_secs_f64());
                let scheduled = seq.scheduled_at.unwrap_or(seq.arrival);
                self.stats
                    .prefill_time
                    .observe(now.saturating_sub(scheduled).as_secs_f64());
                self.stats.prompt_sources.count(
                    seq.prompt_len as u64,
                    u64::from(seq.cached_tokens.unwrap_or(0)),
                    u64::from(seq.external_tokens),
                );
                // As vLLM V1 counts them (`IterationStats::update_from_output`): with the
                // first token, the moment the prefill time is observed, not at the finish.
                self.stats.prompt_tokens += seq.prompt_len as u64;
            }
            let reason = if seq.num_output >= seq.req.max_tokens {
                Some(FinishReason::Length)
            } else if !seq.req.ignore_eos
                && seq.num_output >= seq.natural_len.max(seq.req.min_tokens)
            {
                Some(FinishReason::Stop)
            } else {
                None
            };
            let finished = reason.map(|reason| {
                let seq = self.seqs.remove(&id).expect("present");
                self.running.retain(|&r| r != id);
                self.lora_done(&seq);
                self.stats.count_finished(reason);
                self.stats
                    .e2e
                    .observe(now.saturating_sub(seq.arrival).as_secs_f64());
                // A prefill leg that finished by length lends its blocks to the decode engine
                // (vLLM's NixlConnector `request_finished`: stopped or aborted legs free them
                // and hand out nothing; vLLM from mid-2026 also lends on stop). The decode
                // engine reads the prompt's blocks.
                let remote_block_ids = if seq.req.kv_transfer == KvTransfer::RemoteDecode
                    && reason == FinishReason::Length
                {
                    let prompt_blocks = seq.prompt_len.div_ceil(self.cfg.block_size as usize);
                    let readable = prompt_blocks.min(seq.blocks.len());
                    let lent = seq.blocks[..readable].to_vec();
                    self.leases.grant(id, seq.blocks, readable, now);
                    Some(lent)
                } else {
                    self.pool.free(seq.blocks.iter().rev().copied());
                    None
                };
                Finished {
                    reason,
                    prompt_tokens: seq.prompt_len as u32,
                    completion_tokens: seq.num_output,
                    cached_tokens: seq.cached_tokens.unwrap_or(0),
                    remote_block_ids,
                }
            });
            out.push(Output {
                request: id,
                token_id: tid,
                text: piece,
                finished,
            });
        }
        if self.cfg.max_loras > 0 {
            self.record_lora_info(now);
        }
    }
}

enum Admission {
    /// Runs this step: `tokens` prompt tokens, and `encoder` media tokens through the encoder.
    Scheduled {
        tokens: usize,
        encoder: u64,
    },
    Transferring,
    NoRoom,
}

/// Enters the sequence's newly full blocks (up to `full`) into the prefix cache and records
/// one `BlockStored` event per run of consecutive newly cached blocks.
fn register_blocks(pool: &mut BlockPool, hasher: &BlockHasher, seq: &mut Seq, full: usize) {
    let full = full.min(seq.blocks.len());
    if full <= seq.num_registered {
        return;
    }
    let bs = hasher.block_size();
    hasher.extend_chain(&mut seq.hashes, &seq.tokens[..full * bs], &seq.key);
    let mut run_start: Option<usize> = None;
    for j in seq.num_registered..=full {
        let stored = j < full && pool.cache_block(seq.blocks[j], seq.hashes[j]);
        match (stored, run_start) {
            (true, None) => run_start = Some(j),
            (false, Some(s)) => {
                pool.record(KvCacheEvent::BlockStored {
                    block_hashes: seq.hashes[s..j].to_vec(),
                    parent_block_hash: s.checked_sub(1).map(|p| seq.hashes[p]),
                    token_ids: seq.tokens[s * bs..j * bs].to_vec(),
                    block_size: bs as u32,
                    lora_id: seq.req.lora.as_ref().map(|l| l.id),
                    lora_name: seq.req.lora.as_ref().map(|l| l.name.clone()),
                    extra_keys: (s..j)
                        .map(|b| seq.key.block_extra_key_strings(b, bs))
                        .collect(),
                });
                run_start = None;
            }
            _ => {}
        }
    }
    seq.num_registered = full;
}
