//! Issue 5 acceptance over real processes: 4 modelled engines and 4 sidecars, requests sent to
//! random entry nodes by the real load generator (`kvmesh-sim load`).
//!
//! What is asserted is what does not depend on the machine's speed: the engines' own
//! prefix-cache counters, where requests landed, and errors. Time to first token against
//! round-robin measured in the same test is printed, not asserted: debug sidecars on a loaded
//! 2-core box can lose it to round-robin, which goes straight to the engines (mean 181 ms
//! against 79 ms once, with 99% of the ideal hit rate). The figures against the ratios
//! come from this test run on release binaries (`KVMESH_BIN`, `KVMESH_SIM_BIN`) and from
//! `scripts/demo.sh`, and are recorded in BENCHMARKS.md#mock-demo.

use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::Duration;

use kvmesh_tests::load::{engine_urls, number, run_load, sidecar_urls, url_list};
use kvmesh_tests::openai::{completion_body, served_by};
use kvmesh_tests::sidecar::peer_entry;
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Cluster, Engine, EngineConfig, NodeSpec, Request, Timing, wait_for,
    wait_until,
};
use serde_json::Value;

const NODES: usize = 4;
const LOAD_TIMEOUT: Duration = Duration::from_secs(240);

/// Four engines with the given timing and extra flags, without sidecars (round-robin's).
fn engines(timing: Timing, args: &[&str]) -> Vec<Engine> {
    some_engines(NODES, timing, args)
}

/// `n` engines as [`engines`] starts them.
fn some_engines(n: usize, timing: Timing, args: &[&str]) -> Vec<Engine> {
    (0..n)
        .map(|i| {
            let mut config =
                EngineConfig::new(&format!("engine {i}"), &["mock-model"]).timing(timing);
            for arg in args {
                config = config.arg(arg);
            }
            config.arg("--seed").arg(&i.to_string()).start()
        })
        .collect()
}

/// Four nodes `n0`…`n3` whose engines run as [`engines`]' do; waits until every node sees all
/// the others.
fn mesh(timing: Timing, args: &[&str]) -> Cluster {
    let specs: Vec<NodeSpec> = (0..NODES)
        .map(|i| {
            NodeSpec::new(&format!("n{i}"), &["mock-model"])
                .timing(timing)
                .engine_args(args)
                .engine_args(&["--seed", &i.to_string()])
        })
        .collect();
    Cluster::start_converged(&specs)
}

/// Runs the load generator to completion and returns its JSON report.
fn load(targets: &str, pick: &str, engines: &str, out: &Path, args: &[&str]) -> Value {
    run_load(targets, pick, engines, out, args, LOAD_TIMEOUT)
}

/// Generated shared prefix, sized so that the 4 engines' KV caches can hold every group's
/// system prompt once but not once per engine: the regime where routing decides the hit rate.
const GSP: [&str; 14] = [
    "--workload",
    "gsp",
    "--gsp-groups",
    "16",
    "--gsp-prompts-per-group",
    "8",
    "--gsp-system-len",
    "2048",
    "--gsp-question-len",
    "128",
    "--gsp-output-len",
    "16",
    "--stream",
    "--seed",
];

