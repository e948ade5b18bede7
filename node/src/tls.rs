//! Mutual TLS between sidecars: rustls configurations over the ring provider only.
//!
//! Trust is the cluster CA (or, during a CA rotation, every CA of the bundle in `ca.pem`)
//! and nothing else:
//! - the server side requires a client certificate chaining to a trusted CA
//!   ([`rustls::server::WebPkiClientVerifier`]), so a host without one gets no stream at all;
//! - the client side verifies that the server certificate chains to a trusted CA and is valid
//!   for server authentication, but does not match it against a host name: sidecars dial peers
//!   by address (seeds, gossip addresses), and membership in the cluster is what a certificate
//!   from the CA proves. The peer's identity is then read from its certificate
//!   ([`peer_node_name`]) and handed to whoever uses the connection, who can compare it with
//!   the node it meant to reach.
//! - both sides refuse a certificate that is expired, not valid yet, or listed in a CRL of
//!   `--crl` (see [`live`]).
//!
//! The material (certificate, key, CA bundle, CRLs) is not fixed into the configurations: they
//! ask a [`LiveTls`] for the current material at every handshake, and [`reload`] swaps it when
//! the files change, so a rotation needs no restart and no new endpoint.
//!
//! Session resumption is off on both sides: a resumed TLS 1.3 session skips certificate
//! verification, so a peer revoked (or expired) since its last full handshake could resume
//! its way back in. Mesh connections live for hours; a full handshake per connection costs
//! nothing that matters.
//!
//! QUIC requires TLS 1.3, so only TLS 1.3 is enabled.

pub mod live;
pub mod reload;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, CertificateRevocationListDer, PrivateKeyDer, UnixTime};

pub use self::live::{LiveTls, PeerRole};
pub use self::reload::{TlsMetrics, TlsReload};
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
    #[error("{path} and {key_path} do not belong together: {reason}")]
    KeyMismatch {
        path: String,
        key_path: String,
        reason: String,
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

/// Where a node's TLS material lives: `ca.pem` (one CA or a bundle of several), `NAME.pem`
/// and `NAME.key` in `dir`, and optionally a file of CRLs.
#[derive(Debug, Clone)]
pub struct TlsSource {
    pub dir: PathBuf,
    pub name: String,
    pub crl: Option<PathBuf>,
}

impl TlsSource {
    /// The files [`load`](Self::load) reads, in a fixed order.
    pub fn files(&self) -> Vec<PathBuf> {
        let mut files = vec![
            self.dir.join(CA_CERT_FILE),
            cert::node_cert_path(&self.dir, &self.name),
            cert::node_key_path(&self.dir, &self.name),
        ];
        files.extend(self.crl.clone());
        files
    }

    /// Reads the files, each once, as they are now.
    pub fn read(&self) -> FileSnapshot {
        FileSnapshot {
            files: self
                .files()
                .into_iter()
                .map(|path| {
                    let contents = std::fs::read(&path);
                    (path, contents)
                })
                .collect(),
        }
    }

    /// Reads and checks everything: the CA bundle (at least one certificate), the node's
    /// certificate naming node `name`, and the CRLs. (Whether the key matches the certificate
    /// is checked when the material is built, see [`live::Material::build`].)
    pub fn load(&self) -> Result<NodeIdentity, TlsError> {
        self.parse(&self.read())
    }

    /// Like [`load`](Self::load), from files already read.
    pub fn parse(&self, snapshot: &FileSnapshot) -> Result<NodeIdentity, TlsError> {
        cert::validate_node_name(&self.name)?;
        let [ca, cert, key, crl @ ..] = snapshot.files.as_slice() else {
            return Err(TlsError::Pem {
                path: self.dir.display().to_string(),
                reason: "files missing from the snapshot".into(),
            });
        };
        let cas = parse_pem_all::<CertificateDer<'static>>(ca, "certificate")?;
        let cert_path = cert.0.clone();
        let cert_chain = parse_pem_all::<CertificateDer<'static>>(cert, "certificate")?;
        let found = peer_node_name(&cert_chain[0])?;
        if found != self.name {
            return Err(TlsError::NameMismatch {
                path: cert_path.display().to_string(),
                expected: self.name.clone(),
                found,
            });
        }
        let key_path = key.0.clone();
        let key = PrivateKeyDer::from_pem_slice(contents(key)?)
            .map_err(|err| pem_error(&key_path, err))?;
        let crls = match crl.first() {
            Some(crl) => parse_pem_all::<CertificateRevocationListDer<'static>>(crl, "CRL")?,
            None => Vec::new(),
        };
        Ok(NodeIdentity {
            name: self.name.clone(),
            cas,
            cert_chain,
            key,
            crls,
            cert_path,
            key_path,
            fingerprint: snapshot.fingerprint(),
        })
    }
}

/// The TLS files' contents as read at one moment (or why a file could not be read).
#[derive(Debug)]
pub struct FileSnapshot {
    files: Vec<(PathBuf, std::io::Result<Vec<u8>>)>,
}

impl FileSnapshot {
    /// A hash of every file's contents (a missing file hashes as such): equal fingerprints,
    /// same material.
    pub fn fingerprint(&self) -> blake3::Hash {
        let mut hasher = blake3::Hasher::new();
        for (_, contents) in &self.files {
            match contents {
                Ok(bytes) => {
                    hasher.update(&(bytes.len() as u64).to_le_bytes());
                    hasher.update(bytes);
                }
                Err(err) => {
                    hasher.update(&u64::MAX.to_le_bytes());
                    hasher.update(err.kind().to_string().as_bytes());
                }
            }
        }
        hasher.finalize()
    }
}

type ReadFile = (PathBuf, std::io::Result<Vec<u8>>);

fn contents(file: &ReadFile) -> Result<&[u8], TlsError> {
    match &file.1 {
        Ok(bytes) => Ok(bytes),
        Err(err) => Err(TlsError::Pem {
            path: file.0.display().to_string(),
            reason: err.to_string(),
        }),
    }
}

/// What a node needs to take part in the mesh: the trusted CAs, its own certificate and key,
/// and the CRLs it enforces.
#[derive(Debug)]
pub struct NodeIdentity {
    /// The node name, as written in the first DNS SAN of `cert_chain[0]`.
    pub name: String,
    /// Every CA a peer's certificate may chain to (two during a CA rotation).
    pub cas: Vec<CertificateDer<'static>>,
    pub cert_chain: Vec<CertificateDer<'static>>,
    pub key: PrivateKeyDer<'static>,
    /// Revocation lists; empty when the node was given no `--crl`.
    pub crls: Vec<CertificateRevocationListDer<'static>>,
    /// Where the certificate and key were read from, for error messages.
    pub cert_path: PathBuf,
    pub key_path: PathBuf,
    /// Of the files' contents this was parsed from (see [`FileSnapshot::fingerprint`]).
    pub fingerprint: blake3::Hash,
}

impl Clone for NodeIdentity {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            cas: self.cas.clone(),
            cert_chain: self.cert_chain.clone(),
            key: self.key.clone_key(),
            crls: self.crls.clone(),
            cert_path: self.cert_path.clone(),
            key_path: self.key_path.clone(),
            fingerprint: self.fingerprint,
        }
    }
}

