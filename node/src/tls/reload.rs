//! Reloading the TLS material when its files change, and on SIGHUP.
//!
//! The files are polled (every [`TlsReload::interval`], 2 s by default): each poll reads
//! them and compares a hash of their contents with the last one loaded. Polling rather than
//! inotify because the ways certificates are rotated defeat file watches: Kubernetes
//! updates a mounted Secret by swapping a symlink to a new directory (a watch on the file sees
//! nothing), cert-manager and `mv` replace files by rename, and network filesystems send no
//! events at all. Reading four small files every few seconds costs nothing measurable, needs
//! no new dependency, and a SIGHUP reloads at once for who cannot wait.
//!
//! A change is loaded after a short settle delay (a writer that replaces the certificate and
//! then the key is usually done by then). A load that fails — unreadable files, a key that
//! does not match the certificate, an invalid CA — keeps the current material, logs at error
//! level and counts `kvmesh_tls_reloads_total{outcome="failed"}`; the same contents are not
//! tried again until they change (or SIGHUP), so a half-written rotation is loaded as soon
//! as its second file lands.

use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

use super::live::{LiveTls, Material};
use super::{FileSnapshot, TlsError, TlsSource};

/// Default period of the file poll.
pub const DEFAULT_INTERVAL: Duration = Duration::from_secs(2);
/// Wait between seeing a change and loading it.
const SETTLE: Duration = Duration::from_millis(100);
/// Below this much validity left, every load warns about the node's own certificate.
const EXPIRY_WARNING: Duration = Duration::from_secs(7 * 24 * 3600);

/// What to reload and how often.
#[derive(Debug, Clone)]
pub struct TlsReload {
    pub source: TlsSource,
    pub interval: Duration,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// `kvmesh_tls_reloads_total{outcome="ok|failed"}` and the expiry of this node's certificate.
#[derive(Debug, Clone, Default)]
pub struct TlsMetrics {
    reloads: Family<OutcomeLabel, Counter>,
    /// Unix time at which this node's current certificate expires.
    pub cert_expiry: Gauge,
}

impl TlsMetrics {
    pub fn register(&self, registry: &mut Registry) {
        let registry = registry.sub_registry_with_prefix("kvmesh_tls");
        registry.register(
            "reloads",
            "Reloads of this node's certificate, key, CA bundle and CRLs, by outcome (ok, failed)",
            self.reloads.clone(),
        );
        registry.register(
            "certificate_expiry_timestamp_seconds",
            "Unix time at which this node's current certificate expires",
            self.cert_expiry.clone(),
        );
        for outcome in ["ok", "failed"] {
            let _ = self.reloads.get_or_create(&OutcomeLabel { outcome });
        }
    }

    pub fn reloads(&self, outcome: &'static str) -> u64 {
        self.reloads.get_or_create(&OutcomeLabel { outcome }).get()
    }

