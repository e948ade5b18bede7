//! Behaviour of the decision on small, hand-built clusters.

use super::*;
use crate::digest::{LoadDigest, Role};
use crate::hashing::HASH_VERSION;
use crate::summary::{PeerSummary, SummaryBuilder, SummaryConfig};

const NOW: u64 = 10_000;

pub(crate) fn digest(waiting: u32) -> LoadDigest {
    LoadDigest {
        version: 1,
        timestamp_ms: NOW,
        running: 2,
        waiting,
        kv_usage: 0.3,
        queued_tokens: None,
        kv_capacity_blocks: 10_000,
        block_size: 16,
        ttft_ewma_ms: 0.0,
        prefill_tokens_per_s: 0.0,
        inflight_forwarded: 0,
        role: Role::Mixed,
        healthy: true,
        hash_version: HASH_VERSION,
        models: vec!["m".into()],
        loras: vec![],
        lora_use: Default::default(),
    }
}

fn summary_of(hashes: &[u64]) -> PeerSummary {
    let mut builder = SummaryBuilder::new(SummaryConfig::default(), 1).unwrap();
    hashes.iter().for_each(|&h| {
        builder.insert(h);
    });
    let mut summary = PeerSummary::new();
    for shard in builder.publish_dirty() {
        summary.apply_bytes(&shard.bytes).unwrap();
    }
    summary
}

fn chain(n: u64, salt: u64) -> Vec<u64> {
    (0..n).map(|i| rendezvous_weight(i, salt)).collect()
}

pub(crate) fn candidate<'a>(
    name: &str,
    digest: &'a LoadDigest,
    summary: Option<&'a PeerSummary>,
) -> Candidate<'a> {
    Candidate {
        node_key: node_key(name),
        digest,
        summary,
        held_blocks: None,
        offload: None,
        digest_received_ms: NOW - 50,
        pending: 0,
        digest_pending: 0,
        recent_match: 0,
        fresh: None,
    }
}

/// A 16-token-per-block request for `chain` (shared with the lifecycle's unit tests).
pub(crate) fn request(chain: &[u64]) -> RouteRequest<'_> {
    RouteRequest {
        model: "m",
        chain,
        prompt_tokens: chain.len() as u32 * 16,
        tokens_per_block: 16.0,
        session: None,
        role: Role::Mixed,
        spread: None,
        popular: &[],
        prefixes_recur: true,
    }
}

#[test]
fn the_engine_holding_the_prefix_wins() {
    let prompt = chain(32, 1);
    let held = summary_of(&prompt[..24]);
    let (idle, busy) = (digest(0), digest(2));
    let candidates = [
        candidate("a", &idle, None),
        candidate("b", &busy, Some(&held)),
        candidate("c", &idle, None),
    ];
    let decision = decide(&candidates, &request(&prompt), &RouteConfig::default(), NOW).unwrap();
    assert_eq!(decision.ranked[0], 1);
    assert_eq!(decision.reason, RouteReason::PrefixHit);
    assert!(!decision.new_prefix);
    assert_eq!(decision.matched_blocks, 24);
    assert_eq!(decision.ranked.len(), 3);
}

