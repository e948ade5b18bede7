//! The mock engine over real sockets: shapes, errors, metrics, prefix caching, PD legs.

mod common;

use std::time::Duration;

use common::{EngineProc, metric, within};
use kvmesh_sim::engine::model::tokenizer::tokenize;
use kvmesh_sim::load::client::LoadClient;
use openmetrics_parser::PrometheusValue;
use serde_json::{Value, json};

fn text_of_tokens(n: usize, seed: u64) -> String {
    kvmesh_sim::text::text(seed, n)
}

async fn post(client: &LoadClient, url: &str, body: impl Into<bytes::Bytes>) -> (u16, Value) {
    let (status, _, bytes) = within(30, client.post_json(url, body))
        .await
        .expect("request");
    let v = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    (status.as_u16(), v)
}

#[tokio::test]
async fn repeated_long_prompt_has_a_much_smaller_second_ttft_and_counts_hits() {
    // The legacy engine's slow prefill (12,000 tokens/s) keeps the first TTFT far above the
    // noise of a loaded machine; the cache behaviour checked here is the same on every profile.
    let engine = EngineProc::start(&["--time-scale", "0.5", "--engine-profile", "legacy"]);
    let client = LoadClient::new();
    let prompt = text_of_tokens(8000, 1);
    let body = json!({"prompt": prompt, "max_tokens": 2, "stream": true}).to_string();
    let url = format!("{}/v1/completions", engine.url);
    let hits0 = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
    let first = within(
        60,
        client.measure(
            &url,
            body.clone().into(),
            &[],
            true,
            false,
            Duration::from_secs(60),
        ),
    )
    .await;
    assert!(first.error.is_none(), "{first:?}");
    let hits1 = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
    let second = within(
        60,
        client.measure(&url, body.into(), &[], true, false, Duration::from_secs(60)),
    )
    .await;
    assert!(second.error.is_none(), "{second:?}");
    let hits2 = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
    let (t1, t2) = (first.ttft.unwrap(), second.ttft.unwrap());
    // Modelled: ~0.36 s for 8000 uncached tokens at --time-scale 0.5, ~7 ms when cached.
    assert!(t1 >= Duration::from_millis(300), "first TTFT {t1:?}");
    assert!(t2 * 3 < t1, "second TTFT {t2:?} vs first {t1:?}");
    assert_eq!(hits1 - hits0, 0.0);
    assert_eq!(hits2 - hits1, (7999 / 16 * 16) as f64);
    assert_eq!(first.output_tokens, 2);
}

#[tokio::test]
async fn metrics_parse_with_a_prometheus_parser_and_carry_vllm_names() {
    let engine = EngineProc::start(&["--instant", "--kv-blocks", "1234", "--model", "org/m"]);
    let client = LoadClient::new();
    let (s, _) = post(
        &client,
        &format!("{}/v1/completions", engine.url),
        r#"{"prompt":"hello there","max_tokens":3}"#,
    )
    .await;
    assert_eq!(s, 200);
    let (status, text) = within(10, client.get_text(&format!("{}/metrics", engine.url)))
        .await
        .unwrap();
    assert_eq!(status, 200);
    let parsed = openmetrics_parser::prometheus::parse_prometheus(&text).expect("valid exposition");
    let fam = |name: &str| {
        parsed
            .families
            .get(name)
            .or_else(|| parsed.families.get(name.trim_end_matches("_total")))
            .unwrap_or_else(|| {
                panic!(
                    "missing {name}; have {:?}",
                    parsed.families.keys().collect::<Vec<_>>()
                )
            })
    };
    for name in [
        "vllm:num_requests_running",
        "vllm:num_requests_waiting",
        "vllm:kv_cache_usage_perc",
        "vllm:prefix_cache_queries_total",
        "vllm:prefix_cache_hits_total",
        "vllm:num_preemptions_total",
        "vllm:time_to_first_token_seconds",
        "vllm:cache_config_info",
    ] {
        let f = fam(name);
        for s in f.iter_samples() {
            let labels = s.get_labelset().unwrap();
            assert_eq!(
                labels.get_label_value("model_name"),
                Some("org/m"),
                "{name}"
            );
            assert_eq!(labels.get_label_value("engine"), Some("0"), "{name}");
        }
    }
    let info = fam("vllm:cache_config_info")
        .iter_samples()
        .next()
        .unwrap()
        .get_labelset()
        .unwrap();
    assert_eq!(info.get_label_value("block_size"), Some("16"));
    assert_eq!(info.get_label_value("num_gpu_blocks"), Some("1234"));
    let ttft = fam("vllm:time_to_first_token_seconds")
        .iter_samples()
        .next()
        .unwrap()
        .value
        .clone();
    match ttft {
        PrometheusValue::Histogram(h) => assert_eq!(h.count, Some(1)),
        other => panic!("TTFT is not a histogram: {other:?}"),
    }
    // Counters carry _total on the wire and the queries counted the 3-token prompt.
    assert!(
        text.contains("\nvllm:prefix_cache_queries_total{model_name=\"org/m\",engine=\"0\"} 3.0\n")
    );
}