#[test]
fn shared_prefixes_meet_their_cache_and_beat_round_robin() {
    let dir = tempfile::tempdir().expect("tempdir");
    let timing = Timing::Scaled(0.5);
    let engine_args = ["--kv-blocks", "1024"];
    let mut args: Vec<&str> = GSP.to_vec();
    args.extend(["7", "--rate", "16"]);

    let meshed = mesh(timing, &engine_args);
    let kvmesh = load(
        &sidecar_urls(meshed.nodes()),
        "random",
        &engine_urls(meshed.nodes()),
        &dir.path().join("kvmesh.json"),
        &args,
    );
    drop(meshed);

    // Fresh engines: round-robin starts from cold caches too.
    let direct = engines(timing, &engine_args);
    let engine_urls = url_list(direct.iter().map(Engine::url));
    let round_robin = load(
        &engine_urls,
        "round-robin",
        &engine_urls,
        &dir.path().join("rr.json"),
        &args,
    );

    // One infinite cache: the first prompt of each group misses everything, the other 7 hit
    // the 2048-token system prompt (block-aligned, 16-token blocks).
    let ideal = 7.0 * 2048.0 / (8.0 * (2048.0 + 128.0));
    let hit = number(&kvmesh, "/cluster/hit_rate");
    let rr_hit = number(&round_robin, "/cluster/hit_rate");
    let (ttft, rr_ttft) = (
        number(&kvmesh, "/ttft_s/mean"),
        number(&round_robin, "/ttft_s/mean"),
    );
    println!(
        "hit rate: kvmesh {:.1}% ({:.0}% of ideal {:.1}%), round-robin {:.1}%; mean TTFT: kvmesh \
         {:.1} ms, round-robin {:.1} ms (ratio {:.2}); p99: {:.1} ms vs {:.1} ms",
        hit * 100.0,
        hit / ideal * 100.0,
        ideal * 100.0,
        rr_hit * 100.0,
        ttft * 1e3,
        rr_ttft * 1e3,
        ttft / rr_ttft,
        number(&kvmesh, "/ttft_s/p99") * 1e3,
        number(&round_robin, "/ttft_s/p99") * 1e3,
    );
    assert_eq!(
        number(&kvmesh, "/requests/failed"),
        0.0,
        "kvmesh lost requests"
    );
    assert!(
        hit >= 0.9 * ideal,
        "hit rate {hit} below 90% of the ideal {ideal}"
    );
    assert!(
        hit > rr_hit + 0.1,
        "hit rate {hit} not clearly above round-robin's {rr_hit}"
    );
    let placed: f64 = kvmesh["placements"]
        .as_object()
        .expect("placements")
        .values()
        .filter_map(Value::as_f64)
        .sum();
    assert_eq!(
        placed,
        number(&kvmesh, "/requests/ok"),
        "every answer names its node"
    );
}

/// The load generator's offline placement (`--pick placement`), the reference a router's hit
/// rate is held against, deals each group's system prompt to one engine and the groups evenly:
/// every system prompt is computed once, so it reaches the ideal hit rate exactly, which
/// round-robin over the same fresh engines cannot.
#[test]
fn the_offline_placement_computes_each_shared_prompt_once_on_balanced_engines() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut args: Vec<&str> = GSP.to_vec();
    args.extend(["5", "--rate", "32"]);
    let run = |pick: &str| {
        let direct = some_engines(2, Timing::Scaled(0.1), &["--kv-blocks", "4096"]);
        let urls = url_list(direct.iter().map(Engine::url));
        let records = dir.path().join(format!("{pick}.records.jsonl"));
        let mut flags = args.clone();
        flags.extend(["--records", records.to_str().expect("utf-8 path")]);
        let report = load(
            &urls,
            pick,
            &urls,
            &dir.path().join(format!("{pick}.json")),
            &flags,
        );
        let mut per_target = std::collections::BTreeMap::<String, u32>::new();
        for line in std::fs::read_to_string(&records).expect("records").lines() {
            let record: Value = serde_json::from_str(line).expect("a JSON record");
            let target = record["target"].as_str().expect("a target").to_owned();
            *per_target.entry(target).or_default() += 1;
        }
        (report, per_target)
    };
    let (placed, per_target) = run("placement");
    let (round_robin, _) = run("round-robin");

    let ideal = 7.0 * 2048.0 / (8.0 * (2048.0 + 128.0));
    let hit = number(&placed, "/cluster/hit_rate");
    let rr_hit = number(&round_robin, "/cluster/hit_rate");
    println!(
        "hit rate: placement {hit:.4}, round-robin {rr_hit:.4}, ideal {ideal:.4}; requests per engine {per_target:?}"
    );
    assert_eq!(number(&placed, "/requests/failed"), 0.0);
    assert!(
        (hit - ideal).abs() < 1e-3,
        "the placement's hit rate {hit} is not the ideal {ideal}"
    );
    assert!(
        hit > rr_hit + 0.05,
        "placement {hit} against round-robin {rr_hit}"
    );
    let counts: Vec<u32> = per_target.values().copied().collect();
    assert_eq!(counts, vec![64, 64], "16 equal groups of 8 split 8 and 8");
}

