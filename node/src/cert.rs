//! The cluster certificate authority: `kvmesh cert init`, `issue`, `trust`, and (in [`crl`])
//! `revoke` and `crl`.
//!
//! A cluster is defined by one CA. Every sidecar holds a certificate signed by it, usable both
//! as a QUIC server certificate (peers dial it) and as a client certificate (it dials peers):
//! mutual TLS against that CA is what admits a host to the mesh.
//!
//! Layout of a TLS directory:
//! - `ca.pem`, `ca.key`: the CA certificate and its private key (the key stays with the
//!   operator; a sidecar only needs `ca.pem`).
//! - `NAME.pem`, `NAME.key`: the certificate and key of node `NAME`. The first DNS subject
//!   alternative name of a node certificate is its node name; peers read it from the
//!   certificate presented during the handshake (see [`crate::tls::peer_node_name`]).
//!
//! - `crl.pem`: the CA's certificate revocation list (see [`crl`]).
//!
//! Private keys are written with mode 0600, and no key or certificate is ever overwritten:
//! re-running a command over existing files is an error, so a CA key cannot be lost by a
//! typo. Two files are replaced on purpose, always by rename (a node polling them never reads
//! half of one): a CA bundle when [`trust_ca`] appends a CA to it, and the CRL.
//!
//! Rotating the CA: create the new CA in a directory of its own (`kvmesh cert init`), append
//! it to every node's bundle (`kvmesh cert trust`), wait for the nodes to reload, issue new node
//! certificates from it, and finally remove the old CA from the bundles.

pub mod crl;

use std::fs::{self, OpenOptions};
use std::io::Write;
use std::net::IpAddr;
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, ExtendedKeyUsagePurpose, IsCa,
    Issuer, KeyPair, KeyUsagePurpose, SanType,
};
use rustls_pki_types::CertificateDer;
use rustls_pki_types::pem::PemObject;
use time::OffsetDateTime;

/// File name of the CA certificate inside a TLS directory.
pub const CA_CERT_FILE: &str = "ca.pem";
/// File name of the CA private key inside a TLS directory.
pub const CA_KEY_FILE: &str = "ca.key";
/// Default validity of a cluster CA: 10 years.
pub const DEFAULT_CA_VALIDITY: Duration = Duration::from_secs(10 * 365 * 24 * 3600);
/// Default validity of a node certificate: 1 year.
pub const DEFAULT_NODE_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);
/// Certificates are valid from one hour in the past, so modest clock skew between the host
/// that issues and the hosts that verify does not reject a fresh certificate.
const BACKDATE: Duration = Duration::from_secs(3600);

