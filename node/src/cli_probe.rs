//! `kvmesh mesh-probe`: run only the mesh layer (QUIC, mutual TLS, gossip) and print the
//! membership as it changes, one JSON object per line on stdout.
//!
//! For checking certificates, seeds and reachability between hosts before (or without)
//! the HTTP front, and for the process-level mesh tests.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use clap::Args;
use kvmesh_node::mesh::{Membership, Mesh, MeshConfig};
use kvmesh_node::tls::NodeIdentity;
use serde_json::json;

#[derive(Args, Debug)]
pub struct ProbeArgs {
    /// Directory holding ca.pem, NODE.pem and NODE.key.
    #[arg(long, env = "KVMESH_TLS_DIR")]
    tls_dir: PathBuf,
    /// This node's name (must match its certificate).
    #[arg(long, env = "KVMESH_NODE_ID")]
    node: String,
    /// UDP address of the QUIC endpoint.
    #[arg(long, env = "KVMESH_MESH", default_value = "127.0.0.1:7946")]
    mesh: SocketAddr,
    /// Address peers reach this node at (default: the bound address).
    #[arg(long, env = "KVMESH_ADVERTISE")]
    advertise: Option<SocketAddr>,
    /// Seed peers, `host:port`, comma-separated.
    #[arg(long, env = "KVMESH_SEEDS", value_delimiter = ',')]
    seeds: Vec<String>,
    #[arg(long, env = "KVMESH_CLUSTER_ID", default_value = "kvmesh")]
    cluster_id: String,
    /// Key-values to publish, `key=value`, repeatable.
    #[arg(long = "set", value_parser = parse_key_value)]
    set: Vec<(String, String)>,
    /// Stop after this many seconds (default: run until killed).
    #[arg(long)]
    duration_secs: Option<u64>,
}

fn parse_key_value(arg: &str) -> Result<(String, String), String> {
    arg.split_once('=')
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .ok_or_else(|| format!("expected key=value, got {arg:?}"))
}

pub fn run(args: ProbeArgs) -> anyhow::Result<()> {
    tokio::runtime::Runtime::new()
        .context("cannot start the async runtime")?
        .block_on(probe(args))
}

async fn probe(args: ProbeArgs) -> anyhow::Result<()> {
    let identity = NodeIdentity::load(&args.tls_dir, &args.node)
        .context("cannot load this node's TLS identity")?;
    let mut config = MeshConfig::new(args.mesh, args.cluster_id, args.seeds);
    config.advertise = args.advertise;
    let mesh = Mesh::start(config, identity).await?;
    for (key, value) in &args.set {
        mesh.gossip().set(key, value).await?;
    }
    let started = Instant::now();
    println!(
        "{}",
        json!({
            "event": "started",
            "node": mesh.node_name(),
            "generation": mesh.gossip().self_node().generation,
            "addr": mesh.advertise_addr().to_string(),
        })
    );
    let mut watch = mesh.gossip().watch();
    let deadline = args
        .duration_secs
        .map(|secs| tokio::time::Instant::now() + Duration::from_secs(secs));
    loop {
        let view = watch.borrow_and_update().clone();
        println!("{}", membership_line(&view, started.elapsed()));
        let changed = watch.changed();
        let outcome = match deadline {
            Some(deadline) => tokio::time::timeout_at(deadline, changed).await.ok(),
            None => Some(changed.await),
        };
        match outcome {
            Some(Ok(())) => continue,
            Some(Err(_)) => anyhow::bail!("gossip stopped"),
            None => break,
        }
    }
    mesh.shutdown(Duration::from_secs(1)).await;
    Ok(())
}

fn membership_line(view: &Membership, elapsed: Duration) -> serde_json::Value {
    let peers: Vec<_> = view
        .peers
        .iter()
        .map(|peer| {
            json!({
                "name": peer.name,
                "generation": peer.generation,
                "addr": peer.mesh_addr.to_string(),
                "keys": &*peer.key_values,
            })
        })
        .collect();
    json!({
        "event": "membership",
        "elapsed_ms": elapsed.as_millis() as u64,
        "peers": peers,
    })
}
