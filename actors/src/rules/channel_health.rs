//! How a domain's channel is on this node, as its pods' devices report it: the kubelet's
//! device health (`DRAResourceHealth`) and the claim's `status.devices` both say what
//! this rule decides, so a pod and its claim never disagree.
//!
//! A channel is healthy when the domain's IMEX daemon runs here, is ready and reaches
//! every peer, and the domain is Ready. The first thing that is not so is the reason
//! given: a job's owner reads the cause nearest to their pod first.

use std::collections::BTreeMap;
use std::fmt;

use crate::model::{ChannelId, CliqueId, NodeId, Slot};
use crate::rules::peers::PeerSet;
use crate::rules::readiness::Readiness;

/// The kubelet keeps at most this many characters of a device's health message.
pub const MAX_MESSAGE_CHARS: usize = 1024;

#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum ChannelHealth {
    /// Not known yet: IMEX has not answered, or the domain's view is not built.
    #[default]
    Unknown,
    Healthy,
    /// Why not, in at most [`MAX_MESSAGE_CHARS`] characters.
    Unhealthy(String),
}

impl ChannelHealth {
    fn unhealthy(why: String) -> Self {
        ChannelHealth::Unhealthy(truncate_chars(why, MAX_MESSAGE_CHARS))
    }

    pub fn is_healthy(&self) -> bool {
        matches!(self, ChannelHealth::Healthy)
    }

    pub fn message(&self) -> &str {
        match self {
            ChannelHealth::Unknown => "",
            ChannelHealth::Healthy => "",
            ChannelHealth::Unhealthy(why) => why,
        }
    }
}

impl fmt::Display for ChannelHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ChannelHealth::Unknown => f.write_str("Unknown"),
            ChannelHealth::Healthy => f.write_str("Healthy"),
            ChannelHealth::Unhealthy(why) => write!(f, "Unhealthy: {why}"),
        }
    }
}

/// Which of the causes [`ChannelHealth`] says in words, for machines: the claim's
/// `Ready` condition gives it as its reason (CamelCase, as conditions' reasons are).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum HealthReason {
    #[default]
    Pending,
    ImexReady,
    DomainReady,
    ImexFailing,
    LinkDown,
    ImexNotReady,
    DomainNotReady,
}

impl HealthReason {
    /// Every reason (the book's reference lists them from here).
    pub const ALL: [HealthReason; 7] = [
        Self::Pending,
        Self::ImexReady,
        Self::DomainReady,
        Self::ImexFailing,
        Self::LinkDown,
        Self::ImexNotReady,
        Self::DomainNotReady,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Self::Pending => "Pending",
            Self::ImexReady => "ImexReady",
            Self::DomainReady => "DomainReady",
            Self::ImexFailing => "ImexFailing",
            Self::LinkDown => "LinkDown",
            Self::ImexNotReady => "ImexNotReady",
            Self::DomainNotReady => "DomainNotReady",
        }
    }

    /// What the reason says, and the health that goes with it.
    pub fn meaning(self) -> &'static str {
        match self {
            Self::Pending => {
                "Unknown: IMEX has not answered, or the domain has not judged itself yet."
            }
            Self::ImexReady => {
                "Healthy: IMEX runs, is ready and reaches every peer, and the domain is Ready."
            }
            Self::DomainReady => {
                "Healthy without NVLink fabric: the domain is Ready, there is no IMEX to judge."
            }
            Self::ImexFailing => {
                "Unhealthy: IMEX not running, or not ready within a failure episode."
            }
            Self::LinkDown => "Unhealthy: IMEX runs but does not reach a peer.",
            Self::ImexNotReady => {
                "Unhealthy: IMEX runs, reaches no peer that is down, and is not ready yet \
                 (forming)."
            }
            Self::DomainNotReady => "Unhealthy: the channel is fine here, the domain is not Ready.",
        }
    }
}

