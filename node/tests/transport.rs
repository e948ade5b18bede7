//! The QUIC endpoint over real sockets: forward streams, mutual TLS refusing strangers,
//! and hostile bytes on gossip streams.

mod common;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use common::{TestCa, start, wait_for_peers};
use kvmesh_node::mesh::wire::{GossipFrame, StreamKind};
use kvmesh_node::mesh::{Mesh, MeshError};
use kvmesh_node::tls::{self, NodeIdentity};
use quinn::crypto::rustls::QuicClientConfig;

/// Bound on every convergence wait: typically under 2 s, generous for a loaded machine.
const CONVERGE: Duration = Duration::from_secs(30);

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_stream_round_trip_names_both_peers() {
    let ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    let n2 = start(&ca, "n2", &[]).await;
    let mut incoming = n2.take_incoming_forwards().expect("first take");
    assert!(n2.take_incoming_forwards().is_none(), "only one consumer");

    let server = tokio::spawn(async move {
        let mut forward = incoming.recv().await.expect("incoming forward");
        let request = forward
            .recv
            .read_to_end(1 << 20)
            .await
            .expect("read request");
        let mut reply = b"pong:".to_vec();
        reply.extend_from_slice(&request);
        forward.send.write_all(&reply).await.expect("write reply");
        forward.send.finish().expect("finish");
        // Keep the stream alive until the peer has read everything.
        let _ = forward.send.stopped().await;
        forward.peer_name.to_string()
    });

    let mut stream = n1
        .open_forward_stream(n2.advertise_addr())
        .await
        .expect("open");
    assert_eq!(&*stream.peer_name, "n2");
    stream.send.write_all(b"ping").await.unwrap();
    stream.send.finish().unwrap();
    let reply = tokio::time::timeout(CONVERGE, stream.recv.read_to_end(1 << 20))
        .await
        .expect("reply in time")
        .expect("reply");
    assert_eq!(reply, b"pong:ping");
    let seen_by_server = tokio::time::timeout(CONVERGE, server)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(seen_by_server, "n1");

    // The connection is pooled: a second stream reuses it.
    let opened = n1.metrics().connections_opened.get();
    let again = n1
        .open_forward_stream(n2.advertise_addr())
        .await
        .expect("open again");
    assert_eq!(&*again.peer_name, "n2");
    assert_eq!(n1.metrics().connections_opened.get(), opened);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forward_to_a_node_not_accepting_is_refused_not_hung() {
    let ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    let n2 = start(&ca, "n2", &[]).await;
    drop(n2.take_incoming_forwards()); // nobody forwards on n2
    let mut stream = n1
        .open_forward_stream(n2.advertise_addr())
        .await
        .expect("open");
    stream.send.write_all(b"request").await.ok();
    let reply = tokio::time::timeout(CONVERGE, stream.recv.read_to_end(1024))
        .await
        .expect("refusal in time");
    assert!(reply.is_err(), "stream should be reset, got {reply:?}");
    assert!(n2.metrics().streams_rejected.get() >= 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn requests_to_a_silent_peer_fail_together_not_one_connect_timeout_after_another() {
    let ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    // A UDP socket that never answers: every handshake to it runs into the connect timeout.
    let silent = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    let addr = silent.local_addr().unwrap();
    let n1 = Arc::new(n1);
    let started = Instant::now();
    let opens: Vec<_> = (0..6)
        .map(|_| {
            let n1 = n1.clone();
            tokio::spawn(async move { n1.open_forward_stream(addr).await.map(|_| ()) })
        })
        .collect();
    for open in opens {
        let result = tokio::time::timeout(CONVERGE, open)
            .await
            .expect("bounded")
            .unwrap();
        assert!(
            matches!(
                result,
                Err(MeshError::Connect { .. } | MeshError::Timeout { .. })
            ),
            "{result:?}"
        );
    }
    // One connect timeout (2 s), not six in a row (12 s).
    let took = started.elapsed();
    assert!(took < Duration::from_secs(8), "took {took:?}");
    assert_eq!(
        n1.metrics().connect_failures.get(),
        1,
        "one dial for all six"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn node_with_certificate_from_another_ca_gets_nothing() {
    let ca = TestCa::new();
    let rogue_ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    let n2 = start(&ca, "n2", &[n1.advertise_addr()]).await;
    wait_for_peers(&n1, &["n2"], false, CONVERGE).await;

    // Same node-name scheme, same cluster id, seeds pointing at the real cluster.
    let rogue = start(
        &rogue_ca,
        "rogue",
        &[n1.advertise_addr(), n2.advertise_addr()],
    )
    .await;
    rogue.gossip().set("role", "rogue").await.unwrap();

    // Neither side can open a stream to the other.
    let started = Instant::now();
    let err = rogue
        .open_forward_stream(n1.advertise_addr())
        .await
        .unwrap_err();
    assert!(
        matches!(err, MeshError::Connect { .. } | MeshError::Timeout { .. }),
        "{err}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(5),
        "refusal must be prompt"
    );
    let err = n1
        .open_forward_stream(rogue.advertise_addr())
        .await
        .unwrap_err();
    assert!(matches!(err, MeshError::Connect { .. }), "{err}");

    // During many gossip rounds, the rogue never appears and learns nothing.
    let deadline = Instant::now() + Duration::from_secs(3);
    while Instant::now() < deadline {
        for node in [&n1, &n2] {
            let view = node.gossip().membership();
            assert!(
                view.get("rogue").is_none(),
                "{} admitted the rogue",
                node.node_name()
            );
        }
        assert!(
            rogue.gossip().membership().is_empty(),
            "rogue learned the membership"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(n1.metrics().handshakes_rejected.get() >= 1);
    assert_eq!(rogue.metrics().gossip_bytes_received.get(), 0);
}

/// A client with a valid certificate, speaking raw QUIC to a node.
async fn raw_client(identity: &NodeIdentity, node: &Mesh) -> quinn::Connection {
    let crypto = QuicClientConfig::try_from(tls::client_config(identity).unwrap()).unwrap();
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).unwrap();
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    endpoint
        .connect(node.advertise_addr(), tls::SNI)
        .unwrap()
        .await
        .expect("raw connect")
}

/// Sends `bytes` on a new unidirectional stream; the node may refuse it midway.
async fn send_uni(conn: &quinn::Connection, bytes: &[u8]) {
    let mut stream = conn.open_uni().await.expect("open uni");
    if stream.write_all(bytes).await.is_ok() {
        let _ = stream.finish();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn corrupt_gossip_streams_do_not_hurt_the_node() {
    let ca = TestCa::new();
    let n1 = start(&ca, "n1", &[]).await;
    let n2 = start(&ca, "n2", &[n1.advertise_addr()]).await;
    wait_for_peers(&n1, &["n2"], false, CONVERGE).await;

    let conn = raw_client(&ca.identity("mallory"), &n1).await;
    let fake_sender: SocketAddr = "127.0.0.1:9".parse().unwrap();
    let mut frame_with_junk = Vec::new();
    GossipFrame {
        sender: fake_sender,
        datagram: &[0xde, 0xad, 0xbe, 0xef, 0, 1, 2, 3],
    }
    .encode(&mut frame_with_junk);
    // A chitchat header (magic, version, type) followed by truncated garbage.
    let mut truncated_chitchat = Vec::new();
    GossipFrame {
        sender: fake_sender,
        datagram: &[0x53, 0xb0, 1, 0, 0xff, 0xff, 0xff],
    }
    .encode(&mut truncated_chitchat);
    let hostile: Vec<Vec<u8>> = vec![
        vec![StreamKind::Gossip as u8],                     // kind only
        vec![StreamKind::Gossip as u8, 9, 9, 9],            // bad address family
        vec![StreamKind::Gossip as u8, 4, 127, 0, 0, 1, 0], // truncated port
        frame_with_junk,
        truncated_chitchat,
        vec![0x00, 1, 2, 3],                 // unknown kind
        vec![StreamKind::Forward as u8; 16], // forward kind on a uni stream
        {
            let mut big = vec![StreamKind::Gossip as u8, 4, 127, 0, 0, 1, 0, 9];
            big.resize(200_000, 0xAA); // over the gossip stream limit
            big
        },
    ];
    for bytes in &hostile {
        send_uni(&conn, bytes).await;
    }
    // A bidirectional stream with an unknown kind is reset.
    let (mut send, mut recv) = conn.open_bi().await.unwrap();
    send.write_all(&[0x99, 1, 2]).await.unwrap();
    let refused = tokio::time::timeout(CONVERGE, recv.read_to_end(1024))
        .await
        .unwrap();
    assert!(refused.is_err());

    // The node is still serving: gossip keeps flowing, new state propagates.
    n2.gossip().set("after", "corruption").await.unwrap();
    let seen = n1
        .gossip()
        .wait_for(CONVERGE, |v| {
            v.get("n2")
                .is_some_and(|p| p.key_values.contains_key("after"))
        })
        .await;
    assert!(seen.is_some(), "n1 stopped gossiping after corrupt input");
    assert!(n1.metrics().gossip_datagrams_dropped.get() >= 3);
    assert!(n1.metrics().streams_rejected.get() >= 3);
    // The garbage sender never became a member.
    assert!(n1.gossip().membership().names().all(|name| name == "n2"));
    // And the hostile connection itself is still usable (nothing was fatal).
    assert!(conn.close_reason().is_none());
}
