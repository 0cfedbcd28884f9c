//! Per-node and domain readiness.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use crate::model::{DomainMember, NodeId, Phase};
use crate::rules::slots::SlotAssignment;

/// A member is ready when its IMEX daemon is ready and it advertises the slot the
/// assignment gives it (so its peers configured it where it thinks it is).
pub fn node_ready(member: &DomainMember, assignment: &SlotAssignment, admitted: bool) -> bool {
    admitted
        && member.ad.imex_ready
        && member.ad.slot.is_some()
        && member.ad.slot == assignment.slot_of(&member.node)
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NotReadyReason {
    /// Members are still forming: not all ready yet.
    Forming,
    /// `numNodes` asks for more members than there are.
    WaitingForNodes { want: u32 },
    /// Members died and have not come back.
    Degraded { lost: Vec<NodeId> },
    /// More members than slots; these wait for a slot.
    Full { waiting: Vec<NodeId> },
    /// No member at all.
    Empty,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Readiness {
    pub phase: Phase,
    pub ready: usize,
    /// Live members plus lost ones.
    pub total: usize,
    pub ready_nodes: BTreeSet<NodeId>,
    pub reason: Option<NotReadyReason>,
    /// Live members whose IMEX daemon is failing (they advertise it): named in the
    /// status whatever else keeps the domain from being ready.
    pub imex_failing: Vec<NodeId>,
}

impl Readiness {
    pub fn is_ready(&self) -> bool {
        self.phase == Phase::Ready
    }
}

impl fmt::Display for Readiness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{} nodes ready", self.ready, self.total)?;
        match &self.reason {
            None => Ok(()),
            Some(NotReadyReason::Forming) => Ok(()),
            Some(NotReadyReason::Empty) => {
                write!(
                    f,
                    ", no members: no node holds a prepared claim of the domain"
                )
            }
            Some(NotReadyReason::WaitingForNodes { want }) => {
                write!(f, ", waiting for {want} nodes (spec.numNodes)")
            }
            Some(NotReadyReason::Degraded { lost }) => write!(f, ", lost: {}", lost.join(", ")),
            Some(NotReadyReason::Full { waiting }) => {
                write!(f, ", no free IMEX slot for: {}", waiting.join(", "))
            }
        }?;
        if !self.imex_failing.is_empty() {
            write!(f, ", IMEX failing on: {}", self.imex_failing.join(", "))?;
        }
        Ok(())
    }
}

