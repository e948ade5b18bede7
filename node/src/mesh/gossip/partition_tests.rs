//! The mesh's gossip (chitchat with kvmesh's configuration: failure detector, grace periods,
//! seed refresh, the membership view) over chitchat's in-process `ChannelTransport`, whose
//! links can be cut and healed and whose datagrams can be dropped: partitions and loss
//! without sockets or root (issue 18). The same cases over the real QUIC mesh, with nftables,
//! are in `tests/tests/network_faults.rs`; added delay over real sockets is in
//! `tests/tests/network_delay.rs` (chitchat's own delay wrapper holds its socket's lock while
//! it waits to receive, so a delayed datagram leaves only after the next one arrives).

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use chitchat::transport::{ChannelTransport, Transport, TransportExt};

use super::{Gossip, GossipNode, Membership, start_over};
use crate::mesh::config::GossipConfig;

const NODES: usize = 8;
/// Bound on every wait: far above what convergence takes (a few seconds), so that only a
/// mesh that does not converge fails.
const WITHIN: Duration = Duration::from_secs(60);

fn addr(i: usize) -> SocketAddr {
    SocketAddr::from(([127, 0, 0, 1], 10_001 + i as u16))
}

fn name(i: usize) -> String {
    format!("n{i}")
}

/// `NODES` nodes gossiping over `transport`, every one seeded with the first.
async fn start_nodes(transport: &dyn Transport) -> Vec<Gossip> {
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let seed = (i != 0).then(|| addr(0));
        let node = GossipNode::for_test(
            "partition-test",
            name(i),
            addr(i),
            seed,
            GossipConfig::default(),
        );
        nodes.push(start_over(transport, node).await.expect("gossip starts"));
    }
    nodes
}

/// Whether `view` holds exactly the peers `peers`, each with `key` published.
fn sees_exactly(view: &Membership, peers: &[usize], key: &str) -> bool {
    view.len() == peers.len()
        && peers.iter().all(|&p| {
            view.get(&name(p)).is_some_and(|peer| {
                peer.key_values.get(key) == Some(&format!("{key} of {}", name(p)))
            })
        })
}

/// Waits until every node of `group` sees exactly the rest of `group`, each with `key`.
async fn converge(nodes: &[Gossip], group: &[usize], key: &str, what: &str) -> Duration {
    let started = Instant::now();
    for &i in group {
        let others: Vec<usize> = group.iter().copied().filter(|&p| p != i).collect();
        let seen = nodes[i]
            .wait_for(WITHIN, |view| sees_exactly(view, &others, key))
            .await;
        assert!(
            seen.is_some(),
            "{what}: {} does not see exactly {others:?} with {key:?} within {WITHIN:?}: {:?}",
            name(i),
            nodes[i].membership().names().collect::<Vec<_>>()
        );
    }
    started.elapsed()
}

async fn publish(nodes: &[Gossip], group: &[usize], key: &str) {
    for &i in group {
        let value = format!("{key} of {}", name(i));
        nodes[i].set(key, &value).await.expect("a small key");
    }
}

async fn cut(channels: &ChannelTransport, left: &[usize], right: &[usize], heal: bool) {
    for &a in left {
        for &b in right {
            if heal {
                channels.add_link(addr(a), addr(b)).await;
            } else {
                channels.remove_link(addr(a), addr(b)).await;
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn both_halves_of_a_partition_keep_gossiping_and_the_heal_restores_every_node_and_key() {
    let channels = ChannelTransport::default();
    let nodes = start_nodes(&channels).await;
    let all: Vec<usize> = (0..NODES).collect();
    let (left, right) = all.split_at(NODES / 2);
    publish(&nodes, &all, "before").await;
    converge(&nodes, &all, "before", "start").await;

    cut(&channels, left, right, false).await;
    // Each half declares the other dead and keeps gossiping within itself: a key published on
    // either side during the partition reaches that side.
    publish(&nodes, &all, "during").await;
    let split = converge(&nodes, left, "during", "left half").await;
    converge(&nodes, right, "during", "right half").await;

    cut(&channels, left, right, true).await;
    let healed = converge(&nodes, &all, "during", "after the heal").await;
    // Keys from before the partition survived it everywhere.
    for node in &nodes {
        let view = node.membership();
        let others: Vec<usize> = all
            .iter()
            .copied()
            .filter(|&p| name(p) != node.self_node().name)
            .collect();
        assert!(sees_exactly(&view, &others, "before"));
    }
    println!(
        "in-process partition of {NODES} nodes: halves apart after {:.2} s, whole again {:.2} s \
         after the heal",
        split.as_secs_f64(),
        healed.as_secs_f64()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tenth_of_the_datagrams_lost_slows_gossip_but_kills_nobody() {
    let lossy = ChannelTransport::default().drop_message(0.1);
    let nodes = start_nodes(lossy.as_ref()).await;
    let all: Vec<usize> = (0..NODES).collect();
    publish(&nodes, &all, "first").await;
    converge(&nodes, &all, "first", "start under loss").await;
    // Nobody is declared dead while datagrams keep being lost: every node keeps seeing all
    // the others through several failure-detector windows, and a new key still spreads.
    let watched = Instant::now();
    let mut deaths = 0;
    while watched.elapsed() < Duration::from_secs(5) {
        deaths += nodes
            .iter()
            .filter(|node| node.membership().len() != NODES - 1)
            .count();
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert_eq!(deaths, 0, "a node missed a peer under 10% loss");
    publish(&nodes, &all, "second").await;
    let spread = converge(&nodes, &all, "second", "a new key under loss").await;
    println!(
        "in-process, 10% of datagrams dropped: a new key on every node reached all {NODES} in \
         {:.2} s",
        spread.as_secs_f64()
    );
}
