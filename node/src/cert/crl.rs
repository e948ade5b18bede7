//! Revocation: `kvmesh cert revoke` and `kvmesh cert crl`.
//!
//! The CA keeps one CRL, by default `crl.pem` beside `ca.pem`. Revoking a node adds its
//! certificate's serial number to it (entries already there are kept) and signs it again
//! with a higher CRL number; `kvmesh cert crl` signs it again with what it has, creating an
//! empty one the first time. Nodes given the file with `--crl` refuse a revoked peer at every
//! new handshake and close its established connections when they reload the file. The file
//! is replaced by rename, so a node polling it never reads half of it.

use std::path::{Path, PathBuf};
use std::time::Duration;

use rcgen::{CertificateRevocationListParams, KeyIdMethod, RevokedCertParams, SerialNumber};
use rustls_pki_types::CertificateRevocationListDer;
use rustls_pki_types::pem::PemObject;
use time::OffsetDateTime;

use super::{CA_CERT_FILE, CertError, load_issuer, node_cert_path, read_to_string, replace_file};

/// File name of the CRL inside a CA directory.
pub const CRL_FILE: &str = "crl.pem";
/// A CRL's `nextUpdate`. Nodes do not enforce it (see `tls::live`); it only has to be
/// later than `thisUpdate`.
const CRL_VALIDITY: Duration = Duration::from_secs(365 * 24 * 3600);

/// What [`revoke`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Revoked {
    pub crl: PathBuf,
    /// The revoked certificate's serial number, in hex.
    pub serial: String,
    /// False when the serial was already in the CRL (the CRL is signed again all the same).
    pub newly: bool,
    /// How many certificates the CRL lists now.
    pub listed: usize,
}

/// Adds the certificate `cert` (default `CA_DIR/NODE.pem`) of node `node` to the CA's CRL
/// `crl` (default `CA_DIR/crl.pem`), creating it if needed.
pub fn revoke(
    ca_dir: &Path,
    node: &str,
    cert: Option<&Path>,
    crl: Option<&Path>,
) -> Result<Revoked, CertError> {
    let cert_path = cert.map_or_else(|| node_cert_path(ca_dir, node), Path::to_owned);
    let crl_path = crl.map_or_else(|| ca_dir.join(CRL_FILE), Path::to_owned);
    let ca_subject = ca_subject(ca_dir)?;
    let (serial, issuer) = serial_and_issuer(&cert_path)?;
    if issuer != ca_subject {
        return Err(CertError::Corrupt {
            path: cert_path,
            reason: "this certificate was not issued by this CA".into(),
        });
    }
    let mut entries = existing_entries(&crl_path, &ca_subject)?;
    let newly = !entries
        .iter()
        .any(|e| e.serial_number.as_ref() == serial.as_slice());
    if newly {
        entries.push(RevokedCertParams {
            serial_number: SerialNumber::from_slice(&serial),
            revocation_time: OffsetDateTime::now_utc(),
            reason_code: None,
            invalidity_date: None,
        });
    }
    let listed = entries.len();
    sign(ca_dir, &crl_path, entries)?;
    Ok(Revoked {
        crl: crl_path,
        serial: serial.iter().map(|b| format!("{b:02x}")).collect(),
        newly,
        listed,
    })
}

/// Signs the CA's CRL again with the entries it holds (none, when it does not exist yet).
/// Returns the path and how many certificates it lists.
pub fn refresh(ca_dir: &Path, crl: Option<&Path>) -> Result<(PathBuf, usize), CertError> {
    let crl_path = crl.map_or_else(|| ca_dir.join(CRL_FILE), Path::to_owned);
    let entries = existing_entries(&crl_path, &ca_subject(ca_dir)?)?;
    let listed = entries.len();
    sign(ca_dir, &crl_path, entries)?;
    Ok((crl_path, listed))
}

fn sign(ca_dir: &Path, crl_path: &Path, entries: Vec<RevokedCertParams>) -> Result<(), CertError> {
    let issuer = load_issuer(ca_dir)?;
    let now = OffsetDateTime::now_utc();
    // Increasing with time, so a later CRL always has a higher number.
    let number = now.unix_timestamp_nanos() / 1_000_000;
    let params = CertificateRevocationListParams {
        this_update: now,
        next_update: now + CRL_VALIDITY,
        crl_number: SerialNumber::from_slice(&(number as u64).to_be_bytes()),
        issuing_distribution_point: None,
        revoked_certs: entries,
        key_identifier_method: KeyIdMethod::Sha256,
    };
    let pem = params.signed_by(&issuer)?.pem()?;
    replace_file(crl_path, pem.as_bytes(), 0o644)
}

/// The raw subject of the CA certificate in `ca_dir`.
fn ca_subject(ca_dir: &Path) -> Result<Vec<u8>, CertError> {
    let path = ca_dir.join(CA_CERT_FILE);
    let der = first_certificate(&path)?;
    let (_, ca) = x509_parser::parse_x509_certificate(&der).map_err(|err| corrupt(&path, err))?;
    Ok(ca.subject().as_raw().to_vec())
}

