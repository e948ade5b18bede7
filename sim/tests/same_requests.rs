//! The load generator and the simulator run the same requests: for every workload, the same
//! flags and seed give, request by request, the same prompt tokens (as the mock engine reads
//! the load generator's body), the same output length, the same session key and the same
//! arrival time.

use std::collections::HashMap;
use std::time::Duration;

use clap::Parser;
use kvmesh_protocol::route::node_key;
use kvmesh_sim::engine::model::tokenizer::tokenize;
use kvmesh_sim::engine::server::openai::{Models, parse_chat, parse_completion};
use kvmesh_sim::load::config::LoadArgs;
use kvmesh_sim::load::render::Api;
use kvmesh_sim::load::runner::Plan;
use kvmesh_sim::simulate::SimulateArgs;
use kvmesh_sim::simulate::prompt;
use kvmesh_sim::simulate::run::{Inputs, stream};
use kvmesh_sim::simulate::workload::SimRequest;

#[derive(Parser)]
struct LoadCli {
    #[command(flatten)]
    args: LoadArgs,
}

#[derive(Parser)]
struct SimulateCli {
    #[command(flatten)]
    args: SimulateArgs,
}

const REQUESTS: u64 = 240;

/// The load generator's and the simulator's requests for the same `flags`.
fn both(flags: &str) -> (Plan, Vec<SimRequest>) {
    let flags = format!("--seed 11 --requests {REQUESTS} {flags}");
    let load = LoadCli::try_parse_from(
        ["load", "--targets", "http://127.0.0.1:9"]
            .into_iter()
            .chain(flags.split_whitespace()),
    )
    .expect("valid load flags")
    .args;
    let sim =
        SimulateCli::try_parse_from(std::iter::once("simulate").chain(flags.split_whitespace()))
            .expect("valid simulate flags")
            .args;
    let inputs = Inputs::new(&sim).expect("the simulator's workload builds");
    let requests: Vec<SimRequest> = stream(&sim, &inputs, 4).collect();
    assert_eq!(requests.len() as u64, REQUESTS);
    (
        Plan::new(&load).expect("the load generator's workload builds"),
        requests,
    )
}

/// Checks every request of `flags`; returns how many of them start with the same 256 tokens as
/// an earlier one (in the simulator).
fn assert_same_requests(flags: &str) -> usize {
    let (plan, sim) = both(flags);
    let models = Models::new(vec!["mock-model".into()], &[]);
    let release: Vec<Duration> = plan
        .release_times()
        .expect("open-loop flags")
        .take(REQUESTS as usize)
        .collect();
    let mut previous_turn: HashMap<u64, Vec<u32>> = HashMap::new();
    let mut prefixes = std::collections::HashSet::new();
    let mut repeated = 0;
    for (i, s) in sim.iter().enumerate() {
        let spec = plan.request(i as u64);
        let tokens = prompt::tokens(&s.segments);
        let generation = match spec.api {
            Api::Completions => parse_completion(&spec.body, &models),
            Api::Chat => parse_chat(&spec.body, &models),
        }
        .unwrap_or_else(|e| panic!("{flags}: request {i}: the engine refuses it: {e:?}"));
        assert_eq!(generation.prompts.len(), 1);
        let engine_tokens = &generation.prompts[0];
        match spec.api {
            Api::Completions => {
                assert_eq!(
                    engine_tokens, &tokens,
                    "{flags}: request {i}'s prompt tokens"
                );
            }
            Api::Chat => {
                // Message by message, the contents are the segments; the engine's chat
                // template around them extends each turn of a session from the previous one.
                let body: serde_json::Value = serde_json::from_slice(&spec.body).unwrap();
                let contents: String = body["messages"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|m| m["content"].as_str().unwrap())
                    .collect();
                assert_eq!(
                    tokenize(&contents),
                    tokens,
                    "{flags}: request {i}'s messages"
                );
                let session = s.session.expect("a chat request has a session");
                if let Some(prev) = previous_turn.get(&session) {
                    // The previous prompt ends in a chunk that may straddle the new text.
                    let whole = &prev[..prev.len() - 1];
                    assert_eq!(
                        &engine_tokens[..whole.len()],
                        whole,
                        "{flags}: request {i} extends its session's previous turn"
                    );
                }
                previous_turn.insert(session, engine_tokens.clone());
            }
        }
        assert_eq!(
            generation.max_tokens,
            Some(s.output_tokens),
            "{flags}: request {i}"
        );
        assert_eq!(spec.input_tokens, u64::from(s.prompt_tokens()));
        assert_eq!(
            spec.session.as_deref().map(node_key),
            s.session,
            "{flags}: request {i}'s session key"
        );
        let gap = release[i].as_nanos() as i128 - i128::from(s.arrival_ns);
        assert!(
            gap.abs() <= 1_000,
            "{flags}: request {i} arrives {gap} ns apart"
        );
        if tokens.len() >= 256 && !prefixes.insert(tokens[..256].to_vec()) {
            repeated += 1;
        }
    }
    repeated
}

#[test]
fn every_synthetic_workload_is_the_same_in_both() {
    for flags in [
        "--workload gsp --gsp-groups 8 --gsp-prompts-per-group 4 --gsp-system-len 256 \
         --gsp-question-len 16 --gsp-output-len 8",
        "--workload chat --chat-sessions 8 --chat-turns 3 --chat-system-len 256 \
         --chat-user-len 16 --chat-output-len 8",
        "--workload rag --rag-docs 20 --rag-doc-len 256 --rag-k 3 --rag-output-len 8",
        "--workload rag-pressure",
        "--workload hot --hot-system-len 256 --hot-question-len 16 --hot-output-len 8",
    ] {
        let repeated = assert_same_requests(&format!("{flags} --rate 25"));
        assert!(
            repeated > 20,
            "{flags}: only {repeated} shared 256-token prefixes"
        );
    }
}

#[test]
fn trace_replays_are_the_same_in_both() {
    // The project's Mooncake copy on its own timeline, clipped as the demo clips it.
    let repeated =
        assert_same_requests("--workload trace --max-input-tokens 2048 --max-output-tokens 64");
    assert!(repeated > 5, "only {repeated} shared prefixes");
    // An Azure trace: lengths and times only, every prompt its own.
    let dir = std::env::temp_dir().join(format!("kvmesh-same-requests-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("azure.csv");
    let mut text = String::from("TIMESTAMP,ContextTokens,GeneratedTokens\n");
    for i in 0..REQUESTS {
        text.push_str(&format!(
            "2023-11-16 18:00:{:02}.{:03}0000,{},{}\n",
            i / 10,
            (i % 10) * 100 + i % 7,
            300 + (i * 37) % 500,
            1 + i % 9
        ));
    }
    std::fs::write(&csv, text).unwrap();
    let repeated = assert_same_requests(&format!("--trace {}", csv.display()));
    assert_eq!(repeated, 0, "Azure prompts share nothing");
    std::fs::remove_dir_all(&dir).unwrap();
}
