//! One forward stream between two sidecars' QUIC endpoints on loopback (issue 17): the time
//! from opening the stream to the serving side's one-byte answer, for a body of 128 bytes and
//! for a chat with a 256 KiB image (349,722 bytes, what `scripts/bench-media-overhead.sh`
//! sends). The serving side reads the stream as `forward::serving` does (`read_chunk`, a
//! packet's worth at a time); nothing else runs: no HTTP, no parsing, no engine. What the
//! image costs here is the QUIC hop itself: packets built, encrypted, sent, received,
//! decrypted and acknowledged, both sides on this machine.
//!
//! Run: `cargo bench -p kvmesh-node --bench mesh_stream`.

use bytes::Bytes;
use criterion::{BenchmarkId, Criterion, Throughput, criterion_group, criterion_main};
use kvmesh_node::cert::{self, DEFAULT_CA_VALIDITY, DEFAULT_NODE_VALIDITY};
use kvmesh_node::mesh::{Mesh, MeshConfig};
use kvmesh_node::tls::NodeIdentity;
use std::path::Path;

/// The image request's body length in `scripts/bench-media-overhead.sh`.
const IMAGE_BODY: usize = 349_722;

fn identity(dir: &Path, name: &str) -> NodeIdentity {
    cert::issue_node_cert(dir, name, dir, &[], DEFAULT_NODE_VALIDITY).expect("issue certificate");
    NodeIdentity::load(dir, name).expect("load identity")
}

async fn start(dir: &Path, name: &str) -> Mesh {
    let config = MeshConfig::new("127.0.0.1:0".parse().unwrap(), "bench", Vec::new());
    Mesh::start(config, identity(dir, name))
        .await
        .expect("start mesh node")
}

fn forward_stream(c: &mut Criterion) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let dir = tempfile::tempdir().unwrap();
    cert::init_ca(dir.path(), "bench", DEFAULT_CA_VALIDITY).expect("init CA");
    let (entry, server) = runtime.block_on(async {
        (
            start(dir.path(), "entry").await,
            start(dir.path(), "server").await,
        )
    });
    let mut incoming = server.take_incoming_forwards().unwrap();
    runtime.spawn(async move {
        while let Some(mut forward) = incoming.recv().await {
            tokio::spawn(async move {
                let mut read = 0;
                while let Ok(Some(chunk)) = forward.recv.read_chunk(64 * 1024, true).await {
                    read += chunk.bytes.len();
                }
                let _ = forward.send.write_all(&[u8::from(read > 0)]).await;
                let _ = forward.send.finish();
                let _ = forward.send.stopped().await;
            });
        }
    });
    let to = server.advertise_addr();
    let mut group = c.benchmark_group("forward_stream");
    for (name, len) in [("128B", 128), ("chat_256KiB_image", IMAGE_BODY)] {
        let body = Bytes::from(vec![b'A'; len]);
        group.throughput(Throughput::Bytes(len as u64));
        group.bench_with_input(BenchmarkId::from_parameter(name), &body, |b, body| {
            b.to_async(&runtime).iter(|| async {
                let mut stream = entry.open_forward_stream(to).await.unwrap();
                stream.send.write_chunk(body.clone()).await.unwrap();
                stream.send.finish().unwrap();
                let answer = stream.recv.read_to_end(16).await.unwrap();
                assert_eq!(answer, [1]);
            })
        });
    }
    group.finish();
}

criterion_group!(benches, forward_stream);
criterion_main!(benches);