#[test]
fn a_prefix_owed_more_holders_counts_as_held_everywhere() {
    // A 24-block system prompt and an 8-block question; one of four engines holds the prompt
    // and runs a batch, the others are idle.
    let prompt = chain(32, 12);
    let held = summary_of(&prompt[..24]);
    let (idle, busy) = (
        digest(0),
        LoadDigest {
            running: 6,
            ..digest(1)
        },
    );
    let candidates = [
        candidate("holder", &busy, Some(&held)),
        candidate("a", &idle, None),
        candidate("b", &idle, None),
        candidate("c", &idle, None),
    ];
    let config = RouteConfig::default();
    let with_share = |share| {
        let popular = [16, 24].map(|blocks| PrefixShare {
            blocks,
            share,
            until: blocks + 3,
        });
        let request = RouteRequest {
            popular: &popular,
            prefixes_recur: true,
            ..request(&prompt)
        };
        decide(&candidates, &request, &config, NOW).unwrap()
    };
    // A third of the traffic fills one engine of four: its holder has it.
    let decision = with_share(0.33);
    assert_eq!(decision.ranked[0], 0);
    assert_eq!(decision.matched_blocks, 24);
    assert_eq!(decision.popular_blocks, 0);
    // Four in five requests fill three engines: the load decides, and an idle engine takes
    // it (and will hold it), holder or not.
    let decision = with_share(0.8);
    assert_ne!(decision.ranked[0], 0);
    assert_eq!(decision.matched_blocks, 0, "what it really holds");
    assert_eq!(decision.best_matched_blocks, 24);
    assert_eq!(
        decision.popular_blocks, 24,
        "the deepest prefix owed holders"
    );
    // Turned off (`popular_owed_holders = false`), the same share leaves it with its holder.
    let off = RouteConfig {
        hit: HitRules {
            popular_owed_holders: false,
            ..config.hit
        },
        ..config
    };
    let popular = [16, 24].map(|blocks| PrefixShare {
        blocks,
        share: 0.8,
        until: blocks + 3,
    });
    let request_80 = RouteRequest {
        popular: &popular,
        prefixes_recur: true,
        ..request(&prompt)
    };
    let decision = decide(&candidates, &request_80, &off, NOW).unwrap();
    assert_eq!(decision.ranked[0], 0, "the holder, as without a share");
    assert_eq!(decision.popular_blocks, 0);
    // Once three hold it, the holders are preferred again.
    let candidates = [
        candidates[0],
        candidate("a", &busy, Some(&held)),
        candidate("b", &busy, Some(&held)),
        candidate("c", &idle, None),
    ];
    let popular = [PrefixShare {
        blocks: 24,
        share: 0.8,
        until: 27,
    }];
    let request = RouteRequest {
        popular: &popular,
        prefixes_recur: true,
        ..request(&prompt)
    };
    let decision = decide(&candidates, &request, &config, NOW).unwrap();
    assert_ne!(decision.ranked[0], 3);
    assert_eq!(decision.matched_blocks, 24);
    assert_eq!(decision.popular_blocks, 0);
}

#[test]
fn an_offloaded_prefix_counts_less_than_one_on_the_gpu() {
    let prompt = chain(32, 11);
    let on_gpu = summary_of(&prompt[..16]);
    let offloaded = summary_of(&prompt);
    let idle = digest(0);
    let mut gpu_only = candidate("gpu", &idle, Some(&on_gpu));
    let mut offload_only = candidate("cpu", &idle, None);
    offload_only.offload = Some(&offloaded);
    // The GPU holder also has the whole prompt offloaded: 16 on the GPU + 16 × 0.5.
    gpu_only.offload = Some(&offloaded);
    let candidates = [offload_only, gpu_only, candidate("none", &idle, None)];
    let config = RouteConfig::default();
    let decision = decide(&candidates, &request(&prompt), &config, NOW).unwrap();
    assert_eq!(decision.ranked[0], 1, "16 + 0.5 × 16 beats 0.5 × 32");
    assert_eq!(decision.matched_blocks, 24);
    assert_eq!(decision.ranked[1], 0, "an offload hit still beats no hit");

    let ignored = RouteConfig {
        hit: HitRules {
            offload_weight: 0.0,
            ..config.hit
        },
        ..config
    };
    let decision = decide(&candidates, &request(&prompt), &ignored, NOW).unwrap();
    assert_eq!(decision.matched_blocks, 16);
}

#[test]
fn a_cold_prefix_goes_to_the_same_node_from_every_entry() {
    let prompt = chain(8, 2);
    let load = digest(1);
    let names = ["a", "b", "c", "d", "e"];
    let forward: Vec<Candidate> = names.iter().map(|n| candidate(n, &load, None)).collect();
    let backward: Vec<Candidate> = names
        .iter()
        .rev()
        .map(|n| candidate(n, &load, None))
        .collect();
    let config = RouteConfig::default();
    let a = decide(&forward, &request(&prompt), &config, NOW).unwrap();
    let b = decide(&backward, &request(&prompt), &config, NOW).unwrap();
    assert_eq!(a.reason, RouteReason::ColdHash);
    assert_eq!(
        forward[a.ranked[0]].node_key,
        backward[b.ranked[0]].node_key
    );
}

#[test]
fn a_hot_prefix_spills_past_the_load_bound() {
    let prompt = chain(16, 3);
    let held = summary_of(&prompt);
    let mut hot = digest(2);
    hot.running = 30;
    let idle = digest(0);
    let mut hot_candidate = candidate("hot", &hot, Some(&held));
    hot_candidate.pending = 5;
    let candidates = [
        hot_candidate,
        candidate("x", &idle, None),
        candidate("y", &idle, None),
    ];
    let decision = decide(&candidates, &request(&prompt), &RouteConfig::default(), NOW).unwrap();
    assert_ne!(decision.ranked[0], 0);
    assert_eq!(decision.reason, RouteReason::LoadSpill);
    assert_eq!(
        *decision.ranked.last().unwrap(),
        0,
        "the hot node stays as a last resort"
    );
}