#[tokio::test]
async fn bad_input_gets_openai_errors() {
    let engine = EngineProc::start(&["--instant", "--max-body-bytes", "2000", "--lora", "ad"]);
    let client = LoadClient::new();
    let url = format!("{}/v1/completions", engine.url);
    let chat = format!("{}/v1/chat/completions", engine.url);
    let check = |v: &Value, code: u64, kind: &str| {
        let e = &v["error"];
        assert_eq!(e["code"], json!(code), "{v}");
        assert_eq!(e["type"], json!(kind), "{v}");
        assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
        assert!(e.get("param").is_some(), "{v}");
    };
    let (s, v) = post(&client, &url, "{\"prompt\": ").await;
    assert_eq!(s, 400);
    check(&v, 400, "BadRequestError");
    let (s, v) = post(&client, &url, r#"{"max_tokens": 3}"#).await;
    assert_eq!(s, 400);
    check(&v, 400, "BadRequestError");
    let (s, v) = post(
        &client,
        &chat,
        r#"{"model":"nope","messages":[{"role":"user","content":"x"}]}"#,
    )
    .await;
    assert_eq!(s, 404);
    check(&v, 404, "NotFoundError");
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("mock-model, ad")
    );
    let big = json!({"prompt": "x".repeat(5000)}).to_string();
    let (s, v) = post(&client, &url, big).await;
    assert_eq!(s, 413);
    check(&v, 413, "RequestEntityTooLarge");
    let (s, v) = post(&client, &url, r#"{"prompt":"abc","max_tokens":100000000}"#).await;
    assert_eq!(s, 400);
    assert!(
        v["error"]["message"]
            .as_str()
            .unwrap()
            .contains("maximum context length")
    );
    let (s, _) = post(&client, &format!("{}/v1/nothing", engine.url), "{}").await;
    assert_eq!(s, 404);
    let (s, _) = within(10, client.get_text(&url)).await.unwrap();
    assert_eq!(s, 405);
    // Unknown fields are accepted, as vLLM accepts them; a LoRA name is a model.
    let (s, v) = post(
        &client,
        &url,
        r#"{"model":"ad","prompt":"abc","max_tokens":2,"frobnicate":{"x":1},"cache_salt":"s","priority":3}"#,
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["model"], json!("ad"));
    // The engine still works after all that.
    let (s, _) = within(10, client.get_text(&format!("{}/health", engine.url)))
        .await
        .unwrap();
    assert_eq!(s, 200);
}

#[tokio::test]
async fn streaming_shapes_and_the_sse_parser_agree_with_the_engine() {
    let engine = EngineProc::start(&["--time-scale", "0.05"]);
    let client = LoadClient::new();
    for (path, body) in [
        (
            "/v1/completions",
            json!({"prompt": "Once upon a time", "max_tokens": 7, "stream": true,
            "stream_options": {"include_usage": true}}),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "hi"}], "max_tokens": 5,
            "stream": true}),
        ),
    ] {
        let url = format!("{}{path}", engine.url);
        let raw = within(30, client.post_json(&url, body.to_string()))
            .await
            .unwrap();
        assert_eq!(raw.0, 200);
        assert_eq!(raw.1["content-type"], "text/event-stream; charset=utf-8");
        let text = String::from_utf8(raw.2.to_vec()).unwrap();
        assert!(text.ends_with("data: [DONE]\n\n"), "{text}");
        let chunks: Vec<Value> = text
            .split("\n\n")
            .filter_map(|e| e.strip_prefix("data: "))
            .filter(|d| *d != "[DONE]")
            .map(|d| serde_json::from_str(d).unwrap())
            .collect();
        let measured = within(
            30,
            client.measure(
                &url,
                body.to_string().into(),
                &[],
                true,
                true,
                Duration::from_secs(30),
            ),
        )
        .await;
        assert!(measured.error.is_none(), "{measured:?}");
        if path == "/v1/completions" {
            assert_eq!(chunks.len(), 8, "7 tokens + usage");
            assert_eq!(chunks[0]["object"], "text_completion");
            assert!(chunks[0]["choices"][0]["text"].as_str().unwrap().len() == 4);
            assert_eq!(chunks[6]["choices"][0]["finish_reason"], "length");
            assert_eq!(chunks[7]["choices"], json!([]));
            assert_eq!(chunks[7]["usage"]["completion_tokens"], 7);
            assert_eq!(
                chunks[7]["usage"]["prompt_tokens"],
                json!(tokenize("Once upon a time").len())
            );
            assert_eq!(measured.output_tokens, 7);
            assert_eq!(measured.itl.len(), 6);
        } else {
            assert_eq!(chunks[0]["object"], "chat.completion.chunk");
            assert_eq!(
                chunks[0]["choices"][0]["delta"],
                json!({"role": "assistant", "content": ""})
            );
            assert_eq!(chunks.len(), 6);
            assert!(chunks[1]["choices"][0]["delta"].get("role").is_none());
            assert_eq!(chunks[5]["choices"][0]["finish_reason"], "length");
            assert_eq!(measured.output_tokens, 5);
        }
        // The same seed and prompt give the same text, so the parser saw the whole stream.
        let streamed: String = chunks
            .iter()
            .filter_map(|c| {
                let ch = &c["choices"][0];
                ch["text"]
                    .as_str()
                    .or(ch["delta"]["content"].as_str())
                    .map(str::to_owned)
            })
            .collect();
        assert_eq!(measured.text, streamed);
        assert!(measured.ttft.is_some());
    }
}

