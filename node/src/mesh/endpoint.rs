//! The node's single QUIC endpoint: server and client on one UDP socket.

use std::net::SocketAddr;
use std::sync::Arc;

use quinn::crypto::rustls::{QuicClientConfig, QuicServerConfig};
use quinn::{IdleTimeout, TransportConfig, VarInt};

use super::MeshError;
use super::config::QuicConfig;
use crate::tls::{self, LiveTls};

/// Binds the endpoint: it accepts peers (mutual TLS, our certificate as server) and dials
/// peers with our certificate as client, both with the same transport settings. Both sides
/// read the certificate and trust from `tls` at each handshake, so a reload needs no new
/// endpoint.
pub fn bind(
    tls: &Arc<LiveTls>,
    bind: SocketAddr,
    config: &QuicConfig,
) -> Result<quinn::Endpoint, MeshError> {
    let transport = Arc::new(transport_config(config)?);

    let server_crypto = QuicServerConfig::try_from(tls::live_server_config(tls)?)
        .map_err(|err| MeshError::Config(format!("QUIC server TLS: {err}")))?;
    let mut server = quinn::ServerConfig::with_crypto(Arc::new(server_crypto));
    server.transport_config(transport.clone());

    let client_crypto = QuicClientConfig::try_from(tls::live_client_config(tls)?)
        .map_err(|err| MeshError::Config(format!("QUIC client TLS: {err}")))?;
    let mut client = quinn::ClientConfig::new(Arc::new(client_crypto));
    client.transport_config(transport);

    let bind_error = |source| MeshError::Bind { bind, source };
    let socket = udp_socket(bind).map_err(bind_error)?;
    let runtime = quinn::default_runtime()
        .ok_or_else(|| MeshError::Config("no async runtime for the QUIC endpoint".to_owned()))?;
    let mut endpoint = quinn::Endpoint::new(
        quinn::EndpointConfig::default(),
        Some(server),
        socket,
        runtime,
    )
    .map_err(bind_error)?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
}

/// Socket buffers the mesh asks for, each way. A forwarded request with an image is hundreds
/// of kilobytes sent at once; with the kernel's default 208 KiB receive buffer, a burst that
/// the receiving task has not drained yet overflows it, and every datagram dropped costs a
/// loss recovery and halves the congestion window (measured: about two drops per forwarded
/// 256 KiB image on loopback, adding milliseconds). The kernel caps the request at
/// `net.core.rmem_max` / `wmem_max`; raise those where they are lower.
const UDP_BUFFER_BYTES: usize = 4 * 1024 * 1024;

/// The endpoint's UDP socket, bound, with larger buffers where the kernel allows them.
fn udp_socket(bind: SocketAddr) -> std::io::Result<std::net::UdpSocket> {
    let socket = socket2::Socket::from(std::net::UdpSocket::bind(bind)?);
    for (what, result) in [
        ("receive", socket.set_recv_buffer_size(UDP_BUFFER_BYTES)),
        ("send", socket.set_send_buffer_size(UDP_BUFFER_BYTES)),
    ] {
        if let Err(error) = result {
            tracing::warn!(%error, "the mesh socket keeps the kernel's default {what} buffer");
        }
    }
    if let Ok(size) = socket.recv_buffer_size() {
        tracing::debug!(bytes = size, "mesh socket receive buffer");
    }
    Ok(socket.into())
}

fn transport_config(config: &QuicConfig) -> Result<TransportConfig, MeshError> {
    let mut transport = TransportConfig::default();
    transport
        .max_concurrent_bidi_streams(VarInt::from_u32(config.max_concurrent_bidi_streams))
        .max_concurrent_uni_streams(VarInt::from_u32(config.max_concurrent_uni_streams))
        .keep_alive_interval(Some(config.keep_alive_interval))
        .max_idle_timeout(Some(IdleTimeout::try_from(config.idle_timeout).map_err(
            |_| MeshError::Config(format!("idle timeout {:?} too large", config.idle_timeout)),
        )?));
    Ok(transport)
}
