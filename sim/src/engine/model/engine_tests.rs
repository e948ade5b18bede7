//! Behaviour of the engine model, driven in virtual time.

use std::time::Duration;

use super::*;

fn cfg(blocks: u32) -> EngineConfig {
    EngineConfig {
        num_gpu_blocks: blocks,
        block_size: 16,
        seed: 7,
        ..Default::default()
    }
}

/// Runs the engine until idle, returning (request, first-token time, outputs) per request.
fn run(engine: &mut Engine) -> Vec<(Duration, Output)> {
    let mut all = Vec::new();
    let mut guard = 0;
    while let Some(t) = engine.next_event_time() {
        for o in engine.advance(t) {
            all.push((t, o));
        }
        guard += 1;
        assert!(guard < 1_000_000, "engine does not converge");
    }
    all
}

fn prompt(seed: u32, len: u32) -> Vec<u32> {
    (0..len)
        .map(|i| (i * 7919 + seed * 104_729) % 100_000)
        .collect()
}

/// Submits requests `0..count` at once, each a distinct prompt of `len` tokens asking for
/// `max_tokens`.
fn submit_at_once(engine: &mut Engine, count: u64, len: u32, max_tokens: u32) {
    for i in 0..count {
        engine
            .submit(
                EngineRequest::new(i, prompt(i as u32, len), max_tokens),
                Duration::ZERO,
            )
            .unwrap();
    }
}

#[test]
fn a_repeated_prompt_hits_the_cache_and_has_a_smaller_ttft() {
    let mut e = Engine::new(cfg(1024));
    e.submit(EngineRequest::new(1, prompt(1, 4000), 4), Duration::ZERO)
        .unwrap();
    let first = run(&mut e);
    let ttft1 = first[0].0;
    assert_eq!(first.len(), 4);
    assert_eq!(
        first.last().unwrap().1.finished.as_ref().unwrap().reason,
        FinishReason::Length
    );
    assert_eq!(
        e.cached_prefix_tokens(&prompt(1, 4000), &CacheKey::default()),
        249 * 16
    );
    assert_eq!(
        e.cached_prefix_tokens(&prompt(2, 4000), &CacheKey::default()),
        0
    );
    let start = ttft1 + Duration::from_secs(1);
    e.submit(EngineRequest::new(2, prompt(1, 4000), 4), start)
        .unwrap();
    let second = run(&mut e);
    let ttft2 = second[0].0 - start;
    assert!(
        ttft2 * 5 < ttft1,
        "second TTFT {ttft2:?} vs first {ttft1:?}"
    );
    let s = e.stats();
    assert_eq!(s.prefix_cache_queries, 8000);
    // 4000 tokens = 250 blocks; the last token is always recomputed, so 249 blocks hit.
    assert_eq!(s.prefix_cache_hits, 249 * 16);
    let fin = second.last().unwrap().1.finished.clone().unwrap();
    assert_eq!(fin.cached_tokens, 249 * 16);
    assert_eq!(fin.prompt_tokens, 4000);
}

/// vLLM V1 caches a block when a step is planned to fill it, so copies of one prompt that
/// wait together are computed once: the later copies hit the first's blocks in the same
/// step and their first tokens come with its. Caching only at the step's end would compute
/// the prompt once per copy, in one step three times as long.
#[test]
fn copies_scheduled_in_one_step_share_the_blocks_it_computes() {
    let copy = |id| EngineRequest::new(id, prompt(1, 2000), 2);
    let mut alone = Engine::new(cfg(1024));
    alone.submit(copy(1), Duration::ZERO).unwrap();
    let alone_ttft = run(&mut alone)[0].0;

    let mut e = Engine::new(cfg(1024));
    for id in 1..=3 {
        e.submit(copy(id), Duration::ZERO).unwrap();
    }
    let outputs = run(&mut e);
    let firsts: Vec<Duration> = (1..=3)
        .map(|id| outputs.iter().find(|(_, o)| o.request == id).unwrap().0)
        .collect();
    assert!(
        firsts.iter().all(|&t| t == firsts[0]),
        "first tokens at {firsts:?}"
    );
    // Each later copy recomputes only its last block (16 tokens): a few percent, not 3 x.
    assert!(
        firsts[0].as_secs_f64() < alone_ttft.as_secs_f64() * 1.05,
        "copies {:?} against one alone {alone_ttft:?}",
        firsts[0]
    );
    let cached: Vec<u32> = outputs
        .iter()
        .filter_map(|(_, o)| o.finished.as_ref().map(|f| f.cached_tokens))
        .collect();
    // The last token is always recomputed: 124 of 125 blocks hit for each later copy.
    assert_eq!(cached, vec![0, 124 * 16, 124 * 16]);
}