#[test]
fn bounded_on_the_queue_a_big_batch_keeps_its_prefix_and_a_queue_spills_it() {
    let prompt = chain(16, 3);
    let held = summary_of(&prompt);
    let queued = RouteConfig::default();
    assert_eq!(queued.load.bound_on, BoundOn::Queued);
    let in_flight = RouteConfig {
        load: LoadBound {
            bound_on: BoundOn::InFlight,
            ..Default::default()
        },
        ..RouteConfig::default()
    };
    let idle = digest(0);
    // Twelve requests decoding, none waiting: the in-flight bound spills, the queue bound not.
    let mut batching = digest(0);
    batching.running = 12;
    let candidates = |holder| {
        [
            candidate("holder", holder, Some(&held)),
            candidate("x", &idle, None),
            candidate("y", &idle, None),
        ]
    };
    let decision = decide(&candidates(&batching), &request(&prompt), &in_flight, NOW).unwrap();
    assert_eq!(decision.reason, RouteReason::LoadSpill);
    let decision = decide(&candidates(&batching), &request(&prompt), &queued, NOW).unwrap();
    assert_eq!(
        (decision.ranked[0], decision.reason),
        (0, RouteReason::PrefixHit)
    );
    // Five waiting: a queue over the bound (mean 2, cap 5), spilled.
    let queueing = digest(5);
    let decision = decide(&candidates(&queueing), &request(&prompt), &queued, NOW).unwrap();
    assert_eq!(decision.reason, RouteReason::LoadSpill);
}

#[test]
fn unhealthy_foreign_and_wrong_role_engines_are_never_chosen() {
    let prompt = chain(4, 4);
    let mut sick = digest(0);
    sick.healthy = false;
    let mut other_model = digest(0);
    other_model.models = vec!["other".into()];
    let mut prefill = digest(0);
    prefill.role = Role::Prefill;
    let busy = digest(50);
    let candidates = [
        candidate("sick", &sick, None),
        candidate("other", &other_model, None),
        candidate("prefill", &prefill, None),
        candidate("busy", &busy, None),
    ];
    let decision = decide(&candidates, &request(&prompt), &RouteConfig::default(), NOW).unwrap();
    assert_eq!(decision.ranked, vec![3]);
    assert_eq!(decision.reason, RouteReason::OnlyCandidate);
    let none = decide(
        &candidates[..3],
        &request(&prompt),
        &RouteConfig::default(),
        NOW,
    );
    assert_eq!(none, Err(RouteError::NoCandidate("m".into())));
}

#[test]
fn stale_digests_yield_to_fresh_ones_but_still_serve_alone() {
    let prompt = chain(4, 5);
    let load = digest(0);
    let mut stale = candidate("stale", &load, None);
    stale.digest_received_ms = 0;
    let now = 60_000;
    let fresh = candidate("fresh", &load, None);
    let config = RouteConfig::default();
    let mut fresh = fresh;
    fresh.digest_received_ms = now - 10;
    let both = decide(&[stale, fresh], &request(&prompt), &config, now).unwrap();
    assert_eq!(both.ranked, vec![1]);
    let alone = decide(&[stale], &request(&prompt), &config, now).unwrap();
    assert_eq!(alone.ranked, vec![0]);
}

#[test]
fn pending_assignments_count_as_load() {
    let load = digest(0);
    let mut a = candidate("a", &load, None);
    let b = candidate("b", &load, None);
    let config = RouteConfig::default();
    // A prompt shorter than one block is placed on load alone.
    a.pending = 3;
    let decision = decide(&[a, b], &request(&[]), &config, NOW).unwrap();
    assert_eq!(decision.ranked[0], 1);
    assert_eq!(decision.reason, RouteReason::LeastLoaded);
}

#[test]
fn recent_sends_count_as_a_match() {
    let prompt = chain(10, 6);
    let load = digest(0);
    let mut a = candidate("a", &load, None);
    a.recent_match = 10;
    let candidates = [candidate("b", &load, None), a, candidate("c", &load, None)];
    let decision = decide(&candidates, &request(&prompt), &RouteConfig::default(), NOW).unwrap();
    assert_eq!(decision.ranked[0], 1);
    assert_eq!(decision.reason, RouteReason::PrefixHit);
}

