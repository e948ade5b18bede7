//! The real QUIC mesh under network faults made with nftables on loopback
//! ([`kvmesh_tests::netfault`]): a partition, during which both sides keep serving with what
//! they know and after whose heal every node sees every node and every prefix again; and
//! datagram loss, under which gossip still converges and forwarded requests still succeed.
//! The measured times are printed; RELIABILITY.md has them.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use kvmesh_tests::netfault::{self, LoopbackFaults};
use kvmesh_tests::openai::{completion_body, served_by};
use kvmesh_tests::tools::skipped_for_lack_of;
use kvmesh_tests::{CONVERGENCE_TIMEOUT, Call, Cluster, NodeSpec, try_call, wait_for};
use serde_json::Value;

const MODEL: &str = "mock-model";

/// The faults, or `None` when this machine cannot make them and `scripts/test.sh` said so.
fn faults() -> Option<LoopbackFaults> {
    if !netfault::available() && skipped_for_lack_of(netfault::TOOL) {
        return None;
    }
    Some(LoopbackFaults::new())
}

fn names(prefix: &str, nodes: usize) -> Vec<String> {
    (0..nodes).map(|i| format!("{prefix}{i}")).collect()
}

fn start(names: &[String]) -> Cluster {
    let specs: Vec<NodeSpec> = names.iter().map(|n| NodeSpec::new(n, &[MODEL])).collect();
    let cluster = Cluster::start(&specs);
    cluster.wait_membership(&refs(names), CONVERGENCE_TIMEOUT);
    cluster
}

fn refs(names: &[String]) -> Vec<&str> {
    names.iter().map(String::as_str).collect()
}

fn mesh_addrs(cluster: &Cluster, names: &[&str]) -> Vec<SocketAddr> {
    names
        .iter()
        .map(|name| cluster.sidecar(name).mesh_addr())
        .collect()
}

/// A long text (many blocks), unlike any other `tag`'s.
fn long_text(tag: &str) -> String {
    (0..300).map(|i| format!("{tag} fact {i}. ")).collect()
}

/// A completion body whose prompt is [`long_text`].
fn long_prompt(tag: &str) -> Value {
    completion_body(MODEL, &long_text(tag), 4, false)
}

/// Sends `body` through `entry`; the node that served it.
fn serve(cluster: &Cluster, entry: &str, body: &Value) -> String {
    let response = cluster.sidecar(entry).post_json("/v1/completions", body);
    assert_eq!(response.status, 200, "{}", response.describe());
    served_by(&response)
}

/// Waits until every one of `entries` lists `owner` as holding all of `body`'s prefix.
fn wait_prefix_known(cluster: &Cluster, entries: &[&str], body: &Value, owner: &str) {
    wait_for(
        CONVERGENCE_TIMEOUT,
        &format!("{entries:?} know {owner}'s prefix"),
        || {
            entries.iter().try_for_each(|entry| {
                cluster
                    .sidecar(entry)
                    .sees_whole_prefix_at(body, owner)
                    .map(drop)
            })
        },
    );
}

/// Splits `nodes` nodes in two halves for as long as it takes both to notice, serves through
/// both, heals, and prints how long after the heal every node saw every node, and every
/// prefix learnt on the other side.
fn partition_and_heal(nodes: usize) {
    let Some((membership, prefixes)) = cut_and_heal(nodes) else {
        return;
    };
    eprintln!(
        "{nodes} nodes healed: membership after {:.2} s, every prefix after {:.2} s",
        membership.as_secs_f64(),
        prefixes.as_secs_f64()
    );
}

