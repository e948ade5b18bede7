//! The mock engine's pooling, scoring, detokenize and Responses endpoints over real sockets:
//! shapes, errors, and that they run through the engine (metrics, prefix cache).

mod common;

use base64::Engine as _;
use common::{EngineProc, metric, within};
use kvmesh_sim::engine::model::tokenizer::tokenize;
use kvmesh_sim::load::client::LoadClient;
use serde_json::{Value, json};

async fn post(client: &LoadClient, url: &str, body: Value) -> (u16, Value) {
    let (status, _, bytes) = within(30, client.post_json(url, body.to_string()))
        .await
        .expect("request");
    let v = serde_json::from_slice(&bytes)
        .unwrap_or(Value::String(String::from_utf8_lossy(&bytes).into()));
    (status.as_u16(), v)
}

fn check_error(v: &Value, code: u64, kind: &str) {
    let e = &v["error"];
    assert_eq!(e["code"], json!(code), "{v}");
    assert_eq!(e["type"], json!(kind), "{v}");
    assert!(e["message"].as_str().is_some_and(|m| !m.is_empty()), "{v}");
    assert!(e.get("param").is_some(), "{v}");
}

async fn successes(client: &LoadClient, url: &str) -> f64 {
    metric(client, url, "vllm:request_success_total").await
}

