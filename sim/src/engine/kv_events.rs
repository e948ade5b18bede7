//! KV cache events over ZMQ, in vLLM's wire format.
//!
//! A PUB socket sends one message per engine batch of events, three frames:
//! `[topic, seq (u64 big-endian, from 0, +1 per batch), payload (msgpack)]`. The payload is
//! `[ts, events, data_parallel_rank]` with positional events (`--kv-events-format array`), or
//! `{"ts", "events", "data_parallel_rank"}` with map events (`map`). Events:
//!
//! - array: `["BlockStored", block_hashes, parent_block_hash, token_ids, block_size, lora_id,
//!   medium, lora_name, extra_keys]`, `["BlockRemoved", block_hashes, medium]`,
//!   `["AllBlocksCleared"]`;
//! - map: `{"type": "BlockStored", "block_hashes", "parent_block_hash", "token_ids",
//!   "block_size", "lora_id", "medium", "lora_name", "extra_keys"}`, `{"type": "BlockRemoved",
//!   "block_hashes", "medium"}`, `{"type": "AllBlocksCleared"}`.
//!
//! Like msgspec's `omit_defaults`, trailing fields at their default (`None`) are left out: a
//! store with neither adapter nor extra keys has 7 positions, and `lora_name` is sent (nil for
//! the base model) when `extra_keys` follows it. `extra_keys` is vLLM's shape: one entry per
//! stored block, `nil` for a block without extra keys, otherwise the array of that block's keys
//! as strings in hash order (LoRA name on every block, then the identifiers of the media items
//! overlapping the block, then `cache_salt` on the first block of a chain). It is omitted when
//! no stored block has an extra key.
//!
//! Block hashes are u64, `medium` is `"GPU"`, except for the events of the CPU offload tier
//! (`--kv-offload-blocks`), shaped as vLLM's `OffloadingConnector` sends them: a token-less
//! `BlockStored` (parent nil, `token_ids` empty, `block_size` 0, `lora_id` nil, medium `"CPU"`)
//! and a `BlockRemoved` with medium `"CPU"`. The replay socket (ROUTER) takes a request whose
//! last frame is an 8-byte big-endian start seq (from a DEALER, with or without an empty
//! delimiter frame, or a REQ) and answers, behind the same envelope, one
//! `[topic, seq, payload]` message per buffered batch from that seq on, then the end marker
//! `[topic, 0xFFFFFFFFFFFFFFFF, ""]`.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use bytes::Bytes;
use rmpv::Value;
use tokio::sync::mpsc;
use zeromq::{PubSocket, RouterSocket, Socket, SocketRecv, SocketSend, ZmqMessage};

use super::config::KvEventsFormat;
use super::model::KvCacheEvent;

/// Sequence number of the replay end marker.
pub const END_SEQ: u64 = u64::MAX;

/// Where and how to publish.
#[derive(Debug, Clone)]
pub struct KvEventsConfig {
    /// PUB endpoint. As vLLM does ([`publisher_binds`]), a wildcard one is bound
    /// (`tcp://*:5557`; `tcp://*:0`, any free port) and any other connected to: the
    /// subscriber must listen there.
    pub endpoint: String,
    /// ROUTER endpoint for replay, if any.
    pub replay_endpoint: Option<String>,
    /// Topic frame.
    pub topic: String,
    /// Event shape.
    pub format: KvEventsFormat,
    /// Batches kept for replay.
    pub buffer: usize,
}

/// Failure to start the publisher.
#[derive(Debug, thiserror::Error)]
pub enum KvEventsError {
    /// Binding a ZMQ socket failed.
    #[error("cannot bind ZMQ socket on {endpoint}: {source}")]
    Bind {
        /// The endpoint.
        endpoint: String,
        /// The cause.
        source: zeromq::ZmqError,
    },
}