#[test]
fn a_new_prefix_sent_to_every_entry_at_once_lands_on_one_engine() {
    let cluster = Arc::new(mesh(Timing::Instant, &[]));
    for round in 0..3 {
        // A long prompt nobody has seen, sent by 4 clients to 4 entry nodes at the same moment.
        let prompt = format!(
            "round {round}: {}",
            "a brand new system prompt. ".repeat(80)
        );
        let barrier = Arc::new(Barrier::new(NODES));
        let servers: Vec<String> = (0..NODES)
            .map(|i| {
                let (cluster, barrier, prompt) = (cluster.clone(), barrier.clone(), prompt.clone());
                std::thread::spawn(move || {
                    let request = Request::post_json(
                        "/v1/completions",
                        &completion_body("mock-model", &prompt, 4, false),
                    );
                    barrier.wait();
                    let response = cluster.nodes()[i].sidecar.send(request);
                    assert_eq!(response.status, 200, "{}", response.describe());
                    (
                        served_by(&response),
                        response.header("x-kvmesh-reason").unwrap_or("").to_string(),
                    )
                })
            })
            // Spawn all four before joining any: they meet at the barrier.
            .collect::<Vec<_>>()
            .into_iter()
            .map(|thread| thread.join().expect("client thread"))
            .map(|(node, reason)| {
                assert!(
                    matches!(reason.as_str(), "cold-hash" | "prefix-hit"),
                    "a new prefix was routed by {reason}"
                );
                node
            })
            .collect();
        assert!(
            servers.windows(2).all(|w| w[0] == w[1]),
            "round {round}: landed on {servers:?}"
        );
    }
}

/// A prefix behind every request the entries route is owed a holder on every engine. On idle
/// engines a holder always wins a request for its prefix, so without that the first engine to
/// compute it would serve all of them.
#[test]
fn a_prefix_behind_every_request_spreads_to_every_engine() {
    let cluster = mesh(Timing::Instant, &[]);
    let nodes = cluster.nodes();
    let system = "a system prompt behind every request. ".repeat(60);
    let mut servers = std::collections::BTreeSet::new();
    // Each entry sees the prefix in more requests than it takes to count its share.
    for i in 0..64 {
        let prompt = format!("{system}question {i}: what is {i} plus {i}?");
        let request = Request::post_json(
            "/v1/completions",
            &completion_body("mock-model", &prompt, 2, false),
        );
        let response = nodes[i % NODES].sidecar.send(request);
        assert_eq!(response.status, 200, "{}", response.describe());
        servers.insert(served_by(&response));
    }
    let new_holders: f64 = nodes
        .iter()
        .map(|node| {
            let sent = node
                .sidecar
                .metric(
                    "kvmesh_popular_prefix_routes_total",
                    &[("outcome", "new_holder")],
                )
                .expect("metrics");
            sent.unwrap_or(0.0)
        })
        .sum();
    assert_eq!(servers.len(), NODES, "served by {servers:?}");
    assert!(new_holders >= 3.0, "{new_holders} sent to new holders");
}