impl fmt::Display for HealthReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A domain as its channel's devices on this node report it.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct DomainHealth {
    pub health: ChannelHealth,
    /// The cause `health` gives, as a machine reads it.
    pub reason: HealthReason,
    pub clique: CliqueId,
    /// This node's slot (its IMEX index) in the domain.
    pub index: Option<Slot>,
    /// The domain's channel on this node (`isolation: Channel`); none is channel 0.
    pub channel: Option<ChannelId>,
    /// Remote IMEX peers whose link IMEX last reported up.
    pub linked_peers: usize,
    /// Remote IMEX peers in the peer set IMEX runs with.
    pub peers: usize,
    /// This node's IMEX is down or not ready within a failure episode: the episode's
    /// first failure's reason.
    pub imex_failing: Option<String>,
}

/// What this node's IMEX daemon last said.
#[derive(Debug, Clone, Copy)]
pub struct LocalImex<'a> {
    pub running: bool,
    pub ready: bool,
    /// The failure episode under way: its first failure's reason.
    pub failure: Option<&'a str>,
    /// Each peer slot's link as last reported; a slot absent is not known yet.
    pub links: &'a BTreeMap<Slot, bool>,
}

#[derive(Debug, Clone, Copy)]
pub struct HealthInput<'a> {
    pub me: &'a str,
    pub clique: &'a CliqueId,
    pub has_fabric: bool,
    /// None until IMEX has answered (or, for a sharing domain, the shared IMEX domain
    /// has said how its daemon is).
    pub imex: Option<LocalImex<'a>>,
    pub peer_set: &'a PeerSet,
    /// None until the first pass.
    pub readiness: Option<&'a Readiness>,
    pub index: Option<Slot>,
    pub channel: Option<ChannelId>,
}

pub fn domain_health(input: HealthInput<'_>) -> DomainHealth {
    let HealthInput {
        me,
        clique,
        has_fabric,
        imex,
        peer_set,
        readiness,
        index,
        channel,
    } = input;
    let remote: Vec<(Slot, &NodeId)> = peer_set
        .peers
        .iter()
        .filter(|(_, peer)| peer.node != me)
        .map(|(slot, peer)| (*slot, &peer.node))
        .collect();
    let link = |slot: Slot| imex.and_then(|imex| imex.links.get(&slot).copied());
    let linked_peers = remote
        .iter()
        .filter(|(slot, _)| link(*slot) == Some(true))
        .count();
    let (reason, health) = judge(has_fabric, imex, &remote, link, readiness);
    DomainHealth {
        health,
        reason,
        clique: clique.clone(),
        index,
        channel,
        linked_peers,
        peers: remote.len(),
        // An episode lasts until the daemon has stayed up a while; a daemon running
        // and ready again serves its pods, so it is not failing them.
        imex_failing: imex
            .filter(|imex| !(imex.running && imex.ready))
            .and_then(|imex| imex.failure)
            .map(str::to_owned),
    }
}

fn judge(
    has_fabric: bool,
    imex: Option<LocalImex<'_>>,
    remote: &[(Slot, &NodeId)],
    link: impl Fn(Slot) -> Option<bool>,
    readiness: Option<&Readiness>,
) -> (HealthReason, ChannelHealth) {
    let unhealthy = |reason, why| (reason, ChannelHealth::unhealthy(why));
    let Some(readiness) = readiness else {
        return (HealthReason::Pending, ChannelHealth::Unknown);
    };
    // Without NVLink fabric there is no IMEX to judge: the domain's readiness is all.
    if has_fabric {
        let Some(imex) = imex else {
            return (HealthReason::Pending, ChannelHealth::Unknown);
        };
        if !imex.running {
            return unhealthy(
                HealthReason::ImexFailing,
                match imex.failure {
                    Some(reason) => format!("IMEX is failing on this node: {reason}"),
                    None => "IMEX is not running on this node".to_owned(),
                },
            );
        }
        // A daemon that runs but is not ready is so because of a peer, when one is down:
        // naming it tells the owner where to look.
        let down: Vec<String> = remote
            .iter()
            .filter(|(slot, _)| link(*slot) == Some(false))
            .map(|(slot, node)| format!("{node} (index {slot})"))
            .collect();
        if !down.is_empty() {
            return unhealthy(
                HealthReason::LinkDown,
                format!("IMEX link down to {}", down.join(", ")),
            );
        }
        if !imex.ready {
            return match imex.failure {
                Some(reason) => unhealthy(
                    HealthReason::ImexFailing,
                    format!("IMEX is failing on this node: {reason}"),
                ),
                None => unhealthy(
                    HealthReason::ImexNotReady,
                    "IMEX on this node is not ready for the domain's peers yet".to_owned(),
                ),
            };
        }
    }
    if !readiness.is_ready() {
        return unhealthy(
            HealthReason::DomainNotReady,
            format!("ComputeDomain NotReady: {readiness}"),
        );
    }
    let reason = if has_fabric {
        HealthReason::ImexReady
    } else {
        HealthReason::DomainReady
    };
    (reason, ChannelHealth::Healthy)
}

