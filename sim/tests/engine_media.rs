//! Multimodal chats against the mock engine over real sockets: `/tokenize` expands an image
//! into its placeholder run, a repeated image is served from the prefix cache, and the KV
//! events name the image on exactly the blocks its placeholders overlap.

mod common;

use std::time::Duration;

use base64::Engine as _;
use common::{EngineProc, within};
use kvmesh_sim::engine::model::tokenizer::IMAGE_PLACEHOLDER_TOKEN;
use kvmesh_sim::load::client::LoadClient;
use rmpv::Value as Msg;
use serde_json::{Value, json};
use zeromq::{Socket, SocketRecv, SubSocket};

const BS: usize = 16;

/// The start of a PNG of `width`×`height` (the IHDR chunk the size estimate reads), then
/// `salt` so that pictures of one size differ.
fn png(width: u32, height: u32, salt: &[u8]) -> Vec<u8> {
    let mut b = b"\x89PNG\r\n\x1a\n\0\0\0\x0dIHDR".to_vec();
    b.extend(width.to_be_bytes());
    b.extend(height.to_be_bytes());
    b.extend([8, 6, 0, 0, 0]);
    b.extend(salt);
    b
}

/// A 280×140 image: 10×5 = 50 tokens of 28×28 px.
fn image_url(salt: &[u8]) -> String {
    let b64 = base64::engine::general_purpose::STANDARD.encode(png(280, 140, salt));
    format!("data:image/png;base64,{b64}")
}

const IMAGE_TOKENS: usize = 50;

fn messages(url: &str, uuid: Option<&str>) -> Value {
    let mut image = json!({"type": "image_url", "image_url": {"url": url}});
    if let Some(uuid) = uuid {
        image["uuid"] = json!(uuid);
    }
    json!([{"role": "user", "content": [
        {"type": "text", "text": "Here is a photo from my holiday, taken at dawn. "},
        image,
        {"type": "text", "text": "Describe what you see in it, in two or three sentences."},
    ]}])
}

async fn post(client: &LoadClient, url: &str, body: Value) -> Value {
    let (status, _, bytes) = within(30, client.post_json(url, body.to_string()))
        .await
        .expect("request");
    let v: Value = serde_json::from_slice(&bytes).expect("json body");
    assert_eq!(status.as_u16(), 200, "{v}");
    v
}

/// The token ids `/tokenize` gives for a chat.
async fn tokenize(client: &LoadClient, engine: &EngineProc, messages: &Value) -> Vec<u32> {
    let v = post(
        client,
        &format!("{}/tokenize", engine.url),
        json!({ "messages": messages }),
    )
    .await;
    let tokens: Vec<u32> = serde_json::from_value(v["tokens"].clone()).unwrap();
    assert_eq!(v["count"], tokens.len());
    tokens
}

/// Where the placeholder run is: (offset, length); asserts there is exactly one.
fn placeholder_run(tokens: &[u32]) -> (usize, usize) {
    let offset = tokens
        .iter()
        .position(|&t| t == IMAGE_PLACEHOLDER_TOKEN)
        .expect("a placeholder");
    let length = tokens[offset..]
        .iter()
        .take_while(|&&t| t == IMAGE_PLACEHOLDER_TOKEN)
        .count();
    let total = tokens
        .iter()
        .filter(|&&t| t == IMAGE_PLACEHOLDER_TOKEN)
        .count();
    assert_eq!(total, length, "one contiguous run");
    (offset, length)
}

#[tokio::test]
async fn tokenize_expands_an_image_into_its_placeholder_run() {
    let engine = EngineProc::start(&["--instant"]);
    let client = LoadClient::new();
    let msgs = messages(&image_url(b"a"), None);
    let tokens = tokenize(&client, &engine, &msgs).await;
    let (offset, length) = placeholder_run(&tokens);
    assert_eq!(length, IMAGE_TOKENS, "280x140 px = 10x5 tokens");
    assert!(offset > 0 && offset + length < tokens.len());
    // The chat runs exactly these tokens.
    let chat = post(
        &client,
        &format!("{}/v1/chat/completions", engine.url),
        json!({"messages": msgs, "max_tokens": 1}),
    )
    .await;
    assert_eq!(chat["usage"]["prompt_tokens"], tokens.len());

    let fixed = EngineProc::start(&["--instant", "--media-tokens-per-item", "7"]);
    let (_, length) = placeholder_run(&tokenize(&client, &fixed, &msgs).await);
    assert_eq!(length, 7);
}

#[tokio::test]
async fn a_repeated_image_is_served_from_the_cache_and_another_is_not() {
    let engine = EngineProc::start(&["--instant", "--enable-prompt-tokens-details"]);
    let client = LoadClient::new();
    let url = format!("{}/v1/chat/completions", engine.url);
    let cat = messages(&image_url(b"cat"), None);
    let tokens = tokenize(&client, &engine, &cat).await;
    let (offset, length) = placeholder_run(&tokens);
    let cached = |v: &Value| v["usage"]["prompt_tokens_details"]["cached_tokens"].as_u64();
    let body = |m: &Value| json!({"messages": m, "max_tokens": 1});

    let first = post(&client, &url, body(&cat)).await;
    assert_eq!(cached(&first), Some(0));
    let second = post(&client, &url, body(&cat)).await;
    assert_eq!(second["usage"]["prompt_tokens"], tokens.len());
    let hit = cached(&second).unwrap() as usize;
    assert!(
        hit >= offset + length,
        "hit {hit} vs image end {}",
        offset + length
    );
    assert_eq!(hit, (tokens.len() - 1) / BS * BS);

    // Same size, other pixels: same token ids, but a miss from the first image block on.
    let dog = messages(&image_url(b"dog"), None);
    assert_eq!(tokenize(&client, &engine, &dog).await, tokens);
    let third = post(&client, &url, body(&dog)).await;
    assert_eq!(cached(&third), Some((offset / BS * BS) as u64));
}

