//! Realistic values of every decoded type, the raw material of the seed corpus: what a node,
//! a peer or a vLLM engine actually sends, so the fuzzers start from messages that decode.

use kvmesh_protocol::hashing::HASH_VERSION;
use kvmesh_protocol::kv_events::{BlockExtraKeys, KvEvent, Medium};
use kvmesh_protocol::lifecycle::{LoadReport, PrefixSample};
use kvmesh_protocol::route::RouteReason;
use kvmesh_protocol::summary::{SummaryBuilder, SummaryConfig};
use kvmesh_protocol::wire::{RequestHead, ResponseHead, WireError, WireErrorCode};
use kvmesh_protocol::{LoadDigest, Role};

pub fn digests() -> Vec<LoadDigest> {
    let busy = LoadDigest {
        version: 7,
        timestamp_ms: 1_790_000_000_000,
        running: 12,
        waiting: 3,
        kv_usage: 0.42,
        queued_tokens: Some(3_072),
        kv_capacity_blocks: 20_000,
        block_size: 16,
        ttft_ewma_ms: 180.5,
        prefill_tokens_per_s: 9_000.0,
        inflight_forwarded: 4,
        role: Role::Mixed,
        healthy: true,
        hash_version: HASH_VERSION,
        models: vec!["meta-llama/Llama-3.1-8B-Instruct".into()],
        loras: vec!["sql-lora".into()],
        lora_use: Default::default(),
    };
    let idle = LoadDigest {
        version: 1,
        running: 0,
        waiting: 0,
        kv_usage: 0.0,
        queued_tokens: None,
        ttft_ewma_ms: 0.0,
        prefill_tokens_per_s: 0.0,
        role: Role::Prefill,
        healthy: false,
        models: vec![],
        loras: vec![],
        ..busy.clone()
    };
    let full = LoadDigest {
        kv_usage: 1.0,
        role: Role::Decode,
        models: vec!["a".into(), "b".into(), "Qwen/Qwen2.5-7B-Instruct".into()],
        ..busy.clone()
    };
    vec![busy, idle, full]
}

fn load_report() -> LoadReport {
    LoadReport {
        digest_version: 41,
        running: 9,
        waiting: 2,
        kv_usage: 0.63,
        queued_tokens: Some(1_536),
        inflight: 3,
    }
}

pub fn request_heads() -> Vec<RequestHead> {
    let chat = RequestHead {
        request_id: "chatcmpl-5f1c2a".into(),
        hop_count: 1,
        deadline_unix_ms: 1_790_000_600_000,
        model: "meta-llama/Llama-3.1-8B-Instruct".into(),
        method: "POST".into(),
        path: "/v1/chat/completions".into(),
        headers: vec![
            ("content-type".into(), "application/json".into()),
            ("x-request-id".into(), "chatcmpl-5f1c2a".into()),
        ],
        reason: RouteReason::PrefixHit,
        entry_node: "node-a".into(),
        prefix_key: Some(0x9e37_79b9_7f4a_7c15),
        new_prefix: false,
        prefill_tokens: 2_048,
        decline_above_tokens: Some(300),
        streamed: true,
        prefix_samples: Vec::new(),
    };
    let retry = RequestHead {
        request_id: "cmpl-77".into(),
        hop_count: 1,
        deadline_unix_ms: 0,
        path: "/v1/completions".into(),
        headers: vec![],
        reason: RouteReason::Retry,
        prefix_key: None,
        new_prefix: true,
        prefill_tokens: 0,
        decline_above_tokens: None,
        streamed: false,
        prefix_samples: vec![
            PrefixSample {
                tokens: 16,
                hash: 0x51ed_2701_f3a5_c1b4,
            },
            PrefixSample {
                tokens: 2_304,
                hash: 0x2545_f491_4f6c_dd1d,
            },
        ],
        ..chat.clone()
    };
    vec![chat, retry]
}

pub fn response_heads() -> Vec<ResponseHead> {
    vec![
        ResponseHead {
            status: 200,
            headers: vec![("content-type".into(), "text/event-stream".into())],
            served_by: "node-b".into(),
            load: Some(load_report()),
        },
        ResponseHead {
            status: 400,
            headers: vec![("content-type".into(), "application/json".into())],
            served_by: "node-c".into(),
            load: None,
        },
    ]
}