/// The domain is Ready when every live member is ready, none is lost, none waits for
/// a slot, and there are at least `num_nodes` of them (when `num_nodes` > 0).
pub fn domain_readiness(
    members: &BTreeMap<NodeId, DomainMember>,
    assignment: &SlotAssignment,
    admitted: impl Fn(&str) -> bool,
    lost: &BTreeSet<NodeId>,
    num_nodes: u32,
) -> Readiness {
    let ready_nodes: BTreeSet<NodeId> = members
        .values()
        .filter(|m| node_ready(m, assignment, admitted(&m.node)))
        .map(|m| m.node.clone())
        .collect();
    let lost: Vec<NodeId> = lost
        .iter()
        .filter(|n| !members.contains_key(*n))
        .cloned()
        .collect();
    let total = members.len() + lost.len();
    let imex_failing: Vec<NodeId> = members
        .values()
        .filter(|m| m.ad.imex_failing && !ready_nodes.contains(&m.node))
        .map(|m| m.node.clone())
        .collect();
    let reason = if members.is_empty() {
        Some(NotReadyReason::Empty)
    } else if !lost.is_empty() {
        Some(NotReadyReason::Degraded { lost })
    } else if num_nodes > 0 && (members.len() as u64) < u64::from(num_nodes) {
        Some(NotReadyReason::WaitingForNodes { want: num_nodes })
    } else if !assignment.unassigned.is_empty() {
        Some(NotReadyReason::Full {
            waiting: assignment.unassigned.clone(),
        })
    } else if ready_nodes.len() < members.len() {
        Some(NotReadyReason::Forming)
    } else {
        None
    };
    Readiness {
        phase: if reason.is_none() {
            Phase::Ready
        } else {
            Phase::NotReady
        },
        ready: ready_nodes.len(),
        total,
        ready_nodes,
        reason,
        imex_failing,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Advertisement;
    use crate::rules::fixtures::{self, advertisement};

    fn member(node: &str, slot: Option<u16>, ready: bool) -> (NodeId, DomainMember) {
        let ad = Advertisement {
            slot,
            imex_ready: ready,
            ..advertisement()
        };
        (node.into(), fixtures::member(node, ad))
    }

    fn assign(pairs: &[(&str, u16)]) -> SlotAssignment {
        SlotAssignment {
            slots: pairs.iter().map(|(n, s)| ((*n).to_owned(), *s)).collect(),
            unassigned: vec![],
        }
    }

    #[test]
    fn ready_when_all_ready_with_their_assigned_slots() {
        let members: BTreeMap<_, _> =
            [member("a", Some(0), true), member("b", Some(1), true)].into();
        let r = domain_readiness(
            &members,
            &assign(&[("a", 0), ("b", 1)]),
            |_| true,
            &BTreeSet::new(),
            0,
        );
        assert!(r.is_ready());
        assert_eq!(r.to_string(), "2/2 nodes ready");
    }

    #[test]
    fn a_member_on_a_stale_slot_is_not_ready() {
        let members: BTreeMap<_, _> =
            [member("a", Some(0), true), member("b", Some(0), true)].into();
        let r = domain_readiness(
            &members,
            &assign(&[("a", 0), ("b", 1)]),
            |_| true,
            &BTreeSet::new(),
            0,
        );
        assert_eq!(r.reason, Some(NotReadyReason::Forming));
        assert_eq!(r.to_string(), "1/2 nodes ready");
    }

    #[test]
    fn num_nodes_is_honoured() {
        let members: BTreeMap<_, _> = [member("a", Some(0), true)].into();
        let r = domain_readiness(
            &members,
            &assign(&[("a", 0)]),
            |_| true,
            &BTreeSet::new(),
            3,
        );
        assert_eq!(r.phase, Phase::NotReady);
        assert_eq!(
            r.to_string(),
            "1/1 nodes ready, waiting for 3 nodes (spec.numNodes)"
        );
    }

    #[test]
    fn a_lost_member_degrades_the_domain() {
        let members: BTreeMap<_, _> = [member("a", Some(0), true)].into();
        let lost: BTreeSet<NodeId> = ["b".to_string()].into();
        let r = domain_readiness(&members, &assign(&[("a", 0)]), |_| true, &lost, 0);
        assert_eq!(
            r.reason,
            Some(NotReadyReason::Degraded {
                lost: vec!["b".into()]
            })
        );
        assert_eq!(r.to_string(), "1/2 nodes ready, lost: b");
    }

    #[test]
    fn members_whose_imex_is_failing_are_named_whatever_else_is_wrong() {
        let (name, mut failing) = member("b", None, false);
        failing.ad.imex_failing = true;
        let members: BTreeMap<_, _> = [member("a", Some(0), true), (name, failing)].into();
        let r = domain_readiness(
            &members,
            &assign(&[("a", 0), ("b", 1)]),
            |_| true,
            &BTreeSet::new(),
            0,
        );
        assert_eq!(r.imex_failing, vec!["b".to_string()]);
        assert_eq!(r.to_string(), "1/2 nodes ready, IMEX failing on: b");
        let lost: BTreeSet<NodeId> = ["c".to_string()].into();
        let r = domain_readiness(&members, &assign(&[("a", 0)]), |_| true, &lost, 0);
        assert_eq!(
            r.to_string(),
            "1/3 nodes ready, lost: c, IMEX failing on: b"
        );
        // A healthy domain says nothing of it.
        let healthy: BTreeMap<_, _> = [member("a", Some(0), true)].into();
        let r = domain_readiness(
            &healthy,
            &assign(&[("a", 0)]),
            |_| true,
            &BTreeSet::new(),
            0,
        );
        assert!(r.imex_failing.is_empty());
        assert_eq!(r.to_string(), "1/1 nodes ready");
    }

    #[test]
    fn dropped_members_and_full_domains_are_not_ready() {
        let members: BTreeMap<_, _> =
            [member("a", Some(0), true), member("b", Some(1), true)].into();
        let r = domain_readiness(
            &members,
            &assign(&[("a", 0), ("b", 1)]),
            |n| n != "b",
            &BTreeSet::new(),
            0,
        );
        assert_eq!(r.ready, 1);
        let mut full = assign(&[("a", 0), ("b", 1)]);
        full.unassigned.push("c".into());
        let r = domain_readiness(&members, &full, |_| true, &BTreeSet::new(), 0);
        assert_eq!(
            r.reason,
            Some(NotReadyReason::Full {
                waiting: vec!["c".into()]
            })
        );
        let r = domain_readiness(
            &BTreeMap::new(),
            &assign(&[]),
            |_| true,
            &BTreeSet::new(),
            0,
        );
        assert_eq!(r.reason, Some(NotReadyReason::Empty));
    }
}
