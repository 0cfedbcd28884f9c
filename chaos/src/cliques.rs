//! The **cliques** invariant of a rack of several NVLink cliques: no gossip member and
//! no IMEX peer of any node is ever a node of another clique. Checked on every
//! observation, faults or not, with no grace: a frame that reached another clique is
//! already a breach, however soon it is forgotten.
//!
//! Pure: what each node showed ([`CliqueSighting`]) against who is in which clique
//! ([`CliqueMap`]).

use std::collections::BTreeMap;
use std::net::IpAddr;

use domaind_node::run::NodeView;

use crate::invariants::{Invariant, Violation};
use crate::observe::HostsBlock;

/// Who is in which clique, by name and by address.
#[derive(Debug, Clone, Default)]
pub struct CliqueMap {
    by_name: BTreeMap<String, usize>,
    by_ip: BTreeMap<IpAddr, String>,
}

impl CliqueMap {
    /// Nodes `(name, ip, clique)`.
    pub fn new(nodes: impl IntoIterator<Item = (String, IpAddr, usize)>) -> Self {
        let mut map = Self::default();
        for (name, ip, clique) in nodes {
            map.by_ip.insert(ip, name.clone());
            map.by_name.insert(name, clique);
        }
        map
    }

    pub fn clique_of(&self, node: &str) -> Option<usize> {
        self.by_name.get(node).copied()
    }

    /// How many cliques the map knows (the highest index plus one).
    pub fn cliques(&self) -> usize {
        self.by_name.values().max().map_or(0, |c| c + 1)
    }
}

/// What one node showed of its peers at one moment; empty where nothing was read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CliqueSighting {
    pub node: String,
    /// Live gossip members, from `/state`.
    pub gossip_members: Vec<String>,
    /// IMEX peers of every domain, from `/state`.
    pub imex_peers: Vec<String>,
    /// Addresses of the hosts block, the peer set the IMEX daemon reads.
    pub hosts: Vec<IpAddr>,
}

impl CliqueSighting {
    /// From a node's `/state` and hosts block, whichever were read.
    pub fn new(node: &str, view: Option<&NodeView>, hosts: Option<&HostsBlock>) -> Self {
        Self {
            node: node.to_owned(),
            gossip_members: view.map(|v| v.gossip.members.clone()).unwrap_or_default(),
            imex_peers: view
                .map(|v| {
                    v.domains
                        .iter()
                        .flat_map(|d| d.peers.values().cloned())
                        .collect()
                })
                .unwrap_or_default(),
            hosts: hosts
                .map(|h| h.slots.values().copied().collect())
                .unwrap_or_default(),
        }
    }
}

/// Every peer of a sighting that belongs to another clique than its node's. Names and
/// addresses the map does not know are the isolation invariant's business.
pub fn crossings(map: &CliqueMap, seen: &[CliqueSighting]) -> Vec<Violation> {
    let mut violations = Vec::new();
    for sighting in seen {
        let Some(own) = map.clique_of(&sighting.node) else {
            continue;
        };
        let mut breach = |what: &str, peer: &str| {
            if let Some(other) = map.clique_of(peer).filter(|c| *c != own) {
                violations.push(Violation::new(
                    Invariant::Cliques,
                    Some(&sighting.node),
                    format!("{what} {peer} is of clique {other}, not {own}"),
                ));
            }
        };
        for member in &sighting.gossip_members {
            breach("gossip member", member);
        }
        for peer in &sighting.imex_peers {
            breach("IMEX peer", peer);
        }
        for ip in &sighting.hosts {
            if let Some(peer) = map.by_ip.get(ip) {
                breach(&format!("hosts-file peer {ip}:"), peer);
            }
        }
    }
    violations.sort();
    violations.dedup();
    violations
}

#[cfg(test)]
mod tests {
    use super::*;

    fn map() -> CliqueMap {
        CliqueMap::new((0..6).map(|i| {
            (
                format!("node-{i}"),
                IpAddr::from([127, 0, 132, i as u8 + 1]),
                i / 3,
            )
        }))
    }

    fn sighting(node: usize, gossip: &[usize], imex: &[usize], hosts: &[usize]) -> CliqueSighting {
        CliqueSighting {
            node: format!("node-{node}"),
            gossip_members: gossip.iter().map(|i| format!("node-{i}")).collect(),
            imex_peers: imex.iter().map(|i| format!("node-{i}")).collect(),
            hosts: hosts
                .iter()
                .map(|i| IpAddr::from([127, 0, 132, *i as u8 + 1]))
                .collect(),
        }
    }

    #[test]
    fn clique_mates_only_is_no_violation() {
        let seen = vec![
            sighting(0, &[0, 1, 2], &[0, 1, 2], &[0, 1, 2]),
            sighting(4, &[3, 4, 5], &[3, 4], &[3, 4]),
            CliqueSighting::new("node-5", None, None),
        ];
        assert_eq!(map().cliques(), 2);
        assert_eq!(crossings(&map(), &seen), Vec::new());
    }

    #[test]
    fn a_member_or_peer_of_another_clique_is_named() {
        let seen = vec![
            sighting(0, &[0, 1, 4], &[0, 1], &[0, 1]),
            sighting(3, &[3], &[3, 2], &[3]),
            sighting(5, &[5], &[5], &[5, 0]),
        ];
        let found: Vec<(Option<String>, String)> = crossings(&map(), &seen)
            .into_iter()
            .map(|v| {
                assert_eq!(v.invariant, Invariant::Cliques);
                (v.node, v.detail)
            })
            .collect();
        assert_eq!(
            found,
            vec![
                (
                    Some("node-0".into()),
                    "gossip member node-4 is of clique 1, not 0".into()
                ),
                (
                    Some("node-3".into()),
                    "IMEX peer node-2 is of clique 0, not 1".into()
                ),
                (
                    Some("node-5".into()),
                    "hosts-file peer 127.0.132.1: node-0 is of clique 0, not 1".into()
                ),
            ]
        );
    }

    #[test]
    fn names_the_map_does_not_know_are_left_to_isolation() {
        let mut stranger = sighting(0, &[0], &[0], &[]);
        stranger.gossip_members.push("ghost".into());
        stranger.hosts.push(IpAddr::from([10, 0, 0, 1]));
        assert_eq!(crossings(&map(), &[stranger]), Vec::new());
        assert_eq!(
            crossings(&map(), &[sighting(9, &[4], &[], &[])]),
            Vec::new()
        );
    }
}
