//! Counters of the mesh layer, as prometheus-client metrics.
//!
//! Metrics are cheap shared handles: the mesh updates its clones, and whoever serves
//! `/metrics` registers them once with [`MeshMetrics::register`].

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use crate::tls::TlsMetrics;

/// What an operator asks of the mesh: is gossip flowing, how many peers are alive, are
/// connections failing.
#[derive(Debug, Clone, Default)]
pub struct MeshMetrics {
    /// Bytes of gossip frames sent over QUIC.
    pub gossip_bytes_sent: Counter,
    /// Bytes of gossip frames received over QUIC (accepted or not).
    pub gossip_bytes_received: Counter,
    /// Gossip datagrams dropped: malformed frame, peer unreachable, queue full.
    pub gossip_datagrams_dropped: Counter,
    /// Live peers, this node excluded.
    pub peers_alive: Gauge,
    /// Outgoing QUIC connections established (each passed mutual TLS).
    pub connections_opened: Counter,
    /// Outgoing QUIC connections that failed: unreachable, refused certificate, timeout.
    pub connect_failures: Counter,
    /// Incoming connections whose handshake failed (e.g. a certificate not from the CA).
    pub handshakes_rejected: Counter,
    /// Incoming streams refused: unknown kind, malformed, nobody accepting forwards.
    pub streams_rejected: Counter,
    /// Peers gossip declared dead whose connection stayed silent, so it was closed.
    pub dead_peer_connections_closed: Counter,
    /// Peers gossip declared dead whose connection kept answering (a gossip hiccup, e.g. a
    /// starved CPU): the connection and its streams were kept.
    pub dead_peer_connections_kept: Counter,
    /// Established connections closed because the peer's certificate stopped passing
    /// verification (revoked, expired, its CA dropped from the bundle).
    pub connections_untrusted: Counter,
    /// TLS reloads and this node's certificate expiry (`kvmesh_tls_*`).
    pub tls: TlsMetrics,
}

impl MeshMetrics {
    /// Registers every metric under the `kvmesh_mesh` prefix.
    pub fn register(&self, registry: &mut Registry) {
        self.tls.register(registry);
        let registry = registry.sub_registry_with_prefix("kvmesh_mesh");
        registry.register(
            "gossip_sent_bytes",
            "Bytes of gossip sent to peers over QUIC",
            self.gossip_bytes_sent.clone(),
        );
        registry.register(
            "gossip_received_bytes",
            "Bytes of gossip received from peers over QUIC",
            self.gossip_bytes_received.clone(),
        );
        registry.register(
            "gossip_dropped_datagrams",
            "Gossip datagrams dropped (malformed, unreachable peer, full queue)",
            self.gossip_datagrams_dropped.clone(),
        );
        registry.register(
            "peers_alive",
            "Peers considered alive by the failure detector, this node excluded",
            self.peers_alive.clone(),
        );
        registry.register(
            "connections_opened",
            "Outgoing QUIC connections established",
            self.connections_opened.clone(),
        );
        registry.register(
            "connect_failures",
            "Outgoing QUIC connections that failed or timed out",
            self.connect_failures.clone(),
        );
        registry.register(
            "handshakes_rejected",
            "Incoming QUIC connections whose handshake failed",
            self.handshakes_rejected.clone(),
        );
        registry.register(
            "streams_rejected",
            "Incoming QUIC streams refused",
            self.streams_rejected.clone(),
        );
        registry.register(
            "dead_peer_connections_closed",
            "Connections to peers declared dead by gossip that stayed silent and were closed",
            self.dead_peer_connections_closed.clone(),
        );
        registry.register(
            "dead_peer_connections_kept",
            "Connections to peers declared dead by gossip that kept answering and were kept",
            self.dead_peer_connections_kept.clone(),
        );
        registry.register(
            "connections_untrusted",
            "Established connections closed because the peer's certificate is no longer accepted",
            self.connections_untrusted.clone(),
        );
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn registered_metrics_are_encoded() {
        let metrics = MeshMetrics::default();
        metrics.gossip_bytes_sent.inc_by(42);
        metrics.peers_alive.set(3);
        let mut registry = Registry::default();
        metrics.register(&mut registry);
        let mut text = String::new();
        prometheus_client::encoding::text::encode(&mut text, &registry).unwrap();
        assert!(
            text.contains("kvmesh_mesh_gossip_sent_bytes_total 42"),
            "{text}"
        );
        assert!(text.contains("kvmesh_mesh_peers_alive 3"), "{text}");
        assert!(
            text.contains(r#"kvmesh_tls_reloads_total{outcome="failed"} 0"#),
            "{text}"
        );
    }
}
