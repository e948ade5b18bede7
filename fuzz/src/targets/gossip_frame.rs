//! `GossipFrame::decode`: a whole unidirectional stream a peer opens, read as the acceptor
//! reads it (a `StreamKind` byte, then the sender's advertised address and a chitchat
//! datagram).
//!
//! The frame's format is fixed-width, so the round trip is exact: whatever decodes encodes
//! back to the very bytes of the stream. The chitchat datagram itself goes to chitchat's own
//! UDP socket, whose decoder is private to chitchat (see `node/src/mesh/gossip/loopback.rs`),
//! so it is not fuzzed here.

use kvmesh_node::mesh::wire::{GossipFrame, MAX_GOSSIP_PAYLOAD, StreamKind};
use std::net::SocketAddr;

pub fn run(data: &[u8]) {
    let Some((&kind, rest)) = data.split_first() else {
        return;
    };
    match StreamKind::from_byte(kind) {
        Some(StreamKind::Gossip) => {}
        Some(other) => {
            assert_eq!(other as u8, kind);
            return;
        }
        None => return,
    }
    let Ok(frame) = GossipFrame::decode(rest) else {
        return;
    };
    assert!(frame.sender.port() != 0 && !frame.sender.ip().is_unspecified());
    assert!(!frame.datagram.is_empty() && frame.datagram.len() <= MAX_GOSSIP_PAYLOAD);
    let mut encoded = Vec::new();
    frame.encode(&mut encoded);
    assert_eq!(encoded, data, "the stream re-encodes to its bytes");
}

pub fn seeds() -> Vec<Vec<u8>> {
    let senders: [SocketAddr; 3] = [
        "10.1.2.3:7946".parse().expect("literal"),
        "[fd00::1]:7946".parse().expect("literal"),
        "[::ffff:192.168.0.9]:443".parse().expect("literal"),
    ];
    // A chitchat datagram of the size and look of a SYN (protocol version, message tag,
    // cluster id, a digest entry); its content only matters as a realistic tail here.
    let datagram = b"\x00\x00\x0bkvmesh-demo\x02\x00\x06node-a\x00\x00\x00\x00\x00\x00\x00\x01";
    senders
        .iter()
        .map(|&sender| {
            let mut out = Vec::new();
            GossipFrame { sender, datagram }.encode(&mut out);
            out
        })
        .collect()
}
