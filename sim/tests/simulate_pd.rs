//! Prefill/decode disaggregation in `kvmesh-sim simulate` (issue 15), through its flags: the
//! legs and the transfer checked by hand on the smallest cluster, the decode-choice modes, and
//! what disaggregation does to the gaps between tokens.

mod common;

use common::simulate::{by_policy, refusal, run, ttft_min_max};
use kvmesh_sim::simulate::PolicyResult;
use kvmesh_sim::workload::random_target;

/// One prefill and one decode engine; two prompts sharing a 1,024-token system prompt (64
/// blocks) with 64-token questions (68 blocks in all), 8 output tokens, about 7 s apart (after
/// the first one's 5 s handshake).
const TWO_NODES: &str = "--nodes 2 --prefill-nodes 1 --requests 2 --gsp-groups 1 \
     --gsp-prompts-per-group 2 --gsp-system-len 1024 --gsp-question-len 64 --gsp-output-len 8 \
     --rate 0.05 --policy kvmesh";

fn kvmesh(flags: &str) -> PolicyResult {
    by_policy(&run(flags), "kvmesh").clone()
}

fn reasons(r: &PolicyResult) -> Vec<(&str, u64)> {
    r.pd_reasons.iter().map(|(k, &v)| (k.as_str(), v)).collect()
}

/// A step of the default engine (the h100-8b roofline) computing `tokens` prompt tokens after
/// `before`, alone: its CPU part and the larger of reading the weights and KV and computing.
fn step(tokens: f64, before: f64) -> f64 {
    let r = kvmesh_sim::engine::model::profile::H100_8B;
    let memory = r.weights_s + r.kv_s_per_token * (before + tokens);
    let compute =
        r.token_s * tokens + r.attention_s_per_token_ctx * tokens * (before + tokens / 2.0);
    r.cpu_s + r.cpu_per_seq_s + memory.max(compute)
}

#[test]
fn a_split_request_pays_prefill_handshake_and_pull_then_the_next_hits_the_pulled_prefix() {
    let r = kvmesh(TWO_NODES);
    assert_eq!((r.completed, r.rejected), (2, 0));
    // The first prompt is all uncached: split. The decode engine then holds the system
    // prompt it pulled, so the second's uncached part is its 64-token question: whole there.
    assert_eq!(reasons(&r), vec![("pd", 1), ("pd-skip-short", 1)]);
    assert_eq!(r.transfers.pulls, 1);
    assert_eq!(r.transfers.handshake_waits, 1, "the pair's first contact");
    assert_eq!(r.transfers.blocks, 68);
    // The prefill engine computed the first prompt, the decode engine its last token (to
    // sample from) and the second one's question.
    assert_eq!(r.computed_prompt_tokens, 1088 + 1 + 64);
    // 68 blocks of 16 tokens × 128 KiB per token at 10 GB/s.
    let pull = 68.0 * 16.0 * 131_072.0 / 10e9;
    let handshake = 5.0;
    assert!(
        (r.transfers.mean_s - (handshake + pull)).abs() < 1e-6,
        "{:?}",
        r.transfers
    );
    // TTFT of the split request: prefill (1,088 tokens), the answer and the decode leg
    // crossing the mesh (one hop each way between the two nodes, whichever is the entry:
    // 2 × 0.14 ms), handshake and pull, then the decode engine computes the last prompt
    // token itself (vLLM) and samples.
    let split = step(1088.0, 0.0) + 0.000_28 + handshake + pull + step(1.0, 1087.0);
    // The whole request computes its 64-token question on the decode engine (node 1), two
    // hops away if it entered at the prefill node.
    let hops = if random_target(0, 1, 2) == 1 {
        0.0
    } else {
        0.000_28
    };
    let whole = step(64.0, 1024.0) + hops;
    let (fastest, slowest) = ttft_min_max(&r);
    assert!((slowest - split).abs() < 1e-5, "{slowest} vs {split}");
    assert!((fastest - whole).abs() < 1e-5, "{fastest} vs {whole}");
}

#[test]
fn a_fixed_split_disaggregates_the_short_one_too_and_its_pull_skips_the_local_prefix() {
    let r = kvmesh(&format!("{TWO_NODES} --pd-split always"));
    assert_eq!(reasons(&r), vec![("pd", 2)]);
    assert_eq!(r.transfers.pulls, 2);
    assert_eq!(
        r.transfers.handshake_waits, 1,
        "the pair is warm the second time"
    );
    // 68 blocks, then the 4 of the question (the decode engine hits the system prompt).
    assert_eq!(r.transfers.blocks, 72);
    // The prefill engine kept the first prompt's blocks cached once they were read.
    assert_eq!(r.computed_prompt_tokens, 1088 + 1 + 64 + 1);
    let fastest = ttft_min_max(&r).0;
    assert!(fastest < 0.2, "no handshake the second time: {fastest}");
}