/// A new engine joins three whose caches are full, and prompts arrive that meet only a short
/// shared instruction anywhere: the new engine, with room for them, takes them. Without that
/// it would be one near-equal engine among four, behind each entry's own idle one, and get
/// work only by chance or once the others queued.
#[test]
fn a_joining_engine_takes_new_documents_that_full_ones_would_evict_for() {
    // 64 KV blocks of 16 tokens; a prompt is a 1-block instruction and a 25-block document:
    // two fill an engine, a third would evict.
    const KV_BLOCKS: u64 = 64;
    const DOCUMENT_BLOCKS: u64 = 25;
    let spec = |name: &str| {
        NodeSpec::new(name, &["mock-model"])
            .timing(Timing::Instant)
            .engine_args(&["--kv-blocks", &KV_BLOCKS.to_string()])
    };
    let mut cluster = Cluster::start_converged(&[spec("a"), spec("b"), spec("c")]);
    let instruction = "Answer from the document below and cite the lines you used.     ";
    assert_eq!(instruction.len(), 64, "one block");
    let prompt = |doc: usize| {
        let body = format!("document {doc:03}: a paragraph of reference text. ").repeat(40);
        format!("{instruction}{}", &body[..1_600])
    };
    let body = |doc: usize| completion_body("mock-model", &prompt(doc), 2, false);
    let send = |cluster: &Cluster, entry: &str, doc: usize| {
        let response = cluster
            .sidecar(entry)
            .send(Request::post_json("/v1/completions", &body(doc)));
        assert_eq!(response.status, 200, "{}", response.describe());
        served_by(&response)
    };
    let entries = ["a", "b", "c"];
    let seen_everywhere = |cluster: &Cluster, doc: usize, server: &str| {
        wait_for(CONVERGENCE_TIMEOUT, "every entry sees the document", || {
            entries.iter().try_for_each(|entry| {
                let seen = cluster
                    .sidecar(entry)
                    .sees_whole_prefix_at(&body(doc), server);
                seen.map(drop)
            })
        });
    };
    // Warm: documents until every entry sees every engine too full for one more (its own
    // by what it publishes, the others' by their summaries).
    let full = |cluster: &Cluster| -> Result<(), String> {
        for entry in entries {
            let view = cluster.sidecar(entry).debug_cluster()?;
            let peers = view["peers"].as_array().cloned().unwrap_or_default();
            let mut held = std::iter::once(&view).chain(&peers).map(|node| {
                let name = node["node"].as_str().unwrap_or_default().to_owned();
                (name, node["cached_blocks"].as_u64().unwrap_or(0))
            });
            let room = |(_, blocks): &(String, u64)| blocks + DOCUMENT_BLOCKS <= KV_BLOCKS;
            if let Some((name, blocks)) = held.find(room) {
                return Err(format!("{entry} sees {blocks} blocks at {name}"));
            }
        }
        Ok(())
    };
    let mut doc = 1;
    while full(&cluster).is_err() {
        assert!(doc <= 12, "12 documents did not fill three engines of 2");
        let entry = entries[doc % 3];
        let server = send(&cluster, entry, doc);
        seen_everywhere(&cluster, doc, &server);
        doc += 1;
    }

    cluster.join(&spec("d"));
    cluster.wait_membership(&["a", "b", "c", "d"], CONVERGENCE_TIMEOUT);
    wait_for(CONVERGENCE_TIMEOUT, "every entry has d's gauges", || {
        entries.iter().try_for_each(|entry| {
            let estimate = cluster.sidecar(entry).estimate_of("d");
            estimate
                .map(drop)
                .ok_or(format!("{entry} has no digest of d"))
        })
    });
    // Two new documents, each through another old entry: both fit at d.
    for (entry, doc) in [("a", 100), ("b", 101)] {
        let server = send(&cluster, entry, doc);
        assert_eq!(server, "d", "document {doc} entering at {entry}");
        seen_everywhere(&cluster, doc, "d");
    }
}

/// An entry whose recent prompts share no prefix says so (`kvmesh_prefixes_recur` 0: a new
/// prefix then goes to an engine that looks idle, if any, rather than to its rendezvous
/// engine); until it has seen enough requests to tell, it assumes they do.
#[test]
fn an_entry_tells_whether_its_prompts_share_prefixes() {
    let cluster = mesh(Timing::Instant, &[]);
    let entry = &cluster.nodes()[0].sidecar;
    let recur = || {
        entry
            .metric("kvmesh_prefixes_recur", &[])
            .expect("metrics")
            .expect("the gauge is set once a request was routed")
    };
    let send = |i: usize| {
        let prompt = format!("prompt {i} of its own: {}", "unrelated words. ".repeat(40));
        let request = Request::post_json(
            "/v1/completions",
            &completion_body("mock-model", &prompt, 2, false),
        );
        let response = entry.send(request);
        assert_eq!(response.status, 200, "{}", response.describe());
    };
    send(0);
    assert_eq!(recur(), 1.0, "one request says nothing yet");
    for i in 1..64 {
        send(i);
    }
    assert_eq!(recur(), 0.0, "64 prompts, each its own");
}