/// [`partition_and_heal`]'s work: the two times, or `None` when it was skipped for lack of
/// nftables.
fn cut_and_heal(nodes: usize) -> Option<(Duration, Duration)> {
    let faults = faults()?;
    let all = names("p", nodes);
    let cluster = start(&all);
    let (left, right) = all.split_at(nodes / 2);
    let (left, right) = (refs(left), refs(right));

    faults.partition(&mesh_addrs(&cluster, &left), &mesh_addrs(&cluster, &right));
    let cut = Instant::now();
    cluster.wait_membership(&left, CONVERGENCE_TIMEOUT);
    cluster.wait_membership(&right, CONVERGENCE_TIMEOUT);
    eprintln!(
        "{nodes} nodes: both halves saw the other dead {:.2} s after the cut",
        cut.elapsed().as_secs_f64()
    );

    // Both sides keep serving, each on its own engines, and learn their own new prefixes.
    let mut learnt = Vec::new();
    for (side, entries) in [("left", &left), ("right", &right)] {
        for (i, entry) in entries.iter().enumerate() {
            let served = try_call(
                cluster.sidecar(entry),
                Call::ALL[i % Call::ALL.len()],
                MODEL,
                &format!("{side} {i} during the partition"),
            )
            .unwrap_or_else(|problem| panic!("{problem}"));
            assert!(
                entries.contains(&served.node.as_str()),
                "{entry} served by {} across the partition",
                served.node
            );
        }
        let body = long_prompt(side);
        let owner = serve(&cluster, entries[0], &body);
        assert!(
            entries.contains(&owner.as_str()),
            "{owner} not on the {side}"
        );
        wait_prefix_known(&cluster, entries, &body, &owner);
        learnt.push((body, owner));
    }
    assert!(faults.dropped() > 0, "the partition dropped nothing");

    faults.heal();
    let healed = Instant::now();
    cluster.wait_membership(&refs(&all), CONVERGENCE_TIMEOUT);
    let membership = healed.elapsed();
    for (body, owner) in &learnt {
        wait_prefix_known(&cluster, &refs(&all), body, owner);
    }
    let prefixes = healed.elapsed();

    // The healed mesh routes on what the other side learnt: a prefix goes to its holder
    // from every node.
    for (body, owner) in &learnt {
        for entry in &all {
            assert_eq!(&serve(&cluster, entry, body), owner, "entering at {entry}");
        }
    }
    Some((membership, prefixes))
}

#[test]
fn after_a_partition_heals_every_node_sees_every_node_and_prefix() {
    partition_and_heal(4);
}

/// The figure: 8 nodes (16 processes: nextest runs it alone, `.config/nextest.toml`).
#[test]
fn eight_nodes_heal_a_partition() {
    partition_and_heal(8);
}

#[test]
fn under_ten_percent_loss_gossip_converges_and_forwarded_requests_succeed() {
    let Some(faults) = faults() else {
        return;
    };
    let all = names("l", 4);
    let cluster = start(&all);
    let all = refs(&all);

    // A new prefix reaches every node: once on a whole network, once under loss.
    let mut spread = Vec::new();
    let mut owner = String::new();
    for lossy in [false, true] {
        if lossy {
            faults.lose(&mesh_addrs(&cluster, &all), 10);
        }
        let body = long_prompt(if lossy { "lossy" } else { "whole" });
        let sent = Instant::now();
        owner = serve(&cluster, all[0], &body);
        wait_prefix_known(&cluster, &all, &body, &owner);
        spread.push(sent.elapsed());
    }

    // Requests extending that prefix, entering anywhere, reach its holder: those entering
    // elsewhere cross the lossy mesh, and none fails.
    let shared = long_text("lossy");
    let mut forwarded = 0;
    for i in 0..32 {
        let entry = all[i % all.len()];
        let call = [Call::Completion, Call::StreamedCompletion][i % 2];
        let prompt = format!("{shared} question {i}");
        let served = try_call(cluster.sidecar(entry), call, MODEL, &prompt)
            .unwrap_or_else(|problem| panic!("request {i} under loss: {problem}"));
        assert_eq!(served.node, owner, "request {i} entering at {entry}");
        forwarded += usize::from(served.node != entry);
    }
    // The membership held: nobody was declared dead for lost heartbeats.
    cluster.wait_membership(&all, Duration::from_secs(1));
    let dropped = faults.dropped();
    assert!(dropped > 0, "the loss rule dropped nothing");
    eprintln!(
        "a new prefix known everywhere after {:.2} s whole, {:.2} s under 10% loss; \
         {forwarded} of 32 requests forwarded, none failed; {dropped} datagrams dropped",
        spread[0].as_secs_f64(),
        spread[1].as_secs_f64()
    );
}