#[test]
fn with_one_decode_engine_choosing_it_at_arrival_changes_nothing() {
    let at_end = kvmesh(&format!("{TWO_NODES} --pd-split always"));
    let at_arrival = kvmesh(&format!(
        "{TWO_NODES} --pd-split always --pd-decode arrival"
    ));
    assert_eq!(
        (at_end.ttft_s, at_end.e2e_s, at_end.transfers.blocks),
        (
            at_arrival.ttft_s,
            at_arrival.e2e_s,
            at_arrival.transfers.blocks
        )
    );
}

#[test]
fn the_skip_rule_follows_its_settings() {
    // Raised above the 1,088-token prompt: nothing is long enough to split.
    let r = kvmesh(&format!("{TWO_NODES} --pd min_uncached_tokens=2000"));
    assert_eq!(reasons(&r), vec![("pd-skip-short", 2)]);
    assert_eq!(r.transfers.pulls, 0);
}

/// Long prompts arriving while others decode: on mixed engines every prefill chunk stalls
/// the decodes batched with it; on decode engines nothing prefills but the last token. (At 6
/// requests/s: an H100 prefills a 4k prompt in ~0.1 s, and at 3/s, the rate the legacy model
/// needed, its stalls are under 1% of the gaps, below the p99.)
#[test]
fn disaggregation_shortens_the_longest_gaps_between_tokens() {
    let flags = "--nodes 4 --requests 120 --gsp-groups 120 --gsp-prompts-per-group 1 \
         --gsp-system-len 4096 --gsp-question-len 64 --gsp-output-len 64 --rate 6 \
         --policy kvmesh --nixl-handshake-ms 0";
    let mixed = kvmesh(flags);
    let pd = kvmesh(&format!("{flags} --prefill-nodes 1"));
    assert_eq!(pd.completed, 120);
    assert_eq!(reasons(&pd).first(), Some(&("pd", pd.transfers.pulls)));
    assert!(pd.transfers.pulls > 60, "{:?}", pd.pd_reasons);
    assert!(
        pd.itl_s.p99 * 2.0 < mixed.itl_s.p99,
        "ITL p99: PD {:.4} s, mixed {:.4} s",
        pd.itl_s.p99,
        mixed.itl_s.p99
    );
    assert!(mixed.pd_reasons.is_empty() && mixed.transfers.pulls == 0);
    // Goodput only grows as the ITL objective loosens.
    for r in [&mixed, &pd] {
        let rates: Vec<f64> = r.goodput_by_itl.iter().map(|&(_, rps)| rps).collect();
        assert!(rates.windows(2).all(|w| w[0] <= w[1]), "{rates:?}");
    }
    println!(
        "ITL p99: mixed {:.4} s, PD {:.4} s; goodput by ITL objective: mixed {:?}, PD {:?}",
        mixed.itl_s.p99, pd.itl_s.p99, mixed.goodput_by_itl, pd.goodput_by_itl
    );
}

#[test]
fn a_central_policy_splits_everything_and_pays_no_hop() {
    for decode in ["arrival", "prefill-end"] {
        let report = run(&format!(
            "{} --pd-decode {decode}",
            TWO_NODES.replace("--policy kvmesh", "--policy least-loaded,round-robin")
        ));
        for r in &report.runs[0].results {
            assert_eq!((r.completed, r.rejected), (2, 0), "{}", r.policy);
            assert_eq!(reasons(r), vec![("pd", 2)], "{}", r.policy);
            assert_eq!(r.transfers.pulls, 2);
            assert_eq!(
                r.transfers.blocks, 72,
                "the second pull skips the pulled prefix"
            );
            let pull = 68.0 * 16.0 * 131_072.0 / 10e9;
            let first = step(1088.0, 0.0) + 5.0 + pull + step(1.0, 1087.0);
            let slowest = ttft_min_max(r).1;
            assert!((slowest - first).abs() < 1e-6, "{slowest} vs {first}");
        }
    }
}

#[test]
fn a_pd_cluster_needs_decode_engines_and_a_policy_that_can_split() {
    let no_decode = refusal("--nodes 2 --prefill-nodes 2 --requests 1 --policy kvmesh");
    assert!(no_decode.is_some_and(|e| e.contains("no decode engine")));
    let by_prefix = refusal("--nodes 4 --prefill-nodes 1 --requests 1 --policy kvmesh,chwbl");
    assert!(by_prefix.is_some_and(|e| e.contains("chwbl")));
    let unknown = refusal("--nodes 4 --prefill-nodes 1 --requests 1 --policy kvmesh --pd x=1");
    assert!(unknown.is_some_and(|e| e.contains("--pd x")));
}
