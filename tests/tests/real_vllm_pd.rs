//! Issue 45 §2: prefill/decode disaggregation over real vLLM. Two CPU servers run vLLM's
//! NixlConnector (NIXL over UCX, KV buffers in CPU memory: `nixl` is pinned in
//! `scripts/lib/vllm/requirements.txt`), one behind a `--role prefill` sidecar, one behind a
//! `--role decode` sidecar. A long prompt entering at either node is prefilled on one server and
//! decoded on the other, and vLLM's own counters say so: the prefill server computed the
//! prompt, the decode server received it by KV transfer
//! (`vllm:prompt_tokens_by_source_total{source="external_kv_transfer"}`) and generated the
//! answer. Its own binary, apart from `real_vllm/`: each test binary runs alone (nextest's
//! `real-vllm` group), so that no more than two vLLM servers run at once.

use std::time::{Duration, Instant};

use kvmesh_tests::certs::ClusterCa;
use kvmesh_tests::cluster::wait_meshed;
use kvmesh_tests::openai::{chat_body, completion_body, served_by};
use kvmesh_tests::vllm::{MODEL, core, post_ok, prompt, start_all};
use kvmesh_tests::{
    CONVERGENCE_TIMEOUT, Response, Sidecar, SidecarConfig, VllmConfig, VllmServer, stage,
    wait_until,
};
use serde_json::{Value, json};

/// Prompts long enough to be split: past `[pd] min_uncached_tokens` (512 by default).
const LONG_PROMPT_TOKENS: usize = 2048;
/// Tokens each answer asks for (`ignore_eos`, so exactly these).
const ANSWER_TOKENS: u64 = 16;
const LEARN_TIMEOUT: Duration = Duration::from_secs(30);

fn nixl_server(name: &str, index: usize) -> VllmConfig {
    VllmConfig::new(name, core(index))
        .nixl()
        .args(&["--num-gpu-blocks-override", "500"])
}

/// What vLLM's counters say about the prompt tokens and answers of one server.
#[derive(Debug, Clone, Copy, PartialEq)]
struct Counters {
    computed: f64,
    transferred: f64,
    generated: f64,
}

impl Counters {
    fn of(server: &VllmServer) -> Self {
        let source = |source: &str| {
            server.metric("vllm:prompt_tokens_by_source_total", &[("source", source)])
        };
        Counters {
            computed: source("local_compute"),
            transferred: source("external_kv_transfer"),
            generated: server.metric("vllm:generation_tokens_total", &[]),
        }
    }

    fn since(self, before: Counters) -> Counters {
        Counters {
            computed: self.computed - before.computed,
            transferred: self.transferred - before.transferred,
            generated: self.generated - before.generated,
        }
    }
}

