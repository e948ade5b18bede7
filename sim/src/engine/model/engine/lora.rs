//! The engine's side of LoRA adapters: vLLM's scheduler rule that a batch holds at most
//! `max_loras` distinct adapters, the GPU slots they are loaded into
//! ([`LoraSlots`](crate::engine::model::lora_slots::LoraSlots)), and the labels of
//! `vllm:lora_requests_info`. Everything here is inert when `max_loras` is 0.

use std::time::Duration;

use super::{Engine, Seq};
use crate::engine::model::lora_slots::SlotState;
use crate::engine::model::request::RequestId;

impl Engine {
    /// Loads adapter `name` into a GPU slot ahead of its requests, as vLLM's `add_lora`
    /// activates the adapter it adds: a free slot, else the least recently used idle one. With
    /// every slot busy nothing is loaded and the first request pays the load later.
    pub fn add_lora(&mut self, name: &str, now: Duration) -> SlotState {
        if self.cfg.max_loras == 0 {
            return SlotState::Ready;
        }
        let (running, seqs) = (&self.running, &self.seqs);
        let state = self
            .slots
            .acquire(name, now, |n| runs_with(running, seqs, n));
        if let SlotState::Loading(t) = state {
            self.lora_wake = Some(self.lora_wake.map_or(t, |w| w.min(t)));
        }
        state
    }

    /// Frees adapter `name`'s GPU slot (it was unloaded). A slot whose adapter still has
    /// running requests is kept until they finish and then ages out by LRU. Returns whether
    /// the slot was freed.
    pub fn remove_lora(&mut self, name: &str) -> bool {
        if runs_with(&self.running, &self.seqs, name) {
            return false;
        }
        self.slots.remove(name)
    }

    /// Adapters holding a GPU slot (loaded or loading), least recently used first.
    pub fn loaded_loras(&self) -> Vec<&str> {
        self.slots.loaded()
    }

    /// Adapters of the running requests and of the waiting ones (including decode legs
    /// waiting for their KV), each list in order of first appearance: the labels of
    /// `vllm:lora_requests_info`.
    pub fn lora_requests(&self) -> (Vec<&str>, Vec<&str>) {
        let names = |ids: &mut dyn Iterator<Item = &RequestId>| {
            let mut v: Vec<&str> = Vec::new();
            for id in ids {
                if let Some(l) = self.seqs.get(id).and_then(|s| s.req.lora.as_ref())
                    && !v.contains(&l.name.as_str())
                {
                    v.push(&l.name);
                }
            }
            v
        };
        if self.lora_seqs == 0 {
            return (Vec::new(), Vec::new());
        }
        let running = names(&mut self.running.iter());
        let waiting = names(&mut self.waiting.iter().chain(&self.pulling));
        (running, waiting)
    }

    /// Whether waiting request `id` may join this step's batch (`plan` so far; `batch` lists
    /// its adapters, filled on first use). vLLM's rule: a request whose adapter is not in the
    /// batch waits when the batch already holds `max_loras` adapters. The mock adds the slot:
    /// the adapter must be loaded, so a request waits while its adapter loads or while every
    /// slot holds an adapter that is loading or has running requests.
    pub(super) fn lora_admissible(
        &mut self,
        id: RequestId,
        plan: &[(RequestId, usize)],
        batch: &mut Option<Vec<String>>,
    ) -> bool {
        if self.cfg.max_loras == 0 {
            return true;
        }
        let Some(name) = self.seqs[&id].req.lora.as_ref().map(|l| l.name.clone()) else {
            return true;
        };
        let batch = batch.get_or_insert_with(|| {
            let mut v: Vec<String> = Vec::new();
            for (pid, _) in plan {
                if let Some(l) = self.seqs[pid].req.lora.as_ref()
                    && !v.contains(&l.name)
                {
                    v.push(l.name.clone());
                }
            }
            v
        });
        // Adapters in the batch run already, so their slots are loaded.
        if batch.contains(&name) {
            return true;
        }
        if batch.len() >= self.cfg.max_loras as usize {
            return false;
        }
        let (running, seqs) = (&self.running, &self.seqs);
        match self
            .slots
            .acquire(&name, self.clock, |n| runs_with(running, seqs, n))
        {
            SlotState::Ready => {
                self.slots.touch(&name);
                batch.push(name);
                true
            }
            SlotState::Loading(t) => {
                self.lora_wake = Some(self.lora_wake.map_or(t, |w| w.min(t)));
                false
            }
            SlotState::Full => false,
        }
    }

    /// A request left the engine: its adapter was just used.
    pub(super) fn lora_done(&mut self, seq: &Seq) {
        if let Some(l) = &seq.req.lora {
            self.lora_seqs = self.lora_seqs.saturating_sub(1);
            self.slots.touch(&l.name);
        }
    }

    /// Records this step's `vllm:lora_requests_info` labels, as vLLM does on every step.
    pub(super) fn record_lora_info(&mut self, now: Duration) {
        let (running, waiting) = self.lora_requests();
        let (running, waiting) = (running.join(","), waiting.join(","));
        self.stats.record_lora_info(running, waiting, now);
    }
}

/// Whether a running request uses adapter `name`.
fn runs_with(
    running: &[RequestId],
    seqs: &std::collections::HashMap<RequestId, Seq>,
    name: &str,
) -> bool {
    running.iter().any(|id| {
        seqs.get(id)
            .and_then(|s| s.req.lora.as_ref())
            .is_some_and(|l| l.name == name)
    })
}