#[test]
fn output_is_deterministic_from_the_seed() {
    let texts = |seed: u64| {
        let mut e = Engine::new(EngineConfig { seed, ..cfg(256) });
        e.submit(EngineRequest::new(1, prompt(3, 100), 20), Duration::ZERO)
            .unwrap();
        run(&mut e)
            .into_iter()
            .map(|(t, o)| (t, o.text))
            .collect::<Vec<_>>()
    };
    assert_eq!(texts(1), texts(1));
    assert_ne!(texts(1), texts(2));
}

#[test]
fn natural_stop_unless_ignore_eos() {
    let mut e = Engine::new(cfg(256));
    e.submit(EngineRequest::new(1, prompt(1, 50), 2000), Duration::ZERO)
        .unwrap();
    let out = run(&mut e);
    let fin = out.last().unwrap().1.finished.clone().unwrap();
    assert_eq!(fin.reason, FinishReason::Stop);
    assert!((16..=512).contains(&fin.completion_tokens));
    let mut req = EngineRequest::new(2, prompt(1, 50), 600);
    req.ignore_eos = true;
    e.submit(req, Duration::from_secs(100)).unwrap();
    let out = run(&mut e);
    assert_eq!(out.len(), 600);
    assert_eq!(
        out.last().unwrap().1.finished.as_ref().unwrap().reason,
        FinishReason::Length
    );
}

#[test]
fn unreferenced_blocks_are_evicted_lru_at_capacity() {
    // 64 blocks; each prompt of 320 tokens = 20 blocks, plus output blocks.
    let mut e = Engine::new(cfg(64));
    for i in 0..3u32 {
        e.submit(
            EngineRequest::new(u64::from(i), prompt(i + 1, 320), 2),
            Duration::ZERO,
        )
        .unwrap();
        run(&mut e);
    }
    e.take_kv_events();
    let hashes_a = e.block_hashes(&prompt(1, 320), &CacheKey::default());
    assert!(
        hashes_a.iter().all(|h| e.pool().contains(*h)),
        "prompt 1 still cached"
    );
    // A fourth prompt needs 20 blocks; only 4 are empty, so 16 cached blocks are evicted,
    // and the least recently freed ones belong to prompt 1.
    e.submit(
        EngineRequest::new(9, prompt(9, 320), 2),
        Duration::from_secs(10),
    )
    .unwrap();
    run(&mut e);
    let evicted: Vec<u64> = e
        .take_kv_events()
        .into_iter()
        .filter_map(|ev| match ev {
            KvCacheEvent::BlockRemoved { block_hashes } => Some(block_hashes),
            _ => None,
        })
        .flatten()
        .collect();
    assert!(!evicted.is_empty());
    assert!(
        evicted.iter().all(|h| hashes_a.contains(h)),
        "LRU victims come from prompt 1"
    );
    assert!(evicted.iter().all(|h| !e.pool().contains(*h)));
    let hashes_c = e.block_hashes(&prompt(3, 320), &CacheKey::default());
    assert!(
        hashes_c.iter().all(|h| e.pool().contains(*h)),
        "most recent prompt survives"
    );
}

