//! What domaind's core sees of gossip: the live members with their keys, and the
//! changes between two views. Pure data and functions, so that the core builds without
//! the gossip implementation (chitchat, rustls, ring), which fills them.

use std::collections::BTreeMap;
use std::net::SocketAddr;

/// One live node as gossip knows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Member {
    pub node: String,
    /// Chitchat generation: higher after every restart of the node.
    pub generation: u64,
    pub gossip_addr: SocketAddr,
    pub keys: BTreeMap<String, String>,
}

/// Live members keyed by node name.
pub type Membership = BTreeMap<String, Member>;

/// A change between two views of the membership.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GossipEvent {
    /// A node became live, or restarted (a new generation replaced the old).
    NodeJoined {
        node: String,
        generation: u64,
        gossip_addr: SocketAddr,
    },
    /// A node is no longer live (failure detector), or a restart retired its old
    /// generation. Its keys are gone with it: no `KeyDeleted` follows.
    NodeLeft {
        node: String,
        generation: u64,
    },
    KeySet {
        node: String,
        key: String,
        value: String,
    },
    KeyDeleted {
        node: String,
        key: String,
    },
}

/// The events that turn `before` into `after`, node by node in name order: leaves first,
/// then joins, then key changes of nodes present in both.
pub fn diff(before: &Membership, after: &Membership) -> Vec<GossipEvent> {
    let mut events = Vec::new();
    for (node, old) in before {
        match after.get(node) {
            Some(new) if new.generation == old.generation => {}
            _ => events.push(GossipEvent::NodeLeft {
                node: node.clone(),
                generation: old.generation,
            }),
        }
    }
    for (node, new) in after {
        let old = before
            .get(node)
            .filter(|old| old.generation == new.generation);
        let Some(old) = old else {
            events.push(GossipEvent::NodeJoined {
                node: node.clone(),
                generation: new.generation,
                gossip_addr: new.gossip_addr,
            });
            events.extend(new.keys.iter().map(|(key, value)| GossipEvent::KeySet {
                node: node.clone(),
                key: key.clone(),
                value: value.clone(),
            }));
            continue;
        };
        for (key, value) in &new.keys {
            if old.keys.get(key) != Some(value) {
                events.push(GossipEvent::KeySet {
                    node: node.clone(),
                    key: key.clone(),
                    value: value.clone(),
                });
            }
        }
        for key in old.keys.keys() {
            if !new.keys.contains_key(key) {
                events.push(GossipEvent::KeyDeleted {
                    node: node.clone(),
                    key: key.clone(),
                });
            }
        }
    }
    events
}

/// Replays `events` onto `view`; `diff` followed by `apply` must reproduce `after`
/// (the property the tests check).
pub fn apply(view: &mut Membership, events: &[GossipEvent]) {
    for event in events {
        match event {
            GossipEvent::NodeLeft { node, .. } => {
                view.remove(node);
            }
            GossipEvent::NodeJoined {
                node,
                generation,
                gossip_addr,
            } => {
                view.insert(
                    node.clone(),
                    Member {
                        node: node.clone(),
                        generation: *generation,
                        gossip_addr: *gossip_addr,
                        keys: BTreeMap::new(),
                    },
                );
            }
            GossipEvent::KeySet { node, key, value } => {
                if let Some(member) = view.get_mut(node) {
                    member.keys.insert(key.clone(), value.clone());
                }
            }
            GossipEvent::KeyDeleted { node, key } => {
                if let Some(member) = view.get_mut(node) {
                    member.keys.remove(key);
                }
            }
        }
    }
}