#[tokio::test]
async fn tokenize_returns_the_ids_the_engine_uses() {
    let engine = EngineProc::start(&["--instant"]);
    let client = LoadClient::new();
    let (s, v) = post(
        &client,
        &format!("{}/tokenize", engine.url),
        r#"{"prompt":"abcdefghij"}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["tokens"], json!(tokenize("abcdefghij")));
    assert_eq!(v["count"], 3);
    let msgs =
        json!([{"role": "system", "content": "be brief"}, {"role": "user", "content": "hi"}]);
    let (_, tok) = post(
        &client,
        &format!("{}/tokenize", engine.url),
        json!({"messages": msgs}).to_string(),
    )
    .await;
    let (_, chat) = post(
        &client,
        &format!("{}/v1/chat/completions", engine.url),
        json!({"messages": msgs, "max_tokens": 1}).to_string(),
    )
    .await;
    assert_eq!(chat["usage"]["prompt_tokens"], tok["count"]);
    // A token-id prompt is used as is.
    let ids = tok["tokens"].clone();
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", engine.url),
        json!({"prompt": ids, "max_tokens": 1}).to_string(),
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["usage"]["prompt_tokens"], tok["count"]);
    // A batch gets one choice per prompt.
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", engine.url),
        r#"{"prompt":["abcd","efgh"],"max_tokens":2}"#,
    )
    .await;
    assert_eq!(s, 200);
    assert_eq!(v["choices"].as_array().unwrap().len(), 2);
    assert_eq!(v["usage"]["completion_tokens"], 4);
}

#[tokio::test]
async fn eviction_happens_at_capacity() {
    // 32 blocks of 16 tokens = 512 tokens of KV.
    let engine = EngineProc::start(&["--instant", "--kv-blocks", "32"]);
    let client = LoadClient::new();
    let url = format!("{}/v1/completions", engine.url);
    let send = |seed: u64| {
        let body = json!({"prompt": text_of_tokens(160, seed), "max_tokens": 1}).to_string();
        let (client, url) = (client.clone(), url.clone());
        async move { post(&client, &url, body).await }
    };
    send(1).await;
    let h0 = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
    send(1).await;
    let h1 = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
    assert_eq!(h1 - h0, 144.0, "9 of 10 blocks hit while cached");
    for seed in 2..6 {
        send(seed).await; // 4 × 10 blocks > 32: prompt 1 is the LRU victim
    }
    send(1).await;
    let h2 = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
    assert_eq!(h2 - h1, 0.0, "prompt 1 was evicted");
    let usage = metric(&client, &engine.url, "vllm:kv_cache_usage_perc").await;
    assert_eq!(usage, 0.0, "idle engine holds no blocks");
}