#[test]
fn an_offload_tier_reports_its_copies_but_serves_no_hits() {
    let mut e = Engine::new(EngineConfig {
        num_offload_blocks: 256,
        ..cfg(64)
    });
    let hashes_a = e.block_hashes(&prompt(1, 320), &CacheKey::default());
    e.submit(EngineRequest::new(1, prompt(1, 320), 2), Duration::ZERO)
        .unwrap();
    run(&mut e);
    let events = e.take_kv_events();
    // Each GPU store is followed, in the same batch, by the CPU store of the same hashes.
    let mut offloaded: Vec<u64> = Vec::new();
    for (i, ev) in events.iter().enumerate() {
        if let KvCacheEvent::BlockStored { block_hashes, .. } = ev {
            assert_eq!(
                events.get(i + 1),
                Some(&KvCacheEvent::OffloadStored {
                    block_hashes: block_hashes.clone()
                })
            );
            offloaded.extend(block_hashes);
        }
    }
    assert_eq!(offloaded, hashes_a);

    // Five more prompts of 20 blocks push prompt 1 out of the 64 GPU blocks, not off the CPU.
    for i in 2..=6u32 {
        e.submit(
            EngineRequest::new(u64::from(i), prompt(i, 320), 2),
            Duration::from_secs(u64::from(i)),
        )
        .unwrap();
        run(&mut e);
    }
    let events = e.take_kv_events();
    assert!(hashes_a.iter().all(|h| !e.pool().contains(*h)));
    assert!(hashes_a.iter().all(|h| e.offload().contains(*h)));
    assert!(
        !events
            .iter()
            .any(|ev| matches!(ev, KvCacheEvent::OffloadRemoved { .. })),
        "6 × 20 blocks fit in 256"
    );
    assert_eq!(e.offload().len(), 6 * 20);

    // The CPU copy is not a hit: prompt 1 is computed again, and its GPU store refreshes the
    // CPU copies without reporting them again.
    assert_eq!(
        e.cached_prefix_tokens(&prompt(1, 320), &CacheKey::default()),
        0
    );
    e.submit(
        EngineRequest::new(7, prompt(1, 320), 2),
        Duration::from_secs(10),
    )
    .unwrap();
    let out = run(&mut e);
    let fin = out.last().unwrap().1.finished.clone().unwrap();
    assert_eq!(fin.cached_tokens, 0);
    let events = e.take_kv_events();
    assert!(events.iter().any(|ev| matches!(
        ev,
        KvCacheEvent::BlockStored { block_hashes, .. } if block_hashes.contains(&hashes_a[0])
    )));
    assert!(
        !events
            .iter()
            .any(|ev| matches!(ev, KvCacheEvent::OffloadStored { .. })),
        "already offloaded"
    );
}

#[test]
fn kv_events_replay_to_the_cache_state() {
    let mut e = Engine::new(cfg(40));
    let mut cached = std::collections::HashSet::new();
    for i in 0..12u32 {
        let mut req = EngineRequest::new(u64::from(i), prompt(i % 5, 100 + 37 * i), 20);
        req.ignore_eos = true;
        e.submit(req, Duration::from_millis(u64::from(i) * 5))
            .unwrap();
        if i % 3 == 0 {
            run(&mut e);
        }
    }
    run(&mut e);
    for ev in e.take_kv_events() {
        match ev {
            KvCacheEvent::BlockStored {
                block_hashes,
                token_ids,
                block_size,
                ..
            } => {
                assert_eq!(token_ids.len(), block_hashes.len() * block_size as usize);
                for h in block_hashes {
                    assert!(cached.insert(h), "stored twice without removal");
                }
            }
            KvCacheEvent::BlockRemoved { block_hashes } => {
                for h in block_hashes {
                    assert!(cached.remove(&h), "removed a block never stored");
                }
            }
            KvCacheEvent::AllBlocksCleared => cached.clear(),
            KvCacheEvent::OffloadStored { .. } | KvCacheEvent::OffloadRemoved { .. } => {
                panic!("an offload event without an offload tier")
            }
        }
    }
    let actual: std::collections::HashSet<u64> = e.pool().cached_hashes().collect();
    assert_eq!(cached, actual);
}

#[test]
fn kv_pressure_preempts_and_everything_still_finishes() {
    // 24 blocks of 16 tokens; four requests of 64-token prompts that each grow to 300 tokens.
    let mut e = Engine::new(EngineConfig {
        max_model_len: 384,
        ..cfg(24)
    });
    for i in 0..4u32 {
        let mut req = EngineRequest::new(u64::from(i), prompt(i + 10, 64), 236);
        req.ignore_eos = true;
        e.submit(req, Duration::ZERO).unwrap();
    }
    let out = run(&mut e);
    assert!(e.stats().num_preemptions > 0);
    let mut counts = std::collections::HashMap::new();
    for (_, o) in &out {
        *counts.entry(o.request).or_insert(0) += 1;
    }
    assert_eq!(counts.len(), 4);
    assert!(
        counts.values().all(|&c| c == 236),
        "no token lost or repeated: {counts:?}"
    );
    assert!(e.is_idle());
    assert_eq!(e.gauges().kv_usage, 0.0);
}

#[test]
fn batching_is_bounded_by_max_num_seqs() {
    let mut e = Engine::new(EngineConfig {
        max_num_seqs: 2,
        ..cfg(256)
    });
    submit_at_once(&mut e, 5, 20, 10);
    let t = e.next_event_time().unwrap();
    e.advance(t);
    let g = e.gauges();
    assert_eq!(g.running, 2);
    assert_eq!(g.waiting, 3);
    run(&mut e);
    assert!(e.is_idle());
}

