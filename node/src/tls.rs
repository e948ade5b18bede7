//! Mutual TLS between sidecars: rustls configurations over the ring provider only.
//!
//! Trust is the cluster CA and nothing else:
//! - the server side requires a client certificate chaining to the CA
//!   ([`WebPkiClientVerifier`]), so a host without one gets no stream at all;
//! - the client side verifies that the server certificate chains to the CA and is valid for
//!   server authentication, but does not match it against a host name: sidecars dial peers by
//!   address (seeds, gossip addresses), and membership in the cluster is what a certificate
//!   from the CA proves. The peer's identity is then read from its certificate
//!   ([`peer_node_name`]) and handed to whoever uses the connection, who can compare it with
//!   the node it meant to reach.
//!
//! QUIC requires TLS 1.3, so only TLS 1.3 is enabled.

use std::path::Path;
use std::sync::Arc;

use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::client::verify_server_cert_signed_by_trust_anchor;
use rustls::crypto::{CryptoProvider, WebPkiSupportedAlgorithms};
use rustls::server::{ParsedCertificate, WebPkiClientVerifier};
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName, UnixTime};

use crate::cert::{self, CA_CERT_FILE, CertError};

/// ALPN protocol id of the kvmesh mesh protocol; bump on incompatible wire changes.
pub const ALPN: &[u8] = b"kvmesh/1";

/// Server name sent in the TLS ClientHello. Servers present one certificate whatever the SNI,
/// and clients do not match it (see the module documentation).
pub const SNI: &str = "kvmesh";

/// Errors of TLS setup and peer identification.
#[derive(Debug, thiserror::Error)]
pub enum TlsError {
    #[error(transparent)]
    Cert(#[from] CertError),
    #[error("{path}: {reason}")]
    Pem { path: String, reason: String },
    #[error("{path} holds certificate for node {found:?}, expected {expected:?}")]
    NameMismatch {
        path: String,
        expected: String,
        found: String,
    },
    #[error("peer certificate has no DNS subject alternative name to identify the node")]
    NoPeerName,
    #[error("peer certificate cannot be parsed: {0}")]
    BadPeerCertificate(String),
    #[error("TLS configuration: {0}")]
    Rustls(#[from] rustls::Error),
    #[error("TLS client verifier: {0}")]
    Verifier(#[from] rustls::server::VerifierBuilderError),
}

/// What a node needs to take part in the mesh: the cluster CA, its own certificate and key.
#[derive(Debug)]
pub struct NodeIdentity {
    /// The node name, as written in the first DNS SAN of `cert_chain[0]`.
    pub name: String,
    pub ca: CertificateDer<'static>,
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
}

impl Clone for NodeIdentity {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            ca: self.ca.clone(),
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
        }
    }
}

impl NodeIdentity {
    /// Loads `ca.pem`, `NAME.pem` and `NAME.key` from `dir` and checks that the certificate
    /// names node `name`.
    pub fn load(dir: &Path, name: &str) -> Result<Self, TlsError> {
        cert::validate_node_name(name)?;
        let ca_path = dir.join(CA_CERT_FILE);
        let ca = CertificateDer::from_pem_file(&ca_path).map_err(|err| pem_error(&ca_path, err))?;
        let cert_path = cert::node_cert_path(dir, name);
        let cert_chain = CertificateDer::pem_file_iter(&cert_path)
            .map_err(|err| pem_error(&cert_path, err))?
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| pem_error(&cert_path, err))?;
        let Some(leaf) = cert_chain.first() else {
            return Err(TlsError::Pem {
                path: cert_path.display().to_string(),
                reason: "no certificate found".into(),
            });
        };
        let found = peer_node_name(leaf)?;
        if found != name {
            return Err(TlsError::NameMismatch {
                path: cert_path.display().to_string(),
                expected: name.to_owned(),
                found,
            });
        }
        let key_path = cert::node_key_path(dir, name);
        let key =
            PrivateKeyDer::from_pem_file(&key_path).map_err(|err| pem_error(&key_path, err))?;
        Ok(Self {
            name: name.to_owned(),
            ca,
            cert_chain,
            key,
        })
    }

    fn roots(&self) -> Result<Arc<RootCertStore>, TlsError> {
        let mut roots = RootCertStore::empty();
        roots.add(self.ca.clone())?;
        Ok(Arc::new(roots))
    }
}

fn pem_error(path: &Path, err: rustls_pki_types::pem::Error) -> TlsError {
    TlsError::Pem {
        path: path.display().to_string(),
        reason: err.to_string(),
    }
}