#[test]
fn a_long_prompt_is_prefilled_on_one_vllm_and_decoded_on_the_other() {
    let ca = ClusterCa::init("kvmesh-vllm-pd");
    let servers: [VllmServer; 2] = start_all(vec![
        nixl_server("vllm prefill", 0),
        nixl_server("vllm decode", 1),
    ])
    .try_into()
    .unwrap_or_else(|_| panic!("two servers"));
    let (p, d) = stage("sidecars p (prefill) and d (decode) mesh", || {
        let p = SidecarConfig::new("p", &servers[0].url(), &ca)
            .arg("--role")
            .arg("prefill")
            .start();
        let d = SidecarConfig::new("d", &servers[1].url(), &ca)
            .seeds(&[p.mesh_addr()])
            .arg("--role")
            .arg("decode")
            .start();
        wait_meshed(&[&p, &d], CONVERGENCE_TIMEOUT);
        for (observer, peer, role) in [(&p, "d", "decode"), (&d, "p", "prefill")] {
            wait_until(LEARN_TIMEOUT, "each node knows the other's role", || {
                observer
                    .digest_of(peer)
                    .is_some_and(|digest| digest["role"] == role && digest["healthy"] == true)
            });
        }
        (p, d)
    });
    stage("completions are split, entering at either node", || {
        for (i, entry) in [&p, &d].into_iter().enumerate() {
            for stream in [false, true] {
                let text = prompt(&format!("pd completion {i} {stream}"), LONG_PROMPT_TOKENS);
                let mut body = completion_body(MODEL, &text, ANSWER_TOKENS as u32, stream);
                body["ignore_eos"] = json!(true);
                split(entry, "/v1/completions", &body, &servers);
            }
        }
    });
    stage("a chat is split", || {
        let mut body = chat_body(
            MODEL,
            &prompt("pd chat", LONG_PROMPT_TOKENS),
            ANSWER_TOKENS as u32,
            false,
        );
        body["ignore_eos"] = json!(true);
        let response = split(&p, "/v1/chat/completions", &body, &servers);
        assert_eq!(response.json()["object"], "chat.completion");
    });
    stage("a short prompt runs whole on the decode server", || {
        let before = counters(&servers);
        let mut body = completion_body(MODEL, &prompt("pd short", 100), 4, false);
        body["ignore_eos"] = json!(true);
        let response = post_ok(&p, "/v1/completions", &body);
        assert_eq!(
            response.header("x-kvmesh-reason"),
            Some("pd-skip-short"),
            "{}",
            response.describe()
        );
        assert_eq!(served_by(&response), "d");
        let [prefill, decode] = counters(&servers);
        let (prefill, decode) = (prefill.since(before[0]), decode.since(before[1]));
        assert_eq!(
            prefill.computed, 0.0,
            "the prefill server ran a short prompt"
        );
        assert_eq!(
            decode.transferred, 0.0,
            "a short prompt's KV was transferred"
        );
        assert_eq!(decode.computed, 100.0, "{decode:?}");
    });
    for sidecar in [p, d] {
        let failures = sidecar
            .metric("kvmesh_pd_fallbacks_total", &[])
            .expect("the sidecar's /metrics")
            .unwrap_or(0.0);
        assert_eq!(
            failures,
            0.0,
            "{} fell back from disaggregation",
            sidecar.node_id()
        );
    }
}

/// Sends `body` through `entry` and checks that it was split: answered by d with the prefill
/// leg on p, the prompt computed by the prefill server, transferred to the decode server,
/// which generated the answer.
fn split(entry: &Sidecar, path: &str, body: &Value, servers: &[VllmServer; 2]) -> Response {
    let before = counters(servers);
    let response = post_ok(entry, path, body);
    let what = format!("{path} via {}: {}", entry.node_id(), response.describe());
    assert_eq!(response.header("x-kvmesh-reason"), Some("pd"), "{what}");
    assert_eq!(
        response.header("x-kvmesh-prefill-node"),
        Some("p"),
        "{what}"
    );
    assert_eq!(served_by(&response), "d", "{what}");
    // The counters of a request are updated as it finishes, which the answer may precede.
    let mut seen = (before[0], before[1]);
    let settled = wait_until_or(Duration::from_secs(10), || {
        let [prefill, decode] = counters(servers);
        seen = (prefill.since(before[0]), decode.since(before[1]));
        seen.1.generated >= ANSWER_TOKENS as f64 && seen.1.transferred > 0.0
    });
    let (prefill, decode) = seen;
    assert!(
        settled,
        "vLLM's counters after {what}: prefill {prefill:?}, decode {decode:?}"
    );
    // The prefill leg computed the prompt and made one token (`max_tokens: 1`).
    assert!(
        prefill.computed >= LONG_PROMPT_TOKENS as f64,
        "the prefill server computed {} prompt tokens; {what}",
        prefill.computed
    );
    assert_eq!(prefill.generated, 1.0, "{what}");
    // The decode leg pulled the prompt's blocks over NIXL rather than computing them.
    assert!(
        decode.transferred >= (LONG_PROMPT_TOKENS - 32) as f64,
        "the decode server received {} tokens by KV transfer; {what}",
        decode.transferred
    );
    assert!(
        decode.computed < 64.0,
        "the decode server computed {} prompt tokens itself; {what}",
        decode.computed
    );
    assert_eq!(decode.generated, ANSWER_TOKENS as f64, "{what}");
    response
}

/// Polls `condition` until it holds or `timeout` passes; whether it held.
fn wait_until_or(timeout: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let started = Instant::now();
    loop {
        if condition() {
            return true;
        }
        if started.elapsed() >= timeout {
            return false;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The counters of (prefill, decode) server.
fn counters(servers: &[VllmServer; 2]) -> [Counters; 2] {
    [Counters::of(&servers[0]), Counters::of(&servers[1])]
}