#[tokio::test]
async fn prefill_and_decode_legs_follow_the_nixl_protocol() {
    // Real time: pulling 250 blocks is modelled at ~55 ms after a 50 ms handshake, computing
    // 4000 tokens at ~350 ms on the legacy engine (an H100 computes them in ~100 ms, too close
    // to the pull for a real-time test on a loaded machine; the protocol is the same).
    let nixl = [
        "--kv-connector",
        "nixl",
        "--nixl-handshake-ms",
        "50",
        "--engine-profile",
        "legacy",
    ];
    let prefill = EngineProc::start(&nixl);
    let decode = EngineProc::start(&nixl);
    let client = LoadClient::new();
    let prompt = text_of_tokens(4000, 9);
    let leg1 = json!({"prompt": prompt, "max_tokens": 1, "stream": false, "kv_transfer_params": {
        "do_remote_decode": true, "do_remote_prefill": false, "remote_engine_id": null,
        "remote_block_ids": null, "remote_host": null, "remote_port": null}});
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", prefill.url),
        leg1.to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    let params = v["kv_transfer_params"].clone();
    assert_eq!(params["do_remote_prefill"], true);
    assert_eq!(params["do_remote_decode"], false);
    assert_eq!(params["remote_block_ids"].as_array().unwrap().len(), 250);
    assert!(params["remote_engine_id"].is_string());
    assert_eq!(params["remote_host"], "127.0.0.1");
    assert!(params["remote_port"].is_u64());
    let internal = params["remote_request_id"].as_str().unwrap();
    assert!(internal.starts_with("cmpl-"), "{internal}");
    // The decode leg pulls the KV (modelled) instead of computing it: fast first token.
    let leg2 =
        json!({"prompt": prompt, "max_tokens": 4, "stream": true, "kv_transfer_params": params});
    let url = format!("{}/v1/completions", decode.url);
    let out = within(
        30,
        client.measure(
            &url,
            leg2.to_string().into(),
            &[],
            true,
            false,
            Duration::from_secs(30),
        ),
    )
    .await;
    assert!(out.error.is_none(), "{out:?}");
    assert_eq!(out.output_tokens, 4);
    let plain = json!({"prompt": text_of_tokens(4000, 10), "max_tokens": 1, "stream": true});
    let local = within(
        30,
        client.measure(
            &url,
            plain.to_string().into(),
            &[],
            true,
            false,
            Duration::from_secs(30),
        ),
    )
    .await;
    assert!(
        out.ttft.unwrap() < local.ttft.unwrap(),
        "{:?} vs {:?}",
        out.ttft,
        local.ttft
    );
    // Like vLLM's NixlConnector, an engine takes either leg: the proxy decides.
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", decode.url),
        leg1.to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["kv_transfer_params"]["do_remote_prefill"], true);
    // Without a connector the params are ignored, as by vLLM without one.
    let plain_engine = EngineProc::start(&[]);
    let (s, v) = post(
        &client,
        &format!("{}/v1/completions", plain_engine.url),
        leg1.to_string(),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert_eq!(v["kv_transfer_params"], Value::Null);
    assert_eq!(v["usage"]["completion_tokens"], 1);
}

#[tokio::test]
async fn a_client_that_goes_away_gets_its_request_aborted() {
    let engine = EngineProc::start(&["--max-num-seqs", "1"]);
    let client = LoadClient::new();
    let url = format!("{}/v1/completions", engine.url);
    let long = json!({"prompt": "tell me a long story", "max_tokens": 5000, "ignore_eos": true, "stream": true});
    // One request streams (and holds the only slot), a second one waits in the queue; both
    // clients give up after 300 ms.
    let a = client.measure(
        &url,
        long.to_string().into(),
        &[],
        true,
        false,
        Duration::from_millis(300),
    );
    let b = client.measure(
        &url,
        long.to_string().into(),
        &[],
        true,
        false,
        Duration::from_millis(300),
    );
    let (a, b) = tokio::join!(a, b);
    assert_eq!(a.error, Some(kvmesh_sim::load::client::ErrorKind::Timeout));
    assert_eq!(b.error, Some(kvmesh_sim::load::client::ErrorKind::Timeout));
    let deadline = tokio::time::Instant::now() + Duration::from_secs(20);
    loop {
        let (_, text) = within(10, client.get_text(&format!("{}/metrics", engine.url)))
            .await
            .unwrap();
        let aborted = text.contains("finished_reason=\"abort\"} 2.0");
        let idle = text
            .contains("vllm:num_requests_running{model_name=\"mock-model\",engine=\"0\"} 0.0")
            && text
                .contains("vllm:num_requests_waiting{model_name=\"mock-model\",engine=\"0\"} 0.0");
        if aborted && idle {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "requests not aborted:\n{text}"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