#[test]
fn session_affinity_is_a_soft_preference() {
    let load = digest(0);
    let names = ["a", "b", "c", "d"];
    let candidates: Vec<Candidate> = names.iter().map(|n| candidate(n, &load, None)).collect();
    let mut with_session = request(&[]);
    with_session.session = Some(42);
    let config = RouteConfig::default();
    let first = decide(&candidates, &with_session, &config, NOW).unwrap();
    let again = decide(&candidates, &with_session, &config, NOW).unwrap();
    assert_eq!(first.ranked[0], again.ranked[0]);
    assert!(matches!(
        first.reason,
        RouteReason::Session | RouteReason::LeastLoaded
    ));
    // A heavy queue outweighs the affinity.
    let busy = digest(40);
    let mut loaded = candidates.clone();
    loaded[first.ranked[0]].digest = &busy;
    let moved = decide(&loaded, &with_session, &config, NOW).unwrap();
    assert_ne!(moved.ranked[0], first.ranked[0]);
}

#[test]
fn cost_policy_trades_cached_prefill_against_queueing() {
    let prompt = chain(64, 7);
    let held = summary_of(&prompt);
    let mut holder = digest(2);
    holder.prefill_tokens_per_s = 1_000.0;
    holder.ttft_ewma_ms = 300.0;
    let mut idle = digest(0);
    idle.prefill_tokens_per_s = 1_000.0;
    let config = RouteConfig {
        form: ScoreForm::Cost,
        ..RouteConfig::default()
    };
    let mut request = request(&prompt);
    request.prompt_tokens = 1024;
    // Holder: 2 queued × 100 ms, no prefill. Idle: 1024 ms of prefill.
    let candidates = [
        candidate("idle", &idle, None),
        candidate("holder", &holder, Some(&held)),
    ];
    assert_eq!(
        decide(&candidates, &request, &config, NOW).unwrap().ranked[0],
        1
    );
    // A holder with a long queue loses to prefilling from scratch.
    let mut swamped = holder.clone();
    swamped.waiting = 12;
    swamped.ttft_ewma_ms = 13.0 * 1_000.0;
    let candidates = [
        candidate("idle", &idle, None),
        candidate("holder", &swamped, Some(&held)),
    ];
    let config = RouteConfig {
        load: LoadBound {
            epsilon: 100.0,
            ..config.load
        },
        ..config
    };
    assert_eq!(
        decide(&candidates, &request, &config, NOW).unwrap().ranked[0],
        0
    );
}

#[test]
fn requests_spread_over_near_equal_holders_of_a_hot_prefix() {
    let prompt = chain(16, 8);
    let held = summary_of(&prompt[..12]);
    let load = digest(0);
    let names = ["a", "b", "c", "d"];
    // a, b and c hold the prefix; d does not.
    let candidates: Vec<Candidate> = names
        .iter()
        .map(|n| candidate(n, &load, (*n != "d").then_some(&held)))
        .collect();
    let config = RouteConfig::default();
    let mut counts = [0u32; 4];
    for id in 0..3_000u64 {
        let mut request = request(&prompt);
        request.spread = Some(rendezvous_weight(id, 99));
        let decision = decide(&candidates, &request, &config, NOW).unwrap();
        assert_eq!(decision.reason, RouteReason::PrefixHit);
        counts[decision.ranked[0]] += 1;
    }
    assert_eq!(
        counts[3], 0,
        "the node without the prefix is not near-equal"
    );
    assert!(
        counts[..3].iter().all(|&c| (800..1_200).contains(&c)),
        "{counts:?}"
    );
    // Without a spread key every request goes to the same holder.
    let fixed = decide(&candidates, &request(&prompt), &config, NOW).unwrap();
    let again = decide(&candidates, &request(&prompt), &config, NOW).unwrap();
    assert_eq!(fixed.ranked, again.ranked);
}

#[test]
fn the_spread_leaves_clear_winners_and_cold_prefixes_alone() {
    let prompt = chain(16, 9);
    let held = summary_of(&prompt);
    let (idle, queued) = (digest(0), digest(4));
    let config = RouteConfig::default();
    // A holder with a queue of 4 (0.25 below in score) is not near-equal to an idle one.
    let candidates = [
        candidate("a", &queued, Some(&held)),
        candidate("b", &idle, Some(&held)),
    ];
    for id in 0..200u64 {
        let mut request = request(&prompt);
        request.spread = Some(id);
        assert_eq!(
            decide(&candidates, &request, &config, NOW).unwrap().ranked[0],
            1
        );
    }
    // A new prefix goes to its rendezvous home whatever the request's key.
    let cold = chain(8, 10);
    let names = ["a", "b", "c", "d"];
    let fresh: Vec<Candidate> = names.iter().map(|n| candidate(n, &idle, None)).collect();
    let home = decide(&fresh, &request(&cold), &config, NOW)
        .unwrap()
        .ranked[0];
    for id in 0..200u64 {
        let mut request = request(&cold);
        request.spread = Some(id);
        let decision = decide(&fresh, &request, &config, NOW).unwrap();
        assert_eq!(decision.ranked[0], home);
        assert_eq!(decision.reason, RouteReason::ColdHash);
    }
}

