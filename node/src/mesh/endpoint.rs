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

    let mut endpoint =
        quinn::Endpoint::server(server, bind).map_err(|source| MeshError::Bind { bind, source })?;
    endpoint.set_default_client_config(client);
    Ok(endpoint)
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
