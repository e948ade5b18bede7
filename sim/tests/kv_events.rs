//! KV events over real ZMQ sockets: both wire shapes, sequence numbers, replay, and agreement
//! with the engine's real cache state (predicted hits from events = hits the engine reports).

mod common;

use std::collections::HashMap;
use std::time::Duration;

use bytes::Bytes;
use common::{EngineProc, metric, within};
use kvmesh_sim::engine::model::tokenizer::tokenize;
use kvmesh_sim::load::client::LoadClient;
use rmpv::Value;
use serde_json::json;
use zeromq::{DealerSocket, Socket, SocketRecv, SocketSend, SubSocket, ZmqMessage};

const BS: usize = 16;

/// A decoded event, independent of the wire shape.
#[derive(Debug, Clone, PartialEq)]
enum Ev {
    Stored {
        hashes: Vec<u64>,
        parent: Option<u64>,
        tokens: Vec<u32>,
        block_size: usize,
    },
    Removed(Vec<u64>),
    Cleared,
}

fn field<'a>(v: &'a Value, key: &str) -> Option<&'a Value> {
    v.as_map()?
        .iter()
        .find(|(k, _)| k.as_str() == Some(key))
        .map(|(_, v)| v)
}

fn u64s(v: &Value) -> Vec<u64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_u64().expect("uint"))
        .collect()
}

/// Field `key` of a map-shaped event, or position `pos` of a positional one.
fn get(e: &Value, key: &str, pos: usize) -> Option<Value> {
    match e {
        Value::Array(a) => a.get(pos).cloned(),
        Value::Map(_) => field(e, key).cloned(),
        other => panic!("unexpected event {other}"),
    }
}

/// Decodes a payload in either shape (batch array or map; events positional or maps).
fn decode(payload: &[u8]) -> Vec<Ev> {
    let batch = rmpv::decode::read_value(&mut &payload[..]).expect("msgpack");
    let (ts, events) = match &batch {
        Value::Array(a) => (&a[0], &a[1]),
        Value::Map(_) => (
            field(&batch, "ts").unwrap(),
            field(&batch, "events").unwrap(),
        ),
        other => panic!("unexpected batch {other}"),
    };
    assert!(ts.as_f64().unwrap() > 1.6e9);
    events
        .as_array()
        .unwrap()
        .iter()
        .map(|e| {
            let tag = get(e, "type", 0)
                .and_then(|t| t.as_str().map(str::to_owned))
                .expect("tag");
            let get = |k: &str, i: usize| get(e, k, i);
            match tag.as_str() {
                "BlockStored" => Ev::Stored {
                    hashes: u64s(&get("block_hashes", 1).unwrap()),
                    parent: get("parent_block_hash", 2).unwrap().as_u64(),
                    tokens: u64s(&get("token_ids", 3).unwrap())
                        .into_iter()
                        .map(|t| t as u32)
                        .collect(),
                    block_size: get("block_size", 4).unwrap().as_u64().unwrap() as usize,
                },
                "BlockRemoved" => Ev::Removed(u64s(&get("block_hashes", 1).unwrap())),
                "AllBlocksCleared" => Ev::Cleared,
                t => panic!("unknown tag {t}"),
            }
        })
        .collect()
}

/// What a consumer (like kvmesh's exact mode) rebuilds from events.
#[derive(Default)]
struct Mirror {
    /// hash -> (parent, block tokens)
    blocks: HashMap<u64, (Option<u64>, Vec<u32>)>,
    /// (parent, block tokens) -> hash
    by_content: HashMap<(Option<u64>, Vec<u32>), u64>,
}

impl Mirror {
    fn apply(&mut self, ev: &Ev) {
        match ev {
            Ev::Stored {
                hashes,
                parent,
                tokens,
                block_size,
            } => {
                assert_eq!(*block_size, BS);
                assert_eq!(tokens.len(), hashes.len() * BS);
                let mut parent = *parent;
                for (i, &h) in hashes.iter().enumerate() {
                    let blk = tokens[i * BS..(i + 1) * BS].to_vec();
                    assert!(
                        self.blocks.insert(h, (parent, blk.clone())).is_none(),
                        "stored twice"
                    );
                    self.by_content.insert((parent, blk), h);
                    parent = Some(h);
                }
            }
            Ev::Removed(hs) => {
                for h in hs {
                    let (p, blk) = self.blocks.remove(h).expect("removed a block never stored");
                    self.by_content.remove(&(p, blk));
                }
            }
            Ev::Cleared => {
                self.blocks.clear();
                self.by_content.clear();
            }
        }
    }

    /// Prompt tokens the engine should find cached (the last token is always recomputed).
    fn predicted_hits(&self, tokens: &[u32]) -> usize {
        let mut parent = None;
        let mut n = 0;
        for blk in tokens.chunks_exact(BS).take((tokens.len() - 1) / BS) {
            match self.by_content.get(&(parent, blk.to_vec())) {
                Some(&h) => {
                    parent = Some(h);
                    n += 1;
                }
                None => break,
            }
        }
        n * BS
    }
}

