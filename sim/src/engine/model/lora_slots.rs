//! The GPU's LoRA adapter slots (vLLM's `--max-loras`), with least-recently-used replacement.
//!
//! vLLM keeps at most `max_loras` adapters active on the GPU. An adapter a batch needs that is
//! not active takes a free slot, or the slot of the least recently used adapter that no running
//! request uses (vLLM's `LRUCacheLoRAModelManager`); loading its weights takes time. The mock
//! models one tier: every slot load costs `load` (vLLM's CPU cache of `--max-cpu-loras` is not
//! modelled, so a reload costs as much as a first load).
//!
//! Time enters as an argument, like everywhere in the model.

use std::time::Duration;

/// An adapter in a slot.
#[derive(Debug, Clone, PartialEq, Eq)]
struct Slot {
    name: String,
    /// When its weights are on the GPU; until then it is loading and cannot be evicted (a
    /// request is waiting for exactly this load).
    ready_at: Duration,
    /// Recency for LRU replacement: a tick of [`LoraSlots::tick`] at its last use.
    last_used: u64,
}

/// What [`LoraSlots::acquire`] found for an adapter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SlotState {
    /// Loaded: requests of this adapter may run now.
    Ready,
    /// Loading until this time.
    Loading(Duration),
    /// Every slot holds an adapter that is in use or loading: wait for one to go idle.
    Full,
}

/// `max_loras` slots with LRU replacement. See the module docs.
#[derive(Debug, Clone)]
pub struct LoraSlots {
    capacity: usize,
    load: Duration,
    slots: Vec<Slot>,
    tick: u64,
}

impl LoraSlots {
    /// `capacity` slots (vLLM's `max_loras`); loading one adapter takes `load`.
    pub fn new(capacity: u32, load: Duration) -> Self {
        Self {
            capacity: capacity as usize,
            load,
            slots: Vec::new(),
            tick: 0,
        }
    }

    /// Number of slots.
    pub fn capacity(&self) -> usize {
        self.capacity
    }

    /// Whether `name` holds a slot (loaded or loading).
    pub fn holds(&self, name: &str) -> bool {
        self.slots.iter().any(|s| s.name == name)
    }

    /// Adapters holding a slot, least recently used first.
    pub fn loaded(&self) -> Vec<&str> {
        let mut v: Vec<&Slot> = self.slots.iter().collect();
        v.sort_by_key(|s| s.last_used);
        v.into_iter().map(|s| s.name.as_str()).collect()
    }

    /// Finds or makes a slot for `name` at `now`. A new load takes a free slot, else evicts the
    /// least recently used ready adapter for which `busy` is false (`busy`: it has a running
    /// request). Loading is not use: it does not refresh recency.
    pub fn acquire(&mut self, name: &str, now: Duration, busy: impl Fn(&str) -> bool) -> SlotState {
        if let Some(s) = self.slots.iter().find(|s| s.name == name) {
            return if s.ready_at <= now {
                SlotState::Ready
            } else {
                SlotState::Loading(s.ready_at)
            };
        }
        if self.slots.len() >= self.capacity {
            let victim = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| s.ready_at <= now && !busy(&s.name))
                .min_by_key(|(_, s)| s.last_used)
                .map(|(i, _)| i);
            match victim {
                Some(i) => {
                    self.slots.swap_remove(i);
                }
                None => return SlotState::Full,
            }
        }
        let ready_at = now + self.load;
        self.tick += 1;
        self.slots.push(Slot {
            name: name.to_owned(),
            ready_at,
            last_used: self.tick,
        });
        if ready_at <= now {
            SlotState::Ready
        } else {
            SlotState::Loading(ready_at)
        }
    }

    /// Marks `name` as just used (a request of it was scheduled or finished).
    pub fn touch(&mut self, name: &str) {
        self.tick += 1;
        let tick = self.tick;
        if let Some(s) = self.slots.iter_mut().find(|s| s.name == name) {
            s.last_used = tick;
        }
    }

    /// Frees `name`'s slot (the adapter was unloaded). Returns whether it held one.
    pub fn remove(&mut self, name: &str) -> bool {
        let before = self.slots.len();
        self.slots.retain(|s| s.name != name);
        self.slots.len() != before
    }

    /// The earliest time after `now` at which a loading slot becomes ready.
    pub fn next_ready(&self, now: Duration) -> Option<Duration> {
        self.slots
            .iter()
            .map(|s| s.ready_at)
            .filter(|&t| t > now)
            .min()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_load_takes_its_time_then_the_adapter_is_ready() {
        let mut s = LoraSlots::new(1, 100 * MS);
        assert_eq!(
            s.acquire("a", 10 * MS, |_| false),
            SlotState::Loading(110 * MS)
        );
        assert_eq!(
            s.acquire("a", 50 * MS, |_| false),
            SlotState::Loading(110 * MS)
        );
        assert_eq!(s.next_ready(50 * MS), Some(110 * MS));
        assert_eq!(s.acquire("a", 110 * MS, |_| false), SlotState::Ready);
        assert_eq!(s.next_ready(110 * MS), None);
    }

    #[test]
    fn a_loading_or_busy_adapter_is_never_evicted() {
        let mut s = LoraSlots::new(1, 100 * MS);
        s.acquire("a", Duration::ZERO, |_| false);
        // "a" is still loading: "b" must wait even though nothing runs.
        assert_eq!(s.acquire("b", 50 * MS, |_| false), SlotState::Full);
        // Loaded but running a request: still no room.
        assert_eq!(s.acquire("b", 200 * MS, |n| n == "a"), SlotState::Full);
        assert!(s.holds("a") && !s.holds("b"));
        // Idle: "b" replaces it.
        assert_eq!(
            s.acquire("b", 200 * MS, |_| false),
            SlotState::Loading(300 * MS)
        );
        assert_eq!(s.loaded(), vec!["b"]);
    }

    #[test]
    fn eviction_takes_the_least_recently_used_idle_adapter() {
        let mut s = LoraSlots::new(3, Duration::ZERO);
        for n in ["a", "b", "c"] {
            assert_eq!(s.acquire(n, Duration::ZERO, |_| false), SlotState::Ready);
        }
        s.touch("a"); // order of use now: b, c, a
        assert_eq!(s.loaded(), vec!["b", "c", "a"]);
        // "b" is the oldest but busy: "c" goes.
        assert_eq!(s.acquire("d", MS, |n| n == "b"), SlotState::Ready);
        assert_eq!(s.loaded(), vec!["b", "a", "d"]);
        assert_eq!(s.acquire("e", MS, |_| false), SlotState::Ready);
        assert_eq!(s.loaded(), vec!["a", "d", "e"]);
        assert!(s.remove("a") && !s.remove("a"));
        assert_eq!(s.capacity(), 3);
    }
}