    /// Records the material now in use.
    pub fn loaded(&self, material: &Material) {
        self.cert_expiry
            .set(material.not_after.as_secs().try_into().unwrap_or(i64::MAX));
    }
}

/// Spawns [`reload_loop`]. SIGHUP is caught from the moment this returns (before, it would
/// end the process), so call it before telling anyone the node is up. Says at once (in the
/// log and the expiry gauge) when the node's own certificate runs out.
pub fn spawn(
    live: Arc<LiveTls>,
    reload: TlsReload,
    metrics: TlsMetrics,
) -> tokio::task::JoinHandle<()> {
    let hangups = hangups();
    metrics.loaded(&live.current());
    warn_if_expiring(&live.current());
    tokio::spawn(reload_loop(live, reload, metrics, hangups))
}

/// Polls the files of `reload.source` and replaces `live`'s material when they change or on
/// SIGHUP; runs until aborted.
async fn reload_loop(
    live: Arc<LiveTls>,
    reload: TlsReload,
    metrics: TlsMetrics,
    mut hangups: Hangups,
) {
    // What the current material was read from: a change made since is seen at the first tick.
    let mut seen = live.current().fingerprint;
    let mut ticker = tokio::time::interval(reload.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let forced = tokio::select! {
            _ = ticker.tick() => false,
            Some(()) = next_hangup(&mut hangups) => true,
        };
        let mut snapshot = reload.source.read();
        if !forced && snapshot.fingerprint() == seen {
            continue;
        }
        if !forced {
            tokio::time::sleep(SETTLE).await;
            snapshot = reload.source.read();
        }
        seen = snapshot.fingerprint();
        let started = Instant::now();
        let why = if forced { "SIGHUP" } else { "files changed" };
        match load(&live, &reload.source, &snapshot) {
            Ok(material) => {
                metrics
                    .reloads
                    .get_or_create(&OutcomeLabel { outcome: "ok" })
                    .inc();
                metrics.loaded(&material);
                tracing::info!(
                    node = %material.name,
                    reason = why,
                    cas = material.cas,
                    crls = material.crls,
                    took_us = started.elapsed().as_micros() as u64,
                    "TLS material reloaded; new handshakes use it"
                );
                warn_if_expiring(&material);
            }
            Err(err) => {
                metrics
                    .reloads
                    .get_or_create(&OutcomeLabel { outcome: "failed" })
                    .inc();
                tracing::error!(
                    reason = why,
                    error = %err,
                    "TLS reload failed; keeping the current certificate, key, CAs and CRLs"
                );
            }
        }
    }
}

fn load(
    live: &LiveTls,
    source: &TlsSource,
    snapshot: &FileSnapshot,
) -> Result<Arc<Material>, TlsError> {
    live.replace(source.parse(snapshot)?)
}

fn warn_if_expiring(material: &Material) {
    let now = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let not_after = Duration::from_secs(material.not_after.as_secs());
    if not_after <= now {
        tracing::error!(node = %material.name, "this node's certificate has expired: peers refuse it");
    } else if not_after - now < EXPIRY_WARNING {
        let hours_left = (not_after - now).as_secs() / 3600;
        tracing::warn!(node = %material.name, hours_left, "this node's certificate expires soon");
    }
}

#[cfg(unix)]
type Hangups = Option<tokio::signal::unix::Signal>;
#[cfg(not(unix))]
type Hangups = Option<()>;

#[cfg(unix)]
fn hangups() -> Hangups {
    use tokio::signal::unix::{SignalKind, signal};
    match signal(SignalKind::hangup()) {
        Ok(signal) => Some(signal),
        Err(err) => {
            tracing::warn!(error = %err, "cannot listen for SIGHUP; TLS files are still polled");
            None
        }
    }
}

#[cfg(not(unix))]
fn hangups() -> Hangups {
    None
}

/// The next SIGHUP; never, without a handler.
async fn next_hangup(hangups: &mut Hangups) -> Option<()> {
    #[cfg(unix)]
    if let Some(signal) = hangups {
        return signal.recv().await;
    }
    let _ = hangups;
    std::future::pending().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cert::{
        CA_CERT_FILE, DEFAULT_CA_VALIDITY, DEFAULT_NODE_VALIDITY, init_ca, issue_node_cert,
    };

    /// Polls `condition` every 10 ms for up to 5 s.
    async fn eventually(what: &str, condition: impl Fn() -> bool) {
        for _ in 0..500 {
            if condition() {
                return;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        panic!("timed out waiting until {what}");
    }

    #[tokio::test]
    async fn a_bad_file_is_counted_once_and_the_good_one_loaded_when_it_returns() {
        let dir = tempfile::tempdir().unwrap();
        init_ca(dir.path(), "t", DEFAULT_CA_VALIDITY).unwrap();
        issue_node_cert(dir.path(), "a", dir.path(), &[], DEFAULT_NODE_VALIDITY).unwrap();
        let source = TlsSource {
            dir: dir.path().to_owned(),
            name: "a".into(),
            crl: None,
        };
        let live = LiveTls::new(source.load().unwrap()).unwrap();
        let metrics = TlsMetrics::default();
        let reload = TlsReload {
            source,
            interval: Duration::from_millis(20),
        };
        let task = spawn(live.clone(), reload, metrics.clone());
        assert!(metrics.cert_expiry.get() > 0);

        let bundle = dir.path().join(CA_CERT_FILE);
        let good = std::fs::read(&bundle).unwrap();
        std::fs::write(&bundle, "not a certificate").unwrap();
        eventually("the bad bundle is counted", || {
            metrics.reloads("failed") == 1
        })
        .await;
        // The same bad contents are not tried again, and the old material stays.
        tokio::time::sleep(Duration::from_millis(200)).await;
        assert_eq!(metrics.reloads("failed"), 1);
        assert_eq!(metrics.reloads("ok"), 0);
        assert_eq!(*live.subscribe().borrow(), 0);

        std::fs::write(&bundle, good).unwrap();
        eventually("the good bundle is loaded", || metrics.reloads("ok") == 1).await;
        assert_eq!(*live.subscribe().borrow(), 1);
        task.abort();
    }
}
