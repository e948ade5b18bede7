//! Speaking to a node as one of its peers would: raw QUIC with a certificate of the cluster's
//! CA, for tests that send forwarding frames no sidecar would send (`misbehaving_peer`) or
//! exactly the heads an entry would (`copy_admission`).

use std::net::SocketAddr;
use std::sync::Arc;

use kvmesh_node::tls::{self, NodeIdentity};
use quinn::crypto::rustls::QuicClientConfig;

/// Connects to `mesh` as `identity`, as a peer would (the caller bounds the wait).
pub async fn connect(identity: &NodeIdentity, mesh: SocketAddr) -> quinn::Connection {
    let crypto = QuicClientConfig::try_from(tls::client_config(identity).expect("client TLS"))
        .expect("QUIC client TLS");
    let mut endpoint = quinn::Endpoint::client("127.0.0.1:0".parse().unwrap()).expect("endpoint");
    endpoint.set_default_client_config(quinn::ClientConfig::new(Arc::new(crypto)));
    endpoint
        .connect(mesh, tls::SNI)
        .expect("connect")
        .await
        .expect("handshake with a valid certificate")
}