/// Errors of certificate creation and loading.
#[derive(Debug, thiserror::Error)]
pub enum CertError {
    #[error("cannot access {path}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{path} already exists; refusing to overwrite it (move it away first)")]
    AlreadyExists { path: PathBuf },
    #[error("{path}: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("invalid node name {name:?}: {reason}")]
    InvalidNodeName { name: String, reason: &'static str },
    #[error("invalid subject alternative name {san:?}: {reason}")]
    InvalidSan { san: String, reason: String },
    #[error("certificate generation failed: {0}")]
    Generate(#[from] rcgen::Error),
}

/// Paths written by [`init_ca`].
#[derive(Debug, Clone)]
pub struct CaPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Paths written by [`issue_node_cert`].
#[derive(Debug, Clone)]
pub struct NodeCertPaths {
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// Path of the certificate of node `name` inside `dir`.
pub fn node_cert_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.pem"))
}

/// Path of the private key of node `name` inside `dir`.
pub fn node_key_path(dir: &Path, name: &str) -> PathBuf {
    dir.join(format!("{name}.key"))
}

/// Creates a new cluster CA in `dir` (`ca.pem`, `ca.key`), creating `dir` if needed.
pub fn init_ca(dir: &Path, cluster_id: &str, validity: Duration) -> Result<CaPaths, CertError> {
    let paths = CaPaths {
        cert: dir.join(CA_CERT_FILE),
        key: dir.join(CA_KEY_FILE),
    };
    refuse_existing(&paths.cert)?;
    refuse_existing(&paths.key)?;

    let key = KeyPair::generate()?;
    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "kvmesh");
    // The key's fingerprint makes every CA's name its own: a second CA of the same cluster
    // (a CA rotation) must not pass for the first, whose certificates and CRLs verifiers find
    // by issuer name.
    let fingerprint = blake3::hash(key.public_key_raw()).to_hex();
    dn.push(
        DnType::CommonName,
        format!("kvmesh cluster CA {cluster_id} {}", &fingerprint[..16]),
    );
    params.distinguished_name = dn;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    set_validity(&mut params, validity);
    let cert = params.self_signed(&key)?;

    create_dir(dir)?;
    // Key first: a CA certificate without its key would be useless, the reverse is recoverable.
    write_new(&paths.key, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&paths.cert, cert.pem().as_bytes(), 0o644)?;
    Ok(paths)
}

/// Issues a certificate for node `name`, signed by the CA found in `ca_dir`, and writes
/// `NAME.pem` and `NAME.key` into `out_dir`. `extra_sans` are added after the node name
/// (IP addresses become IP SANs, anything else a DNS SAN).
pub fn issue_node_cert(
    ca_dir: &Path,
    name: &str,
    out_dir: &Path,
    extra_sans: &[String],
    validity: Duration,
) -> Result<NodeCertPaths, CertError> {
    validate_node_name(name)?;
    let paths = NodeCertPaths {
        cert: node_cert_path(out_dir, name),
        key: node_key_path(out_dir, name),
    };
    refuse_existing(&paths.cert)?;
    refuse_existing(&paths.key)?;

    let issuer = load_issuer(ca_dir)?;

    let mut params = CertificateParams::default();
    let mut dn = DistinguishedName::new();
    dn.push(DnType::OrganizationName, "kvmesh");
    dn.push(DnType::CommonName, name);
    params.distinguished_name = dn;
    params.subject_alt_names = node_sans(name, extra_sans)?;
    params.is_ca = IsCa::ExplicitNoCa;
    params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
    params.extended_key_usages = vec![
        ExtendedKeyUsagePurpose::ServerAuth,
        ExtendedKeyUsagePurpose::ClientAuth,
    ];
    params.use_authority_key_identifier_extension = true;
    set_validity(&mut params, validity);

    let key = KeyPair::generate()?;
    let cert = params.signed_by(&key, &issuer)?;

    create_dir(out_dir)?;
    write_new(&paths.key, key.serialize_pem().as_bytes(), 0o600)?;
    write_new(&paths.cert, cert.pem().as_bytes(), 0o644)?;
    Ok(paths)
}

/// The CA of `ca_dir` as an issuer: its certificate (the first of `ca.pem`) and its key.
fn load_issuer(ca_dir: &Path) -> Result<Issuer<'static, KeyPair>, CertError> {
    let ca_cert_path = ca_dir.join(CA_CERT_FILE);
    let ca_key_path = ca_dir.join(CA_KEY_FILE);
    let ca_cert_pem = read_to_string(&ca_cert_path)?;
    let ca_key_pem = read_to_string(&ca_key_path)?;
    let ca_key = KeyPair::from_pem(&ca_key_pem).map_err(|err| CertError::Corrupt {
        path: ca_key_path.clone(),
        reason: format!("not a PEM private key: {err}"),
    })?;
    Issuer::from_ca_cert_pem(&ca_cert_pem, ca_key).map_err(|err| CertError::Corrupt {
        path: ca_cert_path.clone(),
        reason: format!("not a PEM CA certificate: {err}"),
    })
}

