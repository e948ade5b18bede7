//! `GET /ready`: whether this sidecar should receive client traffic now (a Kubernetes
//! readiness probe), as opposed to `/health`, which only says the process serves HTTP.
//!
//! Ready means all three:
//! - **not draining** (SIGTERM stops it being a target at once);
//! - **its engine is healthy** (an engine still loading its model, or down, would make this
//!   node an entry point that cannot serve locally; the other sidecars take the traffic);
//! - **joined the mesh**: it has seen a live peer at least once since it started, or it is
//!   alone by configuration (no `--seeds`), or `--join-wait-secs` passed without any peer
//!   answering (a mesh of one whose seed list names only itself, e.g. a one-replica
//!   StatefulSet behind its headless Service).
//!
//! "Seen once" rather than "sees now": when every peer dies, the survivor must stay ready and
//! serve, not take the whole client Service down with them. The join wait bounds the other
//! deadlock: a node that waited for peers forever could never become ready alone.

use std::time::Duration;

/// What readiness is judged from; read from the shared state by the handler.
#[derive(Clone, Copy, Debug)]
pub struct ReadinessInputs {
    pub draining: bool,
    pub engine_healthy: bool,
    /// Live peers now, this node excluded.
    pub peers_alive: usize,
    /// Whether any peer was live at some moment since start.
    pub peer_seen: bool,
    /// Whether `--seeds` names anything.
    pub has_seeds: bool,
    pub uptime: Duration,
    pub join_wait: Duration,
}

/// How this node counts as joined.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Joined {
    /// It has seen a live peer.
    Peer,
    /// No seeds: a mesh of one by configuration.
    NoSeeds,
    /// Seeds, but no peer answered within the join wait.
    WaitedAlone,
}

impl Joined {
    pub fn as_str(self) -> &'static str {
        match self {
            Joined::Peer => "peer",
            Joined::NoSeeds => "no-seeds",
            Joined::WaitedAlone => "join-wait-passed",
        }
    }
}

/// The verdict, with every reason it is not ready.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Readiness {
    pub joined: Option<Joined>,
    pub not_ready: Vec<&'static str>,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.not_ready.is_empty()
    }
}

pub fn evaluate(inputs: &ReadinessInputs) -> Readiness {
    let joined = if inputs.peer_seen || inputs.peers_alive > 0 {
        Some(Joined::Peer)
    } else if !inputs.has_seeds {
        Some(Joined::NoSeeds)
    } else if inputs.uptime >= inputs.join_wait {
        Some(Joined::WaitedAlone)
    } else {
        None
    };
    let mut not_ready = Vec::new();
    if inputs.draining {
        not_ready.push("draining");
    }
    if !inputs.engine_healthy {
        not_ready.push("engine unhealthy");
    }
    if joined.is_none() {
        not_ready.push("joining the mesh: no peer seen yet");
    }
    Readiness { joined, not_ready }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ready_alone() -> ReadinessInputs {
        ReadinessInputs {
            draining: false,
            engine_healthy: true,
            peers_alive: 0,
            peer_seen: false,
            has_seeds: false,
            uptime: Duration::ZERO,
            join_wait: Duration::from_secs(15),
        }
    }

    #[test]
    fn a_node_without_seeds_is_alone_by_configuration() {
        let verdict = evaluate(&ready_alone());
        assert!(verdict.is_ready());
        assert_eq!(verdict.joined, Some(Joined::NoSeeds));
    }

    #[test]
    fn a_seeded_node_waits_for_a_peer_until_the_join_wait() {
        let seeded = ReadinessInputs {
            has_seeds: true,
            ..ready_alone()
        };
        let verdict = evaluate(&seeded);
        assert!(!verdict.is_ready());
        assert_eq!(
            verdict.not_ready,
            vec!["joining the mesh: no peer seen yet"]
        );
        let with_peer = evaluate(&ReadinessInputs {
            peers_alive: 1,
            ..seeded
        });
        assert_eq!(with_peer.joined, Some(Joined::Peer));
        assert!(with_peer.is_ready());
        let waited = evaluate(&ReadinessInputs {
            uptime: Duration::from_secs(15),
            ..seeded
        });
        assert_eq!(waited.joined, Some(Joined::WaitedAlone));
        assert!(waited.is_ready());
    }

    #[test]
    fn a_survivor_of_its_peers_stays_ready() {
        let verdict = evaluate(&ReadinessInputs {
            has_seeds: true,
            peer_seen: true,
            peers_alive: 0,
            ..ready_alone()
        });
        assert!(verdict.is_ready());
        assert_eq!(verdict.joined, Some(Joined::Peer));
    }

    #[test]
    fn draining_or_an_unhealthy_engine_is_never_ready_and_every_reason_is_given() {
        let verdict = evaluate(&ReadinessInputs {
            draining: true,
            engine_healthy: false,
            has_seeds: true,
            ..ready_alone()
        });
        assert!(!verdict.is_ready());
        assert_eq!(
            verdict.not_ready,
            vec![
                "draining",
                "engine unhealthy",
                "joining the mesh: no peer seen yet"
            ]
        );
        let joined_but_draining = evaluate(&ReadinessInputs {
            draining: true,
            peer_seen: true,
            ..ready_alone()
        });
        assert_eq!(joined_but_draining.not_ready, vec!["draining"]);
    }
}