pub fn wire_errors() -> Vec<WireError> {
    vec![
        WireError {
            code: WireErrorCode::Busy,
            message: "queue of 4100 prefill tokens over 300".into(),
            load: Some(load_report()),
        },
        WireError {
            code: WireErrorCode::Interrupted,
            message: "engine closed the stream".into(),
            load: None,
        },
    ]
}

/// An OpenAI chat body as an entry forwards it.
pub const CHAT_BODY: &[u8] = br#"{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a careful assistant."},{"role":"user","content":"What is the capital of France?"}],"stream":true,"max_tokens":64}"#;

/// SSE chunks as vLLM streams them.
pub const SSE_CHUNKS: [&[u8]; 3] = [
    b"data: {\"id\":\"chatcmpl-5f1c2a\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"Paris\"}}]}\n\n",
    b"data: {\"id\":\"chatcmpl-5f1c2a\",\"object\":\"chat.completion.chunk\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}]}\n\n",
    b"data: [DONE]\n\n",
];

/// Summary shards as a node publishes them, one generation per geometry: exact shards (few
/// hashes per shard), Bloom filters (many), and the default geometry.
pub fn shards() -> Vec<Vec<Vec<u8>>> {
    let geometries = [
        (4, 256, 40),
        (4, 64, 200),
        (SummaryConfig::default().num_shards, 1024, 1_000),
    ];
    (1..)
        .zip(geometries)
        .map(|(generation, (num_shards, shard_bytes, count))| {
            let config = SummaryConfig {
                num_shards,
                shard_bytes,
            };
            let mut builder = SummaryBuilder::new(config, generation).expect("valid geometry");
            for hash in chain_hashes(count) {
                builder.insert(hash);
            }
            builder
                .publish_dirty()
                .into_iter()
                .map(|s| s.bytes)
                .collect()
        })
        .collect()
}

/// Spread-out 64-bit hashes, like the chain hashes a summary holds.
pub fn chain_hashes(count: u64) -> Vec<u64> {
    (1..=count)
        .map(|i| i.wrapping_mul(0x9e37_79b9_7f4a_7c15).rotate_left(17))
        .collect()
}

/// vLLM's KV events for two requests sharing a prefix, an offload of the shared blocks to
/// CPU, an eviction and a reset: what one engine publishes in a few batches.
pub fn kv_events(block_size: u32) -> Vec<Vec<KvEvent>> {
    let bs = block_size as usize;
    let tokens = |from: u32, blocks: usize| (from..).take(blocks * bs).collect::<Vec<u32>>();
    vec![
        vec![KvEvent::BlockStored {
            block_hashes: vec![0x1111, 0x2222, 0x3333],
            parent_block_hash: None,
            token_ids: tokens(100, 3),
            block_size,
            lora_name: None,
            medium: Medium::Gpu,
            extra_keys: vec![],
        }],
        vec![
            KvEvent::BlockStored {
                block_hashes: vec![0x4444],
                parent_block_hash: Some(0x2222),
                token_ids: tokens(900, 1),
                block_size,
                lora_name: None,
                medium: Medium::Gpu,
                extra_keys: vec![BlockExtraKeys::None],
            },
            KvEvent::BlockStored {
                block_hashes: vec![0x1111, 0x2222],
                parent_block_hash: None,
                token_ids: vec![],
                block_size,
                lora_name: None,
                medium: Medium::Cpu,
                extra_keys: vec![],
            },
            KvEvent::BlockStored {
                block_hashes: vec![0x5555, 0x6666],
                parent_block_hash: None,
                token_ids: tokens(7, 2),
                block_size,
                lora_name: Some("sql-lora".into()),
                medium: Medium::Gpu,
                extra_keys: vec![BlockExtraKeys::None, BlockExtraKeys::Opaque],
            },
        ],
        vec![
            KvEvent::BlockRemoved {
                block_hashes: vec![0x3333, 0x4444],
                medium: Medium::Gpu,
            },
            KvEvent::BlockRemoved {
                block_hashes: vec![0x1111],
                medium: Medium::Cpu,
            },
        ],
        vec![KvEvent::AllBlocksCleared],
    ]
}

