//! Property tests of the request lifecycle: the entry's plans and the serving side's queue,
//! driven through random interleavings of requests and outcomes.

use kvmesh_protocol::hashing::HASH_VERSION;
use kvmesh_protocol::lifecycle::{
    Admission, EntryState, Failure, LoadReport, Outcome, PeerInput, Plan, PrefixSample, Progress,
    ServingState,
};
use kvmesh_protocol::route::{LateBinding, MIN_SIGHTINGS, node_key};
use kvmesh_protocol::{
    LoadDigest, PeerSummary, Role, RouteConfig, RouteRequest, SummaryBuilder, SummaryConfig,
};
use proptest::prelude::*;

fn digest(waiting: u32, running: u32) -> LoadDigest {
    LoadDigest {
        version: 1,
        timestamp_ms: 0,
        running,
        waiting,
        kv_usage: 0.3,
        queued_tokens: None,
        kv_capacity_blocks: 1000,
        block_size: 16,
        ttft_ewma_ms: 80.0,
        prefill_tokens_per_s: 4000.0,
        inflight_forwarded: 0,
        role: Role::Mixed,
        healthy: true,
        hash_version: HASH_VERSION,
        models: vec!["m".into()],
        loras: vec![],
        lora_use: Default::default(),
    }
}

/// What a random serving node answers to one attempt.
#[derive(Copy, Clone, Debug)]
enum Answer {
    Start,
    Decline,
    FailRetryable,
    FailFinal,
    TimeOut,
}

fn answer() -> impl Strategy<Value = Answer> {
    prop_oneof![
        4 => Just(Answer::Start),
        3 => Just(Answer::Decline),
        2 => Just(Answer::FailRetryable),
        1 => Just(Answer::FailFinal),
        1 => Just(Answer::TimeOut),
    ]
}

