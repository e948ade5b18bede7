//! Seeds: `host:port` strings resolved again and again, so a DNS name (a Kubernetes
//! headless service) keeps finding peers as pods come and go.
//!
//! chitchat resolves its seeds once at start and then only every 60 s; this loop resolves
//! them every `seed_refresh_interval` and starts a gossip round with every resolved seed
//! address that is not already a live member, so a node whose seeds were not resolvable or
//! not up at start joins as soon as they are.

use std::collections::HashSet;
use std::net::SocketAddr;
use std::time::Duration;

use chitchat::ChitchatHandle;
use tokio::net::lookup_host;
use tokio::time::timeout;

/// Bound on one DNS resolution.
const RESOLVE_TIMEOUT: Duration = Duration::from_secs(2);

/// Resolves every seed; unresolvable ones are logged and skipped.
pub(crate) async fn resolve(seeds: &[String]) -> HashSet<SocketAddr> {
    let mut addrs = HashSet::new();
    for seed in seeds {
        if let Ok(addr) = seed.parse::<SocketAddr>() {
            addrs.insert(addr);
            continue;
        }
        match timeout(RESOLVE_TIMEOUT, lookup_host(seed.as_str())).await {
            Ok(Ok(resolved)) => addrs.extend(resolved),
            Ok(Err(err)) => tracing::warn!(%seed, error = %err, "cannot resolve seed"),
            Err(_) => tracing::warn!(%seed, "seed resolution timed out"),
        }
    }
    addrs
}

/// Seed addresses worth a gossip round: not ourselves, not already a live member.
pub(crate) fn to_contact(
    resolved: &HashSet<SocketAddr>,
    self_addr: SocketAddr,
    live_addrs: &HashSet<SocketAddr>,
) -> Vec<SocketAddr> {
    let mut addrs: Vec<SocketAddr> = resolved
        .iter()
        .filter(|addr| **addr != self_addr && !live_addrs.contains(addr))
        .copied()
        .collect();
    addrs.sort();
    addrs
}

/// Runs until aborted.
pub(crate) async fn refresh_loop(
    handle: std::sync::Arc<ChitchatHandle>,
    seeds: Vec<String>,
    self_addr: SocketAddr,
    every: Duration,
) {
    if seeds.is_empty() {
        return;
    }
    let mut ticker = tokio::time::interval(every);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticker.tick().await;
        let resolved = resolve(&seeds).await;
        let live_addrs: HashSet<SocketAddr> = handle
            .with_chitchat(|chitchat| {
                chitchat
                    .live_nodes()
                    .map(|id| id.gossip_advertise_addr)
                    .collect()
            })
            .await;
        for addr in to_contact(&resolved, self_addr, &live_addrs) {
            if handle.gossip(addr).is_err() {
                return; // chitchat has stopped
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn resolves_literals_and_names_and_skips_garbage() {
        let resolved = resolve(&[
            "127.0.0.1:7000".into(),
            "localhost:7001".into(),
            "no-such-host.invalid:1".into(),
            "not an address".into(),
        ])
        .await;
        assert!(resolved.contains(&"127.0.0.1:7000".parse().unwrap()));
        assert!(resolved.iter().any(|addr| addr.port() == 7001));
        assert!(
            resolved
                .iter()
                .all(|addr| [7000, 7001].contains(&addr.port()))
        );
    }

    #[test]
    fn contacts_only_unknown_seeds_other_than_self() {
        let a: SocketAddr = "10.0.0.1:1".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:1".parse().unwrap();
        let me: SocketAddr = "10.0.0.3:1".parse().unwrap();
        let resolved = HashSet::from([a, b, me]);
        assert_eq!(to_contact(&resolved, me, &HashSet::from([a])), vec![b]);
        assert!(to_contact(&resolved, me, &HashSet::from([a, b])).is_empty());
    }
}