struct Received {
    seq: u64,
    payload: Bytes,
}

async fn recv(sub: &mut SubSocket, within: Duration) -> Received {
    let msg = tokio::time::timeout(within, sub.recv())
        .await
        .expect("no KV event in time")
        .expect("recv");
    let frames = msg.into_vec();
    assert_eq!(frames.len(), 3, "[topic, seq, payload]");
    assert_eq!(&frames[0][..], b"kv-events");
    let seq = u64::from_be_bytes(frames[1][..].try_into().expect("8-byte seq"));
    Received {
        seq,
        payload: frames[2].clone(),
    }
}

async fn events_agree_with_cache_state(format: &str) {
    let engine = EngineProc::start(&[
        "--instant",
        "--kv-blocks",
        "40",
        "--kv-events",
        // A wildcard endpoint: the engine binds it, as vLLM does (it connects to a host).
        "tcp://*:0",
        "--kv-events-replay",
        "tcp://127.0.0.1:0",
        "--kv-events-format",
        format,
    ]);
    let mut sub = SubSocket::new();
    within(10, sub.connect(engine.kv_events.as_ref().unwrap()))
        .await
        .unwrap();
    within(10, sub.subscribe("kv-events")).await.unwrap();
    tokio::time::sleep(Duration::from_millis(300)).await; // let the subscription reach the PUB
    let client = LoadClient::new();
    let url = format!("{}/v1/completions", engine.url);
    let mut mirror = Mirror::default();
    let mut all = Vec::new();
    let mut saw_removal = false;
    // Eight prompts of 200 tokens (13 blocks each) cycle through a 40-block cache; prompts
    // 0..4 come back, some still cached, some evicted.
    let order = [0u64, 1, 2, 0, 3, 4, 5, 1, 0, 6, 2, 7, 0, 3];
    for (i, &p) in order.iter().enumerate() {
        let prompt = kvmesh_sim::text::text(100 + p, 200);
        let tokens = tokenize(&prompt);
        let predicted = mirror.predicted_hits(&tokens);
        let before = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
        let body = json!({"prompt": prompt, "max_tokens": 1}).to_string();
        let (status, _, _) = within(30, client.post_json(&url, body)).await.unwrap();
        assert_eq!(status, 200);
        let after = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
        assert_eq!(
            (after - before) as usize,
            predicted,
            "request {i} (prompt {p})"
        );
        // The request's full blocks are cached once it is served: read events until the
        // mirror shows them (bounded), so the next prediction sees the whole state.
        let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
        while mirror.predicted_hits(&tokens) < (tokens.len() - 1) / BS * BS {
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            let r = recv(&mut sub, left).await;
            for ev in decode(&r.payload) {
                saw_removal |= matches!(ev, Ev::Removed(_));
                if let Ev::Stored {
                    tokens: t,
                    parent: None,
                    ..
                } = &ev
                {
                    assert_eq!(
                        &t[..BS],
                        &tokens[..BS],
                        "stored token ids are the /tokenize ids"
                    );
                }
                mirror.apply(&ev);
            }
            all.push(r);
        }
    }
    assert!(saw_removal, "the workload must evict");
    assert!(!all.is_empty());
    for (i, r) in all.iter().enumerate() {
        assert_eq!(
            r.seq, i as u64,
            "sequence numbers start at 0 and grow by one"
        );
    }
    // Replay from seq 2 over a DEALER (with the REQ-style empty delimiter).
    let mut dealer = DealerSocket::new();
    within(10, dealer.connect(engine.kv_replay.as_ref().unwrap()))
        .await
        .unwrap();
    let mut req = ZmqMessage::from(Bytes::new());
    req.push_back(Bytes::copy_from_slice(&2u64.to_be_bytes()));
    within(10, dealer.send(req)).await.unwrap();
    let mut replayed = Vec::new();
    loop {
        let msg = within(10, dealer.recv()).await.unwrap().into_vec();
        assert_eq!(msg.len(), 4, "['', topic, seq, payload]");
        assert!(msg[0].is_empty());
        let seq = u64::from_be_bytes(msg[2][..].try_into().unwrap());
        if seq == u64::MAX {
            assert!(msg[3].is_empty());
            break;
        }
        replayed.push((seq, msg[3].clone()));
    }
    let expected: Vec<(u64, Bytes)> = all
        .iter()
        .skip(2)
        .map(|r| (r.seq, r.payload.clone()))
        .collect();
    assert_eq!(replayed, expected);
}

#[tokio::test]
async fn array_events_agree_with_cache_state_and_replay() {
    events_agree_with_cache_state("array").await;
}

#[tokio::test]
async fn map_events_agree_with_cache_state_and_replay() {
    events_agree_with_cache_state("map").await;
}
