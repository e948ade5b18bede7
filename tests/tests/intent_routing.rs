//! Intent routing over real processes: two engines serving different models, every sidecar
//! with the same intents file. A request for `model: "auto"` reaches the model of its
//! prompt's intent through either node, and says which intent in `x-kvmesh-intent`; a model
//! that exists nowhere is still 404; a node with another intents file shows in
//! `/debug/cluster`.

use kvmesh_protocol::prometheus_text;
use kvmesh_tests::openai::{
    CHAT_COMPLETIONS, COMPLETIONS, assert_completion, assert_openai_error, chat_body,
    completion_body, served_by,
};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, wait_for};
use std::path::Path;

const INTENTS: &str = r#"
default_model = "model-a"

[[intent]]
name = "code"
model = "model-a"
examples = [
  "write a python function that reverses a string",
  "fix this rust compile error in my struct",
  "how do I sort a list in javascript",
  "why does my java program throw a null pointer exception",
]

[[intent]]
name = "math"
model = "model-b"
keywords = ["integral", "derivative"]
examples = [
  "solve 3x + 7 = 22 for x",
  "what is the probability of rolling two sixes",
  "prove that there are infinitely many primes",
  "compute 15% of 480",
]
chat_template_kwargs = { enable_thinking = true }

[[intent]]
name = "creative"
model = "model-b"
examples = [
  "write a short poem about the ocean at night",
  "tell me a bedtime story about a dragon",
  "write a haiku about autumn leaves",
  "compose song lyrics about leaving home",
]
"#;

/// (intent, prompt, the model it must reach).
const PROMPTS: [(&str, &str, &str); 4] = [
    (
        "code",
        "write a python function that sorts a list of numbers",
        "model-a",
    ),
    ("math", "what is the integral of x squared", "model-b"),
    ("math", "solve 2x + 5 = 11 for x", "model-b"),
    (
        "creative",
        "write a poem about the moon over the ocean",
        "model-b",
    ),
];

fn write(dir: &Path, name: &str, text: &str) -> String {
    let path = dir.join(name);
    std::fs::write(&path, text).expect("write intents file");
    path.display().to_string()
}

#[test]
fn auto_requests_reach_their_intents_model_through_any_node() {
    let dir = tempfile::tempdir().expect("tempdir");
    let intents = write(dir.path(), "intents.toml", INTENTS);
    let args = ["--intents", intents.as_str()];
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["model-a"]).sidecar_args(&args),
        NodeSpec::new("b", &["model-b"]).sidecar_args(&args),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    // The auto name is listed as a model at every node with the intents.
    cluster.wait_models(
        &["a", "b"],
        &["auto", "model-a", "model-b"],
        CONVERGENCE_TIMEOUT,
    );

    for entry in ["a", "b"] {
        let sidecar = cluster.sidecar(entry);
        for (intent, prompt, model) in PROMPTS {
            let owner = &model["model-".len()..];
            for (path, body, object) in [
                (
                    CHAT_COMPLETIONS,
                    chat_body("auto", prompt, 4, false),
                    "chat.completion",
                ),
                (
                    COMPLETIONS,
                    completion_body("auto", prompt, 4, false),
                    "text_completion",
                ),
            ] {
                let response = sidecar.post_json(path, &body);
                assert_completion(&response, object, model);
                assert_eq!(served_by(&response), owner, "{prompt} at {entry}");
                assert_eq!(
                    response.header("x-kvmesh-intent"),
                    Some(intent),
                    "{prompt} at {entry}: {}",
                    response.describe()
                );
            }
        }
        // A model no engine serves is still refused, and is no intent's.
        let unknown = sidecar.post_json(COMPLETIONS, &completion_body("model-z", "hi", 4, false));
        assert_openai_error(&unknown, 404);
        assert_eq!(unknown.header("x-kvmesh-intent"), None);
        // A named model is served as asked, untouched by intents.
        let named = sidecar.post_json(COMPLETIONS, &completion_body("model-b", "a poem", 4, false));
        assert_completion(&named, "text_completion", "model-b");
        assert_eq!(named.header("x-kvmesh-intent"), None);

        let metrics = sidecar.get("/metrics").text();
        let count = |intent: &str| {
            prometheus_text::sum(
                &metrics,
                "kvmesh_intent_requests_total",
                &[("intent", intent)],
            )
        };
        // Each prompt twice (chat, completions) entered here.
        assert_eq!(count("code"), Some(2.0), "{metrics}");
        assert_eq!(count("math"), Some(4.0), "{metrics}");
        assert_eq!(count("creative"), Some(2.0), "{metrics}");
        assert_eq!(count("default"), Some(0.0), "{metrics}");
    }

    // Same file everywhere: nobody is out of step.
    let hash = |entry: &str| {
        let cluster_view = cluster
            .sidecar(entry)
            .debug_cluster()
            .expect("/debug/cluster");
        assert_eq!(
            cluster_view["intents_mismatch"],
            serde_json::json!([]),
            "{cluster_view}"
        );
        cluster_view["intents"]["hash"]
            .as_str()
            .expect("hash")
            .to_owned()
    };
    assert_eq!(hash("a"), hash("b"));

    // A third node with another file: the others name it as out of step.
    let other = write(
        dir.path(),
        "other.toml",
        &INTENTS.replace("model-b", "model-c"),
    );
    cluster.join(&NodeSpec::new("c", &["model-c"]).sidecar_args(&["--intents", &other]));
    for entry in ["a", "b"] {
        wait_for(
            CONVERGENCE_TIMEOUT,
            "the third node's intents are seen",
            || {
                let view = cluster.sidecar(entry).debug_cluster()?;
                match view["intents_mismatch"].as_array() {
                    Some(names) if names == &[serde_json::json!("c")] => Ok(()),
                    _ => Err(view.to_string()),
                }
            },
        );
    }
}

#[test]
fn a_bad_intents_file_stops_the_node_with_a_clear_error() {
    let dir = tempfile::tempdir().expect("tempdir");
    let bad = write(
        dir.path(),
        "bad.toml",
        "default_model = \"m\"\n[[intent]]\nname = \"x\"\nmodel = \"m\"\nregex = \"(\"\n",
    );
    let output = std::process::Command::new(kvmesh_tests::binaries::KVMESH.path())
        .args(["intents", "check", "--intents", &bad])
        .output()
        .expect("run kvmesh intents check");
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("bad.toml") && stderr.contains("intent `x`: `regex` is invalid"),
        "{stderr}"
    );
}