/// `names` by their rendezvous weight on `block`, highest first.
fn by_rendezvous<'a>(names: &[&'a str], block: u64) -> Vec<&'a str> {
    let mut by_weight = names.to_vec();
    by_weight.sort_by_key(|n| std::cmp::Reverse(rendezvous_weight(block, node_key(n))));
    by_weight
}

/// The node key of the engine a new prefix `chain` goes to first, in traffic whose prefixes
/// recur or not.
fn new_prefix_goes_to(
    candidates: &[Candidate<'_>],
    chain: &[u64],
    prefixes_recur: bool,
    config: &RouteConfig,
) -> u64 {
    let request = RouteRequest {
        prefixes_recur,
        ..request(chain)
    };
    let d = decide(candidates, &request, config, NOW).unwrap();
    assert!(d.new_prefix);
    candidates[d.ranked[0]].node_key
}

#[test]
fn a_cold_prefix_goes_to_the_less_loaded_of_its_two_rendezvous_choices() {
    let prompt = chain(8, 4);
    let names = ["a", "b", "c", "d", "e"];
    let by_weight = by_rendezvous(&names, prompt[0]);
    let (first, second, third) = (by_weight[0], by_weight[1], by_weight[2]);
    let (idle, busy, busier) = (digest(0), digest(1), digest(2));
    fn cluster<'a>(names: &[&str], load_of: impl Fn(&str) -> &'a LoadDigest) -> Vec<Candidate<'a>> {
        names
            .iter()
            .map(|n| candidate(n, load_of(n), None))
            .collect()
    }
    let chosen = |candidates: &[Candidate<'_>], config: &RouteConfig| {
        let d = decide(candidates, &request(&prompt), config, NOW).unwrap();
        assert_eq!(d.reason, RouteReason::ColdHash);
        assert!(d.new_prefix);
        candidates[d.ranked[0]].node_key
    };
    let config = RouteConfig {
        cold: ColdPrefixes {
            choices: 2,
            load_margin: 0,
            ..Default::default()
        },
        ..RouteConfig::default()
    };

    // Equal loads: the rendezvous-first engine, as with plain rendezvous.
    let even = cluster(&names, |_| &busy);
    assert_eq!(chosen(&even, &config), node_key(first));
    // The first choice busier than the second: the second.
    let first_busy = cluster(&names, |n| if n == first { &busier } else { &busy });
    assert_eq!(chosen(&first_busy, &config), node_key(second));
    // An idle engine outside the two choices does not draw the prefix.
    let third_idle = cluster(&names, |n| if n == third { &idle } else { &busy });
    assert_eq!(chosen(&third_idle, &config), node_key(first));
    // One choice: plain rendezvous, whatever the loads.
    let single = RouteConfig {
        cold: ColdPrefixes {
            choices: 1,
            ..config.cold
        },
        ..config
    };
    assert_eq!(chosen(&first_busy, &single), node_key(first));
    // Loads within the margin of the lightest choice count as equal: the rendezvous order;
    // beyond it, the lighter.
    let margin = RouteConfig {
        cold: ColdPrefixes {
            load_margin: 1,
            ..config.cold
        },
        ..config
    };
    assert_eq!(chosen(&first_busy, &margin), node_key(first));
    let first_much_busier = cluster(&names, |n| if n == first { &busier } else { &idle });
    assert_eq!(chosen(&first_much_busier, &margin), node_key(second));
    // The retries after the choices follow the rendezvous order.
    let d = decide(&first_busy, &request(&prompt), &config, NOW).unwrap();
    let order: Vec<u64> = d.ranked.iter().map(|&i| first_busy[i].node_key).collect();
    assert_eq!(
        order,
        [second, first, third, by_weight[3]].map(node_key).to_vec()
    );
}

