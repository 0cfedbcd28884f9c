//! This node's IMEX daemon in a domain: which peer set it should run with, when that
//! means reconfiguring it, and when this node may advertise `imex_ready`.
//!
//! Every peer set handed to the daemon gets a new version, and the daemon's reports say
//! which version they are about: a report is only evidence for the set it names, so a
//! node never advertises readiness for a set its daemon is not running yet.

use std::collections::BTreeMap;

use crate::model::{DomainMember, NodeId, Slot};
use crate::rules::peers::{PeerSet, peer_set};
use crate::rules::slots::SlotAssignment;

/// The peer set this node's daemon should run with: the admitted IMEX members
/// ([`crate::rules::roster::Roster::imex_members`]) holding slots, but only while this
/// node holds one itself and has fabric; none otherwise.
pub fn desired_peers(
    imex_members: &BTreeMap<NodeId, DomainMember>,
    assignment: &SlotAssignment,
    admitted: impl Fn(&str) -> bool,
    my_slot: Option<Slot>,
    has_fabric: bool,
) -> PeerSet {
    if my_slot.is_some() && has_fabric {
        peer_set(imex_members, assignment, admitted)
    } else {
        PeerSet::default()
    }
}

/// What to tell the daemon when the desired peer set is computed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reconfigure {
    /// The set it runs with is still right: leave it alone.
    Unchanged,
    /// Nothing to run with: stop it.
    Release,
    /// Run with the new set, as version `version`.
    Apply { version: u64 },
}

/// `current`: the set last handed over, as `version`.
pub fn reconfigure(current: &PeerSet, desired: &PeerSet, version: u64) -> Reconfigure {
    if desired == current {
        Reconfigure::Unchanged
    } else if desired.is_empty() {
        Reconfigure::Release
    } else {
        Reconfigure::Apply {
            version: version + 1,
        }
    }
}

/// What the daemon last reported.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DaemonReport {
    /// The peer-set version it runs with (none before its first start).
    pub version: Option<u64>,
    pub running: bool,
    pub ready: bool,
}