#[test]
fn prefill_time_runs_from_first_scheduling_and_leaves_the_queue_out() {
    // One sequence at a time: the second waits for the first to finish, then prefills.
    let mut e = Engine::new(EngineConfig {
        max_num_seqs: 1,
        ..cfg(1024)
    });
    submit_at_once(&mut e, 2, 2_000, 8);
    run(&mut e);
    let stats = e.stats();
    assert_eq!(stats.prefill_time.count(), 2);
    assert_eq!(stats.ttft.count(), 2);
    // Alone, the first request's prefill time is its TTFT; the second's TTFT adds the
    // first's whole run, which its prefill time leaves out.
    let queued = stats.ttft.sum() - stats.prefill_time.sum();
    let per_request = stats.prefill_time.sum() / 2.0;
    let alone = 2_000.0 / e.config().timing.prefill_tokens_per_s();
    // The first's run: its prefill and 7 decode steps.
    assert!(queued > alone, "the second queued for {queued} s");
    assert!(
        (alone..alone * 1.5).contains(&per_request),
        "{per_request} s against {alone} s of prefill"
    );
}

#[test]
fn submit_validates_length_and_ids() {
    let mut e = Engine::new(EngineConfig {
        max_model_len: 100,
        ..cfg(64)
    });
    assert_eq!(
        e.submit(EngineRequest::new(1, vec![], 1), Duration::ZERO),
        Err(SubmitError::EmptyPrompt)
    );
    assert!(matches!(
        e.submit(EngineRequest::new(1, prompt(0, 90), 20), Duration::ZERO),
        Err(SubmitError::TooLong { total: 110, .. })
    ));
    e.submit(EngineRequest::new(1, prompt(0, 10), 5), Duration::ZERO)
        .unwrap();
    assert_eq!(
        e.submit(EngineRequest::new(1, prompt(0, 10), 5), Duration::ZERO),
        Err(SubmitError::DuplicateId(1))
    );
    assert!(e.abort(1, Duration::ZERO));
    assert!(e.is_idle());
    assert_eq!(e.stats().finished[2], 1);
}

#[test]
fn time_scale_shrinks_latency() {
    let ttft = |scale: f64| {
        let timing = TimingModel {
            time_scale: scale,
            ..TimingModel::default()
        };
        let mut e = Engine::new(EngineConfig { timing, ..cfg(512) });
        e.submit(EngineRequest::new(1, prompt(1, 3000), 1), Duration::ZERO)
            .unwrap();
        run(&mut e)[0].0
    };
    let full = ttft(1.0).as_secs_f64();
    let tenth = ttft(0.1).as_secs_f64();
    assert!((full / tenth - 10.0).abs() < 0.01, "{full} vs {tenth}");
}

#[test]
fn a_request_submitted_after_an_unadvanced_step_end_never_goes_back_in_time() {
    let mut e = Engine::new(cfg(256));
    e.submit(EngineRequest::new(1, prompt(1, 100), 50), Duration::ZERO)
        .unwrap();
    e.advance(Duration::ZERO);
    let end = e.next_event_time().unwrap();
    // Submit well after the step in flight ended, without advancing first.
    let late = end + Duration::from_secs(5);
    e.submit(EngineRequest::new(2, prompt(2, 100), 1), late)
        .unwrap();
    let out = run(&mut e);
    let (t, _) = out.iter().find(|(_, o)| o.request == 2).unwrap();
    assert!(*t >= late);
    assert!(e.stats().ttft.sum() >= 0.0);
}

mod random_interleavings {
    //! Random submits, aborts and clock jumps against a tiny engine (preemption, eviction and
    //! chunked prefill all happen); invariants checked throughout.

    use std::collections::{HashMap, HashSet};

    use proptest::prelude::*;

    use super::*;

