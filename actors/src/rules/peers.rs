//! The IMEX peer set of a domain, and how it is written for `nvidia-imex`.
//!
//! Two addressing modes (the IMEX adapter picks one):
//! - **DNS names** (default): the nodes config lists one stable name per slot, once;
//!   membership changes only rewrite the name → IP mapping, followed by a reload, so
//!   IMEX is never restarted for a membership change. Names of empty slots map to an
//!   address that answers nothing, so they never fall through to cluster DNS.
//! - **IPs**: the nodes config lists member IPs, and every change restarts IMEX.

use std::collections::BTreeMap;
use std::fmt::Write;
use std::net::IpAddr;

use crate::model::{DomainMember, NodeId, Slot};
use crate::rules::slots::SlotAssignment;

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Peer {
    pub node: NodeId,
    pub ip: IpAddr,
}

/// Slot → peer, this node included. Nodes without NVLink fabric take part in the
/// domain as no-op members and are not IMEX peers.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PeerSet {
    pub peers: BTreeMap<Slot, Peer>,
}

impl PeerSet {
    pub fn contains(&self, node: &str) -> bool {
        self.peers.values().any(|p| p.node == node)
    }

    pub fn nodes(&self) -> impl Iterator<Item = &str> {
        self.peers.values().map(|p| p.node.as_str())
    }

    pub fn len(&self) -> usize {
        self.peers.len()
    }

    pub fn is_empty(&self) -> bool {
        self.peers.is_empty()
    }
}

/// The members that hold a slot, have fabric, and are admitted (not dropped by their
/// peer-health tracker).
pub fn peer_set(
    members: &BTreeMap<NodeId, DomainMember>,
    assignment: &SlotAssignment,
    admitted: impl Fn(&str) -> bool,
) -> PeerSet {
    let peers = assignment
        .slots
        .iter()
        .filter_map(|(node, slot)| {
            let member = members.get(node)?;
            (member.ad.clique.has_fabric() && admitted(node)).then(|| {
                (
                    *slot,
                    Peer {
                        node: node.clone(),
                        ip: member.ad.ip,
                    },
                )
            })
        })
        .collect();
    PeerSet { peers }
}

/// The stable DNS name of a slot in DNS-names mode.
pub fn slot_hostname(slot: Slot) -> String {
    format!("domaind-imex-slot-{slot:03}")
}

/// The nodes config in DNS-names mode: every slot's name, whoever holds it.
pub fn render_nodes_config_dns(max_slots: Slot) -> String {
    (0..max_slots).fold(String::new(), |mut out, slot| {
        let _ = writeln!(out, "{}", slot_hostname(slot));
        out
    })
}

/// The hosts file in DNS-names mode: each slot's name → its holder's IP, or
/// `unused_slot_ip` for an empty slot.
pub fn render_hosts(peers: &PeerSet, max_slots: Slot, unused_slot_ip: IpAddr) -> String {
    let mut out = String::from("# Written by domaind: IMEX slot names of this node's domain.\n");
    for slot in 0..max_slots {
        let ip = peers.peers.get(&slot).map_or(unused_slot_ip, |p| p.ip);
        let _ = writeln!(out, "{ip} {}", slot_hostname(slot));
    }
    out
}

/// The nodes config in IPs mode: members' IPs in slot order.
pub fn render_nodes_config_ips(peers: &PeerSet) -> String {
    peers.peers.values().fold(String::new(), |mut out, p| {
        let _ = writeln!(out, "{}", p.ip);
        out
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Advertisement, CliqueId};
    use crate::rules::fixtures::{self, advertisement};

    fn member(node: &str, ip: &str, clique: &str) -> (NodeId, DomainMember) {
        let ad = Advertisement {
            ip: ip.parse().unwrap(),
            clique: CliqueId(clique.into()),
            ..advertisement()
        };
        (node.to_owned(), fixtures::member(node, ad))
    }

    fn assignment(pairs: &[(&str, Slot)]) -> SlotAssignment {
        SlotAssignment {
            slots: pairs.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect(),
            unassigned: vec![],
        }
    }

    #[test]
    fn peer_set_holds_admitted_fabric_members_with_slots() {
        let members: BTreeMap<_, _> = [
            member("a", "10.0.0.1", "c.0"),
            member("b", "10.0.0.2", "c.0"),
            member("nofabric", "10.0.0.3", ""),
            member("dropped", "10.0.0.4", "c.0"),
            member("waiting", "10.0.0.5", "c.0"),
        ]
        .into();
        let set = peer_set(
            &members,
            &assignment(&[("a", 1), ("b", 0), ("nofabric", 2), ("dropped", 3)]),
            |n| n != "dropped",
        );
        assert_eq!(set.nodes().collect::<Vec<_>>(), vec!["b", "a"]);
        assert_eq!(set.peers[&1].ip, "10.0.0.1".parse::<IpAddr>().unwrap());
    }

    #[test]
    fn dns_mode_renders_every_slot_and_parks_empty_ones() {
        let members: BTreeMap<_, _> = [member("a", "10.0.0.1", "c.0")].into();
        let set = peer_set(&members, &assignment(&[("a", 1)]), |_| true);
        assert_eq!(
            render_nodes_config_dns(3),
            "domaind-imex-slot-000\ndomaind-imex-slot-001\ndomaind-imex-slot-002\n"
        );
        let hosts = render_hosts(&set, 3, "127.0.0.0".parse().unwrap());
        let lines: Vec<_> = hosts.lines().skip(1).collect();
        assert_eq!(
            lines,
            vec![
                "127.0.0.0 domaind-imex-slot-000",
                "10.0.0.1 domaind-imex-slot-001",
                "127.0.0.0 domaind-imex-slot-002"
            ]
        );
    }

    #[test]
    fn ip_mode_lists_members_in_slot_order() {
        let members: BTreeMap<_, _> = [
            member("a", "10.0.0.1", "c.0"),
            member("b", "10.0.0.2", "c.0"),
        ]
        .into();
        let set = peer_set(&members, &assignment(&[("a", 4), ("b", 2)]), |_| true);
        assert_eq!(render_nodes_config_ips(&set), "10.0.0.2\n10.0.0.1\n");
    }
}