/// The running publisher: its resolved endpoints and the channel the engine feeds.
#[derive(Debug)]
pub struct KvEventsPublisher {
    /// Resolved PUB endpoint.
    pub endpoint: String,
    /// Resolved replay endpoint.
    pub replay_endpoint: Option<String>,
    /// Send each engine batch of events here.
    pub sender: mpsc::UnboundedSender<Vec<KvCacheEvent>>,
}

type Buffer = Arc<Mutex<VecDeque<(u64, Bytes)>>>;

/// Whether vLLM binds its publisher on `endpoint` rather than connecting to it
/// (`ZmqEventPublisher._is_bind_endpoint`, vLLM 0.32): a wildcard (`tcp://*:5557`, `::`) or
/// an ipc/inproc endpoint is bound; to any other vLLM connects, and a sidecar must listen
/// there (`kvmesh serve --kv-events-bind`). The replay endpoint is always bound.
pub fn publisher_binds(endpoint: &str) -> bool {
    endpoint.contains('*')
        || endpoint.contains("::")
        || endpoint.starts_with("ipc://")
        || endpoint.starts_with("inproc://")
}

/// vLLM's configs say `tcp://*:PORT` (all interfaces); the zeromq crate wants an address.
/// `tcp://*:0` (any free port) binds loopback here, where vLLM binds the node's IP: the mock
/// serves tests and demos on one machine.
pub fn normalize_endpoint(endpoint: &str) -> String {
    match endpoint.strip_prefix("tcp://*:") {
        Some("0") => "tcp://127.0.0.1:0".to_owned(),
        Some(port) => format!("tcp://0.0.0.0:{port}"),
        None => endpoint.to_owned(),
    }
}

/// Binds (or, per [`publisher_binds`], starts connecting) the sockets and starts the
/// publishing and replay tasks on the current runtime.
pub async fn start(cfg: KvEventsConfig) -> Result<KvEventsPublisher, KvEventsError> {
    let mut pub_socket = PubSocket::new();
    let (endpoint, connect_to) = if publisher_binds(&cfg.endpoint) {
        let bound = pub_socket
            .bind(&normalize_endpoint(&cfg.endpoint))
            .await
            .map_err(|source| KvEventsError::Bind {
                endpoint: cfg.endpoint.clone(),
                source,
            })?
            .to_string();
        (bound, None)
    } else {
        (cfg.endpoint.clone(), Some(cfg.endpoint.clone()))
    };
    let buffer: Buffer = Arc::new(Mutex::new(VecDeque::new()));
    let topic = Bytes::from(cfg.topic.clone().into_bytes());
    let replay_endpoint = match &cfg.replay_endpoint {
        Some(ep) => {
            let mut router = RouterSocket::new();
            let bound = router
                .bind(&normalize_endpoint(ep))
                .await
                .map_err(|source| KvEventsError::Bind {
                    endpoint: ep.clone(),
                    source,
                })?
                .to_string();
            tokio::spawn(serve_replay(router, buffer.clone(), topic.clone()));
            Some(bound)
        }
        None => None,
    };
    let (sender, rx) = mpsc::unbounded_channel();
    tokio::spawn(publish(
        pub_socket,
        connect_to,
        rx,
        buffer,
        topic,
        cfg.format,
        cfg.buffer.max(1),
    ));
    Ok(KvEventsPublisher {
        endpoint,
        replay_endpoint,
        sender,
    })
}

/// Pause between attempts to reach a subscriber that is not listening yet.
const CONNECT_RETRY: Duration = Duration::from_millis(100);