#[test]
fn where_prefixes_do_not_recur_a_new_one_goes_to_the_least_loaded_of_a_few() {
    let prompt = chain(8, 5);
    let names = ["a", "b", "c", "d", "e", "f"];
    let by_weight = by_rendezvous(&names, prompt[0]);
    let (idle, busy) = (digest(0), digest(1));
    let config = RouteConfig {
        cold: ColdPrefixes {
            unshared_choices: 4,
            ..Default::default()
        },
        ..RouteConfig::default()
    };
    // Every engine a request busier than `lighter`.
    let cluster = |lighter: &str| -> Vec<Candidate<'_>> {
        let lighter = lighter.to_owned();
        names
            .iter()
            .map(|n| candidate(n, if *n == lighter { &idle } else { &busy }, None))
            .collect()
    };
    let chosen = |candidates: &[Candidate<'_>], prefixes_recur: bool| {
        new_prefix_goes_to(candidates, &prompt, prefixes_recur, &config)
    };
    let fourth_lighter = cluster(by_weight[3]);
    assert_eq!(
        chosen(&fourth_lighter, true),
        node_key(by_weight[0]),
        "rendezvous, whatever the loads"
    );
    assert_eq!(
        chosen(&fourth_lighter, false),
        node_key(by_weight[3]),
        "a request lighter is lighter"
    );
    // Beyond the first four, the rendezvous order again: no herd on one engine's stale view.
    let fifth_lighter = cluster(by_weight[4]);
    assert_eq!(chosen(&fifth_lighter, false), node_key(by_weight[0]));
    // Equal loads: the rendezvous order breaks the tie, alike on every entry node.
    let even: Vec<Candidate<'_>> = names.iter().map(|n| candidate(n, &busy, None)).collect();
    assert_eq!(chosen(&even, false), node_key(by_weight[0]));
}

#[test]
fn where_prefixes_do_not_recur_a_new_one_goes_to_an_engine_that_looks_idle() {
    let prompt = chain(8, 5);
    let names = ["a", "b", "c", "d", "e", "f"];
    let by_weight = by_rendezvous(&names, prompt[0]);
    let busy = digest(0);
    let idle = LoadDigest {
        running: 0,
        ..digest(0)
    };
    let cluster = |idle_ones: &[&str]| -> Vec<Candidate<'_>> {
        names
            .iter()
            .map(|n| candidate(n, if idle_ones.contains(n) { &idle } else { &busy }, None))
            .collect()
    };
    let chosen = |candidates: &[Candidate<'_>], prefixes_recur: bool, config: &RouteConfig| {
        new_prefix_goes_to(candidates, &prompt, prefixes_recur, config)
    };
    let config = RouteConfig::default();
    let last_idle = cluster(&[by_weight[5]]);
    assert_eq!(chosen(&last_idle, false, &config), node_key(by_weight[5]));
    assert_eq!(
        chosen(&last_idle, true, &config),
        node_key(by_weight[0]),
        "a prefix that may recur goes where every entry sends it"
    );
    let off = RouteConfig {
        cold: ColdPrefixes {
            unshared_to_idle: false,
            ..config.cold
        },
        ..config
    };
    assert_eq!(chosen(&last_idle, false, &off), node_key(by_weight[0]));
    // Of several idle engines, the request's rendezvous order picks: another prompt, maybe
    // another engine, so entries with one view do not herd onto one.
    let two_idle = cluster(&[by_weight[5], by_weight[2]]);
    assert_eq!(chosen(&two_idle, false, &config), node_key(by_weight[2]));
    // An engine this node sent a request since its digest is not idle.
    let mut sent_to = cluster(&[by_weight[5]]);
    sent_to[names.iter().position(|n| *n == by_weight[5]).unwrap()].digest_pending = 1;
    assert_eq!(chosen(&sent_to, false, &config), node_key(by_weight[0]));
    // Nothing looks idle: the rendezvous engine.
    assert_eq!(
        chosen(&cluster(&[]), false, &config),
        node_key(by_weight[0])
    );
}

#[test]
fn an_estimate_credits_the_work_done_since_the_gauges_were_read() {
    let mut measured = digest(2);
    measured.prefill_tokens_per_s = 10_000.0;
    let unmeasured = digest(2);
    let c = chain(4, 1);
    let mut old = candidate("a", &measured, None);
    old.digest_received_ms = NOW - 200;
    let mut unknown_speed = candidate("b", &unmeasured, None);
    unknown_speed.digest_received_ms = NOW - 200;
    let mut just_read = candidate("c", &measured, None);
    just_read.digest_received_ms = NOW;
    let decision = decide(
        &[old, unknown_speed, just_read],
        &request(&c),
        &RouteConfig::default(),
        NOW,
    )
    .unwrap();
    let worked = |index: usize| {
        let rank = decision.ranked.iter().position(|&i| i == index).unwrap();
        decision.estimates[rank].worked_tokens
    };
    assert_eq!(worked(0), 2_000, "200 ms at the engine's measured speed");
    assert_eq!(
        worked(1),
        (0.2 * RouteConfig::default().assumed.default_prefill_tokens_per_s) as u32,
        "200 ms at the configured speed when none was measured"
    );
    assert_eq!(worked(2), 0, "gauges read now have done nothing yet");
}

