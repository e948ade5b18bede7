//! `kvmesh-sim load` as a user runs it: a child process against engine child processes,
//! reading its JSON report.

mod common;

use std::process::Command;
use std::time::Duration;

use common::EngineProc;
use serde_json::Value;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn run_load(args: &[&str]) -> Value {
    let dir = scratch_dir("load");
    let json = dir.join("report.json");
    let mut child = Command::new(env!("CARGO_BIN_EXE_kvmesh-sim"))
        .arg("load")
        .args(args)
        .arg("--json")
        .arg(&json)
        .stdout(std::process::Stdio::piped())
        .spawn()
        .expect("spawn load");
    // Bounded wait: the loads below take well under a second of modelled time.
    let deadline = std::time::Instant::now() + Duration::from_secs(120);
    let status = loop {
        if let Some(s) = child.try_wait().unwrap() {
            break s;
        }
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            panic!("load generator did not finish in 120 s");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let mut table = String::new();
    use std::io::Read;
    child
        .stdout
        .take()
        .unwrap()
        .read_to_string(&mut table)
        .unwrap();
    assert!(status.success(), "load failed: {table}");
    assert!(table.contains("TTFT") && table.contains("p99"), "{table}");
    let report: Value = serde_json::from_slice(&std::fs::read(&json).unwrap()).unwrap();
    let _ = std::fs::remove_dir_all(&dir);
    report
}

/// A fresh directory under the system's temp dir, unique to this process and moment.
fn scratch_dir(tag: &str) -> std::path::PathBuf {
    let dir = std::env::temp_dir().join(format!(
        "kvmesh-sim-{tag}-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}

fn rand_suffix() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .subsec_nanos() as u64
}

#[test]
fn gsp_streaming_report_measures_latency_and_cluster_hit_rate() {
    let a = EngineProc::start(&["--time-scale", "0.02"]);
    let b = EngineProc::start(&["--time-scale", "0.02"]);
    let targets = format!("{},{}", a.url, b.url);
    let r = run_load(&[
        "--targets",
        &targets,
        "--pick",
        "round-robin",
        "--workload",
        "gsp",
        "--gsp-groups",
        "4",
        "--gsp-prompts-per-group",
        "8",
        "--gsp-system-len",
        "512",
        "--gsp-question-len",
        "32",
        "--gsp-output-len",
        "16",
        "--stream",
        "--concurrency",
        "4",
    ]);
    assert_eq!(r["schema"], "kvmesh-sim.load.v1");
    assert_eq!(r["requests"]["sent"], 32);
    assert_eq!(r["requests"]["ok"], 32, "{r}");
    assert_eq!(r["errors"], serde_json::json!({}));
    assert_eq!(r["tokens"]["output"], 32 * 16);
    assert_eq!(r["tokens"]["input"], 32 * 544);
    assert_eq!(r["ttft_s"]["count"], 32);
    assert_eq!(r["itl_s"]["count"], 32 * 15);
    for k in ["mean", "p50", "p90", "p99", "max"] {
        assert!(r["ttft_s"][k].as_f64().unwrap() > 0.0, "{k}");
        // Each request's E2E is at least its TTFT, so every order statistic is too.
        assert!(
            r["e2e_s"][k].as_f64().unwrap() >= r["ttft_s"][k].as_f64().unwrap(),
            "{k}"
        );
    }
    assert!(r["e2e_s"]["p50"].as_f64().unwrap() > r["ttft_s"]["p50"].as_f64().unwrap());
    // Round robin over two engines: 16 requests each, seen by the engines' own counters.
    let engines = r["engines"].as_array().unwrap();
    assert_eq!(engines.len(), 2);
    for e in engines {
        assert_eq!(e["requests"], 16.0, "{e}");
        assert!(e["error"].is_null());
    }
    assert_eq!(r["cluster"]["requests"], 32.0);
    assert_eq!(r["cluster"]["request_spread"]["cv"], 0.0);
    // 4 groups × 8 questions; each engine sees every group, so at most 8 misses of 32 system
    // prompts: the hit rate is well above half.
    let hit = r["cluster"]["hit_rate"].as_f64().unwrap();
    assert!(hit > 0.5 && hit < 1.0, "hit rate {hit}");
    assert_eq!(
        r["placements"],
        serde_json::json!({}),
        "no sidecar, no placements"
    );
}

#[test]
fn trace_chat_and_rag_workloads_run_against_the_engine() {
    let e = EngineProc::start(&["--time-scale", "0.01"]);
    let r = run_load(&[
        "--targets",
        &e.url,
        "--workload",
        "trace",
        "--requests",
        "20",
        "--time-scale",
        "0.001",
        "--max-input-tokens",
        "8192",
        "--max-output-tokens",
        "8",
    ]);
    assert_eq!(r["requests"]["ok"], 20, "{r}");
    assert_eq!(r["config"]["arrivals"], "trace");
    let r = run_load(&[
        "--targets",
        &e.url,
        "--workload",
        "chat",
        "--requests",
        "30",
        "--rate",
        "200",
        "--chat-turns",
        "3",
        "--chat-output-len",
        "8",
        "--stream",
    ]);
    assert_eq!(r["requests"]["ok"], 30, "{r}");
    // Later turns resend the history: most prompt tokens hit.
    assert!(r["cluster"]["hit_rate"].as_f64().unwrap() > 0.5, "{r}");
    let r = run_load(&[
        "--targets",
        &e.url,
        "--workload",
        "rag",
        "--requests",
        "30",
        "--concurrency",
        "8",
        "--api",
        "chat",
    ]);
    assert_eq!(r["requests"]["ok"], 30, "{r}");
    assert_eq!(r["config"]["api"], "chat");
}

/// A stand-in for a sidecar: answers every request with a fixed completion and the
/// `x-kvmesh-node` header, one request per connection.
async fn fake_sidecar(listener: tokio::net::TcpListener, node: &'static str) {
    loop {
        let Ok((mut s, _)) = listener.accept().await else {
            return;
        };
        tokio::spawn(async move {
            let mut buf = vec![0u8; 65536];
            let mut got = Vec::new();
            // Read headers and the declared body.
            loop {
                let n = s.read(&mut buf).await.unwrap_or(0);
                if n == 0 {
                    return;
                }
                got.extend_from_slice(&buf[..n]);
                let text = String::from_utf8_lossy(&got).to_lowercase();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text
                        .lines()
                        .find_map(|l| {
                            l.strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if got.len() >= end + 4 + len {
                        break;
                    }
                }
            }
            let body = r#"{"choices":[{"index":0,"text":" hi","finish_reason":"length"}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}"#;
            let resp = format!(
                "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\nx-kvmesh-node: {node}\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = s.write_all(resp.as_bytes()).await;
        });
    }
}

#[test]
fn placements_are_counted_from_the_node_header() {
    let rt = tokio::runtime::Runtime::new().unwrap();
    let (a, b) = rt.block_on(async {
        let a = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let b = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        (a, b)
    });
    let targets = format!(
        "http://{},http://{}",
        a.local_addr().unwrap(),
        b.local_addr().unwrap()
    );
    rt.spawn(fake_sidecar(a, "node-a"));
    rt.spawn(fake_sidecar(b, "node-b"));
    let r = run_load(&[
        "--targets",
        &targets,
        "--pick",
        "round-robin",
        "--workload",
        "gsp",
        "--requests",
        "10",
        "--gsp-system-len",
        "8",
        "--gsp-question-len",
        "8",
        "--gsp-output-len",
        "1",
        "--no-scrape",
    ]);
    assert_eq!(r["requests"]["ok"], 10, "{r}");
    assert_eq!(
        r["placements"],
        serde_json::json!({"node-a": 5, "node-b": 5})
    );
    assert_eq!(r["cluster"]["hit_rate"], Value::Null);
}

#[test]
fn records_file_has_one_line_per_request_with_cached_tokens() {
    let engine = EngineProc::start(&["--time-scale", "0.02", "--enable-prompt-tokens-details"]);
    let dir = scratch_dir("records");
    let records = dir.join("records.jsonl");
    let records_arg = records.to_str().unwrap().to_owned();
    let r = run_load(&[
        "--targets",
        &engine.url,
        "--workload",
        "gsp",
        "--gsp-groups",
        "2",
        "--gsp-prompts-per-group",
        "4",
        "--gsp-system-len",
        "512",
        "--gsp-question-len",
        "32",
        "--gsp-output-len",
        "4",
        "--stream",
        "--concurrency",
        "1",
        "--records",
        &records_arg,
    ]);
    assert_eq!(r["requests"]["ok"], 8, "{r}");
    let lines: Vec<Value> = std::fs::read_to_string(&records)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 8);
    let mut last_sent = 0.0;
    for (i, line) in lines.iter().enumerate() {
        assert_eq!(line["index"], i as u64, "send order");
        let sent = line["sent_at_s"].as_f64().unwrap();
        assert!(sent >= last_sent, "one at a time, in order: {line}");
        last_sent = sent;
        assert_eq!(line["status"], 200);
        assert!(line["error"].is_null());
        assert!(line["ttft_s"].as_f64().unwrap() <= line["e2e_s"].as_f64().unwrap());
        assert_eq!(line["target"], engine.url.trim_end_matches('/'));
        assert!(line["node"].is_null(), "no sidecar in between");
        assert!(line["prefill_node"].is_null(), "no disaggregation: {line}");
        assert_eq!(line["output_tokens"], 4);
        let gap = line["itl_max_s"]
            .as_f64()
            .expect("streamed: a largest token gap");
        assert!(
            gap >= 0.0 && gap <= line["e2e_s"].as_f64().unwrap(),
            "{line}"
        );
    }
    // One engine, one request at a time: each group's first prompt computes its 512-token
    // system prompt, the other three find it cached.
    let cached: Vec<u64> = lines
        .iter()
        .map(|l| l["cached_tokens"].as_u64().expect("cached tokens reported"))
        .collect();
    let hits = cached.iter().filter(|&&c| c >= 512).count();
    assert_eq!(hits, 6, "{cached:?}");
    let _ = std::fs::remove_dir_all(&dir);
}