/// Field `key` of a map-shaped event, or position `pos` of a positional one.
fn field(event: &Msg, key: &str, pos: usize) -> Option<Msg> {
    match event {
        Msg::Array(a) => a.get(pos).cloned(),
        Msg::Map(m) => m
            .iter()
            .find(|(k, _)| k.as_str() == Some(key))
            .map(|(_, v)| v.clone()),
        other => panic!("unexpected event {other}"),
    }
}

/// Per stored block of a batch: its token ids and its `extra_keys` entry (None for nil).
fn stored_blocks(payload: &[u8]) -> Vec<(Vec<u32>, Option<Vec<String>>)> {
    let batch = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    let events = match &batch {
        Msg::Array(a) => a[1].clone(),
        Msg::Map(_) => field(&batch, "events", 1).unwrap(),
        other => panic!("unexpected batch {other}"),
    };
    let mut out = Vec::new();
    for e in events.as_array().unwrap() {
        if field(e, "type", 0)
            .and_then(|t| t.as_str().map(str::to_owned))
            .as_deref()
            != Some("BlockStored")
        {
            continue;
        }
        let hashes = field(e, "block_hashes", 1).unwrap();
        let n = hashes.as_array().unwrap().len();
        let tokens: Vec<u32> = field(e, "token_ids", 3)
            .unwrap()
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t.as_u64().unwrap() as u32)
            .collect();
        let extra: Vec<Option<Vec<String>>> = match field(e, "extra_keys", 8) {
            None | Some(Msg::Nil) => vec![None; n],
            Some(Msg::Array(per_block)) => per_block
                .iter()
                .map(|keys| match keys {
                    Msg::Nil => None,
                    Msg::Array(ks) => Some(
                        ks.iter()
                            .map(|k| k.as_str().expect("string key").to_owned())
                            .collect(),
                    ),
                    other => panic!("extra_keys entry {other}"),
                })
                .collect(),
            Some(other) => panic!("extra_keys {other}"),
        };
        assert_eq!(extra.len(), n, "one extra_keys entry per block");
        for (i, keys) in extra.into_iter().enumerate() {
            out.push((tokens[i * BS..(i + 1) * BS].to_vec(), keys));
        }
    }
    out
}

async fn kv_events_name_the_image_on_its_blocks(format: &str) {
    let engine = EngineProc::start(&[
        "--instant",
        "--kv-events",
        // A wildcard endpoint: the engine binds it, as vLLM does (it connects to a host).
        "tcp://*:0",
        "--kv-events-format",
        format,
    ]);
    let mut sub = SubSocket::new();
    within(10, sub.connect(engine.kv_events.as_ref().unwrap()))
        .await
        .unwrap();
    within(10, sub.subscribe("")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // let the subscription reach the PUB
    let client = LoadClient::new();
    let msgs = messages(&image_url(b"sunrise"), Some("img-7"));
    let tokens = tokenize(&client, &engine, &msgs).await;
    let (offset, length) = placeholder_run(&tokens);
    post(
        &client,
        &format!("{}/v1/chat/completions", engine.url),
        json!({"messages": msgs, "max_tokens": 1}),
    )
    .await;

    let full_blocks = tokens.len() / BS;
    let mut blocks = Vec::new();
    while blocks.len() < full_blocks {
        let msg = within(10, sub.recv()).await.expect("recv");
        let payload = msg.into_vec()[2].clone();
        let decoded = kvmesh_protocol::kv_events::decode_batch(&payload).expect("vLLM batch");
        assert_eq!(
            decoded.bad_events, 0,
            "{format}: the sidecar's decoder takes every event"
        );
        blocks.extend(stored_blocks(&payload));
    }
    assert_eq!(blocks.len(), full_blocks, "{format}");
    let mut named = 0;
    for (i, (block_tokens, keys)) in blocks.iter().enumerate() {
        let (start, end) = (i * BS, (i + 1) * BS);
        assert_eq!(
            block_tokens[..],
            tokens[start..end],
            "{format}: block {i} in prompt order"
        );
        let overlaps = offset < end && start < offset + length;
        let expected = overlaps.then(|| vec!["img-7".to_owned()]);
        assert_eq!(keys, &expected, "{format}: block {i}");
        named += usize::from(overlaps);
    }
    assert!(
        named >= length / BS,
        "{format}: {named} blocks name the image"
    );
    assert!(named < full_blocks, "{format}: text-only blocks exist too");
}

#[tokio::test]
async fn kv_events_name_the_image_on_its_blocks_array() {
    kv_events_name_the_image_on_its_blocks("array").await;
}

#[tokio::test]
async fn kv_events_name_the_image_on_its_blocks_map() {
    kv_events_name_the_image_on_its_blocks("map").await;
}
