//! Copies of a new prefix sent by different entries meet on one engine, and each counts in its
//! serving node's queue what its prompt does not share with the earliest copy: its own
//! question, told from the block hashes sampled into its request head. Before, a copy counted
//! nothing once an earlier one covered as many tokens, so a burst of a new system prompt's
//! copies from every entry (a hot prompt at a cold start) looked like no work at all and queued
//! on one engine for a second and more (`docs/studies/new-prefix-copies.md`).
//!
//! The test speaks to one node as its peers would (a valid certificate, forwarding frames), so
//! that each head says exactly what an entry would: three copies of one new prefix, 1,024
//! shared tokens and 256 of their own, against a bound that fits the first two and not the
//! third. The engine is slow (its prefill of the first copy takes seconds) and the node credits
//! its queue at 1 token/s, so nothing of the queue drains while the test reads the answers.

mod peer;

use std::time::Duration;

use kvmesh_node::mesh::wire::StreamKind;
use kvmesh_node::tls::NodeIdentity;
use kvmesh_protocol::hashing::{ChainSeed, chain_from_tokens};
use kvmesh_protocol::lifecycle::{prefix_key, prefix_samples};
use kvmesh_protocol::route::RouteReason;
use kvmesh_protocol::wire::{Frame, FrameDecoder, RequestHead, WireErrorCode};
use kvmesh_tests::openai::completion_body;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Cluster, NodeSpec, Sidecar, Timing, wait_for};

const MODEL: &str = "mock-model";
const SHARED_TOKENS: u32 = 1_024;
const OWN_TOKENS: u32 = 256;
/// What the entry counts each copy to compute: nothing of the prompt is cached anywhere.
const PROMPT_TOKENS: u32 = SHARED_TOKENS + OWN_TOKENS;
/// Room for the first copy and one copy's own part, with some to spare, not for two.
const BOUND: u32 = PROMPT_TOKENS + OWN_TOKENS + OWN_TOKENS / 2;
/// Bound on every answer the node owes the peer.
const ANSWER: Duration = Duration::from_secs(60);

/// A copy's head: the new prefix's key and samples of a chain of the shared tokens, then
/// `own`'s.
fn copy_head(id: &str, own: u32, decline_above_tokens: Option<u32>) -> RequestHead {
    let tokens: Vec<u32> = (0..SHARED_TOKENS).chain(own..own + OWN_TOKENS).collect();
    let chain = chain_from_tokens(ChainSeed::new(MODEL, None), &tokens, 16);
    RequestHead {
        request_id: id.into(),
        hop_count: 1,
        deadline_unix_ms: 0,
        model: MODEL.into(),
        method: "POST".into(),
        path: "/v1/completions".into(),
        headers: vec![("content-type".into(), "application/json".into())],
        reason: RouteReason::ColdHash,
        entry_node: "entry".into(),
        prefix_key: prefix_key(&chain),
        new_prefix: true,
        prefill_tokens: PROMPT_TOKENS,
        decline_above_tokens,
        streamed: true,
        prefix_samples: prefix_samples(&chain, 16.0),
    }
}

/// A streamed completion long enough for the slow engine to prefill for seconds.
fn body(tag: &str) -> bytes::Bytes {
    let prompt = format!("{tag}: {}", "a long shared system prompt. ".repeat(140));
    serde_json::to_vec(&completion_body(MODEL, &prompt, 4, true))
        .expect("json")
        .into()
}

/// Opens a forward stream to the node and sends `head` and its body.
async fn send(
    conn: &quinn::Connection,
    head: RequestHead,
    tag: &str,
) -> (quinn::SendStream, quinn::RecvStream) {
    let (mut send, recv) = tokio::time::timeout(ANSWER, conn.open_bi())
        .await
        .expect("a stream in time")
        .expect("open a stream");
    send.write_all(&[StreamKind::Forward as u8]).await.unwrap();
    let mut bytes = Frame::RequestHead(head).encode().to_vec();
    bytes.extend_from_slice(&Frame::Data(body(tag)).encode());
    send.write_all(&bytes).await.expect("head and body");
    send.finish().expect("finish");
    (send, recv)
}

/// The first frame the node answers on `recv`: a response head, or an error.
async fn first_frame(recv: &mut quinn::RecvStream) -> Frame {
    let mut decoder = FrameDecoder::new();
    loop {
        if let Some(frame) = decoder.next_frame().expect("well-formed frames") {
            return frame;
        }
        let chunk = tokio::time::timeout(ANSWER, recv.read_chunk(64 * 1024, true))
            .await
            .expect("an answer in time")
            .expect("an answer, not a reset")
            .expect("a frame before the stream ends");
        decoder.push(&chunk.bytes);
    }
}

/// Waits until `node` counts `count` new prefixes in flight (admitted, no first byte back).
fn wait_admitted(node: &Sidecar, count: f64) {
    wait_for(ANSWER, &format!("{count} copies admitted"), || {
        let in_flight = node
            .metric("kvmesh_new_prefixes_in_flight", &[])?
            .unwrap_or(0.0);
        match in_flight == count {
            true => Ok(()),
            false => Err(format!("{in_flight} in flight")),
        }
    });
}

#[test]
fn a_copy_counts_its_own_question_and_the_one_past_the_bound_is_declined() {
    let dir = tempfile::tempdir().expect("tempdir");
    let config = dir.path().join("kvmesh.toml");
    std::fs::write(&config, "[route]\ndefault_prefill_tokens_per_s = 1\n").expect("config");
    let config = config.to_str().expect("utf-8 path");
    let cluster = Cluster::start(&[NodeSpec::new("b", &[MODEL])
        .timing(Timing::Scaled(20.0))
        .sidecar_args(&["--config", config])]);
    cluster.wait_membership(&["b"], CONVERGENCE_TIMEOUT);
    let b = cluster.sidecar("b");
    let entry = NodeIdentity::load(&cluster.ca().issue("entry"), "entry").expect("identity");
    let runtime = tokio::runtime::Runtime::new().expect("runtime");
    runtime.block_on(async {
        let conn = tokio::time::timeout(ANSWER, peer::connect(&entry, b.mesh_addr()))
            .await
            .expect("connected in time");

        // The first copy computes the prefix: its last attempt, never declined.
        let (_first_send, mut first) = send(&conn, copy_head("first", 10_000, None), "a").await;
        tokio::task::block_in_place(|| wait_admitted(b, 1.0));
        // The second waits for the first's 1,280 tokens, then computes its own 256.
        let (_second_send, mut second) =
            send(&conn, copy_head("second", 20_000, Some(BOUND)), "b").await;
        tokio::task::block_in_place(|| wait_admitted(b, 2.0));
        // The third would wait for both: 1,792 tokens, over the bound of 1,664.
        let (_third_send, mut third) =
            send(&conn, copy_head("third", 30_000, Some(BOUND)), "c").await;
        match first_frame(&mut third).await {
            Frame::Error(error) => assert_eq!(error.code, WireErrorCode::Busy, "{error:?}"),
            other => panic!("the third copy was admitted: {other:?}"),
        }
        for (name, recv) in [("first", &mut first), ("second", &mut second)] {
            match first_frame(recv).await {
                Frame::ResponseHead(head) => assert_eq!(head.status, 200, "{name}"),
                other => panic!("the {name} copy was not served: {other:?}"),
            }
        }
        conn.close(0u32.into(), b"done");
    });
    let declined = b
        .metric("kvmesh_declined_total", &[("reason", "new-prefix")])
        .expect("metrics")
        .unwrap_or(0.0);
    assert_eq!(declined, 1.0, "the third copy, declined as a new prefix");
}