    #[derive(Debug, Clone)]
    enum Op {
        Submit {
            family: u32,
            len: usize,
            max_tokens: u32,
            wait_ms: u64,
        },
        Abort {
            pick: usize,
            wait_ms: u64,
        },
    }

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            4 => (0u32..4, 1usize..60, 1u32..30, 0u64..40).prop_map(|(family, len, max_tokens, wait_ms)| {
                Op::Submit { family, len, max_tokens, wait_ms }
            }),
            1 => (0usize..64, 0u64..40).prop_map(|(pick, wait_ms)| Op::Abort { pick, wait_ms }),
        ]
    }

    fn apply(ev: KvCacheEvent, mirror: &mut HashSet<u64>) {
        match ev {
            KvCacheEvent::BlockStored { block_hashes, .. } => {
                for h in block_hashes {
                    assert!(mirror.insert(h), "stored twice");
                }
            }
            KvCacheEvent::BlockRemoved { block_hashes } => {
                for h in block_hashes {
                    assert!(mirror.remove(&h), "removed unknown");
                }
            }
            KvCacheEvent::AllBlocksCleared => mirror.clear(),
            KvCacheEvent::OffloadStored { .. } | KvCacheEvent::OffloadRemoved { .. } => {
                panic!("an offload event without an offload tier")
            }
        }
    }

    #[derive(Default)]
    struct Tracker {
        expected: HashMap<u64, u32>,
        got: HashMap<u64, u32>,
        finished: HashSet<u64>,
        aborted: HashSet<u64>,
        mirror: HashSet<u64>,
    }

    impl Tracker {
        fn check(&mut self, outs: Vec<Output>, e: &mut Engine) -> Result<(), TestCaseError> {
            for o in outs {
                prop_assert!(!self.aborted.contains(&o.request), "output after abort");
                prop_assert!(!self.finished.contains(&o.request), "output after finish");
                let n = self.got.entry(o.request).or_insert(0);
                *n += 1;
                if let Some(f) = o.finished {
                    prop_assert_eq!(*n, self.expected[&o.request]);
                    prop_assert_eq!(f.completion_tokens, *n);
                    self.finished.insert(o.request);
                }
            }
            for ev in e.take_kv_events() {
                apply(ev, &mut self.mirror);
            }
            let actual: HashSet<u64> = e.pool().cached_hashes().collect();
            prop_assert_eq!(&self.mirror, &actual);
            prop_assert!(e.stats().prefix_cache_hits <= e.stats().prefix_cache_queries);
            Ok(())
        }
    }

    proptest! {
        #![proptest_config(ProptestConfig { cases: 64, ..ProptestConfig::default() })]
        #[test]
        fn every_request_completes_exactly_once_and_events_mirror_the_cache(
            ops in proptest::collection::vec(op(), 1..60),
            instant in any::<bool>(),
        ) {
            let timing = TimingModel { instant, ..TimingModel::default() };
            let mut e = Engine::new(EngineConfig {
                num_gpu_blocks: 24,
                num_offload_blocks: 0,
                block_size: 4,
                max_num_seqs: 4,
                max_num_batched_tokens: 32,
                max_model_len: 96,
                timing,
                seed: 3,
                ..EngineConfig::default()
            });
            let mut now = Duration::ZERO;
            let mut t = Tracker::default();
            let mut ids = Vec::new();
            for (i, op) in ops.into_iter().enumerate() {
                let wait = match &op { Op::Submit { wait_ms, .. } | Op::Abort { wait_ms, .. } => *wait_ms };
                now += Duration::from_millis(wait);
                let outs = e.advance(now);
                t.check(outs, &mut e)?;
                match op {
                    Op::Submit { family, len, max_tokens, .. } => {
                        let id = i as u64;
                        let prompt: Vec<u32> = (0..len as u32).map(|t| family * 1000 + t).collect();
                        let mut req = EngineRequest::new(id, prompt, max_tokens);
                        req.ignore_eos = true;
                        e.submit(req, now).unwrap();
                        t.expected.insert(id, max_tokens);
                        ids.push(id);
                    }
                    Op::Abort { pick, .. } => {
                        if let Some(&id) = ids.get(pick % ids.len().max(1))
                            && e.abort(id, now)
                        {
                            t.aborted.insert(id);
                        }
                    }
                }
            }
            let mut guard = 0;
            while let Some(at) = e.next_event_time() {
                let outs = e.advance(at);
                t.check(outs, &mut e)?;
                guard += 1;
                prop_assert!(guard < 100_000, "engine does not converge");
            }
            prop_assert!(e.is_idle());
            for (id, n) in &t.expected {
                if !t.aborted.contains(id) {
                    prop_assert!(t.finished.contains(id), "request {} never finished", id);
                    prop_assert_eq!(t.got[id], *n);
                }
            }
            prop_assert_eq!(e.pool().num_free(), e.pool().num_blocks());
            let g = e.gauges();
            prop_assert_eq!((g.running, g.waiting), (0, 0));
        }
    }
}
