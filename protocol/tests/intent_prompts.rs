//! The labelled prompt set shipped in `sim/data/intents/` (its training split is the intents
//! file's examples, `test.jsonl` its test split): hashed n-grams must keep classifying it well,
//! so a change to the embedding or the decision that loses accuracy fails here.

use kvmesh_protocol::intent::eval::{Labelled, evaluate};
use kvmesh_protocol::intent::{IntentRouter, IntentsFile, NgramEmbedder};
use std::collections::HashSet;

const DATA: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/../sim/data/intents");

fn load() -> (IntentsFile, Vec<Labelled>) {
    let text = std::fs::read_to_string(format!("{DATA}/intents.toml")).unwrap();
    let file = IntentsFile::parse(&text).unwrap();
    let test = std::fs::read_to_string(format!("{DATA}/test.jsonl")).unwrap();
    let prompts = test
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (file, prompts)
}

#[test]
fn the_prompt_set_is_large_balanced_and_split() {
    let (file, test) = load();
    let train: Vec<&String> = file.intents.iter().flat_map(|i| &i.examples).collect();
    assert!(file.intents.len() >= 4);
    assert!(train.len() + test.len() >= 200);
    // No test prompt is a training example: the split measures generalization.
    let seen: HashSet<&str> = train.iter().map(|s| s.as_str()).collect();
    for labelled in &test {
        assert!(
            !seen.contains(labelled.prompt.as_str()),
            "{}",
            labelled.prompt
        );
        assert!(file.intents.iter().any(|i| i.name == labelled.intent));
    }
    let distinct: HashSet<&str> = test.iter().map(|l| l.prompt.as_str()).collect();
    assert_eq!(distinct.len(), test.len(), "a test prompt is repeated");
}

#[test]
fn ngrams_classify_the_test_split() {
    let (file, test) = load();
    let router = IntentRouter::new(file, Box::new(NgramEmbedder::default()));
    let report = evaluate(&router, &test);
    println!("{report}");
    // Measured 2026-12-04 (BENCHMARKS.md#intent-routing); the floor leaves a few prompts
    // of slack for harmless changes, not for a worse classifier.
    assert!(report.accuracy() >= FLOOR, "{report}");
    assert_eq!(report.unknown_labels, 0);
}

const FLOOR: f64 = 0.75;