/// Appends the CA certificate(s) of `ca` to the bundle `bundle` (a node's `ca.pem`), so the
/// node trusts both during a CA rotation. A certificate already in the bundle is not added
/// twice. Returns how many certificates the bundle holds now.
pub fn trust_ca(bundle: &Path, ca: &Path) -> Result<usize, CertError> {
    let parse = |path: &Path| -> Result<Vec<CertificateDer<'static>>, CertError> {
        let pem = read_to_string(path)?;
        let certs = CertificateDer::pem_slice_iter(pem.as_bytes())
            .collect::<Result<Vec<_>, _>>()
            .map_err(|err| CertError::Corrupt {
                path: path.to_owned(),
                reason: err.to_string(),
            })?;
        if certs.is_empty() {
            return Err(CertError::Corrupt {
                path: path.to_owned(),
                reason: "no certificate found".into(),
            });
        }
        Ok(certs)
    };
    let mut certs = parse(bundle)?;
    for cert in parse(ca)? {
        if !certs.contains(&cert) {
            certs.push(cert);
        }
    }
    let pem: String = certs.iter().map(|cert| pem_certificate(cert)).collect();
    replace_file(bundle, pem.as_bytes(), 0o644)?;
    Ok(certs.len())
}

fn pem_certificate(der: &[u8]) -> String {
    use base64::Engine;
    let body = base64::engine::general_purpose::STANDARD.encode(der);
    let mut pem = String::from("-----BEGIN CERTIFICATE-----\n");
    for line in body.as_bytes().chunks(64) {
        pem.push_str(std::str::from_utf8(line).unwrap_or_default());
        pem.push('\n');
    }
    pem.push_str("-----END CERTIFICATE-----\n");
    pem
}

/// A node name is one DNS name (it is carried as a DNS SAN): ASCII letters, digits, `-` and
/// `.`, 1 to 253 characters, no empty label. Lowercase is not required but names compare
/// exactly, so keep them lowercase.
pub fn validate_node_name(name: &str) -> Result<(), CertError> {
    let invalid = |reason| CertError::InvalidNodeName {
        name: name.to_owned(),
        reason,
    };
    if name.is_empty() || name.len() > 253 {
        return Err(invalid("must be 1 to 253 characters"));
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b == b'-' || b == b'.')
    {
        return Err(invalid(
            "only ASCII letters, digits, '-' and '.' are allowed",
        ));
    }
    if name
        .split('.')
        .any(|label| label.is_empty() || label.len() > 63 || label.starts_with('-'))
    {
        return Err(invalid(
            "each dot-separated label must be 1 to 63 characters and not start with '-'",
        ));
    }
    Ok(())
}

fn node_sans(name: &str, extra_sans: &[String]) -> Result<Vec<SanType>, CertError> {
    let mut sans = vec![dns_san(name)?];
    for san in extra_sans {
        let san = san.trim();
        if san.is_empty() || san == name {
            continue;
        }
        sans.push(match san.parse::<IpAddr>() {
            Ok(ip) => SanType::IpAddress(ip),
            Err(_) => dns_san(san)?,
        });
    }
    Ok(sans)
}

fn dns_san(name: &str) -> Result<SanType, CertError> {
    let ia5 = name
        .try_into()
        .map_err(|err: rcgen::Error| CertError::InvalidSan {
            san: name.to_owned(),
            reason: err.to_string(),
        })?;
    Ok(SanType::DnsName(ia5))
}

fn set_validity(params: &mut CertificateParams, validity: Duration) {
    let now = OffsetDateTime::now_utc();
    params.not_before = now - BACKDATE;
    params.not_after = now + validity;
}

fn refuse_existing(path: &Path) -> Result<(), CertError> {
    if path.exists() {
        return Err(CertError::AlreadyExists {
            path: path.to_owned(),
        });
    }
    Ok(())
}

fn create_dir(dir: &Path) -> Result<(), CertError> {
    fs::create_dir_all(dir).map_err(|source| CertError::Io {
        path: dir.to_owned(),
        source,
    })
}

pub(crate) fn read_to_string(path: &Path) -> Result<String, CertError> {
    fs::read_to_string(path).map_err(|source| CertError::Io {
        path: path.to_owned(),
        source,
    })
}