impl NodeIdentity {
    /// Loads `ca.pem`, `NAME.pem` and `NAME.key` from `dir` (no CRL) and checks that the
    /// certificate names node `name`.
    pub fn load(dir: &Path, name: &str) -> Result<Self, TlsError> {
        TlsSource {
            dir: dir.to_owned(),
            name: name.to_owned(),
            crl: None,
        }
        .load()
    }
}

/// Every PEM object of type `T` in `file`; at least one.
fn parse_pem_all<T: PemObject>(file: &ReadFile, what: &str) -> Result<Vec<T>, TlsError> {
    let path = &file.0;
    let all = T::pem_slice_iter(contents(file)?)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|err| pem_error(path, err))?;
    if all.is_empty() {
        return Err(TlsError::Pem {
            path: path.display().to_string(),
            reason: format!("no {what} found"),
        });
    }
    Ok(all)
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

/// [`live_server_config`] over fixed material.
pub fn server_config(identity: &NodeIdentity) -> Result<rustls::ServerConfig, TlsError> {
    live_server_config(&LiveTls::new(identity.clone())?)
}

/// [`live_client_config`] over fixed material.
pub fn client_config(identity: &NodeIdentity) -> Result<rustls::ClientConfig, TlsError> {
    live_client_config(&LiveTls::new(identity.clone())?)
}

/// Server side: present the current certificate, require a client certificate from a trusted
/// CA, not revoked; no resumption (see the module documentation).
pub fn live_server_config(live: &Arc<LiveTls>) -> Result<rustls::ServerConfig, TlsError> {
    let mut config = rustls::ServerConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .with_client_cert_verifier(live.clone())
        .with_cert_resolver(live.clone());
    config.session_storage = Arc::new(rustls::server::NoServerSessionStorage {});
    config.send_tls13_tickets = 0;
    config.alpn_protocols = vec![ALPN.to_vec()];
    Ok(config)
}

