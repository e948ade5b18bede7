//! Incoming side of the endpoint: accept connections, welcome them, and dispatch each
//! stream by its kind byte to gossip or to the forwarding layer.
//!
//! Nothing a peer sends can crash the node: a stream with an unknown kind, a malformed
//! gossip frame or one that never finishes is refused (bounded by a timeout and a size
//! limit) and counted; the connection and the node carry on.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use quinn::{Connection, RecvStream, SendStream};
use rustls_pki_types::CertificateDer;
use tokio::sync::mpsc;
use tokio::time::timeout;

use super::metrics::MeshMetrics;
use super::pool::PeerConnection;
use super::trust::Established;
use super::wire::{GossipFrame, MAX_GOSSIP_STREAM, StreamKind, codes};
use crate::tls::{self, PeerRole, TlsError};

/// A gossip datagram received over QUIC, on its way to the loopback relay.
#[derive(Debug)]
pub(crate) struct InboundGossip {
    /// The sender's advertised mesh address, as written in the frame.
    pub sender: SocketAddr,
    /// The authenticated node name of the connection it came on.
    pub peer_name: Arc<str>,
    pub datagram: Vec<u8>,
}

/// A forwarded-request stream opened by a peer. The kind byte has been consumed; the rest
/// of both directions belongs to the forwarding layer.
#[derive(Debug)]
pub struct IncomingForward {
    /// Node name proven by the peer's certificate.
    pub peer_name: Arc<str>,
    /// The peer's address as seen on this connection.
    pub peer_addr: SocketAddr,
    pub send: SendStream,
    pub recv: RecvStream,
}

/// Where accepted streams go. Shared by accepted and dialed connections alike.
#[derive(Clone)]
pub(crate) struct StreamRouter {
    pub gossip: mpsc::Sender<InboundGossip>,
    pub forwards: mpsc::Sender<IncomingForward>,
    pub metrics: MeshMetrics,
    /// Bound on receiving a stream's header (kind byte, whole gossip frame).
    pub header_timeout: Duration,
    /// Every open connection, for re-checking its peer's certificate after a TLS reload.
    pub established: Arc<Established>,
}

/// The node name in the certificate the peer presented during the handshake.
pub(crate) fn identify_peer(conn: &Connection) -> Result<Arc<str>, TlsError> {
    let identity = conn.peer_identity().ok_or(TlsError::NoPeerName)?;
    let chain = identity
        .downcast::<Vec<CertificateDer<'static>>>()
        .map_err(|_| TlsError::BadPeerCertificate("unexpected peer identity type".into()))?;
    let leaf = chain.first().ok_or(TlsError::NoPeerName)?;
    Ok(tls::peer_node_name(leaf)?.into())
}

/// Accepts connections until the endpoint closes.
pub(crate) async fn accept_loop(
    endpoint: quinn::Endpoint,
    router: StreamRouter,
    handshake_timeout: Duration,
) {
    while let Some(incoming) = endpoint.accept().await {
        let router = router.clone();
        tokio::spawn(async move {
            let remote = incoming.remote_address();
            match timeout(handshake_timeout, welcome(incoming)).await {
                Ok(Ok(peer)) => {
                    tracing::debug!(peer = %peer.peer_name, %remote, "mesh connection accepted");
                    router.serve(peer, PeerRole::Client);
                }
                Ok(Err(err)) => {
                    router.metrics.handshakes_rejected.inc();
                    let error = err.to_string();
                    match tls::refusal_reason(&error) {
                        Some(reason) => tracing::warn!(
                            %remote,
                            reason,
                            %error,
                            "mesh handshake rejected: peer at {remote} refused, {reason}"
                        ),
                        None => tracing::warn!(%remote, %error, "mesh handshake rejected"),
                    }
                }
                Err(_) => {
                    router.metrics.handshakes_rejected.inc();
                    tracing::warn!(%remote, "mesh handshake timed out");
                }
            }
        });
    }
}

/// Completes the handshake (rustls has verified the client certificate against the CA by
/// then) and tells the client so.
async fn welcome(incoming: quinn::Incoming) -> Result<PeerConnection, AcceptError> {
    let conn = incoming.await?;
    let peer_name = match identify_peer(&conn) {
        Ok(name) => name,
        Err(err) => {
            conn.close(codes::MALFORMED, b"no node name in certificate");
            return Err(err.into());
        }
    };
    let mut stream = conn.open_uni().await?;
    stream.write_all(&[StreamKind::Welcome as u8]).await?;
    stream.finish()?;
    Ok(PeerConnection { conn, peer_name })
}

