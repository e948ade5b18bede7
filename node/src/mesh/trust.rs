//! Established connections under changing trust.
//!
//! A TLS reload changes what new handshakes accept; connections already open were verified
//! against the old material. [`Established`] keeps every open connection with the side its
//! peer was on, and [`Established::recheck`] verifies each peer's certificate again against
//! the current material: a peer since revoked, expired, or whose CA left the bundle is
//! disconnected (and, at its next dial, refused), while every other connection carries on
//! with its streams. The mesh re-checks after each reload and once a minute, which is how a
//! certificate that expires during a connection ends it.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use quinn::Connection;
use rustls_pki_types::{CertificateDer, UnixTime};

use super::metrics::MeshMetrics;
use super::wire::codes;
use crate::tls::{LiveTls, PeerRole, refusal_reason};

/// How often established connections are re-checked without a reload (for expiry).
pub(crate) const RECHECK_INTERVAL: Duration = Duration::from_secs(60);

/// An open connection and whom it was authenticated as.
struct Tracked {
    conn: Connection,
    peer_name: Arc<str>,
    role: PeerRole,
}

/// The open connections, by quinn's stable id.
#[derive(Default)]
pub(crate) struct Established {
    connections: Mutex<HashMap<usize, Tracked>>,
}

impl Established {
    pub fn insert(&self, conn: &Connection, peer_name: &Arc<str>, role: PeerRole) {
        let entry = Tracked {
            conn: conn.clone(),
            peer_name: peer_name.clone(),
            role,
        };
        self.lock().insert(conn.stable_id(), entry);
    }

    pub fn remove(&self, conn: &Connection) {
        self.lock().remove(&conn.stable_id());
    }

    /// Closes the connections whose peer certificate the current material refuses; returns
    /// how many.
    pub fn recheck(&self, tls: &LiveTls, metrics: &MeshMetrics) -> usize {
        let material = tls.current();
        let now = UnixTime::now();
        let mut refused = Vec::new();
        self.lock().retain(|_, entry| {
            if entry.conn.close_reason().is_some() {
                return false;
            }
            let verdict = match peer_chain(&entry.conn) {
                Some(chain) => material.verify_peer(entry.role, &chain, now),
                None => Err(rustls::Error::NoCertificatesPresented),
            };
            match verdict {
                Ok(()) => true,
                Err(err) => {
                    refused.push((entry.conn.clone(), entry.peer_name.clone(), err));
                    false
                }
            }
        });
        for (conn, peer, err) in &refused {
            let error = err.to_string();
            let reason = refusal_reason(&error).unwrap_or("certificate refused");
            tracing::warn!(
                %peer,
                remote = %conn.remote_address(),
                reason,
                %error,
                "closing mesh connection: the peer's certificate is no longer accepted ({reason})"
            );
            conn.close(codes::UNTRUSTED, reason.as_bytes());
            metrics.connections_untrusted.inc();
        }
        refused.len()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<usize, Tracked>> {
        self.connections.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// The certificate chain the peer presented in the handshake.
fn peer_chain(conn: &Connection) -> Option<Vec<CertificateDer<'static>>> {
    conn.peer_identity()?
        .downcast::<Vec<CertificateDer<'static>>>()
        .ok()
        .map(|chain| *chain)
}

/// Re-checks `established` after every change of `tls` and every [`RECHECK_INTERVAL`];
/// runs until aborted.
pub(crate) async fn recheck_loop(
    tls: Arc<LiveTls>,
    established: Arc<Established>,
    metrics: MeshMetrics,
) {
    let mut changes = tls.subscribe();
    loop {
        tokio::select! {
            changed = changes.changed() => {
                if changed.is_err() {
                    return;
                }
            }
            _ = tokio::time::sleep(RECHECK_INTERVAL) => {}
        }
        let closed = established.recheck(&tls, &metrics);
        if closed > 0 {
            tracing::info!(closed, "closed mesh connections of peers no longer trusted");
        }
    }
}