/// Client side: present the current certificate, accept a server certificate from a trusted
/// CA, not revoked; no resumption.
pub fn live_client_config(live: &Arc<LiveTls>) -> Result<rustls::ClientConfig, TlsError> {
    let mut config = rustls::ClientConfig::builder_with_provider(provider())
        .with_protocol_versions(&[&rustls::version::TLS13])?
        .dangerous()
        .with_custom_certificate_verifier(live.clone())
        .with_client_cert_resolver(live.clone());
    config.resumption = rustls::client::Resumption::disabled();
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

/// The end of a certificate's validity.
pub fn not_after(cert: &CertificateDer<'_>) -> Result<UnixTime, TlsError> {
    let (_, parsed) = x509_parser::parse_x509_certificate(cert.as_ref())
        .map_err(|err| TlsError::BadPeerCertificate(err.to_string()))?;
    let secs = parsed.validity().not_after.timestamp();
    Ok(UnixTime::since_unix_epoch(std::time::Duration::from_secs(
        secs.max(0) as u64,
    )))
}

/// Why a handshake failed, in words an operator greps for, when the error (rustls's own, or
/// the alert a peer sent, as quinn reports them) is a refused certificate.
pub fn refusal_reason(error: &str) -> Option<&'static str> {
    let error = error.to_ascii_lowercase().replace([' ', '_'], "");
    [
        ("expired", "certificate expired"),
        ("revoked", "certificate revoked"),
        ("notvalidyet", "certificate not valid yet"),
        ("unknownissuer", "certificate not from a trusted CA"),
        ("unknownca", "certificate not from a trusted CA"),
        ("badcertificate", "certificate refused"),
        ("invalidpeercertificate", "certificate refused"),
    ]
    .into_iter()
    .find_map(|(needle, reason)| error.contains(needle).then_some(reason))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

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

    fn now() -> UnixTime {
        UnixTime::now()
    }

    #[test]
    fn loads_identity_and_reads_name_from_certificate() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        let id = identity(dir.path(), "node-a");
        assert_eq!(peer_node_name(&id.cert_chain[0]).unwrap(), "node-a");
        server_config(&id).unwrap();
        client_config(&id).unwrap();
        let live = LiveTls::new(id.clone()).unwrap();
        let material = live.current();
        for role in [PeerRole::Client, PeerRole::Server] {
            material.verify_peer(role, &id.cert_chain, now()).unwrap();
        }
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

    #[test]
    fn a_key_of_another_certificate_is_refused_and_the_old_material_stays() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        let a = identity(dir.path(), "node-a");
        let other = identity(dir.path(), "node-b");
        let live = LiveTls::new(a.clone()).unwrap();
        let generation = *live.subscribe().borrow();
        let mut mixed = a.clone();
        mixed.key = other.key.clone_key();
        let err = live.replace(mixed).unwrap_err();
        assert!(matches!(err, TlsError::KeyMismatch { .. }), "{err}");
        assert_eq!(*live.subscribe().borrow(), generation);
        // Another node's identity cannot replace this node's either.
        assert!(live.replace(other).is_err());
        live.replace(a).unwrap();
        assert_eq!(*live.subscribe().borrow(), generation + 1);
    }

    #[test]
    fn a_bundle_trusts_both_cas_and_a_single_ca_only_its_own() {
        let old = tempfile::tempdir().unwrap();
        let new = tempfile::tempdir().unwrap();
        init_ca(old.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        init_ca(new.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        let a = identity(old.path(), "node-a");
        let b = identity(new.path(), "node-b");
        let only_old = LiveTls::new(a.clone()).unwrap().current();
        let err = only_old
            .verify_peer(PeerRole::Client, &b.cert_chain, now())
            .unwrap_err();
        assert_eq!(
            refusal_reason(&err.to_string()),
            Some("certificate not from a trusted CA"),
            "{err}"
        );
        cert::trust_ca(
            &old.path().join(CA_CERT_FILE),
            &new.path().join(CA_CERT_FILE),
        )
        .unwrap();
        let both = LiveTls::new(NodeIdentity::load(old.path(), "node-a").unwrap()).unwrap();
        assert_eq!(both.current().cas, 2);
        for role in [PeerRole::Client, PeerRole::Server] {
            both.current()
                .verify_peer(role, &b.cert_chain, now())
                .unwrap();
            both.current()
                .verify_peer(role, &a.cert_chain, now())
                .unwrap();
        }
    }

    #[test]
    fn an_expired_peer_is_refused_as_expired() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        let a = identity(dir.path(), "node-a");
        issue_node_cert(
            dir.path(),
            "brief",
            dir.path(),
            &[],
            Duration::from_secs(60),
        )
        .unwrap();
        let brief = NodeIdentity::load(dir.path(), "brief").unwrap();
        let material = LiveTls::new(a).unwrap().current();
        let later = UnixTime::since_unix_epoch(Duration::from_secs(now().as_secs() + 120));
        for role in [PeerRole::Client, PeerRole::Server] {
            material
                .verify_peer(role, &brief.cert_chain, now())
                .unwrap();
            let err = material
                .verify_peer(role, &brief.cert_chain, later)
                .unwrap_err();
            assert_eq!(
                refusal_reason(&err.to_string()),
                Some("certificate expired")
            );
        }
    }

    #[test]
    fn refusal_reasons_read_rustls_errors_and_peer_alerts() {
        let expired = rustls::Error::InvalidCertificate(rustls::CertificateError::Expired);
        let revoked = rustls::Error::InvalidCertificate(rustls::CertificateError::Revoked);
        assert_eq!(
            refusal_reason(&expired.to_string()),
            Some("certificate expired")
        );
        assert_eq!(
            refusal_reason(&revoked.to_string()),
            Some("certificate revoked")
        );
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateExpired);
        assert_eq!(
            refusal_reason(&alert.to_string()),
            Some("certificate expired")
        );
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRevoked);
        assert_eq!(
            refusal_reason(&alert.to_string()),
            Some("certificate revoked")
        );
        assert_eq!(refusal_reason("timed out"), None);
    }
}