/// Why an incoming connection was not admitted (only logged: the peer is told by TLS).
#[derive(Debug, thiserror::Error)]
enum AcceptError {
    #[error("handshake: {0}")]
    Handshake(#[from] quinn::ConnectionError),
    #[error("identity: {0}")]
    Identity(#[from] TlsError),
    #[error("welcome: {0}")]
    Welcome(#[from] quinn::WriteError),
    #[error("welcome: {0}")]
    Closed(#[from] quinn::ClosedStream),
}

impl StreamRouter {
    /// Serves the streams the peer opens on `peer` until the connection closes. `role` is the
    /// side the peer took in the handshake.
    pub fn serve(&self, peer: PeerConnection, role: PeerRole) {
        self.established.insert(&peer.conn, &peer.peer_name, role);
        let uni = self.clone();
        let uni_peer = peer.clone();
        tokio::spawn(async move {
            while let Ok(recv) = uni_peer.conn.accept_uni().await {
                let router = uni.clone();
                let name = uni_peer.peer_name.clone();
                tokio::spawn(async move { router.handle_uni(name, recv).await });
            }
        });
        let bi = self.clone();
        tokio::spawn(async move {
            while let Ok((send, recv)) = peer.conn.accept_bi().await {
                let router = bi.clone();
                let name = peer.peer_name.clone();
                let addr = peer.remote_address();
                tokio::spawn(async move { router.handle_bi(name, addr, send, recv).await });
            }
            bi.established.remove(&peer.conn);
        });
    }

    async fn handle_uni(&self, peer_name: Arc<str>, mut recv: RecvStream) {
        let read = timeout(self.header_timeout, recv.read_to_end(MAX_GOSSIP_STREAM)).await;
        let bytes = match read {
            Ok(Ok(bytes)) => bytes,
            Ok(Err(err)) => return self.refuse_uni(&peer_name, recv, &err),
            Err(_) => return self.refuse_uni(&peer_name, recv, &"timed out"),
        };
        self.metrics
            .gossip_bytes_received
            .inc_by(bytes.len() as u64);
        match bytes.split_first() {
            Some((&kind, rest)) if StreamKind::from_byte(kind) == Some(StreamKind::Gossip) => {
                match GossipFrame::decode(rest) {
                    Ok(frame) => self.deliver_gossip(peer_name, &frame),
                    Err(err) => {
                        self.metrics.gossip_datagrams_dropped.inc();
                        tracing::debug!(peer = %peer_name, error = %err, "malformed gossip frame");
                    }
                }
            }
            _ => {
                self.metrics.streams_rejected.inc();
                tracing::debug!(peer = %peer_name, "unidirectional stream of unknown kind");
            }
        }
    }

    fn deliver_gossip(&self, peer_name: Arc<str>, frame: &GossipFrame<'_>) {
        let inbound = InboundGossip {
            sender: frame.sender,
            peer_name,
            datagram: frame.datagram.to_vec(),
        };
        // Gossip is datagrams: when the relay falls behind, dropping is the right answer.
        if self.gossip.try_send(inbound).is_err() {
            self.metrics.gossip_datagrams_dropped.inc();
        }
    }

    fn refuse_uni(&self, peer: &str, mut recv: RecvStream, err: &dyn std::fmt::Display) {
        self.metrics.streams_rejected.inc();
        tracing::debug!(%peer, error = %err, "refused unidirectional stream");
        let _ = recv.stop(codes::MALFORMED);
    }

    async fn handle_bi(
        &self,
        peer_name: Arc<str>,
        peer_addr: SocketAddr,
        send: SendStream,
        mut recv: RecvStream,
    ) {
        let mut kind = [0u8; 1];
        let kind = match timeout(self.header_timeout, recv.read_exact(&mut kind)).await {
            Ok(Ok(())) => StreamKind::from_byte(kind[0]),
            _ => None,
        };
        if kind != Some(StreamKind::Forward) {
            return self.refuse_bi(&peer_name, send, recv, codes::UNKNOWN_STREAM);
        }
        let forward = IncomingForward {
            peer_name,
            peer_addr,
            send,
            recv,
        };
        // A full queue means the forwarding layer is saturated: refusing at once lets the
        // entry node retry elsewhere instead of waiting.
        if let Err(err) = self.forwards.try_send(forward) {
            let forward = match err {
                mpsc::error::TrySendError::Full(f) | mpsc::error::TrySendError::Closed(f) => f,
            };
            self.refuse_bi(
                &forward.peer_name,
                forward.send,
                forward.recv,
                codes::NOT_ACCEPTING,
            );
        }
    }

    fn refuse_bi(
        &self,
        peer: &str,
        mut send: SendStream,
        mut recv: RecvStream,
        code: quinn::VarInt,
    ) {
        self.metrics.streams_rejected.inc();
        tracing::debug!(%peer, code = %code, "refused bidirectional stream");
        let _ = send.reset(code);
        let _ = recv.stop(code);
    }
}
