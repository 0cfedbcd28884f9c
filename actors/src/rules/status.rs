//! The status document the reporter writes: what `kubectl get computedomains` shows.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::model::{Advertisement, DomainMember, NodeId, Phase, Slot};
use crate::rules::readiness::Readiness;
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
    }
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
    use crate::model::CliqueId;
    use crate::rules::readiness::domain_readiness;
    use std::collections::BTreeSet;

    fn ad(slot: u16, ready: bool) -> Advertisement {
        Advertisement {
            namespace: "ns".into(),
            name: "cd".into(),
            num_nodes: 0,
            ip: format!("10.0.0.{slot}").parse().unwrap(),
            clique: CliqueId("c.0".into()),
            slot: Some(slot),
            imex_ready: ready,
            joined_at_ms: 0,
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
}