/// Replaces `path` with `contents` by writing a temporary file beside it and renaming it over
/// `path`: a reader sees the old file or the new one, never a part.
fn replace_file(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    let dir = path.parent().filter(|p| !p.as_os_str().is_empty());
    let dir = dir.unwrap_or_else(|| Path::new("."));
    let name = path.file_name().unwrap_or_default().to_string_lossy();
    let temp = dir.join(format!(".{name}.{}.tmp", std::process::id()));
    let _ = fs::remove_file(&temp);
    write_new(&temp, contents, mode)?;
    fs::rename(&temp, path).map_err(|source| {
        let _ = fs::remove_file(&temp);
        CertError::Io {
            path: path.to_owned(),
            source,
        }
    })
}

/// Writes a file that must not exist yet, with the given Unix mode from the start (a key is
/// never readable by others, not even for an instant).
fn write_new(path: &Path, contents: &[u8], mode: u32) -> Result<(), CertError> {
    let io_err = |source: std::io::Error| {
        if source.kind() == std::io::ErrorKind::AlreadyExists {
            CertError::AlreadyExists {
                path: path.to_owned(),
            }
        } else {
            CertError::Io {
                path: path.to_owned(),
                source,
            }
        }
    };
    let mut file = OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(io_err)?;
    file.write_all(contents).map_err(io_err)?;
    file.sync_all().map_err(io_err)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt;

    use super::*;

    #[test]
    fn init_then_issue_writes_files_with_private_keys_0600() {
        let dir = tempfile::tempdir().unwrap();
        let ca = init_ca(dir.path(), "test", DEFAULT_CA_VALIDITY).unwrap();
        let node = issue_node_cert(
            dir.path(),
            "node-a",
            dir.path(),
            &["10.0.0.1".into(), "a.example".into()],
            DEFAULT_NODE_VALIDITY,
        )
        .unwrap();
        for key in [&ca.key, &node.key] {
            let mode = fs::metadata(key).unwrap().permissions().mode() & 0o777;
            assert_eq!(mode, 0o600, "{}", key.display());
        }
        assert!(
            read_to_string(&node.cert)
                .unwrap()
                .contains("BEGIN CERTIFICATE")
        );
    }

    #[test]
    fn never_overwrites() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "test", DEFAULT_CA_VALIDITY).unwrap();
        let err = init_ca(dir.path(), "test", DEFAULT_CA_VALIDITY).unwrap_err();
        assert!(matches!(err, CertError::AlreadyExists { .. }), "{err}");
        issue_node_cert(dir.path(), "n1", dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap();
        let err =
            issue_node_cert(dir.path(), "n1", dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap_err();
        assert!(matches!(err, CertError::AlreadyExists { .. }), "{err}");
    }

    #[test]
    fn missing_and_corrupt_ca_are_clear_errors() {
        let dir = tempfile::tempdir().unwrap();
        let err =
            issue_node_cert(dir.path(), "n1", dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap_err();
        assert!(matches!(err, CertError::Io { .. }), "{err}");
        assert!(err.to_string().contains("ca.pem"), "{err}");

        init_ca(dir.path(), "test", DEFAULT_CA_VALIDITY).unwrap();
        fs::write(dir.path().join(CA_KEY_FILE), "garbage").unwrap();
        let err =
            issue_node_cert(dir.path(), "n1", dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap_err();
        assert!(matches!(err, CertError::Corrupt { .. }), "{err}");

        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "test", DEFAULT_CA_VALIDITY).unwrap();
        fs::write(
            dir.path().join(CA_CERT_FILE),
            "-----BEGIN CERTIFICATE-----\nAAAA\n",
        )
        .unwrap();
        let err =
            issue_node_cert(dir.path(), "n1", dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap_err();
        assert!(matches!(err, CertError::Corrupt { .. }), "{err}");
        // A failed issue leaves nothing half-written behind.
        assert!(!node_key_path(dir.path(), "n1").exists());
    }

    #[test]
    fn node_names_are_dns_names() {
        for ok in ["a", "node-1", "n1.zone-b.cluster"] {
            validate_node_name(ok).unwrap();
        }
        for bad in ["", "-a", "a..b", "a b", "a/b", "ä", &"x".repeat(64)] {
            assert!(validate_node_name(bad).is_err(), "{bad:?}");
        }
    }
}
