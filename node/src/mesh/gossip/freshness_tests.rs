//! A peer's new value reaches the membership view when it arrives, not at this node's next
//! gossip round (chitchat reports its live nodes' states only then).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chitchat::transport::ChannelTransport;

use super::{Gossip, GossipNode, start_over};
use crate::mesh::config::GossipConfig;

/// Long enough that waiting for the receiver's next round would show.
const INTERVAL: Duration = Duration::from_secs(2);
const WITHIN: Duration = Duration::from_secs(60);

fn addr(i: u16) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 11_001 + i))
}

async fn start(transport: &ChannelTransport, i: u16) -> Gossip {
    let config = GossipConfig {
        interval: INTERVAL,
        ..GossipConfig::default()
    };
    let seed = (i != 0).then(|| addr(0));
    let node = GossipNode::for_test("freshness-test", format!("n{i}"), addr(i), seed, config);
    start_over(transport, node).await.expect("gossip starts")
}

#[tokio::test]
async fn a_peers_new_value_is_in_the_view_as_soon_as_it_arrives() {
    let transport = ChannelTransport::with_mtu(65_507);
    let (a, b) = (start(&transport, 0).await, start(&transport, 1).await);
    let seen = b.wait_for(WITHIN, |view| view.get("n0").is_some()).await;
    assert!(seen.is_some(), "n1 never saw n0");
    let mut delays = Vec::new();
    for round in 0..10 {
        let value = format!("v{round}");
        a.set("k", &value).await.expect("a valid key");
        let sent = Instant::now();
        // a's syn now; n1 gets the value in a's ack, at a moment unrelated to its own rounds.
        a.handle.gossip(addr(1)).expect("chitchat runs");
        let seen = b
            .wait_for(WITHIN, |view| {
                view.get("n0").and_then(|peer| peer.key_values.get("k")) == Some(&value)
            })
            .await;
        assert!(seen.is_some(), "n1 never saw n0's {value}");
        delays.push(sent.elapsed());
    }
    delays.sort();
    // Waiting for n1's next round would make the median about half the interval.
    assert!(
        delays[delays.len() / 2] < INTERVAL / 8,
        "n1 saw n0's values after {delays:?}"
    );
}
