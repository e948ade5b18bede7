//! A peer with a valid certificate that misbehaves on the forwarding path: frames over their
//! limit, garbage after a valid head, a path a peer may not send, a body over the node's
//! limit, and a thousand streams opened and never finished. Each is refused with an error
//! frame and counted (`kvmesh_peer_requests_refused_total`), the stream limit holds, the node
//! does not panic, and everyone else's requests are served meanwhile.

mod peer;

use std::time::Duration;

use bytes::{BufMut, BytesMut};
use kvmesh_node::mesh::wire::StreamKind;
use kvmesh_node::tls::NodeIdentity;
use kvmesh_protocol::route::RouteReason;
use kvmesh_protocol::wire::{Frame, FrameDecoder, RequestHead, WireErrorCode};
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, call, wait_for};

/// The node's limit on a body (set low, so that a body over it is cheap to send).
const MAX_BODY: u64 = 4096;
/// Streams the node lets one connection have open at once (`max_concurrent_bidi_streams`).
const STREAM_LIMIT: usize = 1024;
/// Bound on every answer the node owes the peer.
const ANSWER: Duration = Duration::from_secs(20);

fn head(path: &str, hop_count: u8) -> RequestHead {
    RequestHead {
        request_id: "mallory-1".into(),
        hop_count,
        deadline_unix_ms: 0,
        model: "only-b".into(),
        method: "POST".into(),
        path: path.into(),
        headers: vec![("content-type".into(), "application/json".into())],
        reason: RouteReason::ColdHash,
        entry_node: "mallory".into(),
        prefix_key: None,
        new_prefix: false,
        prefill_tokens: 0,
        decline_above_tokens: None,
        streamed: false,
        prefix_samples: Vec::new(),
    }
}

/// Sends `bytes` on a forward stream and returns the error frame's code the node answered.
async fn refused_with(conn: &quinn::Connection, bytes: &[u8]) -> WireErrorCode {
    let (mut send, mut recv) = tokio::time::timeout(ANSWER, conn.open_bi())
        .await
        .expect("a stream in time")
        .expect("open a stream");
    send.write_all(&[StreamKind::Forward as u8]).await.unwrap();
    // The node may stop reading once it has refused; what matters is its answer.
    if send.write_all(bytes).await.is_ok() {
        let _ = send.finish();
    }
    let answer = tokio::time::timeout(ANSWER, recv.read_to_end(1 << 20))
        .await
        .expect("an answer in time")
        .expect("an answer, not a reset");
    let mut decoder = FrameDecoder::new();
    decoder.push(&answer);
    match decoder.next_frame() {
        Ok(Some(Frame::Error(error))) => error.code,
        other => panic!("expected an error frame, got {other:?}"),
    }
}

#[test]
fn a_misbehaving_peer_is_refused_counted_and_hurts_nobody() {
    let mut cluster = Cluster::start(&[
        NodeSpec::new("a", &["shared"]),
        NodeSpec::new("b", &["shared", "only-b"])
            .sidecar_args(&["--max-body-bytes", &MAX_BODY.to_string()]),
    ]);
    cluster.wait_membership(&["a", "b"], CONVERGENCE_TIMEOUT);
    let b = cluster.sidecar("b");
    let mallory = NodeIdentity::load(&cluster.ca().issue("mallory"), "mallory").unwrap();
    let runtime = tokio::runtime::Runtime::new().unwrap();
    let conn = runtime.block_on(async {
        let connecting = peer::connect(&mallory, b.mesh_addr());
        tokio::time::timeout(ANSWER, connecting)
            .await
            .expect("connected in time")
    });

    let mut valid_head = BytesMut::new();
    Frame::RequestHead(head("/v1/completions", 1)).encode_into(&mut valid_head);
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("too_large", {
            // A head frame announcing 16 MiB: refused on its length, before any is read.
            let mut frame = BytesMut::new();
            frame.put_u32(16 << 20);
            frame.put_u8(valid_head[4]);
            frame.to_vec()
        }),
        ("malformed", {
            let mut bytes = valid_head.to_vec();
            bytes.extend_from_slice(&[0, 0, 0, 9, 0xee, 0xba, 0xad]);
            bytes
        }),
        ("not_forwardable", {
            Frame::RequestHead(head("/v1/load_lora_adapter", 1))
                .encode()
                .to_vec()
        }),
        (
            "not_forwardable",
            Frame::RequestHead(head("/v1/completions", 9))
                .encode()
                .to_vec(),
        ),
        ("too_large", {
            let mut bytes = valid_head.clone();
            Frame::Data(vec![b' '; 2 * MAX_BODY as usize].into()).encode_into(&mut bytes);
            bytes.to_vec()
        }),
    ];
    for (reason, bytes) in &cases {
        let code = runtime.block_on(refused_with(&conn, bytes));
        assert_eq!(code, WireErrorCode::BadRequest, "{reason}");
    }

    // A thousand streams opened and left waiting: the node grants at most its limit, and
    // serves everyone else meanwhile. (Seen from this raw client, each stream it used above
    // still takes one of the limit's credits; the node's own connection pool gets them back,
    // 1,200 forwards over one connection pass.)
    let hanging = runtime.block_on(async {
        let mut hanging = Vec::new();
        while hanging.len() <= STREAM_LIMIT {
            let open = tokio::time::timeout(Duration::from_secs(2), conn.open_bi()).await;
            let Ok(open) = open else { break };
            let (mut send, recv) = open.expect("a stream under the limit");
            send.write_all(&[StreamKind::Forward as u8]).await.unwrap();
            hanging.push((send, recv));
        }
        hanging
    });
    assert!(
        (STREAM_LIMIT - cases.len()..=STREAM_LIMIT).contains(&hanging.len()),
        "{} streams opened, the limit is {STREAM_LIMIT}",
        hanging.len()
    );
    eprintln!("mallory holds {} streams open at b", hanging.len());
    for i in 0..8 {
        let prompt = format!("while mallory waits {i}");
        assert_eq!(
            call(cluster.sidecar("a"), Call::ALL[i % 4], "only-b", &prompt).node,
            "b"
        );
        call(b, Call::ALL[i % 4], "shared", &prompt);
    }
    // Closed before the streams are dropped (which would finish them, each then a request
    // without a head): a cut stream is not counted as bad input.
    conn.close(0u32.into(), b"done");
    drop(hanging);

    let mut expected = std::collections::BTreeMap::new();
    for (reason, _) in &cases {
        *expected.entry(*reason).or_insert(0.0) += 1.0;
    }
    for (reason, count) in expected {
        wait_for(ANSWER, &format!("b counts {count} {reason}"), || {
            let counted = b
                .metric("kvmesh_peer_requests_refused_total", &[("reason", reason)])?
                .unwrap_or(0.0);
            match counted == count {
                true => Ok(()),
                false => Err(format!("{counted} counted")),
            }
        });
    }
    let b = &mut cluster.node_mut("b").sidecar;
    assert!(b.process().is_running(), "b died of a peer's input");
    assert!(
        !b.process().output_contains("panicked"),
        "b panicked on a peer's input"
    );
}
