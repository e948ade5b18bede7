//! Issue 17, multimodal routing over real processes: four mock engines that model media as vLLM
//! does (placeholder tokens, identifiers in block hashes and KV events) behind four sidecars.
//!
//! - Exact mode: a stored image's blocks are advertised within a bound and matched, image
//!   included, by the next request with the same image at another entry node.
//! - Approximate mode: requests with the same image meet the engine that holds it, from any
//!   entry node; the identity the entry pins replaces a client's `uuid`, and the engine files
//!   the image under it.

use std::time::Duration;

use base64::Engine as _;
use kvmesh_protocol::hashing::MediaId;
use kvmesh_tests::openai::served_by;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, Engine, NodeSpec, Request, Sidecar, wait_for};
use serde_json::{Value, json};

const MODEL: &str = "mock-model";
const NODES: usize = 4;
/// The mock engine's placeholder ids: image, audio, video.
const PLACEHOLDERS: &str = "128000,128001,128002";
/// A 448×448 picture: 16×16 = 256 tokens at one per 28×28 pixels, 16 blocks of 16.
const SIDE: u32 = 448;
const IMAGE_TOKENS: u64 = 256;
/// The acceptance's bound on advertising a stored image block.
const ADVERTISE_BOUND: Duration = Duration::from_secs(1);
/// How long the test waits before failing outright on a loaded machine (a time over
/// `ADVERTISE_BOUND` but under this fails with the measured time in the message).
const WAIT_LIMIT: Duration = Duration::from_secs(15);

/// PNG bytes: a real signature and header (the size is what the engine reads), then `key`'s
/// own filler so that two pictures differ.
fn picture(key: u8) -> Vec<u8> {
    let mut png = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    png.extend_from_slice(&SIDE.to_be_bytes());
    png.extend_from_slice(&SIDE.to_be_bytes());
    png.extend_from_slice(&[8, 2, 0, 0, 0]);
    png.extend((0..4096u32).map(|i| (i as u8).wrapping_mul(31) ^ key));
    png
}

fn data_url(png: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(png);
    format!("data:image/png;base64,{b64}")
}

/// A chat asking `question` about `png`, optionally with a client `uuid` on the image part.
fn image_chat(png: &[u8], question: &str, uuid: Option<&str>) -> Value {
    let mut image = json!({"type": "image_url", "image_url": {"url": data_url(png)}});
    if let Some(uuid) = uuid {
        image["uuid"] = json!(uuid);
    }
    json!({
        "model": MODEL,
        "max_tokens": 1,
        "messages": [
            {"role": "system", "content": "You describe product photos for a catalogue, briefly."},
            {"role": "user", "content": [image, {"type": "text", "text": question}]},
        ],
    })
}

/// Four nodes; in exact mode their engines publish KV events (two in each of vLLM's shapes)
/// and their sidecars know the mock's placeholder ids.
fn cluster(exact: bool) -> Cluster {
    let specs: Vec<NodeSpec> = (0..NODES)
        .map(|i| {
            let seed = i.to_string();
            let spec = NodeSpec::new(&format!("n{i}"), &[MODEL]).engine_args(&[
                "--seed",
                &seed,
                "--enable-prompt-tokens-details",
            ]);
            match exact {
                true => spec
                    .kv_events(if i.is_multiple_of(2) { "array" } else { "map" })
                    .sidecar_args(&["--media-placeholder-tokens", PLACEHOLDERS]),
                false => spec,
            }
        })
        .collect();
    let cluster = Cluster::start(&specs);
    let names: Vec<String> = (0..NODES).map(|i| format!("n{i}")).collect();
    let names: Vec<&str> = names.iter().map(String::as_str).collect();
    cluster.wait_membership(&names, CONVERGENCE_TIMEOUT);
    cluster
}

/// `holder`'s matched blocks in `observer`'s `/debug/match` for `body`.
fn believed(observer: &Sidecar, holder: &str, body: &Value) -> Result<u64, String> {
    let response = observer
        .try_send(Request::post_json("/debug/match", body))
        .map_err(|e| e.to_string())?;
    if response.status != 200 {
        return Err(response.describe());
    }
    let answer = response.json();
    answer["nodes"]
        .as_array()
        .and_then(|nodes| nodes.iter().find(|n| n["node"] == holder))
        .and_then(|entry| entry["matched_blocks"].as_u64())
        .ok_or_else(|| format!("no entry for {holder} in {answer}"))
}

/// The prompt's token ids as `engine` tokenizes the chat.
fn tokens(engine: &Engine, body: &Value) -> Vec<u64> {
    let response = Request::post_json(
        "/tokenize",
        &json!({"model": MODEL, "messages": body["messages"]}),
    )
    .send(engine.addr())
    .expect("engine tokenizes");
    assert_eq!(response.status, 200, "{}", response.describe());
    response.json()["tokens"]
        .as_array()
        .expect("token ids")
        .iter()
        .filter_map(Value::as_u64)
        .collect()
}