/// Whether this node advertises its IMEX as ready: always without fabric (a no-op
/// member has nothing to wait for); with fabric, once the daemon reports ready for the
/// very set (`version`, `peers`) it should run with, and that set is not empty.
pub fn imex_ready(
    has_fabric: bool,
    report: Option<DaemonReport>,
    version: u64,
    peers: &PeerSet,
) -> bool {
    if !has_fabric {
        return true;
    }
    report.is_some_and(|report| {
        report.running && report.ready && report.version == Some(version) && !peers.is_empty()
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Advertisement, CliqueId};
    use crate::rules::fixtures::{self, advertisement};
    use crate::rules::peers::Peer;
    use proptest::prelude::*;

    fn member(node: &str, clique: &str) -> (NodeId, DomainMember) {
        let ad = Advertisement {
            clique: CliqueId(clique.into()),
            ..advertisement()
        };
        (node.to_owned(), fixtures::member(node, ad))
    }

    fn set(nodes: &[(Slot, &str)]) -> PeerSet {
        PeerSet {
            peers: nodes
                .iter()
                .map(|(slot, node)| {
                    (
                        *slot,
                        Peer {
                            node: (*node).to_owned(),
                            ip: "10.0.0.1".parse().unwrap(),
                        },
                    )
                })
                .collect(),
        }
    }

    fn report(version: Option<u64>, running: bool, ready: bool) -> DaemonReport {
        DaemonReport {
            version,
            running,
            ready,
        }
    }

    #[test]
    fn the_daemon_runs_only_while_this_node_holds_a_slot_and_has_fabric() {
        let members: BTreeMap<_, _> = [member("a", "c.0"), member("b", "c.0")].into();
        let assignment = SlotAssignment {
            slots: [("a".to_owned(), 0), ("b".to_owned(), 1)].into(),
            unassigned: vec![],
        };
        let all = desired_peers(&members, &assignment, |_| true, Some(0), true);
        assert_eq!(all.nodes().collect::<Vec<_>>(), vec!["a", "b"]);
        let admitted = desired_peers(&members, &assignment, |n| n != "b", Some(0), true);
        assert_eq!(admitted.nodes().collect::<Vec<_>>(), vec!["a"]);
        assert!(desired_peers(&members, &assignment, |_| true, None, true).is_empty());
        assert!(desired_peers(&members, &assignment, |_| true, Some(0), false).is_empty());
    }

    #[test]
    fn a_changed_set_is_a_new_version_and_an_empty_one_stops_the_daemon() {
        let ab = set(&[(0, "a"), (1, "b")]);
        assert_eq!(reconfigure(&ab, &ab, 4), Reconfigure::Unchanged);
        assert_eq!(
            reconfigure(&ab, &set(&[(0, "a")]), 4),
            Reconfigure::Apply { version: 5 }
        );
        assert_eq!(
            reconfigure(&ab, &PeerSet::default(), 4),
            Reconfigure::Release
        );
        assert_eq!(
            reconfigure(&PeerSet::default(), &PeerSet::default(), 4),
            Reconfigure::Unchanged
        );
    }

    #[test]
    fn ready_needs_a_ready_report_for_the_current_set() {
        let peers = set(&[(0, "a")]);
        assert!(imex_ready(
            true,
            Some(report(Some(3), true, true)),
            3,
            &peers
        ));
        assert!(!imex_ready(
            true,
            Some(report(Some(2), true, true)),
            3,
            &peers
        ));
        assert!(!imex_ready(
            true,
            Some(report(Some(3), false, true)),
            3,
            &peers
        ));
        assert!(!imex_ready(
            true,
            Some(report(Some(3), true, false)),
            3,
            &peers
        ));
        assert!(!imex_ready(true, None, 3, &peers));
        assert!(!imex_ready(
            true,
            Some(report(Some(3), true, true)),
            3,
            &PeerSet::default()
        ));
        // Without fabric there is no daemon to wait for.
        assert!(imex_ready(false, None, 0, &PeerSet::default()));
    }

    proptest! {
        /// The daemon reconfigured as this node would (desired sets in turn) and
        /// reporting at random, possibly about versions it no longer runs: `imex_ready`
        /// holds only for a ready report about the set the node wants now.
        #[test]
        fn imex_ready_only_for_the_set_the_daemon_runs(
            steps in proptest::collection::vec((0u8..8, any::<bool>(), any::<bool>(), 0u64..4), 1..60),
        ) {
            let mut current = PeerSet::default();
            let mut version = 0u64;
            // The version each set was handed over as.
            let mut handed: Vec<(u64, PeerSet)> = Vec::new();
            for (mask, running, ready, lag) in steps {
                let nodes: Vec<(Slot, String)> = (0..3u16)
                    .filter(|i| mask & (1 << i) != 0)
                    .map(|i| (i, format!("n{i}")))
                    .collect();
                let refs: Vec<(Slot, &str)> = nodes.iter().map(|(s, n)| (*s, n.as_str())).collect();
                let desired = set(&refs);
                match reconfigure(&current, &desired, version) {
                    Reconfigure::Unchanged => prop_assert_eq!(&desired, &current),
                    Reconfigure::Release => prop_assert!(desired.is_empty()),
                    Reconfigure::Apply { version: next } => {
                        prop_assert_eq!(next, version + 1);
                        version = next;
                        handed.push((next, desired.clone()));
                    }
                }
                current = desired;
                let reported = version.checked_sub(lag).filter(|v| *v > 0);
                let ready_now = imex_ready(true, Some(report(reported, running, ready)), version, &current);
                if ready_now {
                    prop_assert!(running && ready && !current.is_empty());
                    let (_, ran) = handed
                        .iter()
                        .find(|(v, _)| Some(*v) == reported)
                        .expect("a ready report names a version handed over");
                    prop_assert_eq!(ran, &current, "ready for a set the daemon does not run");
                }
            }
        }
    }
}