/// Where an entry's prompts share no prefixes, a new one goes to an engine gossip shows idle,
/// not to its rendezvous engine when that one is running another client's request: nothing
/// is likely to come back for the prompt, and joining a running batch waits for its step.
/// Three of the four engines are kept busy straight at the engine; the entry's own is idle
/// between its requests. By rendezvous alone about a quarter would land there.
#[test]
fn where_prompts_share_nothing_a_new_one_goes_to_an_idle_engine() {
    let cluster = mesh(Timing::Scaled(1.0), &[]);
    let entry = &cluster.nodes()[0].sidecar;
    let send = |i: usize| {
        let prompt = format!("prompt {i} of its own: {}", "unrelated words. ".repeat(40));
        let response = entry.post_json(
            "/v1/completions",
            &completion_body("mock-model", &prompt, 2, false),
        );
        assert_eq!(response.status, 200, "{}", response.describe());
        served_by(&response)
    };
    for i in 0..64 {
        send(i);
    }
    let recur = entry.metric("kvmesh_prefixes_recur", &[]).expect("metrics");
    assert_eq!(recur, Some(0.0), "64 prompts, each its own");

    // Another client's long requests, straight to the engines of n1..n3.
    let busy: Vec<_> = cluster.nodes()[1..]
        .iter()
        .map(|node| {
            let engine = node.engine.addr();
            std::thread::spawn(move || {
                let body = serde_json::json!({"model": "mock-model", "prompt": "a long answer",
                    "max_tokens": 3000, "ignore_eos": true});
                // Ends when the engine does: the cluster is dropped first.
                let _ = Request::post_json("/v1/completions", &body)
                    .timeout(Duration::from_secs(120))
                    .send(engine);
            })
        })
        .collect();
    let digest_of = |view: &Value, node: &str| -> Option<(u64, u64)> {
        let digest = match node {
            "n0" => &view["digest"],
            _ => &peer_entry(view, node)?["digest"],
        };
        Some((digest["running"].as_u64()?, digest["waiting"].as_u64()?))
    };
    // Every entry's view of an engine is its gossiped digest, its own engine's included.
    let looks = |busy: &[&str], idle: &str| {
        entry.debug_cluster().is_ok_and(|view| {
            busy.iter()
                .all(|n| digest_of(&view, n).is_some_and(|(running, _)| running >= 1))
                && digest_of(&view, idle) == Some((0, 0))
        })
    };
    let mut served = Vec::new();
    for i in 0..12 {
        wait_until(
            CONVERGENCE_TIMEOUT,
            "n0 to see n1..n3 busy and its own engine idle",
            || looks(&["n1", "n2", "n3"], "n0"),
        );
        // The entry's last send counts against its engine until a digest built after it.
        std::thread::sleep(Duration::from_millis(300));
        served.push(send(1_000 + i));
    }
    let at_idle = served.iter().filter(|n| *n == "n0").count();
    assert!(
        at_idle >= 9,
        "{at_idle} of 12 new prompts went to the idle engine: {served:?}"
    );
    drop(cluster);
    for thread in busy {
        thread.join().expect("busy client");
    }
}

#[test]
fn a_killed_node_stops_receiving_traffic_and_no_unstarted_request_is_lost() {
    let dir = tempfile::tempdir().expect("tempdir");
    let mut cluster = mesh(Timing::Scaled(0.2), &[]);
    let survivors = sidecar_urls(&cluster.nodes()[..NODES - 1]);
    let engine_urls = engine_urls(cluster.nodes());
    // Non-streamed: nothing reaches a client before its answer is complete, so a request on
    // the killed node has not started and must be retried elsewhere, never lost.
    let args = [
        "--workload",
        "gsp",
        "--gsp-groups",
        "12",
        "--gsp-prompts-per-group",
        "20",
        "--gsp-system-len",
        "512",
        "--gsp-question-len",
        "64",
        "--gsp-output-len",
        "16",
        "--rate",
        "40",
        "--seed",
        "3",
    ];
    let killed = std::thread::scope(|scope| {
        let running = scope.spawn(|| {
            load(
                &survivors,
                "random",
                &engine_urls,
                &dir.path().join("during.json"),
                &args,
            )
        });
        // Killed while its engine works on requests the survivors forwarded to it: those
        // have not started (non-streamed) and must be retried elsewhere.
        wait_until(
            Duration::from_secs(30),
            "requests in flight at the node to be killed",
            || {
                cluster
                    .node("n3")
                    .engine
                    .metric("vllm:num_requests_running", &[])
                    > 0.0
            },
        );
        cluster.node_mut("n3").sidecar.kill9();
        running.join().expect("load thread")
    });
    println!("during the kill: {}", killed["placements"]);
    assert_eq!(
        number(&killed, "/requests/failed"),
        0.0,
        "requests lost: {}",
        killed["errors"]
    );

    // The killed node is declared dead by the others.
    cluster.wait_membership(&["n0", "n1", "n2"], CONVERGENCE_TIMEOUT);
    let after = load(
        &survivors,
        "random",
        &engine_urls,
        &dir.path().join("after.json"),
        &args,
    );
    assert_eq!(
        number(&after, "/requests/failed"),
        0.0,
        "requests lost: {}",
        after["errors"]
    );
    let placements = after["placements"].as_object().expect("placements");
    assert!(
        !placements.contains_key("n3"),
        "the dead node still got traffic: {placements:?}"
    );
    // Its groups were re-learned on the survivors: the run still hits the cache.
    let hit = number(&after, "/cluster/hit_rate");
    assert!(hit > 0.5, "hit rate after the failure {hit}");
}