fn cached_tokens(response: &kvmesh_tests::Response) -> u64 {
    let body = response.json();
    body["usage"]["prompt_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap_or_else(|| panic!("no cached_tokens in {body}"))
}

#[test]
fn exact_mode_advertises_an_image_and_another_entry_matches_it() {
    let cluster = cluster(true);
    let engines: Vec<&Engine> = cluster.nodes().iter().map(|n| &n.engine).collect();
    let sidecars: Vec<&Sidecar> = cluster.nodes().iter().map(|n| &n.sidecar).collect();
    let png = picture(1);
    let first = image_chat(&png, "What colour is the product?", None);

    let ids = tokens(engines[0], &first);
    let image_at = ids
        .iter()
        .position(|&t| t == 128_000)
        .expect("placeholders");
    let run = ids[image_at..]
        .iter()
        .take_while(|&&t| t == 128_000)
        .count();
    assert_eq!(run as u64, IMAGE_TOKENS, "the engine's placeholder count");
    let whole_blocks = ids.len() as u64 / 16;
    let blocks_before_image = image_at as u64 / 16;

    let response = sidecars[0].post_json("/v1/chat/completions", &first);
    assert_eq!(response.status, 200, "{}", response.describe());
    let holder = served_by(&response);
    // Every other node learns it from the holder's events, within the bound.
    let started = std::time::Instant::now();
    for observer in sidecars.iter().filter(|s| s.node_id() != holder) {
        wait_for(
            WAIT_LIMIT,
            &format!(
                "{} learns that {holder} holds the image",
                observer.node_id()
            ),
            || match believed(observer, &holder, &first) {
                Ok(blocks) if blocks == whole_blocks => Ok(()),
                Ok(blocks) => Err(format!("{blocks} of {whole_blocks} blocks")),
                Err(error) => Err(error),
            },
        );
    }
    let took = started.elapsed();
    assert!(
        took <= ADVERTISE_BOUND,
        "the image's blocks were advertised after {took:?} (bound {ADVERTISE_BOUND:?})"
    );
    assert!(
        whole_blocks > blocks_before_image + IMAGE_TOKENS / 16,
        "the match runs through the image"
    );
    println!("an image's blocks advertised in {took:?}");

    // The same image with another question, entering at every other node: the holder, and
    // the engine reads the image from its cache.
    for (i, entry) in sidecars
        .iter()
        .enumerate()
        .filter(|(_, s)| s.node_id() != holder)
    {
        let next = image_chat(&png, &format!("Question {i}: is it in stock?"), None);
        let response = entry.post_json("/v1/chat/completions", &next);
        assert_eq!(response.status, 200, "{}", response.describe());
        assert_eq!(served_by(&response), holder, "{}", response.describe());
        assert_eq!(response.header("x-kvmesh-reason"), Some("prefix-hit"));
        assert!(
            cached_tokens(&response) >= image_at as u64 + IMAGE_TOKENS - 16,
            "the image came from the cache: {}",
            response.describe()
        );
    }

    // Another picture of the same size matches only the text before it.
    let other = image_chat(&picture(2), "What colour is the product?", None);
    let observer = sidecars
        .iter()
        .find(|s| s.node_id() != holder)
        .expect("another node");
    let before = believed(observer, &holder, &other).expect("a match answer");
    assert_eq!(before, blocks_before_image, "another image must not match");
}

#[test]
fn requests_with_the_same_image_meet_its_engine_and_the_pinned_uuid_replaces_the_clients() {
    let cluster = cluster(false);
    let engines: Vec<&Engine> = cluster.nodes().iter().map(|n| &n.engine).collect();
    let sidecars: Vec<&Sidecar> = cluster.nodes().iter().map(|n| &n.sidecar).collect();
    let png = picture(3);
    // A client uuid that names nothing the sidecar verified: it must not reach the engine.
    let first = image_chat(&png, "Describe the stitching.", Some("reused-client-uuid"));
    let response = sidecars[0].post_json("/v1/chat/completions", &first);
    assert_eq!(response.status, 200, "{}", response.describe());
    let holder = served_by(&response);
    let holder_index: usize = holder[1..].parse().expect("node names are n<i>");

    // Every other entry node sends the same picture to the same engine once gossip knows it.
    for (i, entry) in sidecars
        .iter()
        .enumerate()
        .filter(|(_, s)| s.node_id() != holder)
    {
        let next = image_chat(&png, &format!("Question {i}: what material?"), None);
        wait_for(
            WAIT_LIMIT,
            &format!("n{i} routes the image to {holder}"),
            || {
                let response = entry.post_json("/v1/chat/completions", &next);
                match (response.status, response.header("x-kvmesh-node")) {
                    (200, Some(node)) if node == holder => Ok(()),
                    (status, node) => Err(format!("{status} from {node:?}")),
                }
            },
        );
    }

    // The engine filed the image under the verified identity, not the client's uuid: straight
    // to the engine, the verified uuid hits the image's blocks and the client's misses them.
    let engine = engines[holder_index];
    let ids = tokens(engine, &first);
    let image_end = ids
        .iter()
        .rposition(|&t| t == 128_000)
        .expect("placeholders") as u64;
    let direct = |uuid: &str| {
        let body = image_chat(&png, "Describe the stitching.", Some(uuid));
        let response = Request::post_json("/v1/chat/completions", &body)
            .send(engine.addr())
            .expect("engine answers");
        assert_eq!(response.status, 200, "{}", response.describe());
        cached_tokens(&response)
    };
    let verified = MediaId::of_bytes(&png).uuid();
    assert!(
        direct(&verified) >= image_end / 16 * 16,
        "the pinned identity hits"
    );
    assert!(
        direct("reused-client-uuid") < image_end / 16 * 16,
        "the client's uuid never reached the engine"
    );
    let pinned = sidecars[0]
        .metric("kvmesh_media_parts_total", &[("outcome", "replaced")])
        .unwrap()
        .unwrap_or(0.0);
    assert_eq!(pinned, 1.0, "one client uuid replaced at n0");
}