fn report(waiting: u32) -> LoadReport {
    LoadReport {
        digest_version: 1,
        running: 2,
        waiting,
        kv_usage: 0.4,
        queued_tokens: None,
        inflight: waiting + 2,
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Whatever the serving nodes answer: a request is attempted at most once per candidate,
    /// but for a candidate that declined it, tried once more (with no right to decline) after
    /// a later one failed; an attempt that may be declined always has a next in rank, no
    /// more attempts may be declined than configured, and once every request has ended the
    /// entry counts nothing as pending anywhere.
    #[test]
    fn plans_keep_their_invariants(
        loads in prop::collection::vec((0u32..6, 0u32..6), 1..8),
        requests in prop::collection::vec(
            (prop::collection::vec(0u64..4, 0..6), prop::collection::vec(answer(), 8)),
            1..12,
        ),
        max_declines in 0u32..3,
        retries in 0u32..4,
        concurrent in any::<bool>(),
    ) {
        let digests: Vec<LoadDigest> = loads.iter().map(|&(w, r)| digest(w, r)).collect();
        let keys: Vec<u64> = (0..digests.len()).map(|i| node_key(&format!("node-{i}"))).collect();
        let peers: Vec<PeerInput<'_>> = digests
            .iter()
            .zip(&keys)
            .map(|(digest, &key)| PeerInput {
                key,
                digest,
                digest_received_ms: 0,
                summary: None,
                offload: None,
                live: None,
            })
            .collect();
        let config = RouteConfig {
            late: LateBinding {
                max_declines,
                max_new_prefix_declines: max_declines + 1,
                ..LateBinding::default()
            },
            ..RouteConfig::default()
        };
        let mut entry = EntryState::default();
        let now = 100;
        let chains: Vec<Vec<u64>> = requests
            .iter()
            .map(|(blocks, _)| blocks.iter().map(|b| b + 1).collect())
            .collect();
        let mut plans: Vec<(Plan, usize)> = Vec::new();
        let mut served: Vec<usize> = Vec::new();
        for (index, chain) in chains.iter().enumerate() {
            let request = RouteRequest {
                spread: Some(index as u64),
                ..request(chain)
            };
            let plan = entry.route(&peers, &request, &config, now).unwrap();
            plans.push((plan.with_retries(retries), index));
        }
        for (plan, index) in plans.iter_mut() {
            let (chain, answers) = (&chains[*index], &requests[*index].1);
            let ranked: Vec<u64> = plan.ranked_keys().collect();
            let mut attempted = Vec::new();
            let mut declined_by = Vec::new();
            let mut revisited = Vec::new();
            let mut failed = false;
            let mut declinable = 0;
            let mut outcome_count = 0;
            while let Some(attempt) = plan.next_attempt(&mut entry, chain, now) {
                if attempted.contains(&attempt.node_key) {
                    prop_assert!(
                        failed
                            && declined_by.contains(&attempt.node_key)
                            && !revisited.contains(&attempt.node_key)
                            && attempt.decline_above_tokens.is_none(),
                        "attempted twice without having declined before a failure"
                    );
                    revisited.push(attempt.node_key);
                }
                attempted.push(attempt.node_key);
                let rank = ranked.iter().position(|&k| k == attempt.node_key).unwrap();
                if attempt.decline_above_tokens.is_some() {
                    declinable += 1;
                    prop_assert!(rank + 1 < ranked.len(), "a last attempt may be declined");
                }
                let outcome = match answers[outcome_count % answers.len()] {
                    Answer::Start => Outcome::Started((outcome_count % 2 == 0).then(|| report(1))),
                    Answer::Decline => Outcome::Declined(Some(report(5))),
                    Answer::FailRetryable => Outcome::Failed(Failure::Retryable),
                    Answer::FailFinal => Outcome::Failed(Failure::Final),
                    Answer::TimeOut => Outcome::Failed(Failure::TimedOut),
                };
                outcome_count += 1;
                match outcome {
                    // A decline the plan did not allow counts as the peer's failure.
                    Outcome::Declined(_) if attempt.decline_above_tokens.is_none() => {
                        failed = true
                    }
                    Outcome::Declined(_) => declined_by.push(attempt.node_key),
                    Outcome::Failed { .. } => failed = true,
                    Outcome::Started(_) => {}
                }
                match plan.on_outcome(&mut entry, chain, outcome, now) {
                    Progress::Served => {
                        served.push(*index);
                        break;
                    }
                    Progress::TryNext => {}
                    Progress::GaveUp { .. } => break,
                }
            }
            let allowed = match plan.new_prefix() {
                true => config.late.max_new_prefix_declines,
                false => max_declines,
            };
            prop_assert!(plan.declines() <= allowed);
            prop_assert!(plan.declines() <= declinable);
            prop_assert!(plan.failures() <= retries + 1);
            if !concurrent {
                plan.ended(&mut entry);
            }
        }
        for (plan, _) in plans.iter_mut() {
            plan.ended(&mut entry);
        }
        for (peer, &key) in peers.iter().zip(&keys) {
            prop_assert_eq!(entry.pending(key, 0, now), 0, "pending after every request ended");
            prop_assert_eq!(
                entry.estimate(peer, now).pending, 0,
                "counted as sent or as coming back after every request ended"
            );
        }
    }

    /// Whatever the order of hand-overs, first bytes and ends: a request allowed no decline is
    /// never declined, and once every request has ended and the engine was polled idle,
    /// nothing is queued, in flight or counted as a new prefix.
    #[test]
    fn the_serving_queue_returns_to_zero(
        ops in prop::collection::vec(
            (
                any::<bool>(),
                prop::option::of(0u64..3),
                0u32..4_000,
                prop::option::of(0u32..3_000),
                0u8..4,
            ),
            1..64,
        ),
    ) {
        let mut serving = ServingState::new();
        serving.set_prefill_speed(1_000.0);
        let mut tickets = Vec::new();
        for (time, (streamed, new_prefix, prefill_tokens, decline_above_tokens, action)) in
            ops.into_iter().enumerate()
        {
            match action {
                0 | 1 => {
                    // Copies share their key's first 128 tokens, and the rest when of one size.
                    let samples: Vec<PrefixSample> = new_prefix
                        .map(|key| {
                            vec![
                                PrefixSample { tokens: 128, hash: key },
                                PrefixSample {
                                    tokens: prefill_tokens.max(128),
                                    hash: key ^ u64::from(prefill_tokens) << 32,
                                },
                            ]
                        })
                        .unwrap_or_default();
                    let admission = Admission {
                        prefix_key: new_prefix,
                        new_prefix: new_prefix.is_some(),
                        prefill_tokens,
                        decline_above_tokens,
                        streamed,
                        prefix_samples: &samples,
                    };
                    match serving.admit(&admission, time as u64 * 100) {
                        Ok(ticket) => tickets.push(ticket),
                        Err(_) => {
                            prop_assert!(decline_above_tokens.is_some(), "declined a last attempt")
                        }
                    }
                }
                2 if !tickets.is_empty() => {
                    let i = tickets.len() / 2;
                    serving.started(&mut tickets[i], time as u64 * 100);
                }
                3 if !tickets.is_empty() => {
                    serving.finished(tickets.swap_remove(0), time as u64 * 100)
                }
                // Asked for one or two events ago: answers begun since may show as waiting.
                _ => serving.polled(
                    kvmesh_protocol::route::Gauges {
                        running: 1,
                        waiting: tickets.len() as u32,
                        kv_usage: 0.5,
                        queued_tokens: None,
                    },
                    (time as u64 * 100).saturating_sub(150),
                ),
            }
            prop_assert!(serving.inflight() as usize == tickets.len());
        }
        for ticket in tickets.drain(..) {
            serving.finished(ticket, 10_000);
        }
        // Asked for before the last answers ended, read after.
        serving.polled(
            kvmesh_protocol::route::Gauges {
                running: 0,
                waiting: 0,
                kv_usage: 0.0,
                queued_tokens: None,
            },
            9_950,
        );
        prop_assert_eq!(serving.queued(), 0);
        prop_assert_eq!(serving.inflight(), 0);
        prop_assert_eq!(serving.new_prefixes_in_flight(), 0);
        prop_assert_eq!(serving.tokens_ahead(0, 10_000), 0.0, "no prefill left queued");
    }
}

/// Issue 21: a burst of distinct prompts sent at once to one entry, over two idle engines
/// whose gossip shows nothing yet. The entry's own engine is exact (`live`); the peer's answers
/// carry its load back. Neither engine may end up with the burst.
#[test]
fn a_burst_of_new_prefixes_from_one_entry_spreads_over_both_engines() {
    for burst in [200u64, 1_000] {
        let gossiped = digest(0, 0);
        let (own_key, peer_key) = (node_key("node-1"), node_key("node-2"));
        let config = RouteConfig::default();
        let mut engines = [ServingState::new(), ServingState::new()];
        for engine in &mut engines {
            // The speed the digest reports.
            engine.set_prefill_speed(f64::from(gossiped.prefill_tokens_per_s));
        }
        let mut entry = EntryState::default();
        let mut served = [0u64; 2];
        let mut tickets = Vec::new();
        for i in 0..burst {
            let chain = [i * 7 + 1, i * 7 + 2];
            let request = RouteRequest {
                model: "m",
                chain: &chain,
                prompt_tokens: 32,
                tokens_per_block: 16.0,
                session: None,
                role: Role::Mixed,
                spread: Some(i),
                popular: &[],
                prefixes_recur: true,
            };
            let peers = [
                PeerInput {
                    key: own_key,
                    digest: &gossiped,
                    digest_received_ms: 0,
                    summary: None,
                    offload: None,
                    live: Some(engines[0].gauges(10)),
                },
                PeerInput {
                    key: peer_key,
                    digest: &gossiped,
                    digest_received_ms: 0,
                    summary: None,
                    offload: None,
                    live: None,
                },
            ];
            let now = 10;
            let mut plan = entry.route(&peers, &request, &config, now).unwrap();
            assert!(plan.new_prefix());
            while let Some(attempt) = plan.next_attempt(&mut entry, &chain, now) {
                let engine = &mut engines[attempt.candidate];
                let outcome =
                    match engine.admit(&attempt.admission(true, plan.prefix_samples()), now) {
                        Ok(ticket) => {
                            tickets.push(ticket);
                            served[attempt.candidate] += 1;
                            // The entry's own engine needs no report: it is read live.
                            Outcome::Started((attempt.candidate == 1).then(|| engine.report(now)))
                        }
                        Err(_) => Outcome::Declined(Some(engine.report(now))),
                    };
                if plan.on_outcome(&mut entry, &chain, outcome, now) != Progress::TryNext {
                    break;
                }
            }
        }
        let share = served[0].max(served[1]) as f64 / burst as f64;
        assert!(
            share <= 0.6,
            "burst of {burst}: {served:?} served by the two engines"
        );
        eprintln!("burst of {burst}: served {served:?}");
        drop(tickets);
    }
}

/// A prefix behind every request this entry routes is owed a holder on every engine: once
/// the entry has seen it often enough to know, it stops sending it all to the one busy engine
/// that holds it. Without the shares, the holder takes all 40: its queue is empty, and its
/// batch costs less in the score than the prefix.
#[test]
fn an_entry_spreads_a_prefix_behind_all_its_traffic_over_new_holders() {
    // 27 blocks: not a depth the entry counts, so its count ends at 24.
    let system: Vec<u64> = (1..=27).collect();
    let mut builder = SummaryBuilder::new(SummaryConfig::default(), 1).unwrap();
    system.iter().for_each(|&hash| {
        builder.insert(hash);
    });
    let mut held = PeerSummary::new();
    for shard in builder.publish_dirty() {
        held.apply_bytes(&shard.bytes).unwrap();
    }
    let names = ["holder", "a", "b", "c"];
    let config = RouteConfig::default();
    let mut entry = EntryState::default();
    // Each request runs four rounds; the holder also runs a batch of six of its own.
    let mut running: Vec<Vec<u64>> = vec![Vec::new(); names.len()];
    let mut sent_to = Vec::new();
    for i in 0..40u64 {
        let now = i * 100;
        running
            .iter_mut()
            .for_each(|ends| ends.retain(|&end| end > now));
        let digests: Vec<LoadDigest> = (0..names.len())
            .map(|n| digest(0, running[n].len() as u32 + if n == 0 { 6 } else { 0 }))
            .collect();
        let peers: Vec<PeerInput> = names
            .iter()
            .zip(&digests)
            .map(|(name, digest)| PeerInput {
                key: node_key(name),
                digest,
                digest_received_ms: now,
                summary: (*name == "holder").then_some(&held),
                offload: None,
                live: None,
            })
            .collect();
        let chain: Vec<u64> = system.iter().copied().chain([1_000 + i]).collect();
        let mut plan = entry.route(&peers, &request(&chain), &config, now).unwrap();
        let attempt = plan.next_attempt(&mut entry, &chain, now).unwrap();
        sent_to.push(names[attempt.candidate]);
        running[attempt.candidate].push(now + 400);
        plan.on_outcome(&mut entry, &chain, Outcome::Started(None), now);
    }
    let first = MIN_SIGHTINGS as usize;
    assert!(
        sent_to[..first].iter().all(|name| *name == "holder"),
        "before its share is known, the prefix goes to its holder: {sent_to:?}"
    );
    for name in ["a", "b", "c"] {
        assert!(
            sent_to[first..].contains(&name),
            "then every engine takes it, and holds it after: {sent_to:?}"
        );
    }
}

/// An attempt that may be declined counts at the next in rank while it is in flight (a
/// decline would send it there), and stops counting once it is answered either way.
#[test]
fn a_declinable_attempt_counts_at_its_next_until_answered() {
    let (busy, idle) = (digest(0, 0), digest(0, 0));
    let (remote, own) = (node_key("remote"), node_key("own"));
    let peers = [
        PeerInput {
            key: remote,
            digest: &busy,
            digest_received_ms: 0,
            summary: None,
            offload: None,
            live: None,
        },
        PeerInput {
            key: own,
            digest: &idle,
            digest_received_ms: 0,
            summary: None,
            offload: None,
            live: Some(kvmesh_protocol::route::Gauges {
                running: 0,
                waiting: 0,
                kv_usage: 0.0,
                queued_tokens: None,
            }),
        },
    ];
    let config = RouteConfig::default();
    let mut entry = EntryState::default();
    for answer in [Outcome::Started(None), Outcome::Declined(None)] {
        // Find a new prefix whose rendezvous order puts the remote node first.
        let chain = (1..1_000u64)
            .map(|b| vec![b])
            .find(|chain| {
                let request = request(chain);
                let plan = entry.route(&peers, &request, &config, 10).unwrap();
                plan.ranked_keys().next() == Some(remote)
            })
            .unwrap();
        let mut plan = entry.route(&peers, &request(&chain), &config, 10).unwrap();
        let attempt = plan.next_attempt(&mut entry, &chain, 10).unwrap();
        assert_eq!(attempt.node_key, remote);
        assert!(attempt.decline_above_tokens.is_some());
        assert_eq!(
            entry.estimate(&peers[1], 10).pending,
            1,
            "may come back here"
        );
        plan.on_outcome(&mut entry, &chain, answer, 11);
        assert_eq!(entry.estimate(&peers[1], 11).pending, 0, "{answer:?}");
        if let Some(next) = plan.next_attempt(&mut entry, &chain, 11) {
            assert_eq!(next.node_key, own);
            plan.on_outcome(&mut entry, &chain, Outcome::Started(None), 12);
        }
        plan.ended(&mut entry);
    }
}

fn request(chain: &[u64]) -> RouteRequest<'_> {
    RouteRequest {
        model: "m",
        chain,
        prompt_tokens: 64,
        tokens_per_block: 16.0,
        session: None,
        role: Role::Mixed,
        spread: None,
        popular: &[],
        prefixes_recur: true,
    }
}
