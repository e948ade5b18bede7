//! The view of live peers the rest of the node reads, built from chitchat's live-node set.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Instant;

use chitchat::{Chitchat, ChitchatId, NodeState};

/// A live peer as gossip knows it.
#[derive(Debug, Clone, PartialEq)]
pub struct Peer {
    /// The node name (chitchat node id; equal to its certificate's node name).
    pub name: String,
    /// Incarnation: the peer's start time in ms since the Unix epoch. A restarted node
    /// comes back with a higher generation and fresh state.
    pub generation: u64,
    /// Where to reach it over QUIC (its advertised mesh address).
    pub mesh_addr: SocketAddr,
    /// Its published key-values (deleted keys excluded); the same allocation from one view
    /// to the next while none of them changed.
    pub key_values: Arc<BTreeMap<String, String>>,
    /// When this node last saw any of the peer's key-values change (or first saw the peer).
    pub last_change: Instant,
}

/// Live peers, this node excluded, sorted by name; at most one entry per name.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Membership {
    pub peers: Vec<Peer>,
}

impl Membership {
    pub fn get(&self, name: &str) -> Option<&Peer> {
        self.peers
            .binary_search_by(|peer| peer.name.as_str().cmp(name))
            .ok()
            .map(|i| &self.peers[i])
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }

    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.peers.iter().map(|peer| peer.name.as_str())
    }
}

/// The part of a chitchat node state the view needs.
#[derive(Debug, Clone)]
pub(crate) struct NodeSnapshot {
    pub id: ChitchatId,
    pub max_version: u64,
    pub key_values: Arc<BTreeMap<String, String>>,
}

impl NodeSnapshot {
    pub fn from_state(id: &ChitchatId, state: &NodeState) -> Self {
        Self {
            id: id.clone(),
            max_version: state.max_version(),
            key_values: Arc::new(
                state
                    .key_values()
                    .map(|(k, v)| (k.to_owned(), v.to_owned()))
                    .collect(),
            ),
        }
    }
}

/// Snapshots of chitchat's live nodes, copying a node's key-values only when its version
/// moved since the last read (a node's every change raises its max version).
#[derive(Debug, Default)]
pub(crate) struct LiveSnapshots {
    last: HashMap<ChitchatId, NodeSnapshot>,
}

impl LiveSnapshots {
    /// The live nodes (this one included) with their current key-values.
    pub fn read(&mut self, chitchat: &Chitchat) -> Vec<NodeSnapshot> {
        let mut last = std::mem::take(&mut self.last);
        let live: Vec<NodeSnapshot> = chitchat
            .live_nodes()
            .filter_map(|id| {
                let state = chitchat.node_state(id)?;
                Some(match last.remove(id) {
                    Some(kept) if kept.max_version == state.max_version() => kept,
                    _ => NodeSnapshot::from_state(id, state),
                })
            })
            .collect();
        self.last = live
            .iter()
            .map(|node| (node.id.clone(), node.clone()))
            .collect();
        live
    }
}

/// Turns successive live-node sets into [`Membership`] views, remembering when each peer
/// last changed.
#[derive(Debug)]
pub(crate) struct MembershipTracker {
    self_name: String,
    seen: HashMap<ChitchatId, (u64, Instant)>,
}

impl MembershipTracker {
    pub fn new(self_name: impl Into<String>) -> Self {
        Self {
            self_name: self_name.into(),
            seen: HashMap::new(),
        }
    }

    /// The view of `live` at `now`: self excluded, and when two incarnations of one name
    /// are both still live (a restart shortly before the old one is declared dead) only the
    /// newest generation counts, since the old process is gone.
    pub fn update(&mut self, live: Vec<NodeSnapshot>, now: Instant) -> Membership {
        let mut newest: BTreeMap<String, NodeSnapshot> = BTreeMap::new();
        for node in live {
            if *node.id.node_id == *self.self_name {
                continue;
            }
            match newest.get(&*node.id.node_id) {
                Some(kept) if kept.id.generation_id >= node.id.generation_id => {}
                _ => {
                    newest.insert(node.id.node_id.to_string(), node);
                }
            }
        }
        let mut seen = HashMap::with_capacity(newest.len());
        let peers = newest
            .into_values()
            .map(|node| {
                let last_change = match self.seen.get(&node.id) {
                    Some(&(version, at)) if version == node.max_version => at,
                    _ => now,
                };
                seen.insert(node.id.clone(), (node.max_version, last_change));
                Peer {
                    name: node.id.node_id.to_string(),
                    generation: node.id.generation_id,
                    mesh_addr: node.id.gossip_advertise_addr,
                    key_values: node.key_values,
                    last_change,
                }
            })
            .collect();
        self.seen = seen;
        Membership { peers }
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn node(name: &str, generation: u64, version: u64) -> NodeSnapshot {
        NodeSnapshot {
            id: ChitchatId::new(
                name,
                generation,
                format!("127.0.0.1:{}", 7000 + generation).parse().unwrap(),
            ),
            max_version: version,
            key_values: Arc::new(BTreeMap::from([("k".to_owned(), format!("v{version}"))])),
        }
    }

    #[test]
    fn excludes_self_and_keeps_newest_generation() {
        let mut tracker = MembershipTracker::new("me");
        let now = Instant::now();
        let view = tracker.update(
            vec![
                node("me", 1, 1),
                node("b", 5, 1),
                node("a", 1, 1),
                node("b", 9, 1),
            ],
            now,
        );
        assert_eq!(view.names().collect::<Vec<_>>(), ["a", "b"]);
        assert_eq!(view.get("b").unwrap().generation, 9);
        assert_eq!(view.get("b").unwrap().mesh_addr.port(), 7009);
        assert!(view.get("me").is_none());
    }

    #[test]
    fn last_change_moves_only_when_version_moves() {
        let mut tracker = MembershipTracker::new("me");
        let t0 = Instant::now();
        let t1 = t0 + Duration::from_secs(1);
        let t2 = t0 + Duration::from_secs(2);
        tracker.update(vec![node("a", 1, 3)], t0);
        let view = tracker.update(vec![node("a", 1, 3)], t1);
        assert_eq!(view.get("a").unwrap().last_change, t0);
        let view = tracker.update(vec![node("a", 1, 4)], t2);
        assert_eq!(view.get("a").unwrap().last_change, t2);
        assert_eq!(view.get("a").unwrap().key_values["k"], "v4");
    }
}