#[test]
fn among_near_equal_holders_the_one_read_idle_now_goes_first() {
    let prompt = chain(16, 11);
    let held = summary_of(&prompt);
    let mut idle = digest(0);
    idle.running = 0;
    let busy = digest(0);
    let config = RouteConfig::default();
    // "own" is this node's engine, read live at NOW and idle; the others were read by gossip
    // 50 ms ago and show nothing waiting either (one of them running two).
    let mut own = candidate("own", &idle, Some(&held));
    own.digest_received_ms = NOW;
    let candidates = [
        candidate("a", &idle, Some(&held)),
        candidate("b", &busy, Some(&held)),
        own,
    ];
    for id in 0..200u64 {
        let mut request = request(&prompt);
        request.spread = Some(rendezvous_weight(id, 5));
        let decision = decide(&candidates, &request, &config, NOW).unwrap();
        assert_eq!(decision.ranked[0], 2, "request {id}");
    }
    // Once something was sent there since, it is one near-equal holder among the others.
    let mut sent_to = own;
    sent_to.pending = 1;
    let candidates = [
        candidate("a", &idle, Some(&held)),
        candidate("c", &idle, Some(&held)),
        sent_to,
    ];
    let firsts: std::collections::HashSet<usize> = (0..200u64)
        .map(|id| {
            let mut request = request(&prompt);
            request.spread = Some(rendezvous_weight(id, 5));
            decide(&candidates, &request, &config, NOW).unwrap().ranked[0]
        })
        .collect();
    assert!(firsts.len() > 1, "{firsts:?}");
}

#[test]
fn among_near_equal_engines_one_with_room_for_the_prompt_goes_first() {
    use std::collections::HashSet;
    // Every engine holds the prompt's 2-block instruction but one, which holds nothing; the
    // two that hold it are full (100 blocks), so the prompt's 62 new blocks would evict there.
    let prompt = chain(64, 13);
    let other = chain(98, 14);
    let full = summary_of(&[&prompt[..2], &other[..]].concat());
    let load = LoadDigest {
        running: 0,
        kv_capacity_blocks: 100,
        ..digest(0)
    };
    // This node's own engine, read live at NOW: idle now.
    let mut own = candidate("own", &load, Some(&full));
    own.digest_received_ms = NOW;
    let empty = PeerSummary::new();
    let candidates = [
        candidate("full", &load, Some(&full)),
        own,
        candidate("empty", &load, Some(&empty)),
    ];
    let config = RouteConfig::default();
    let firsts = |candidates: &[Candidate]| -> HashSet<usize> {
        (0..200u64)
            .map(|id| {
                let mut request = request(&prompt);
                request.spread = Some(rendezvous_weight(id, 6));
                decide(candidates, &request, &config, NOW).unwrap().ranked[0]
            })
            .collect()
    };
    // Ahead even of this node's own engine, read idle now.
    assert_eq!(firsts(&candidates), HashSet::from([2]));
    // The full peer and this node's own engine, with a third engine.
    let [full_peer, own, _] = candidates;
    let beside = |third| [full_peer, own, third];
    // One whose summary this decision is not shown is not known to have room.
    let unseen = candidate("unseen", &load, None);
    assert_eq!(firsts(&beside(unseen)), HashSet::from([1]));
    // Unless the caller knows what its cache holds (the simulator's oracle): an exact count
    // stands for the summary's estimate, both ways.
    let counted = |held: u64| Candidate {
        held_blocks: Some(held),
        ..unseen
    };
    assert_eq!(firsts(&beside(counted(0))), HashSet::from([2]));
    // It matches nothing of the prompt (no summary): all 64 blocks would be new.
    let fits = firsts(&beside(counted(36)));
    assert_eq!(fits, HashSet::from([2]), "64 more fit in 100");
    let does_not_fit = firsts(&beside(counted(37)));
    assert_eq!(does_not_fit, HashSet::from([1]), "64 more do not fit");
    // Once it holds as much, it is one near-equal engine among the others.
    let filled = summary_of(&chain(95, 15));
    let candidates = beside(candidate("empty", &load, Some(&filled)));
    assert_eq!(
        firsts(&candidates),
        HashSet::from([1]),
        "the idle one leads again"
    );
    let candidates = [
        candidates[0],
        candidates[2],
        candidate("c", &load, Some(&full)),
    ];
    assert!(firsts(&candidates).len() > 1);
    // Room does not outweigh the prompt itself: an engine holding all of it wins.
    let whole = summary_of(&[&prompt[..], &other[..36]].concat());
    let candidates = [
        candidate("empty", &load, Some(&empty)),
        candidate("whole", &load, Some(&whole)),
    ];
    assert_eq!(firsts(&candidates), HashSet::from([1]));
}