async fn publish(
    mut socket: PubSocket,
    connect_to: Option<String>,
    mut rx: mpsc::UnboundedReceiver<Vec<KvCacheEvent>>,
    buffer: Buffer,
    topic: Bytes,
    format: KvEventsFormat,
    capacity: usize,
) {
    // Connecting, like libzmq's connect, retries until the subscriber listens; batches wait
    // in the channel meanwhile, as they would in the socket's queue (vLLM's hwm is 100,000).
    if let Some(endpoint) = connect_to {
        let mut warned = false;
        while let Err(error) = socket.connect(&endpoint).await {
            if !warned {
                tracing::info!(%endpoint, %error, "KV-event subscriber not listening yet; retrying");
                warned = true;
            }
            tokio::time::sleep(CONNECT_RETRY).await;
        }
    }
    let mut seq: u64 = 0;
    while let Some(events) = rx.recv().await {
        let ts = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_secs_f64())
            .unwrap_or(0.0);
        let payload = Bytes::from(encode_batch(ts, &events, format));
        {
            let mut buf = buffer
                .lock()
                .expect("buffer lock never poisoned: no panics inside");
            if buf.len() == capacity {
                buf.pop_front();
            }
            buf.push_back((seq, payload.clone()));
        }
        let msg = frames(&[
            topic.clone(),
            Bytes::copy_from_slice(&seq.to_be_bytes()),
            payload,
        ]);
        if let Err(e) = socket.send(msg).await {
            tracing::warn!(error = %e, seq, "KV event publish failed");
        }
        seq += 1;
    }
}

async fn serve_replay(mut router: RouterSocket, buffer: Buffer, topic: Bytes) {
    loop {
        let msg = match router.recv().await {
            Ok(m) => m,
            Err(e) => {
                tracing::debug!(error = %e, "replay socket receive failed");
                continue;
            }
        };
        let mut frames_in = msg.into_vec();
        let Some(last) = frames_in.pop() else {
            continue;
        };
        let Ok(start) = <[u8; 8]>::try_from(last.as_ref()) else {
            tracing::warn!(
                len = last.len(),
                "invalid replay request: last frame is not an 8-byte seq"
            );
            continue;
        };
        let start = u64::from_be_bytes(start);
        let envelope = frames_in; // identity, plus the empty delimiter when present
        let batches: Vec<(u64, Bytes)> = {
            let buf = buffer
                .lock()
                .expect("buffer lock never poisoned: no panics inside");
            buf.iter().filter(|(s, _)| *s >= start).cloned().collect()
        };
        for (seq, payload) in batches.into_iter().chain([(END_SEQ, Bytes::new())]) {
            let mut out = envelope.clone();
            out.extend([
                topic.clone(),
                Bytes::copy_from_slice(&seq.to_be_bytes()),
                payload,
            ]);
            if let Err(e) = router.send(frames(&out)).await {
                tracing::debug!(error = %e, "replay answer failed");
                break;
            }
        }
    }
}

fn frames(parts: &[Bytes]) -> ZmqMessage {
    let mut msg = ZmqMessage::from(parts[0].clone());
    for p in &parts[1..] {
        msg.push_back(p.clone());
    }
    msg
}

/// Encodes one batch as msgpack (see the module docs for the shapes).
pub fn encode_batch(ts: f64, events: &[KvCacheEvent], format: KvEventsFormat) -> Vec<u8> {
    let events = Value::Array(events.iter().map(|e| encode_event(e, format)).collect());
    let batch = match format {
        KvEventsFormat::Array => Value::Array(vec![Value::F64(ts), events, Value::Nil]),
        KvEventsFormat::Map => Value::Map(vec![
            ("ts".into(), Value::F64(ts)),
            ("events".into(), events),
            ("data_parallel_rank".into(), Value::Nil),
        ]),
    };
    let mut out = Vec::with_capacity(256);
    rmpv::encode::write_value(&mut out, &batch).expect("writing to a Vec cannot fail");
    out
}