fn truncate_chars(mut text: String, max: usize) -> String {
    if let Some((at, _)) = text.char_indices().nth(max) {
        text.truncate(at);
    }
    text
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::{IpAddr, Ipv4Addr};

    use super::*;
    use crate::model::Phase;
    use crate::rules::peers::Peer;
    use crate::rules::readiness::NotReadyReason;

    #[test]
    fn every_reason_is_listed_once_with_its_health() {
        let names: BTreeSet<&str> = HealthReason::ALL.iter().map(|r| r.as_str()).collect();
        assert_eq!(names.len(), HealthReason::ALL.len());
        for reason in HealthReason::ALL {
            let health = reason.meaning().split(':').next().unwrap();
            assert!(
                health.starts_with("Healthy") || ["Unknown", "Unhealthy"].contains(&health),
                "{reason}"
            );
        }
    }

    fn peers(nodes: &[&str]) -> PeerSet {
        PeerSet {
            peers: nodes
                .iter()
                .enumerate()
                .map(|(slot, node)| {
                    (
                        slot as Slot,
                        Peer {
                            node: (*node).to_owned(),
                            ip: IpAddr::V4(Ipv4Addr::new(127, 0, 0, 1 + slot as u8)),
                        },
                    )
                })
                .collect(),
        }
    }

    fn ready() -> Readiness {
        Readiness {
            phase: Phase::Ready,
            ready: 3,
            total: 3,
            ready_nodes: BTreeSet::new(),
            reason: None,
            imex_failing: Vec::new(),
        }
    }

    fn degraded(lost: &str) -> Readiness {
        Readiness {
            phase: Phase::NotReady,
            ready: 2,
            total: 3,
            ready_nodes: BTreeSet::new(),
            reason: Some(NotReadyReason::Degraded {
                lost: vec![lost.to_owned()],
            }),
            imex_failing: Vec::new(),
        }
    }

    struct Case {
        has_fabric: bool,
        imex: Option<(bool, bool, Option<&'static str>)>,
        links: BTreeMap<Slot, bool>,
        readiness: Option<Readiness>,
    }

    impl Case {
        fn healthy() -> Self {
            Case {
                has_fabric: true,
                imex: Some((true, true, None)),
                links: [(1, true), (2, true)].into(),
                readiness: Some(ready()),
            }
        }

        fn judge(&self) -> DomainHealth {
            let set = peers(&["node-0", "node-1", "node-2"]);
            let clique = CliqueId("c.1".into());
            domain_health(HealthInput {
                me: "node-0",
                clique: &clique,
                has_fabric: self.has_fabric,
                imex: self.imex.map(|(running, ready, failure)| LocalImex {
                    running,
                    ready,
                    failure,
                    links: &self.links,
                }),
                peer_set: &set,
                readiness: self.readiness.as_ref(),
                index: Some(0),
                channel: None,
            })
        }
    }

    #[test]
    fn ready_imex_linked_to_every_peer_in_a_ready_domain_is_healthy() {
        let health = Case::healthy().judge();
        assert_eq!(health.health, ChannelHealth::Healthy);
        assert_eq!(health.reason, HealthReason::ImexReady);
        assert_eq!((health.linked_peers, health.peers), (2, 2));
        assert_eq!(health.index, Some(0));
    }

    #[test]
    fn unknown_until_imex_answers_and_the_domain_is_seen() {
        let mut case = Case::healthy();
        case.imex = None;
        assert_eq!(case.judge().health, ChannelHealth::Unknown);
        assert_eq!(case.judge().reason, HealthReason::Pending);
        let mut case = Case::healthy();
        case.readiness = None;
        assert_eq!(case.judge().health, ChannelHealth::Unknown);
        assert_eq!(case.judge().reason, HealthReason::Pending);
    }

    #[test]
    fn a_failing_imex_says_why() {
        let mut case = Case::healthy();
        case.imex = Some((false, false, Some("exited with status 1")));
        let health = case.judge();
        assert_eq!(
            health.health,
            ChannelHealth::Unhealthy("IMEX is failing on this node: exited with status 1".into())
        );
        assert_eq!(health.imex_failing.as_deref(), Some("exited with status 1"));
        assert_eq!(health.reason, HealthReason::ImexFailing);
        case.imex = Some((true, false, Some("exited with status 1")));
        assert_eq!(case.judge().reason, HealthReason::ImexFailing);
    }

    #[test]
    fn imex_down_or_forming_without_an_episode() {
        let mut case = Case::healthy();
        case.imex = Some((false, false, None));
        assert_eq!(
            case.judge().health.message(),
            "IMEX is not running on this node"
        );
        assert_eq!(case.judge().reason, HealthReason::ImexFailing);
        case.imex = Some((true, false, None));
        assert!(case.judge().health.message().contains("not ready"));
        assert_eq!(case.judge().reason, HealthReason::ImexNotReady);
    }

    #[test]
    fn a_link_down_names_the_peer() {
        let mut case = Case::healthy();
        case.links.insert(2, false);
        let health = case.judge();
        assert_eq!(
            health.health,
            ChannelHealth::Unhealthy("IMEX link down to node-2 (index 2)".into())
        );
        assert_eq!(health.reason, HealthReason::LinkDown);
        assert_eq!(health.linked_peers, 1);
    }

    #[test]
    fn a_link_not_reported_yet_is_not_down_nor_linked() {
        let mut case = Case::healthy();
        case.links.remove(&2);
        let health = case.judge();
        assert_eq!(health.health, ChannelHealth::Healthy);
        assert_eq!(health.linked_peers, 1);
    }

    #[test]
    fn a_domain_not_ready_says_its_readiness() {
        let mut case = Case::healthy();
        case.readiness = Some(degraded("node-2"));
        assert_eq!(
            case.judge().health,
            ChannelHealth::Unhealthy(
                "ComputeDomain NotReady: 2/3 nodes ready, lost: node-2".into()
            )
        );
        assert_eq!(case.judge().reason, HealthReason::DomainNotReady);
    }

    #[test]
    fn without_fabric_only_the_domain_counts() {
        let mut case = Case::healthy();
        case.has_fabric = false;
        case.imex = None;
        assert_eq!(case.judge().health, ChannelHealth::Healthy);
        assert_eq!(case.judge().reason, HealthReason::DomainReady);
        case.readiness = Some(degraded("node-1"));
        assert!(!case.judge().health.is_healthy());
        assert_eq!(case.judge().reason, HealthReason::DomainNotReady);
    }

    #[test]
    fn messages_are_cut_at_the_kubelets_limit_on_a_char_boundary() {
        let long = "é".repeat(MAX_MESSAGE_CHARS + 10);
        let ChannelHealth::Unhealthy(cut) = ChannelHealth::unhealthy(long) else {
            unreachable!()
        };
        assert_eq!(cut.chars().count(), MAX_MESSAGE_CHARS);
    }
}
