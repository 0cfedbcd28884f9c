//! The status document the reporter writes: what `kubectl get computedomains` shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Advertisement, ChannelId, DomainMember, NodeId, Phase, Slot};
use crate::rules::readiness::{Readiness, domain_readiness};
use crate::rules::slots::SlotAssignment;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeStatus {
    pub name: NodeId,
    pub ip_address: String,
    /// `<clusterUUID>.<cliqueId>`, empty without fabric.
    pub clique_id: String,
    /// The IMEX slot.
    pub index: Option<Slot>,
    pub status: Phase,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainStatus {
    pub status: Phase,
    pub ready_nodes: u32,
    pub total_nodes: u32,
    /// Why, in words: "17/18 nodes ready, lost: node-07".
    pub message: String,
    /// Sorted by name.
    pub nodes: Vec<NodeStatus>,
    /// Channel isolation: the domain's channel, once every node of the shared IMEX
    /// domain agrees on it.
    pub channel: Option<ChannelId>,
}

/// Builds the document from live members and the members lost (with their last
/// advertisement), which are listed NotReady until they return or are forgotten.
pub fn status_document(
    members: &BTreeMap<NodeId, DomainMember>,
    lost: &BTreeMap<NodeId, Advertisement>,
    assignment: &SlotAssignment,
    readiness: &Readiness,
) -> DomainStatus {
    let mut nodes: Vec<NodeStatus> = members
        .values()
        .map(|m| NodeStatus {
            name: m.node.clone(),
            ip_address: m.ad.ip.to_string(),
            clique_id: m.ad.clique.0.clone(),
            index: assignment.slot_of(&m.node),
            status: if readiness.ready_nodes.contains(&m.node) {
                Phase::Ready
            } else {
                Phase::NotReady
            },
        })
        .collect();
    nodes.extend(
        lost.iter()
            .filter(|(node, _)| !members.contains_key(*node))
            .map(|(node, ad)| NodeStatus {
                name: node.clone(),
                ip_address: ad.ip.to_string(),
                clique_id: ad.clique.0.clone(),
                index: ad.slot,
                status: Phase::NotReady,
            }),
    );
    nodes.sort_by(|a, b| a.name.cmp(&b.name));
    DomainStatus {
        status: readiness.phase,
        ready_nodes: readiness.ready as u32,
        total_nodes: readiness.total as u32,
        message: readiness.to_string(),
        nodes,
        channel: None,
    }
}

/// What the status says once no node serves the domain any more (its workload is
/// gone): NotReady, no nodes, as a domain that never had any. The last node to leave
/// writes it.
pub fn vacated_document() -> DomainStatus {
    let readiness = domain_readiness(
        &BTreeMap::new(),
        &SlotAssignment::default(),
        |_| true,
        &Default::default(),
        0,
    );
    status_document(
        &BTreeMap::new(),
        &BTreeMap::new(),
        &SlotAssignment::default(),
        &readiness,
    )
}

/// Whether the last node to leave has to write: the status as written still lists
/// nodes or reads Ready. Nothing written is nothing stale.
pub fn stale_once_vacated(written: Option<&DomainStatus>) -> bool {
    written.is_some_and(|w| *w != vacated_document())
}

/// Lists `adopted` (members nobody saw leave, see [`crate::rules::takeover`]) among the
/// document's nodes, NotReady.
pub fn with_adopted(mut document: DomainStatus, adopted: &[NodeStatus]) -> DomainStatus {
    let known: std::collections::BTreeSet<NodeId> =
        document.nodes.iter().map(|n| n.name.clone()).collect();
    document.nodes.extend(
        adopted
            .iter()
            .filter(|n| !known.contains(&n.name))
            .map(|n| NodeStatus {
                status: Phase::NotReady,
                ..n.clone()
            }),
    );
    document.nodes.sort_by(|a, b| a.name.cmp(&b.name));
    document
}

/// A short, stable fingerprint of a document (FNV-1a over its JSON): reporters publish
/// it after writing so that a successor can tell the document is already written.
pub fn digest(status: &DomainStatus) -> String {
    let json = serde_json::to_vec(status).expect("a status always serialises");
    let hash = json.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0000_0100_0000_01b3)
    });
    format!("{hash:016x}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::rules::fixtures::advertisement;
    use std::collections::BTreeSet;

    fn ad(slot: u16, ready: bool) -> Advertisement {
        Advertisement {
            ip: format!("10.0.0.{slot}").parse().unwrap(),
            slot: Some(slot),
            imex_ready: ready,
            imex_failing: false,
            ..advertisement()
        }
    }

    #[test]
    fn lists_live_and_lost_members_sorted_with_their_state() {
        let members: BTreeMap<NodeId, DomainMember> = [("b", 1, true), ("a", 0, false)]
            .iter()
            .map(|(n, s, r)| {
                (
                    (*n).to_owned(),
                    DomainMember {
                        node: (*n).to_owned(),
                        generation: 1,
                        ad: ad(*s, *r),
                    },
                )
            })
            .collect();
        let lost: BTreeMap<NodeId, Advertisement> = [("c".to_owned(), ad(2, true))].into();
        let assignment = SlotAssignment {
            slots: [("a".to_owned(), 0), ("b".to_owned(), 1)].into(),
            unassigned: vec![],
        };
        let lost_names: BTreeSet<NodeId> = lost.keys().cloned().collect();
        let readiness = domain_readiness(&members, &assignment, |_| true, &lost_names, 0);
        let doc = status_document(&members, &lost, &assignment, &readiness);
        assert_eq!(doc.status, Phase::NotReady);
        assert_eq!((doc.ready_nodes, doc.total_nodes), (1, 3));
        let rows: Vec<_> = doc
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.index, n.status))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("a", Some(0), Phase::NotReady),
                ("b", Some(1), Phase::Ready),
                ("c", Some(2), Phase::NotReady)
            ]
        );
        assert_eq!(doc.message, "1/3 nodes ready, lost: c");
        assert_eq!(digest(&doc), digest(&doc.clone()));
        let mut other = doc.clone();
        other.ready_nodes = 2;
        assert_ne!(digest(&doc), digest(&other));
    }

    #[test]
    fn a_vacated_domain_is_not_ready_with_no_nodes() {
        let vacated = vacated_document();
        assert_eq!(vacated.status, Phase::NotReady);
        assert_eq!((vacated.ready_nodes, vacated.total_nodes), (0, 0));
        assert!(vacated.nodes.is_empty());
        assert!(
            vacated.message.starts_with("0/0 nodes ready, no members"),
            "{}",
            vacated.message
        );
        assert!(!stale_once_vacated(None));
        assert!(!stale_once_vacated(Some(&vacated)));
        let mut ready = vacated.clone();
        ready.status = Phase::Ready;
        assert!(stale_once_vacated(Some(&ready)));
    }

    #[test]
    fn adopted_members_are_listed_not_ready_once() {
        let row = |name: &str, status| NodeStatus {
            name: name.into(),
            ip_address: "10.0.0.1".into(),
            clique_id: String::new(),
            index: None,
            status,
        };
        let mut document = vacated_document();
        document.nodes = vec![row("b", Phase::Ready)];
        let listed = with_adopted(
            document,
            &[
                row("c", Phase::Ready),
                row("a", Phase::Ready),
                row("b", Phase::NotReady),
            ],
        );
        let rows: Vec<_> = listed
            .nodes
            .iter()
            .map(|n| (n.name.as_str(), n.status))
            .collect();
        assert_eq!(
            rows,
            vec![
                ("a", Phase::NotReady),
                ("b", Phase::Ready),
                ("c", Phase::NotReady)
            ]
        );
    }
}