fn encode_event(e: &KvCacheEvent, format: KvEventsFormat) -> Value {
    let hashes = |h: &[u64]| Value::Array(h.iter().map(|&x| Value::from(x)).collect());
    let opt_u64 = |v: Option<u64>| v.map_or(Value::Nil, Value::from);
    let (tag, fields): (&str, Vec<(&str, Value)>) = match e {
        KvCacheEvent::BlockStored {
            block_hashes,
            parent_block_hash,
            token_ids,
            block_size,
            lora_id,
            lora_name,
            extra_keys,
        } => {
            let mut f = vec![
                ("block_hashes", hashes(block_hashes)),
                ("parent_block_hash", opt_u64(*parent_block_hash)),
                (
                    "token_ids",
                    Value::Array(token_ids.iter().map(|&t| Value::from(t)).collect()),
                ),
                ("block_size", Value::from(*block_size)),
                ("lora_id", opt_u64(lora_id.map(u64::from))),
                ("medium", Value::from("GPU")),
            ];
            let has_extra_keys = extra_keys.iter().any(Option::is_some);
            if lora_name.is_some() || has_extra_keys {
                let name = lora_name.as_deref().map_or(Value::Nil, Value::from);
                f.push(("lora_name", name));
            }
            if has_extra_keys {
                f.push(("extra_keys", encode_extra_keys(extra_keys)));
            }
            ("BlockStored", f)
        }
        KvCacheEvent::BlockRemoved { block_hashes } => (
            "BlockRemoved",
            vec![
                ("block_hashes", hashes(block_hashes)),
                ("medium", Value::from("GPU")),
            ],
        ),
        KvCacheEvent::AllBlocksCleared => ("AllBlocksCleared", vec![]),
        KvCacheEvent::OffloadStored { block_hashes } => (
            "BlockStored",
            vec![
                ("block_hashes", hashes(block_hashes)),
                ("parent_block_hash", Value::Nil),
                ("token_ids", Value::Array(Vec::new())),
                ("block_size", Value::from(0u32)),
                ("lora_id", Value::Nil),
                ("medium", Value::from("CPU")),
            ],
        ),
        KvCacheEvent::OffloadRemoved { block_hashes } => (
            "BlockRemoved",
            vec![
                ("block_hashes", hashes(block_hashes)),
                ("medium", Value::from("CPU")),
            ],
        ),
    };
    match format {
        KvEventsFormat::Array => Value::Array(
            std::iter::once(Value::from(tag))
                .chain(fields.into_iter().map(|(_, v)| v))
                .collect(),
        ),
        KvEventsFormat::Map => Value::Map(
            std::iter::once((Value::from("type"), Value::from(tag)))
                .chain(fields.into_iter().map(|(k, v)| (Value::from(k), v)))
                .collect(),
        ),
    }
}

