//! The engine's LoRA behaviour in virtual time: vLLM's max-loras batch rule, the GPU slots
//! with their load time and LRU replacement, and the `vllm:lora_requests_info` labels.

use std::collections::HashMap;
use std::time::Duration;

use super::*;

const LOAD: Duration = Duration::from_millis(100);

fn cfg(max_loras: u32) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: 1024,
        block_size: 16,
        seed: 7,
        max_loras,
        timing: TimingModel {
            lora_load_s: LOAD.as_secs_f64(),
            ..TimingModel::default()
        },
        ..Default::default()
    }
}

fn request(id: RequestId, lora: Option<&str>, max_tokens: u32) -> EngineRequest {
    EngineRequest {
        lora: lora.map(|name| LoraRef {
            id: name.bytes().map(u32::from).sum(),
            name: name.into(),
        }),
        ignore_eos: true,
        ..EngineRequest::new(
            id,
            (0..64).map(|t| t * 31 + id as u32).collect(),
            max_tokens,
        )
    }
}

/// Drives the engine until idle: per request, its first-token and last-token times.
fn run(e: &mut Engine) -> HashMap<RequestId, (Duration, Duration)> {
    let mut times: HashMap<RequestId, (Duration, Duration)> = HashMap::new();
    let mut guard = 0;
    while let Some(t) = e.next_event_time() {
        for o in e.advance(t) {
            times
                .entry(o.request)
                .and_modify(|(_, last)| *last = t)
                .or_insert((t, t));
        }
        guard += 1;
        assert!(guard < 100_000, "engine does not converge");
    }
    times
}

#[test]
fn an_adapter_pays_its_load_once_then_runs_from_its_slot() {
    let mut e = Engine::new(cfg(1));
    e.submit(request(1, Some("a"), 4), Duration::ZERO).unwrap();
    let t = run(&mut e);
    assert!(t[&1].0 >= LOAD, "first token at {:?}", t[&1].0);
    assert_eq!(e.loaded_loras(), vec!["a"]);
    // Loaded now: a second request of the same adapter starts at once.
    let start = t[&1].1 + Duration::from_secs(1);
    e.submit(request(2, Some("a"), 4), start).unwrap();
    let t2 = run(&mut e);
    assert!(t2[&2].0 - start < LOAD, "ttft {:?}", t2[&2].0 - start);
}

#[test]
fn a_batch_never_holds_more_than_max_loras_adapters() {
    let mut e = Engine::new(cfg(1));
    e.submit(request(1, Some("a"), 8), Duration::ZERO).unwrap();
    e.submit(request(2, Some("b"), 8), Duration::ZERO).unwrap();
    e.submit(request(3, None, 64), Duration::ZERO).unwrap();
    let mut seen_both = false;
    let mut max_running = 0;
    while let Some(now) = e.next_event_time() {
        e.advance(now);
        let (running, _) = e.lora_requests();
        seen_both |= running.len() > 1;
        max_running = max_running.max(e.gauges().running);
    }
    assert!(!seen_both, "two adapters ran in one batch with max_loras 1");
    // The base-model request is not held back by the adapters: it ran beside one of them.
    assert_eq!(max_running, 2);
    assert!(e.is_idle());
}

#[test]
fn the_second_adapter_waits_for_the_first_to_finish_and_then_loads() {
    let mut e = Engine::new(cfg(1));
    e.submit(request(1, Some("a"), 8), Duration::ZERO).unwrap();
    e.submit(request(2, Some("b"), 8), Duration::ZERO).unwrap();
    let t = run(&mut e);
    let (a_first, a_last) = t[&1];
    let (b_first, _) = t[&2];
    assert!(a_first >= LOAD);
    // "b" needs the only slot, which "a" holds while its request runs.
    assert!(
        b_first >= a_last + LOAD,
        "b at {b_first:?}, a ended {a_last:?}"
    );
    assert_eq!(e.loaded_loras(), vec!["b"]);
}

#[test]
fn with_two_slots_two_adapters_load_together_and_share_a_batch() {
    let mut e = Engine::new(cfg(2));
    e.submit(request(1, Some("a"), 8), Duration::ZERO).unwrap();
    e.submit(request(2, Some("b"), 8), Duration::ZERO).unwrap();
    let mut both = false;
    let mut times = HashMap::new();
    while let Some(now) = e.next_event_time() {
        for o in e.advance(now) {
            times.entry(o.request).or_insert(now);
        }
        both |= e.lora_requests().0.len() == 2;
    }
    assert!(both);
    assert!(times[&2] < times[&1] + LOAD, "{times:?}");
}

#[test]
fn a_new_adapter_replaces_the_least_recently_used_idle_one() {
    let mut e = Engine::new(cfg(2));
    let mut now = Duration::ZERO;
    for (id, name) in [(1, "a"), (2, "b"), (3, "a"), (4, "c")] {
        e.submit(request(id, Some(name), 2), now).unwrap();
        now = run(&mut e)[&id].1 + Duration::from_millis(10);
    }
    // "b" was used longest ago: "c" took its slot.
    assert_eq!(e.loaded_loras(), vec!["a", "c"]);
    assert!(e.remove_lora("a"));
    assert_eq!(e.loaded_loras(), vec!["c"]);
}

#[test]
fn a_preloaded_adapter_serves_its_first_request_without_a_load() {
    let mut e = Engine::new(cfg(1));
    assert_eq!(e.add_lora("a", Duration::ZERO), SlotState::Loading(LOAD));
    let start = LOAD * 2;
    e.submit(request(1, Some("a"), 2), start).unwrap();
    let t = run(&mut e);
    assert!(t[&1].0 - start < LOAD);
}

#[test]
fn lora_info_labels_follow_running_and_waiting_adapters() {
    let mut e = Engine::new(cfg(1));
    e.submit(request(1, Some("a"), 8), Duration::ZERO).unwrap();
    e.submit(request(2, Some("b"), 8), Duration::ZERO).unwrap();
    run(&mut e);
    let labels: Vec<(&str, &str)> = e
        .stats()
        .lora_info
        .iter()
        .map(|s| (s.running.as_str(), s.waiting.as_str()))
        .collect();
    assert!(labels.contains(&("a", "b")), "{labels:?}");
    assert!(labels.contains(&("b", "")), "{labels:?}");
    // The newest label set is the last step's: nothing left.
    assert_eq!(labels.last(), Some(&("", "")));
    let at: Vec<Duration> = e.stats().lora_info.iter().map(|s| s.at).collect();
    assert!(at.windows(2).all(|w| w[0] <= w[1]), "{at:?}");
}

#[test]
fn without_max_loras_adapters_need_no_slot() {
    let mut e = Engine::new(cfg(0));
    e.submit(request(1, Some("a"), 2), Duration::ZERO).unwrap();
    e.submit(request(2, Some("b"), 2), Duration::ZERO).unwrap();
    let t = run(&mut e);
    assert!(t[&1].0 < LOAD && t[&2].0 < LOAD, "{t:?}");
    assert!(e.stats().lora_info.is_empty());
    assert!(e.loaded_loras().is_empty());
}
