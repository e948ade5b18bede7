//! The TLS material a node uses right now, read by rustls at every handshake.
//!
//! [`LiveTls`] is at once the server's certificate resolver, the client's certificate
//! resolver, the client-certificate verifier and the server-certificate verifier of the
//! node's one QUIC endpoint. Each asks the current [`Material`] — a certified key and two
//! webpki verifiers built from one [`NodeIdentity`] — so swapping it
//! ([`LiveTls::replace`]) changes what the next handshake presents and accepts, while
//! established connections carry on untouched (see `mesh::trust` for re-checking those).
//!
//! Revocation: with CRLs, only the end-entity certificate is checked (the CAs are roots; a
//! root is trusted or not, by the bundle) and a certificate whose issuer has no CRL in the
//! file is accepted: during a CA rotation the file may hold the old CA's CRL only. A CRL's
//! `nextUpdate` is not enforced: the file is the operator's, reloaded when it changes.

use std::fmt;
use std::sync::{Arc, RwLock};

use rustls::client::ResolvesClientCert;
use rustls::client::WebPkiServerVerifier;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert, WebPkiClientVerifier};
use rustls::sign::CertifiedKey;
use rustls::{
    CertificateError, DigitallySignedStruct, DistinguishedName, RootCertStore, SignatureScheme,
};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::sync::watch;

use super::{NodeIdentity, TlsError, not_after, peer_node_name, provider};

/// Which side of the handshake a peer was on: it dialed us (a client, its certificate checked
/// for client authentication) or we dialed it (a server).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerRole {
    Client,
    Server,
}

/// One consistent set of material: what the node presents and how it judges peers.
pub struct Material {
    pub name: String,
    certified: Arc<CertifiedKey>,
    clients: Arc<dyn ClientCertVerifier>,
    servers: Arc<WebPkiServerVerifier>,
    /// End of this node's own certificate's validity.
    pub not_after: UnixTime,
    /// How many CAs are trusted and how many CRLs are enforced (for logs).
    pub cas: usize,
    pub crls: usize,
    /// Of the files this was read from.
    pub fingerprint: blake3::Hash,
}

impl Material {
    /// Builds the material, checking that the key belongs to the certificate and that the
    /// CAs and CRLs parse.
    pub fn build(identity: NodeIdentity) -> Result<Self, TlsError> {
        let provider = provider();
        let mut roots = RootCertStore::empty();
        for ca in &identity.cas {
            roots.add(ca.clone())?;
        }
        let roots = Arc::new(roots);
        let clients = WebPkiClientVerifier::builder_with_provider(roots.clone(), provider.clone())
            .with_crls(identity.crls.iter().cloned())
            .only_check_end_entity_revocation()
            .allow_unknown_revocation_status()
            .build()?;
        let servers = WebPkiServerVerifier::builder_with_provider(roots, provider.clone())
            .with_crls(identity.crls.iter().cloned())
            .only_check_end_entity_revocation()
            .allow_unknown_revocation_status()
            .build()
            .map_err(|err| TlsError::Rustls(rustls::Error::General(err.to_string())))?;
        let key_mismatch = |reason: String| TlsError::KeyMismatch {
            path: identity.cert_path.display().to_string(),
            key_path: identity.key_path.display().to_string(),
            reason,
        };
        let certified =
            CertifiedKey::from_der(identity.cert_chain.clone(), identity.key, &provider)
                .map_err(|err| key_mismatch(err.to_string()))?;
        Ok(Self {
            not_after: not_after(&identity.cert_chain[0])?,
            name: identity.name,
            certified: Arc::new(certified),
            clients,
            servers,
            cas: identity.cas.len(),
            crls: identity.crls.len(),
            fingerprint: identity.fingerprint,
        })
    }

    /// Whether a peer's chain (leaf first) passes today's verification for its role.
    pub fn verify_peer(
        &self,
        role: PeerRole,
        chain: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<(), rustls::Error> {
        let (leaf, intermediates) = chain
            .split_first()
            .ok_or(rustls::Error::NoCertificatesPresented)?;
        match role {
            PeerRole::Client => self
                .clients
                .verify_client_cert(leaf, intermediates, now)
                .map(drop),
            PeerRole::Server => self.verify_server(leaf, intermediates, now).map(drop),
        }
    }

    /// Chain, validity, usage and revocation of a server certificate, with the certificate's
    /// own node name standing in for the host name (see the `tls` module documentation).
    fn verify_server(
        &self,
        leaf: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let unnamed = || rustls::Error::InvalidCertificate(CertificateError::NotValidForName);
        let name = peer_node_name(leaf).map_err(|_| unnamed())?;
        let name = ServerName::try_from(name).map_err(|_| unnamed())?;
        self.servers
            .verify_server_cert(leaf, intermediates, &name, &[], now)
    }
}

impl fmt::Debug for Material {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Material")
            .field("name", &self.name)
            .field("not_after", &self.not_after.as_secs())
            .field("cas", &self.cas)
            .field("crls", &self.crls)
            .finish_non_exhaustive()
    }
}

/// The current [`Material`], swapped on reload; see the module documentation.
pub struct LiveTls {
    current: RwLock<Arc<Material>>,
    /// Counts replacements; `mesh::trust` re-checks established connections on each.
    generation: watch::Sender<u64>,
}

impl fmt::Debug for LiveTls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LiveTls")
            .field("node", &self.current().name)
            .field("generation", &*self.generation.borrow())
            .finish()
    }
}

impl LiveTls {
    pub fn new(identity: NodeIdentity) -> Result<Arc<Self>, TlsError> {
        Ok(Arc::new(Self {
            current: RwLock::new(Arc::new(Material::build(identity)?)),
            generation: watch::Sender::new(0),
        }))
    }

    /// The material the next handshake uses.
    pub fn current(&self) -> Arc<Material> {
        self.current
            .read()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    /// Builds material from `identity` and makes it current. On error the current material
    /// stays. The node name cannot change: peers know this node by it.
    pub fn replace(&self, identity: NodeIdentity) -> Result<Arc<Material>, TlsError> {
        let name = self.current().name.clone();
        if identity.name != name {
            return Err(TlsError::NameMismatch {
                path: identity.cert_path.display().to_string(),
                expected: name,
                found: identity.name,
            });
        }
        let material = Arc::new(Material::build(identity)?);
        *self.current.write().unwrap_or_else(|e| e.into_inner()) = material.clone();
        self.generation.send_modify(|g| *g += 1);
        Ok(material)
    }

    /// Changes each time the material is replaced.
    pub fn subscribe(&self) -> watch::Receiver<u64> {
        self.generation.subscribe()
    }
}

impl ResolvesServerCert for LiveTls {
    fn resolve(&self, _client_hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.current().certified.clone())
    }
}

impl ResolvesClientCert for LiveTls {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.current().certified.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

impl ClientCertVerifier for LiveTls {
    fn client_auth_mandatory(&self) -> bool {
        true
    }

    /// No hints: the CA list changes on reload and cannot be borrowed from here, and our
    /// clients present their one certificate whatever the hints say.
    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        self.current()
            .clients
            .verify_client_cert(end_entity, intermediates, now)
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
        ClientCertVerifier::verify_tls13_signature(&*self.current().clients, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        ClientCertVerifier::supported_verify_schemes(&*self.current().clients)
    }
}

impl ServerCertVerifier for LiveTls {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        self.current().verify_server(end_entity, intermediates, now)
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
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
        ServerCertVerifier::verify_tls13_signature(&*self.current().servers, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        ServerCertVerifier::supported_verify_schemes(&*self.current().servers)
    }
}