/// `extra_keys`: per block, nil or the array of its keys.
fn encode_extra_keys(per_block: &[Option<Vec<String>>]) -> Value {
    Value::Array(
        per_block
            .iter()
            .map(|keys| match keys {
                None => Value::Nil,
                Some(keys) => Value::Array(keys.iter().map(|k| Value::from(k.as_str())).collect()),
            })
            .collect(),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn like_vllm_it_binds_wildcard_and_ipc_endpoints_and_connects_to_the_rest() {
        assert!(publisher_binds("tcp://*:5557"));
        assert!(publisher_binds("tcp://*:0"));
        assert!(publisher_binds("tcp://[::]:5557"));
        assert!(publisher_binds("ipc:///tmp/kv-events"));
        assert!(!publisher_binds("tcp://127.0.0.1:5557"));
        assert!(!publisher_binds("tcp://vllm-0.local:5557"));
    }

    /// A publisher given a host endpoint connects to the subscriber that listens there, even
    /// one that starts listening after it. Batches sent before the subscription reaches the
    /// publisher are dropped, as by any ZMQ PUB socket (the replay endpoint recovers them),
    /// so batches go out until one arrives.
    #[tokio::test]
    async fn a_host_endpoint_reaches_a_subscriber_that_listens_there() {
        use zeromq::SubSocket;
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .and_then(|l| l.local_addr())
            .expect("a free port")
            .port();
        let endpoint = format!("tcp://127.0.0.1:{port}");
        let publisher = start(KvEventsConfig {
            endpoint: endpoint.clone(),
            replay_endpoint: None,
            topic: "kv-events".into(),
            format: KvEventsFormat::Array,
            buffer: 16,
        })
        .await
        .expect("a connecting publisher starts before its subscriber");
        assert_eq!(publisher.endpoint, endpoint);
        tokio::time::sleep(Duration::from_millis(300)).await;
        let mut subscriber = SubSocket::new();
        subscriber.bind(&endpoint).await.expect("bind");
        subscriber.subscribe("").await.expect("subscribe");
        let sender = publisher.sender.clone();
        let feeding = tokio::spawn(async move {
            while sender.send(vec![KvCacheEvent::AllBlocksCleared]).is_ok() {
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        });
        let message = tokio::time::timeout(Duration::from_secs(10), subscriber.recv())
            .await
            .expect("a batch within 10 s")
            .expect("a message");
        feeding.abort();
        let frames = message.into_vec();
        assert_eq!(frames.len(), 3, "topic, seq, payload");
        assert_eq!(&frames[0][..], b"kv-events");
        assert_eq!(frames[1].len(), 8, "a big-endian u64 seq");
    }

    #[test]
    fn vllm_wildcard_endpoints_are_accepted() {
        assert_eq!(normalize_endpoint("tcp://*:5557"), "tcp://0.0.0.0:5557");
        assert_eq!(normalize_endpoint("tcp://*:0"), "tcp://127.0.0.1:0");
        assert_eq!(
            normalize_endpoint("tcp://127.0.0.1:5557"),
            "tcp://127.0.0.1:5557"
        );
    }

    #[test]
    fn both_shapes_decode_with_a_msgpack_decoder() {
        let events = vec![
            KvCacheEvent::BlockStored {
                block_hashes: vec![u64::MAX, 1],
                parent_block_hash: None,
                token_ids: vec![1, 2, 3, 4],
                block_size: 2,
                lora_id: None,
                lora_name: None,
                extra_keys: vec![None; 2],
            },
            KvCacheEvent::BlockRemoved {
                block_hashes: vec![7],
            },
            KvCacheEvent::AllBlocksCleared,
        ];
        let bytes = encode_batch(1.5, &events, KvEventsFormat::Array);
        let v = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let arr = v.as_array().unwrap();
        assert_eq!(arr[0].as_f64(), Some(1.5));
        let evs = arr[1].as_array().unwrap();
        let stored = evs[0].as_array().unwrap();
        assert_eq!(stored[0].as_str(), Some("BlockStored"));
        assert_eq!(stored[1].as_array().unwrap()[0].as_u64(), Some(u64::MAX));
        assert!(stored[2].is_nil());
        assert_eq!(stored[4].as_u64(), Some(2));
        assert_eq!(stored[6].as_str(), Some("GPU"));
        assert_eq!(stored.len(), 7);
        assert_eq!(evs[2].as_array().unwrap().len(), 1);

        let bytes = encode_batch(1.5, &events, KvEventsFormat::Map);
        let v = rmpv::decode::read_value(&mut &bytes[..]).unwrap();
        let get = |m: &Value, k: &str| {
            m.as_map()
                .unwrap()
                .iter()
                .find(|(kk, _)| kk.as_str() == Some(k))
                .map(|(_, v)| v.clone())
        };
        let evs = get(&v, "events").unwrap();
        let removed = &evs.as_array().unwrap()[1];
        assert_eq!(get(removed, "type").unwrap().as_str(), Some("BlockRemoved"));
        assert_eq!(
            get(removed, "block_hashes").unwrap().as_array().unwrap()[0].as_u64(),
            Some(7)
        );
    }

    #[test]
    fn offload_events_carry_medium_cpu_and_the_sidecar_reads_them_so() {
        use kvmesh_protocol::kv_events::{ExactCache, KvEvent, Medium, Tier, decode_batch};

        let events = vec![
            KvCacheEvent::BlockStored {
                block_hashes: vec![11, 12],
                parent_block_hash: None,
                token_ids: (0..8).collect(),
                block_size: 4,
                lora_id: None,
                lora_name: None,
                extra_keys: vec![None; 2],
            },
            KvCacheEvent::OffloadStored {
                block_hashes: vec![11, 12],
            },
            KvCacheEvent::BlockRemoved {
                block_hashes: vec![11, 12],
            },
            KvCacheEvent::OffloadRemoved {
                block_hashes: vec![12],
            },
        ];
        for format in [KvEventsFormat::Array, KvEventsFormat::Map] {
            let bytes = encode_batch(1.0, &events, format);
            let batch = decode_batch(&bytes).unwrap();
            assert_eq!(batch.bad_events, 0, "{format:?}");
            assert_eq!(
                batch.events[1],
                KvEvent::BlockStored {
                    block_hashes: vec![11, 12],
                    parent_block_hash: None,
                    token_ids: vec![],
                    block_size: 0,
                    lora_name: None,
                    medium: Medium::Cpu,
                    extra_keys: vec![],
                },
                "{format:?}"
            );
            assert!(
                matches!(
                    &batch.events[0],
                    KvEvent::BlockStored {
                        medium: Medium::Gpu,
                        ..
                    }
                ),
                "{format:?}"
            );
            assert_eq!(
                batch.events[3],
                KvEvent::BlockRemoved {
                    block_hashes: vec![12],
                    medium: Medium::Cpu
                },
                "{format:?}"
            );
            // GPU store, then its offload: the token-less store maps through the first one.
            let mut cache = ExactCache::new(4);
            let changes: Vec<_> = batch
                .events
                .iter()
                .map(|e| cache.apply(e, "mock-model"))
                .collect();
            assert!(changes.iter().all(|c| c.skipped.is_none()), "{format:?}");
            assert_eq!(changes[1].offload.added.len(), 2, "{format:?}");
            assert_eq!(cache.len(Tier::Gpu), 0, "{format:?}");
            assert_eq!(cache.len(Tier::Offload), 1, "{format:?}");
        }
    }

    #[test]
    fn extra_keys_follow_lora_name_per_block_nil_or_strings() {
        let stored = |lora: Option<&str>| KvCacheEvent::BlockStored {
            block_hashes: vec![1, 2, 3],
            parent_block_hash: None,
            token_ids: (0..6).collect(),
            block_size: 2,
            lora_id: lora.map(|_| 1),
            lora_name: lora.map(str::to_owned),
            extra_keys: vec![
                Some(vec!["img-1".into(), "salt".into()]),
                Some(vec!["img-1".into()]),
                None,
            ],
        };
        let expected = Value::Array(vec![
            Value::Array(vec!["img-1".into(), "salt".into()]),
            Value::Array(vec!["img-1".into()]),
            Value::Nil,
        ]);
        for lora in [None, Some("ad")] {
            let name = lora.map_or(Value::Nil, Value::from);
            let event = encode_event(&stored(lora), KvEventsFormat::Array);
            let fields = event.as_array().unwrap();
            assert_eq!(fields.len(), 9, "{lora:?}");
            assert_eq!(fields[7], name, "lora_name before extra_keys");
            assert_eq!(fields[8], expected);
            let event = encode_event(&stored(lora), KvEventsFormat::Map);
            let get = |k: &str| {
                event
                    .as_map()
                    .unwrap()
                    .iter()
                    .find(|(kk, _)| kk.as_str() == Some(k))
                    .map(|(_, v)| v.clone())
            };
            assert_eq!(get("extra_keys"), Some(expected.clone()));
            assert_eq!(get("lora_name"), Some(name));
        }
        // No block with extra keys: the field is left out, as msgspec omits a default.
        let mut plain = stored(None);
        if let KvCacheEvent::BlockStored { extra_keys, .. } = &mut plain {
            *extra_keys = vec![None; 3];
        }
        let event = encode_event(&plain, KvEventsFormat::Array);
        assert_eq!(event.as_array().unwrap().len(), 7);
    }
}