#[test]
fn running_requests_weigh_in_the_score_form() {
    let prompt = chain(4, 12);
    let held = summary_of(&prompt);
    let (mut quiet, mut batched) = (digest(1), digest(1));
    quiet.running = 0;
    batched.running = 12;
    let winner = |config: &RouteConfig, batched_name: &str, quiet_name: &str| {
        // Both hold the prompt: only the load tells them apart.
        let candidates = [
            candidate(batched_name, &batched, Some(&held)),
            candidate(quiet_name, &quiet, Some(&held)),
        ];
        let decision = decide(&candidates, &request(&prompt), config, NOW).unwrap();
        assert_eq!(decision.reason, RouteReason::PrefixHit);
        decision.ranked[0]
    };
    let config = RouteConfig::default();
    // The quiet one wins whichever name (node key) it has.
    assert_eq!(winner(&config, "a", "b"), 1);
    assert_eq!(winner(&config, "b", "a"), 1);
    // Weighed at nothing, the two are equal and the node key decides.
    let config = RouteConfig {
        score: ScoreWeights {
            running_weight: 0.0,
            ..config.score
        },
        ..config
    };
    assert_ne!(winner(&config, "a", "b"), winner(&config, "b", "a"));
}

#[test]
fn an_adapter_goes_where_it_runs_then_where_a_slot_is_free() {
    use crate::digest::LoraUse;
    let prompt = chain(4, 40);
    let serving = |running: &[&str], waiting: u32| LoadDigest {
        loras: vec!["sql".into()],
        lora_use: LoraUse {
            running: running.iter().map(|name| name.to_string()).collect(),
            waiting: vec![],
            max_loras: 1,
        },
        ..digest(waiting)
    };
    let for_sql = RouteRequest {
        model: "sql",
        ..request(&prompt)
    };
    let config = RouteConfig::default();
    // One runs `sql` with a request more queued; the other's only slot holds another adapter.
    let (running, full) = (serving(&["sql"], 1), serving(&["chat"], 0));
    let candidates = [
        candidate("running", &running, None),
        candidate("full", &full, None),
    ];
    assert_eq!(
        decide(&candidates, &for_sql, &config, NOW).unwrap().ranked[0],
        0
    );
    // A free slot beats a full one.
    let (free, full) = (serving(&[], 0), serving(&["chat"], 0));
    let candidates = [
        candidate("full", &full, None),
        candidate("free", &free, None),
    ];
    assert_eq!(
        decide(&candidates, &for_sql, &config, NOW).unwrap().ranked[0],
        1
    );
    // A new prefix of an adapter goes to an engine running it, whatever the rendezvous says:
    // over many prompts, never to the one whose slot holds another adapter.
    for salt in 0..32 {
        let prompt = chain(4, 1_000 + salt);
        let request = RouteRequest {
            model: "sql",
            ..request(&prompt)
        };
        let (running, full) = (serving(&["sql"], 0), serving(&["chat"], 0));
        let candidates = [
            candidate("running", &running, None),
            candidate("full", &full, None),
        ];
        let decision = decide(&candidates, &request, &config, NOW).unwrap();
        assert!(decision.new_prefix);
        assert_eq!(decision.ranked[0], 0, "salt {salt}");
    }
    // The same prompt for the base model goes by rendezvous alone: to either.
    let mut chosen = [0; 2];
    for salt in 0..32 {
        let prompt = chain(4, 1_000 + salt);
        let (running, full) = (serving(&["sql"], 0), serving(&["chat"], 0));
        let candidates = [
            candidate("running", &running, None),
            candidate("full", &full, None),
        ];
        chosen[decide(&candidates, &request(&prompt), &config, NOW)
            .unwrap()
            .ranked[0]] += 1;
    }
    assert!(chosen[0] > 0 && chosen[1] > 0, "{chosen:?}");
}