fn serial_and_issuer(path: &Path) -> Result<(Vec<u8>, Vec<u8>), CertError> {
    let der = first_certificate(path)?;
    let (_, cert) = x509_parser::parse_x509_certificate(&der).map_err(|err| corrupt(path, err))?;
    Ok((cert.raw_serial().to_vec(), cert.issuer().as_raw().to_vec()))
}

fn first_certificate(path: &Path) -> Result<Vec<u8>, CertError> {
    let pem = read_to_string(path)?;
    let der = rustls_pki_types::CertificateDer::from_pem_slice(pem.as_bytes())
        .map_err(|err| corrupt(path, err))?;
    Ok(der.to_vec())
}

/// The entries of the CRL at `path`, which must be this CA's; none if it does not exist.
fn existing_entries(path: &Path, ca_subject: &[u8]) -> Result<Vec<RevokedCertParams>, CertError> {
    if !path.exists() {
        return Ok(Vec::new());
    }
    let pem = read_to_string(path)?;
    let der = CertificateRevocationListDer::from_pem_slice(pem.as_bytes())
        .map_err(|err| corrupt(path, err))?;
    let (_, crl) = x509_parser::parse_x509_crl(&der).map_err(|err| corrupt(path, err))?;
    if crl.issuer().as_raw() != ca_subject {
        return Err(CertError::Corrupt {
            path: path.to_owned(),
            reason: "this CRL was not issued by this CA".into(),
        });
    }
    crl.iter_revoked_certificates()
        .map(|entry| {
            let revocation_time =
                OffsetDateTime::from_unix_timestamp(entry.revocation_date.timestamp())
                    .map_err(|err| corrupt(path, err))?;
            Ok(RevokedCertParams {
                serial_number: SerialNumber::from_slice(entry.raw_serial()),
                revocation_time,
                reason_code: None,
                invalidity_date: None,
            })
        })
        .collect()
}

fn corrupt(path: &Path, err: impl std::fmt::Display) -> CertError {
    CertError::Corrupt {
        path: path.to_owned(),
        reason: err.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use rustls_pki_types::UnixTime;

    use super::*;
    use crate::cert::{DEFAULT_CA_VALIDITY, DEFAULT_NODE_VALIDITY, init_ca, issue_node_cert};
    use crate::tls::{LiveTls, PeerRole, TlsSource, refusal_reason};

    fn source(dir: &Path, name: &str, crl: bool) -> TlsSource {
        TlsSource {
            dir: dir.to_owned(),
            name: name.to_owned(),
            crl: crl.then(|| dir.join(CRL_FILE)),
        }
    }

    #[test]
    fn a_revoked_peer_is_refused_on_both_sides_and_others_are_not() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        for node in ["a", "b", "c"] {
            issue_node_cert(dir.path(), node, dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap();
        }
        let (path, listed) = refresh(dir.path(), None).unwrap();
        assert_eq!((path, listed), (dir.path().join(CRL_FILE), 0));
        let live = LiveTls::new(source(dir.path(), "a", true).load().unwrap()).unwrap();
        let c = source(dir.path(), "c", false).load().unwrap();
        let b = source(dir.path(), "b", false).load().unwrap();
        live.current()
            .verify_peer(PeerRole::Client, &c.cert_chain, UnixTime::now())
            .unwrap();

        let revoked = revoke(dir.path(), "c", None, None).unwrap();
        assert!(revoked.newly);
        assert_eq!(revoked.listed, 1);
        let again = revoke(dir.path(), "c", None, None).unwrap();
        assert!(!again.newly);
        assert_eq!(again.listed, 1);
        assert_eq!(revoke(dir.path(), "b", None, None).unwrap().listed, 2);
        // A refresh keeps what is listed.
        assert_eq!(refresh(dir.path(), None).unwrap().1, 2);

        live.replace(source(dir.path(), "a", true).load().unwrap())
            .unwrap();
        assert_eq!(live.current().crls, 1);
        for role in [PeerRole::Client, PeerRole::Server] {
            let err = live
                .current()
                .verify_peer(role, &c.cert_chain, UnixTime::now())
                .unwrap_err();
            assert_eq!(
                refusal_reason(&err.to_string()),
                Some("certificate revoked")
            );
            assert!(
                live.current()
                    .verify_peer(role, &b.cert_chain, UnixTime::now())
                    .is_err()
            );
            let a = source(dir.path(), "a", false).load().unwrap();
            live.current()
                .verify_peer(role, &a.cert_chain, UnixTime::now())
                .unwrap();
        }
    }

    #[test]
    fn a_certificate_of_another_ca_cannot_be_revoked_here() {
        let ours = tempfile::tempdir().unwrap();
        let theirs = tempfile::tempdir().unwrap();
        init_ca(ours.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        init_ca(theirs.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        issue_node_cert(
            theirs.path(),
            "x",
            theirs.path(),
            &[],
            DEFAULT_NODE_VALIDITY,
        )
        .unwrap();
        let cert = node_cert_path(theirs.path(), "x");
        let err = revoke(ours.path(), "x", Some(&cert), None).unwrap_err();
        assert!(err.to_string().contains("not issued by this CA"), "{err}");
        assert!(!ours.path().join(CRL_FILE).exists());
    }
}
