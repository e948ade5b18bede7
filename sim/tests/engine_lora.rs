//! The mock engine's runtime LoRA behaviour over real sockets: vLLM's load/unload endpoints
//! (bodies, statuses, error shapes), `/v1/models` after them, and `vllm:lora_requests_info`.

mod common;

use std::time::{Duration, SystemTime, UNIX_EPOCH};

use common::{EngineProc, within};
use kvmesh_sim::load::client::LoadClient;
use serde_json::{Value, json};

async fn post(client: &LoadClient, url: &str, body: Value) -> (u16, http::HeaderMap, String) {
    let (status, headers, bytes) = within(30, client.post_json(url, body.to_string()))
        .await
        .expect("request");
    (
        status.as_u16(),
        headers,
        String::from_utf8_lossy(&bytes).into(),
    )
}

fn error(body: &str) -> Value {
    serde_json::from_str::<Value>(body).expect("JSON error body")["error"].clone()
}

async fn models(client: &LoadClient, url: &str) -> Vec<Value> {
    let (_, text) = within(10, client.get_text(&format!("{url}/v1/models")))
        .await
        .expect("models");
    let v: Value = serde_json::from_str(&text).unwrap();
    v["data"].as_array().unwrap().clone()
}

/// The `vllm:lora_requests_info` samples: (max_lora, waiting, running, value).
async fn lora_info(client: &LoadClient, url: &str) -> Vec<(String, String, String, f64)> {
    let (_, text) = within(10, client.get_text(&format!("{url}/metrics")))
        .await
        .expect("scrape");
    text.lines()
        .filter_map(|l| l.strip_prefix("vllm:lora_requests_info{"))
        .map(|l| {
            let (labels, value) = l.split_once("} ").unwrap();
            let get = |k: &str| {
                let start = labels.find(&format!("{k}=\"")).unwrap() + k.len() + 2;
                labels[start..].split('"').next().unwrap().to_owned()
            };
            let keys: Vec<&str> = labels
                .split(',')
                .filter_map(|kv| kv.split_once('=').map(|(k, _)| k))
                .filter(|k| !k.is_empty() && !k.contains('"'))
                .collect();
            // vLLM's declared label order, and nothing else (no model_name, no engine).
            assert_eq!(
                keys,
                ["max_lora", "waiting_lora_adapters", "running_lora_adapters"],
                "{l}"
            );
            (
                get("max_lora"),
                get("waiting_lora_adapters"),
                get("running_lora_adapters"),
                value.parse().unwrap(),
            )
        })
        .collect()
}

#[tokio::test]
async fn runtime_loading_answers_as_vllm_and_changes_the_served_models() {
    let engine = EngineProc::start(&["--instant", "--allow-runtime-lora-updating", "--lora", "ad"]);
    let client = LoadClient::new();
    let url = |p: &str| format!("{}{p}", engine.url);

    let (s, headers, body) = post(
        &client,
        &url("/v1/load_lora_adapter"),
        json!({"lora_name": "sql", "lora_path": "/adapters/sql"}),
    )
    .await;
    assert_eq!(
        (s, body.as_str()),
        (200, "Success: LoRA adapter 'sql' added successfully.")
    );
    assert!(headers.get("content-type").is_none(), "{headers:?}");
    let cards = models(&client, &engine.url).await;
    let sql = cards.iter().find(|c| c["id"] == "sql").expect("sql listed");
    assert_eq!(
        (&sql["root"], &sql["parent"]),
        (&json!("/adapters/sql"), &json!("mock-model"))
    );

    // The same name again, a static adapter's name, and missing values: vLLM's 400s.
    for name in ["sql", "ad"] {
        let (s, _, body) = post(
            &client,
            &url("/v1/load_lora_adapter"),
            json!({"lora_name": name, "lora_path": "/x"}),
        )
        .await;
        assert_eq!(s, 400, "{body}");
        assert_eq!(
            error(&body),
            json!({"message": format!("The lora adapter '{name}' has already been loaded. If you \
                want to load the adapter in place, set 'load_inplace' to True."),
                "type": "InvalidUserInput", "param": null, "code": 400})
        );
    }
    let (s, _, body) = post(
        &client,
        &url("/v1/load_lora_adapter"),
        json!({"lora_name": "x", "lora_path": ""}),
    )
    .await;
    assert_eq!(s, 400);
    assert_eq!(
        error(&body)["message"],
        "Both 'lora_name' and 'lora_path' must be provided."
    );
    let (s, _, body) = post(
        &client,
        &url("/v1/load_lora_adapter"),
        json!({"lora_name": "x"}),
    )
    .await;
    assert_eq!(
        (s, error(&body)["type"].clone()),
        (400, json!("BadRequestError"))
    );
    // In place: the new path replaces the old one.
    let (s, _, _) = post(
        &client,
        &url("/v1/load_lora_adapter"),
        json!({"lora_name": "sql", "lora_path": "/adapters/sql-v2", "load_inplace": true}),
    )
    .await;
    assert_eq!(s, 200);
    let cards = models(&client, &engine.url).await;
    assert_eq!(
        cards.iter().find(|c| c["id"] == "sql").unwrap()["root"],
        "/adapters/sql-v2"
    );

    let completion = json!({"model": "sql", "prompt": "hello", "max_tokens": 2});
    let (s, _, body) = post(&client, &url("/v1/completions"), completion.clone()).await;
    assert_eq!(s, 200, "{body}");

    let (s, _, body) = post(
        &client,
        &url("/v1/unload_lora_adapter"),
        json!({"lora_name": "sql"}),
    )
    .await;
    assert_eq!(
        (s, body.as_str()),
        (200, "Success: LoRA adapter 'sql' removed successfully.")
    );
    let (s, _, body) = post(
        &client,
        &url("/v1/unload_lora_adapter"),
        json!({"lora_name": "sql"}),
    )
    .await;
    assert_eq!(s, 404);
    assert_eq!(
        error(&body),
        json!({"message": "The lora adapter 'sql' cannot be found.", "type": "NotFoundError",
            "param": null, "code": 404})
    );
    let (s, _, body) = post(
        &client,
        &url("/v1/unload_lora_adapter"),
        json!({"lora_name": ""}),
    )
    .await;
    assert_eq!(
        (s, error(&body)["type"].clone()),
        (400, json!("InvalidUserInput"))
    );
    // Unknown again: requests for it are vLLM's 404, and it is gone from the list.
    let (s, _, _) = post(&client, &url("/v1/completions"), completion).await;
    assert_eq!(s, 404);
    assert!(
        !models(&client, &engine.url)
            .await
            .iter()
            .any(|c| c["id"] == "sql")
    );
}