/// The only crypto provider kvmesh uses.
pub fn provider() -> Arc<CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// Server side: present our certificate, require a client certificate from the cluster CA.
pub fn server_config(identity: &NodeIdentity) -> Result<rustls::ServerConfig, TlsError> {
    let provider = provider();
    let client_verifier =
        WebPkiClientVerifier::builder_with_provider(identity.roots()?, provider.clone()).build()?;
    let mut config = rustls::ServerConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(client_verifier)
        .with_single_cert(identity.cert_chain.clone(), identity.key.clone_key())?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// Client side: present our certificate, accept a server certificate from the cluster CA.
pub fn client_config(identity: &NodeIdentity) -> Result<rustls::ClientConfig, TlsError> {
    let provider = provider();
    let verifier = Arc::new(ClusterServerVerifier {
        roots: identity.roots()?,
        algorithms: provider.signature_verification_algorithms,
    });
    let mut config = rustls::ClientConfig::builder_with_provider(provider)
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(verifier)
        .with_client_auth_cert(identity.cert_chain.clone(), identity.key.clone_key())?;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// The node name a certificate identifies: its first DNS subject alternative name.
pub fn peer_node_name(cert: &CertificateDer<'_>) -> Result<String, TlsError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|err| TlsError::BadPeerCertificate(err.to_string()))?;
    let san = parsed
        .subject_alternative_name()
        .map_err(|err| TlsError::BadPeerCertificate(err.to_string()))?
        .ok_or(TlsError::NoPeerName)?;
    san.value
        .general_names
        .iter()
        .find_map(|name| match name {
            x509_parser::extensions::GeneralName::DNSName(dns) => Some((*dns).to_owned()),
            _ => None,
        })
        .ok_or(TlsError::NoPeerName)
}

/// Verifies that a server certificate chains to the cluster CA (and is valid now, for server
/// authentication), without matching a host name: see the module documentation.
#[derive(Debug)]
struct ClusterServerVerifier {
    roots: Arc<RootCertStore>,
    algorithms: WebPkiSupportedAlgorithms,
}

impl ServerCertVerifier for ClusterServerVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let cert = ParsedCertificate::try_from(end_entity)?;
        verify_server_cert_signed_by_trust_anchor(
            &cert,
            &self.roots,
            intermediates,
            now,
            self.algorithms.all,
        )?;
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        // Only TLS 1.3 is enabled (QUIC); a TLS 1.2 handshake never reaches this point.
        Err(rustls::Error::PeerIncompatible(
            rustls::PeerIncompatible::Tls12NotOffered,
        ))
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        rustls::crypto::verify_tls13_signature(message, cert, dss, &self.algorithms)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        self.algorithms.supported_schemes()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cert::{DEFAULT_CA_VALIDITY, DEFAULT_NODE_VALIDITY, init_ca, issue_node_cert};

    fn identity(dir: &Path, name: &str) -> NodeIdentity {
        issue_node_cert(
            dir,
            name,
            dir,
            &["extra.example".into()],
            DEFAULT_NODE_VALIDITY,
        )
        .unwrap();
        NodeIdentity::load(dir, name).unwrap()
    }

    #[test]
    fn loads_identity_and_reads_name_from_certificate() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        let id = identity(dir.path(), "node-a");
        assert_eq!(peer_node_name(&id.cert_chain[0]).unwrap(), "node-a");
        server_config(&id).unwrap();
        client_config(&id).unwrap();
    }

    #[test]
    fn renamed_certificate_is_refused() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        identity(dir.path(), "node-a");
        std::fs::copy(
            cert::node_cert_path(dir.path(), "node-a"),
            cert::node_cert_path(dir.path(), "node-b"),
        )
        .unwrap();
        std::fs::copy(
            cert::node_key_path(dir.path(), "node-a"),
            cert::node_key_path(dir.path(), "node-b"),
        )
        .unwrap();
        let err = NodeIdentity::load(dir.path(), "node-b").unwrap_err();
        assert!(matches!(err, TlsError::NameMismatch { .. }), "{err}");
    }

    #[test]
    fn missing_or_corrupt_files_are_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err = NodeIdentity::load(dir.path(), "node-a").unwrap_err();
        assert!(err.to_string().contains("ca.pem"), "{err}");
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        identity(dir.path(), "node-a");
        std::fs::write(cert::node_key_path(dir.path(), "node-a"), "junk").unwrap();
        let err = NodeIdentity::load(dir.path(), "node-a").unwrap_err();
        assert!(matches!(err, TlsError::Pem { .. }), "{err}");
    }
}