#[tokio::test]
async fn pooling_endpoints_answer_vllm_shapes_and_count_as_requests() {
    let engine = EngineProc::start(&[
        "--instant",
        "--model",
        "emb",
        "--lora",
        "ad",
        "--max-model-len",
        "4096",
    ]);
    let client = LoadClient::new();
    let url = |p: &str| format!("{}{p}", engine.url);
    let before = successes(&client, &engine.url).await;

    let (s, v) = post(
        &client,
        &url("/v1/embeddings"),
        json!({"model": "emb", "input": ["hello world", "hello there"]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("embd-"));
    assert_eq!(
        (v["object"].clone(), v["model"].clone()),
        (json!("list"), json!("emb"))
    );
    assert_eq!(v["data"][1]["index"], 1);
    assert_eq!(v["data"][0]["object"], "embedding");
    let e0: Vec<f64> = serde_json::from_value(v["data"][0]["embedding"].clone()).unwrap();
    assert_eq!(e0.len(), 256);
    assert!((e0.iter().map(|x| x * x).sum::<f64>() - 1.0).abs() < 1e-4);
    let tokens = (tokenize("hello world").len() + tokenize("hello there").len()) as u64;
    assert_eq!(
        v["usage"],
        json!({"prompt_tokens": tokens, "total_tokens": tokens, "completion_tokens": 0,
            "prompt_tokens_details": null})
    );
    // The same input embeds the same way; base64 carries the same floats, cut to `dimensions`.
    let (_, again) = post(
        &client,
        &url("/v1/embeddings"),
        json!({"input": "hello world", "encoding_format": "base64", "dimensions": 8}),
    )
    .await;
    let b64 = again["data"][0]["embedding"].as_str().unwrap();
    let bytes = base64::engine::general_purpose::STANDARD
        .decode(b64)
        .unwrap();
    assert_eq!(bytes.len(), 8 * 4);
    let (_, full8) = post(
        &client,
        &url("/v1/embeddings"),
        json!({"input": [tokenize("hello world")], "dimensions": 8}),
    )
    .await;
    let floats: Vec<f32> = bytes
        .chunks(4)
        .map(|c| f32::from_le_bytes(c.try_into().unwrap()))
        .collect();
    assert_eq!(json!(floats), full8["data"][0]["embedding"]);

    let (s, v) = post(&client, &url("/pooling"), json!({"input": "abc"})).await;
    assert_eq!(s, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("pool-"));
    assert_eq!(v["data"][0]["object"], "pooling");
    assert_eq!(v["data"][0]["data"].as_array().unwrap().len(), 256);

    let (s, v) = post(
        &client,
        &url("/classify"),
        json!({"model": "ad", "input": ["good", "bad"]}),
    )
    .await;
    assert_eq!(s, 200, "{v}");
    assert!(v["id"].as_str().unwrap().starts_with("classify-"));
    assert_eq!(v["model"], "ad");
    let d = &v["data"][0];
    assert_eq!(d["num_classes"], 2);
    assert!(d["label"].as_str().unwrap().starts_with("LABEL_"));
    assert_eq!(d["probs"].as_array().unwrap().len(), 2);

    for path in ["/score", "/v1/score"] {
        let (s, v) = post(
            &client,
            &url(path),
            json!({"queries": "the red fox", "documents": ["the red fox", "tax law"]}),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        assert!(v["id"].as_str().unwrap().starts_with("score-"));
        assert_eq!(v["data"][1]["object"], "score");
        let (a, b) = (
            v["data"][0]["score"].as_f64(),
            v["data"][1]["score"].as_f64(),
        );
        assert!(a.unwrap() > 0.99 && a > b, "{v}");
    }
    for path in ["/rerank", "/v1/rerank", "/v2/rerank"] {
        let (s, v) = post(
            &client,
            &url(path),
            json!({"query": "the red fox", "documents": ["tax law", "the red fox runs", "cats"],
                "top_n": 2, "return_documents": true}),
        )
        .await;
        assert_eq!(s, 200, "{v}");
        let results = v["results"].as_array().unwrap();
        assert_eq!(results.len(), 2);
        assert_eq!(results[0]["index"], 1);
        assert_eq!(
            results[0]["document"],
            json!({"text": "the red fox runs", "multi_modal": null})
        );
        assert_eq!(v["usage"]["prompt_tokens"], v["usage"]["total_tokens"]);
        assert_eq!(v["model"], "emb");
    }
    // 2 + 1 + 1 + 1 + 2 embeddings and classifications, 2 × 2 scores, 3 × 3 reranks.
    let after = successes(&client, &engine.url).await;
    assert_eq!(after - before, (2 + 1 + 1 + 1 + 2 + 4 + 9) as f64);

    // Errors: vLLM's shapes, never a panic.
    let (s, v) = post(
        &client,
        &url("/v1/embeddings"),
        json!({"model": "x", "input": "a"}),
    )
    .await;
    assert_eq!(s, 404);
    check_error(&v, 404, "NotFoundError");
    assert!(v["error"]["message"].as_str().unwrap().contains("emb, ad"));
    for (path, body) in [
        ("/v1/embeddings", json!({"input": []})),
        ("/v1/embeddings", json!({"input": "a", "dimensions": 0})),
        (
            "/v1/embeddings",
            json!({"input": "a", "encoding_format": "hex"}),
        ),
        ("/pooling", json!({"input": "a", "task": "plugin"})),
        ("/classify", json!({"prompt": "a"})),
        (
            "/score",
            json!({"data_1": ["a", "b"], "data_2": ["c", "d", "e"]}),
        ),
        (
            "/rerank",
            json!({"query": "q", "documents": ["a"], "top_n": -1}),
        ),
        (
            "/rerank",
            json!({"query": "q", "documents": [{"content": []}]}),
        ),
        ("/v1/embeddings", json!({"input": "x".repeat(4 * 5000)})),
    ] {
        let (s, v) = post(&client, &url(path), body.clone()).await;
        assert_eq!(s, 400, "{path} {body}: {v}");
        check_error(&v, 400, "BadRequestError");
    }
    for path in [
        "/v1/embeddings",
        "/pooling",
        "/classify",
        "/score",
        "/v1/rerank",
        "/v2/rerank",
    ] {
        let (s, _) = within(10, client.get_text(&url(path))).await.unwrap();
        assert_eq!(s, 405, "{path}");
    }
    let (s, _) = within(10, client.get_text(&url("/health"))).await.unwrap();
    assert_eq!(s, 200);
}

#[tokio::test]
async fn embeddings_reuse_the_prefix_cache() {
    let engine = EngineProc::start(&["--instant"]);
    let client = LoadClient::new();
    let text = kvmesh_sim::text::text(3, 100);
    let url = format!("{}/v1/embeddings", engine.url);
    let (s, _) = post(&client, &url, json!({"input": text})).await;
    assert_eq!(s, 200);
    let hits0 = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
    post(&client, &url, json!({"input": text})).await;
    let hits1 = metric(&client, &engine.url, "vllm:prefix_cache_hits_total").await;
    assert_eq!(hits1 - hits0, (99 / 16 * 16) as f64);
}

#[tokio::test]
async fn detokenize_inverts_generated_text() {
    let engine = EngineProc::start(&["--instant"]);
    let client = LoadClient::new();
    let (_, c) = post(
        &client,
        &format!("{}/v1/completions", engine.url),
        json!({"prompt": "Once upon a time", "max_tokens": 6}),
    )
    .await;
    let text = c["choices"][0]["text"].as_str().unwrap().to_owned();
    let (_, t) = post(
        &client,
        &format!("{}/tokenize", engine.url),
        json!({"prompt": text}),
    )
    .await;
    let (s, d) = post(
        &client,
        &format!("{}/detokenize", engine.url),
        json!({"tokens": t["tokens"]}),
    )
    .await;
    assert_eq!(s, 200, "{d}");
    assert_eq!(d, json!({"prompt": text}));
    let (s, v) = post(
        &client,
        &format!("{}/detokenize", engine.url),
        json!({"tokens": [1, 999999]}),
    )
    .await;
    assert_eq!(s, 400);
    check_error(&v, 400, "BadRequestError");
    let (s, v) = post(
        &client,
        &format!("{}/detokenize", engine.url),
        json!({"model": "nope", "tokens": [1]}),
    )
    .await;
    assert_eq!(s, 404, "{v}");
    let (s, _) = within(10, client.get_text(&format!("{}/detokenize", engine.url)))
        .await
        .unwrap();
    assert_eq!(s, 405);
}

#[tokio::test]
async fn responses_answer_stream_store_and_continue_on_the_cached_prefix() {
    let engine = EngineProc::start(&["--time-scale", "0.05"]);
    let client = LoadClient::new();
    let url = format!("{}/v1/responses", engine.url);
    // With these instructions the first prompt's text is a whole number of tokens, so the
    // next turn's tokens extend its prompt and answer exactly.
    let question = kvmesh_sim::text::text(5, 200);
    let (s, first) = post(
        &client,
        &url,
        json!({"model": "mock-model", "input": question, "instructions": "be brief!!",
            "max_output_tokens": 40, "ignore_eos": true}),
    )
    .await;
    assert_eq!(s, 200, "{first}");
    let id = first["id"].as_str().unwrap().to_owned();
    assert!(id.starts_with("resp_"));
    assert_eq!(first["object"], "response");
    assert_eq!(first["status"], "incomplete");
    assert_eq!(
        first["incomplete_details"],
        json!({"reason": "max_output_tokens"})
    );
    assert_eq!(first["instructions"], "be brief!!");
    let item = &first["output"][0];
    assert_eq!(
        (item["type"].clone(), item["role"].clone()),
        (json!("message"), json!("assistant"))
    );
    assert_eq!(item["content"][0]["type"], "output_text");
    let answer = item["content"][0]["text"].as_str().unwrap().to_owned();
    assert_eq!(answer.len(), 40 * 4);
    assert_eq!(first["usage"]["output_tokens"], 40);
    let input_tokens = first["usage"]["input_tokens"].as_u64().unwrap();
    assert_eq!(first["usage"]["total_tokens"], input_tokens + 40);
    assert_eq!(first["usage"]["input_tokens_details"]["cached_tokens"], 0);

    // A stored response can be read back.
    let (s, got) = within(10, client.get_text(&format!("{url}/{id}")))
        .await
        .unwrap();
    assert_eq!(s, 200);
    assert_eq!(serde_json::from_str::<Value>(&got).unwrap(), first);

    // The next turn renders the stored one first: its prompt and answer hit the cache.
    let (s, second) = post(
        &client,
        &url,
        json!({"input": "and then?", "instructions": "be brief!!", "previous_response_id": id,
            "max_output_tokens": 3, "stream": true}),
    )
    .await;
    assert_eq!(s, 200);
    let text = second.as_str().unwrap().to_owned();
    let events: Vec<(String, Value)> = text
        .split("\n\n")
        .filter(|e| !e.is_empty())
        .map(|e| {
            let (kind, data) = e.split_once('\n').unwrap();
            let kind = kind.strip_prefix("event: ").unwrap().to_owned();
            (
                kind,
                serde_json::from_str(data.strip_prefix("data: ").unwrap()).unwrap(),
            )
        })
        .collect();
    let kinds: Vec<&str> = events.iter().map(|(k, _)| k.as_str()).collect();
    assert_eq!(
        kinds[..4],
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added"
        ]
    );
    assert_eq!(
        kinds
            .iter()
            .filter(|k| **k == "response.output_text.delta")
            .count(),
        3
    );
    assert_eq!(
        kinds[kinds.len() - 4..],
        [
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed"
        ]
    );
    for (i, (kind, data)) in events.iter().enumerate() {
        assert_eq!(data["type"], json!(kind));
        assert_eq!(data["sequence_number"], json!(i));
    }
    let done = &events.last().unwrap().1["response"];
    assert_eq!(done["previous_response_id"], json!(id));
    let usage = &done["usage"];
    let second_input = usage["input_tokens"].as_u64().unwrap();
    assert!(second_input > input_tokens + 40);
    // The previous prompt and answer, less the partial last block, came from the cache.
    let cached = usage["input_tokens_details"]["cached_tokens"]
        .as_u64()
        .unwrap();
    assert!(
        cached >= (input_tokens + 40) / 16 * 16 - 16,
        "cached {cached} of {second_input}"
    );

    // Unknown and malformed ids: vLLM's errors.
    let (s, v) = post(
        &client,
        &url,
        json!({"input": "x", "previous_response_id": "resp_gone"}),
    )
    .await;
    assert_eq!(s, 404);
    check_error(&v, 404, "invalid_request_error");
    assert_eq!(
        v["error"]["message"],
        "Response with id 'resp_gone' not found."
    );
    assert_eq!(v["error"]["param"], "response_id");
    let (s, v) = post(
        &client,
        &url,
        json!({"input": "x", "previous_response_id": "nope"}),
    )
    .await;
    assert_eq!(s, 400);
    check_error(&v, 400, "invalid_request_error");
    let (s, v) = within(10, client.get_text(&format!("{url}/resp_gone")))
        .await
        .unwrap();
    assert_eq!(s, 404, "{v}");
    // `store: false` leaves nothing to continue.
    let (_, unstored) = post(
        &client,
        &url,
        json!({"input": "x", "store": false, "max_output_tokens": 1}),
    )
    .await;
    let uid = unstored["id"].as_str().unwrap();
    let (s, _) = post(
        &client,
        &url,
        json!({"input": "y", "previous_response_id": uid}),
    )
    .await;
    assert_eq!(s, 404);
    let (s, v) = post(&client, &url, json!({"input": "x", "model": "other"})).await;
    assert_eq!(s, 404);
    check_error(&v, 404, "NotFoundError");
    let (s, v) = post(&client, &url, json!({"input": 3})).await;
    assert_eq!(s, 400);
    check_error(&v, 400, "BadRequestError");
    let (s, _) = within(10, client.get_text(&url)).await.unwrap();
    assert_eq!(s, 405);
}