#[tokio::test]
async fn without_the_flag_the_endpoints_do_not_exist() {
    let engine = EngineProc::start(&["--instant", "--lora", "ad"]);
    let client = LoadClient::new();
    for path in ["/v1/load_lora_adapter", "/v1/unload_lora_adapter"] {
        let (s, _, body) = post(
            &client,
            &format!("{}{path}", engine.url),
            json!({"lora_name": "ad", "lora_path": "/x"}),
        )
        .await;
        assert_eq!(s, 404, "{body}");
    }
}

#[tokio::test]
async fn lora_requests_info_names_running_and_waiting_adapters_with_a_timestamp() {
    // One slot, and loads slow enough to watch: "b" waits while "a" runs.
    let engine = EngineProc::start(&[
        "--lora",
        "a",
        "--lora",
        "b",
        "--max-loras",
        "1",
        "--lora-load-ms",
        "200",
        "--decode-step-ms",
        "5",
    ]);
    let client = LoadClient::new();
    let started = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_secs_f64();
    let send = |model: &'static str| {
        let client = client.clone();
        let url = format!("{}/v1/completions", engine.url);
        tokio::spawn(async move {
            let body = json!({"model": model, "prompt": "hello there", "max_tokens": 100,
                "ignore_eos": true});
            within(30, client.post_json(&url, body.to_string()))
                .await
                .expect("request")
                .0
                .as_u16()
        })
    };
    let a = send("a");
    tokio::time::sleep(Duration::from_millis(20)).await;
    let b = send("b");
    let newest = |samples: &[(String, String, String, f64)]| {
        samples.iter().max_by(|x, y| x.3.total_cmp(&y.3)).cloned()
    };
    let mut seen = None;
    for _ in 0..200 {
        if let Some(s) = newest(&lora_info(&client, &engine.url).await)
            && !s.1.is_empty()
            && !s.2.is_empty()
        {
            seen = Some(s);
            break;
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let (max_lora, waiting, running, at) = seen.expect("a step with one adapter running");
    assert_eq!(
        (max_lora.as_str(), waiting.as_str(), running.as_str()),
        ("1", "b", "a")
    );
    assert!(
        at >= started - 1.0 && at < started + 60.0,
        "{at} vs {started}"
    );
    assert_eq!((a.await.unwrap(), b.await.unwrap()), (200, 200));
    // Idle again: the newest label set is empty, and the older ones are still exported.
    let samples = lora_info(&client, &engine.url).await;
    let last = newest(&samples).unwrap();
    assert_eq!((last.1.as_str(), last.2.as_str()), ("", ""));
    assert!(samples.iter().any(|s| s.2 == "b"), "{samples:?}");
    assert!(samples.iter().all(|s| s.0 == "1"));
}