/// OpenAI request bodies of every shape the hashing reads.
pub const REQUEST_BODIES: [&str; 9] = [
    r#"{"model":"meta-llama/Llama-3.1-8B-Instruct","messages":[{"role":"system","content":"You are a careful assistant. Answer in one sentence."},{"role":"user","content":"What is the capital of France?"},{"role":"assistant","content":"Paris."},{"role":"user","content":"And of Italy?"}],"stream":true}"#,
    r#"{"model":"m","cache_salt":"tenant-7","user":"alice","messages":[{"role":"user","name":"alice","content":[{"type":"text","text":"Describe this picture in detail, please."},{"type":"image_url","image_url":{"url":"data:image/png;base64,iVBORw0KGgoAAAANSUhEUgAAAAEAAAABCAYAAAAfFcSJAAAADUlEQVR42mNkYPhfDwAChwGA60e6kgAAAABJRU5ErkJggg=="}},{"type":"image_url","image_url":{"url":"https://example.com/cat.png"}}]}]}"#,
    r#"{"model":"m","tools":[{"type":"function","function":{"name":"get_weather","parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}],"messages":[{"role":"user","content":"Weather in Paris?"},{"role":"assistant","content":null,"tool_calls":[{"id":"call_1","type":"function","function":{"name":"get_weather","arguments":"{\"city\":\"Paris\"}"}}]},{"role":"tool","tool_call_id":"call_1","content":"18C, clear"}]}"#,
    r#"{"model":"m","messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"UklGRiQAAABXQVZFZm10IBAAAAABAAEAQB8AAEAfAAABAAgAZGF0YQAAAAA=","format":"wav"}},{"type":"video_url","video_url":"https://example.com/v.mp4"},{"type":"refusal","refusal":"no"}]}]}"#,
    r#"{"model":"meta-llama/Llama-3.1-8B-Instruct","prompt":"Once upon a time, in a land far away, there lived a router that remembered every prefix it had ever seen.","max_tokens":32}"#,
    r#"{"model":"m","prompt":[1,2,3,4,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21,22,23,24,25,26,27,28,29,30,31,32,33]}"#,
    r#"{"model":"m","prompt":[[101,102,103,104,105,106,107,108,109,110,111,112,113,114,115,116,117],[1,2]]}"#,
    r#"{"model":"sql-lora","prompt":["SELECT name FROM users WHERE id = 1; -- explain this query in detail please","second"],"cache_salt":null}"#,
    r#"{"model":"m","messages":[{"role":"user","content":{"unexpected":"object content"}},{"role":"assistant","function_call":{"name":"f","arguments":"{}"}}]}"#,
];

/// vLLM `/metrics` expositions: a current vLLM with two data-parallel engines, and one from
/// before 0.12 with the removed names.
pub const METRICS_TEXTS: [&str; 2] = [
    r#"# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
vllm:num_requests_waiting{engine="0",model_name="m"} 4.0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
vllm:kv_cache_usage_perc{engine="1",model_name="m"} 0.25
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 1000.0
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 640.0
vllm:prompt_tokens_total{engine="0",model_name="m"} 1000.0
vllm:time_to_first_token_seconds_bucket{engine="0",le="+Inf",model_name="m"} 10.0
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 10.0
vllm:request_prefill_time_seconds_sum{engine="0",model_name="m"} 1.5
vllm:cache_config_info{block_size="16",cache_dtype="auto",engine="0",num_gpu_blocks="8192"} 1.0
vllm:num_preemptions_total{engine="0",model_name="m"} 2.0
"#,
    r#"# TYPE vllm:gpu_cache_usage_perc gauge
vllm:gpu_cache_usage_perc{model_name="m"} 0.8
vllm:gpu_prefix_cache_queries_total{model_name="m"} 50
vllm:gpu_prefix_cache_hits_total{model_name="m"} 5
vllm:num_requests_running{model_name="m"} 1 1790000000000
vllm:num_requests_waiting{model_name="m"} +Inf
"#,
];
