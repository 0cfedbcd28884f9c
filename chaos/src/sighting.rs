//! What a run saw at one instant, in one shape whichever run saw it, and the
//! invariants every run checks over it. The simulation fills a [`Sighting`] from its
//! nodes' snapshots and fake IMEX daemons ([`crate::checks`]), a loopback run from a
//! rack's files and `/state` ([`crate::invariants`]), a cluster run from the API server
//! and the daemons' `/state` ([`crate::cluster::checks`]); each then checks what only it
//! can see (checkpoints, status files, pods, events) beside these.
//!
//! - [`peer_set_breaches`]: **slots** (no peer set gives a node two slots, or a slot
//!   two nodes) and **isolation** (no judged peer set, the domain's or its IMEX
//!   daemon's, names a node outside the run, or one the run holds out of the domain).
//! - [`disagreements`]: **agreement** among a domain's members: each sees exactly the
//!   members and none lost (and, where the run asks, the domain Ready), and their IMEX
//!   daemons run with one peer set.
//! - [`status_breaches`]: **status** (the status lists only the run's nodes) and
//!   **slots** (no index twice in it).
//! - [`status_gaps`]: how the status falls short of whole: Ready, with exactly the
//!   members, each Ready.

use std::collections::BTreeMap;
use std::fmt;

use domaind_actors::model::{Phase, Slot};
use domaind_kube_api::crd::{ComputeDomainStatus, Phase as CrdPhase};

use crate::invariants::{Invariant, Violation};

/// A peer set as slot and node pairs: a list, not a map, so that a slot given to two
/// nodes shows as well as a node given two slots. A peer the run cannot name (an
/// address that is no node's) goes by what the run saw of it.
pub type PeerPairs = Vec<(Slot, String)>;

/// The run's nodes at one instant, by name.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sighting {
    /// Every node the run knows, seen or not: a peer not listed here is not one of the
    /// run's nodes.
    pub nodes: BTreeMap<String, NodeSighting>,
    /// The domain's status as the run read it (a status file, the ComputeDomain's),
    /// where it read one; the simulation judges its status writes apart.
    pub status: Option<ComputeDomainStatus>,
}

/// One node at one instant.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeSighting {
    /// The run holds it out of the domain: it holds no claim of it (for a loopback run,
    /// for longer than the grace), so no peer set may name it.
    pub out: bool,
    /// Its view of the domain, or why the run has none.
    pub domain: Result<DomainSighting, String>,
    /// The peer set its IMEX daemon runs with, or why the run sees none.
    pub imex: Result<PeerPairs, String>,
    /// Whether its peer sets are judged for isolation now: a run skips an observer
    /// whose peer set may still be catching up (it just started, or just joined).
    pub judged: bool,
}

impl NodeSighting {
    /// A node the run knows but did not see this time (down, or not answering).
    pub fn unseen(why: impl Into<String>) -> Self {
        let why = why.into();
        Self {
            out: false,
            domain: Err(why.clone()),
            imex: Err(why),
            judged: false,
        }
    }
}

/// A node's own view of the domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DomainSighting {
    /// The live members it sees.
    pub members: Vec<String>,
    /// Members it lists as lost.
    pub lost: Vec<String>,
    pub phase: Phase,
    pub ready: usize,
    pub total: usize,
    /// The slot it assigned each node, where the run sees the assignment (the
    /// simulation); empty otherwise.
    pub slots: PeerPairs,
    /// The IMEX peer set it computed for the domain.
    pub peers: PeerPairs,
}

/// **Slots** over every peer set and slot assignment in `sighting`, and **isolation**
/// over every judged node's peer sets. The same breach seen twice on a node (its domain's
/// peer set and its IMEX daemon's) is one violation.
pub fn peer_set_breaches(sighting: &Sighting) -> Vec<Violation> {
    let mut found: Vec<Violation> = Vec::new();
    let mut push = |violation: Violation| {
        if !found.contains(&violation) {
            found.push(violation);
        }
    };
    for (name, node) in &sighting.nodes {
        let at = Some(name.as_str());
        let domain = node.domain.as_ref().ok();
        let lists = [
            domain.map(|d| &d.slots),
            domain.map(|d| &d.peers),
            node.imex.as_ref().ok(),
        ];
        for pairs in lists.into_iter().flatten() {
            for detail in doubled(pairs) {
                push(Violation::new(Invariant::Slots, at, detail));
            }
        }
        if !node.judged {
            continue;
        }
        let peer_sets = [domain.map(|d| &d.peers), node.imex.as_ref().ok()];
        for (slot, peer) in peer_sets.into_iter().flatten().flatten() {
            let detail = match sighting.nodes.get(peer) {
                None => {
                    format!("its peer set maps slot {slot} to {peer}, not one of the run's nodes")
                }
                Some(target) if target.out => format!(
                    "its peer set maps slot {slot} to {peer}, which holds no claim of the domain"
                ),
                Some(_) => continue,
            };
            push(Violation::new(Invariant::Isolation, at, detail));
        }
    }
    found
}

/// A node given two slots, or a slot given two nodes, in one list.
fn doubled(pairs: &PeerPairs) -> Vec<String> {
    let mut slots_of: BTreeMap<&str, Vec<Slot>> = BTreeMap::new();
    let mut nodes_at: BTreeMap<Slot, Vec<&str>> = BTreeMap::new();
    for (slot, node) in pairs {
        slots_of.entry(node).or_default().push(*slot);
        nodes_at.entry(*slot).or_default().push(node);
    }
    let twice_a_node = slots_of
        .into_iter()
        .filter(|(_, slots)| slots.len() > 1)
        .map(|(node, slots)| format!("its peer set gives {node} slots {slots:?}"));
    let twice_a_slot = nodes_at
        .into_iter()
        .filter(|(_, nodes)| nodes.len() > 1)
        .map(|(slot, nodes)| format!("its peer set gives slot {slot} to {nodes:?}"));
    twice_a_node.chain(twice_a_slot).collect()
}

/// What agreement asks of the domain's members.
#[derive(Debug, Clone, Copy)]
pub struct Agreement<'a> {
    /// The domain's members: each sees exactly these, and none lost.
    pub members: &'a [String],
    /// Whose IMEX daemons must run with one peer set: the members, or with channel
    /// isolation the shared IMEX domain's (the holders of any sharing domain's claim).
    pub peer_holders: &'a [String],
    /// Every member sees the domain Ready.
    pub ready: bool,
    /// Every peer set holds exactly `peer_holders`: a run that names every peer asks
    /// it; one that reads peers by another name than the members' does not.
    pub exact_peers: bool,
    /// Every IMEX daemon runs with its own domain's peer set: a run that sees both
    /// asks it.
    pub imex_as_domain: bool,
}

/// One way a member disagrees. Shown in the words of a loopback run's and the
/// simulation's reports; a cluster run words some coarser, so that a breach lasting
/// the grace is one breach whatever it shows on the way.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Disagreement {
    /// The run has no view of the domain from it, or no peer set: why.
    Unseen(String),
    Members {
        seen: Vec<String>,
        expected: Vec<String>,
    },
    Lost(Vec<String>),
    NotReady {
        phase: Phase,
        ready: usize,
        total: usize,
    },
    PeersNotHolders {
        held: Vec<String>,
        expected: Vec<String>,
    },
    PeersDiffer {
        peers: PeerPairs,
        first: String,
        theirs: PeerPairs,
    },
    ImexNotDomain {
        imex: PeerPairs,
        domain: PeerPairs,
    },
}

impl fmt::Display for Disagreement {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Unseen(why) => f.write_str(why),
            Self::Members { seen, expected } => {
                write!(f, "sees members {seen:?}, not {expected:?}")
            }
            Self::Lost(lost) => write!(f, "lists {lost:?} as lost"),
            Self::NotReady {
                phase,
                ready,
                total,
            } => write!(f, "sees the domain {phase} ({ready}/{total} ready)"),
            Self::PeersNotHolders { held, expected } => {
                write!(f, "its peer set holds {held:?}, not {expected:?}")
            }
            Self::PeersDiffer {
                peers,
                first,
                theirs,
            } => write!(
                f,
                "its peer set {peers:?} differs from {first}'s {theirs:?}"
            ),
            Self::ImexNotDomain { imex, domain } => write!(
                f,
                "its IMEX daemon runs with {imex:?}, not its domain's peer set {domain:?}"
            ),
        }
    }
}

/// **Agreement**: how each member disagrees, by node, in the members' order. Empty
/// when they agree.
pub fn disagreements(sighting: &Sighting, asked: &Agreement<'_>) -> Vec<(String, Disagreement)> {
    let mut found = Vec::new();
    let expected = sorted(asked.members.iter());
    for member in asked.members {
        let Some(node) = sighting.nodes.get(member) else {
            found.push((member.clone(), Disagreement::Unseen("not seen".into())));
            continue;
        };
        let domain = match &node.domain {
            Ok(domain) => domain,
            Err(why) => {
                found.push((member.clone(), Disagreement::Unseen(why.clone())));
                continue;
            }
        };
        let seen = sorted(domain.members.iter());
        if seen != expected {
            let expected = expected.clone();
            found.push((member.clone(), Disagreement::Members { seen, expected }));
        }
        if !domain.lost.is_empty() {
            found.push((member.clone(), Disagreement::Lost(domain.lost.clone())));
        }
        if asked.ready && domain.phase != Phase::Ready {
            let (phase, ready, total) = (domain.phase, domain.ready, domain.total);
            let not_ready = Disagreement::NotReady {
                phase,
                ready,
                total,
            };
            found.push((member.clone(), not_ready));
        }
    }
    let holders = sorted(asked.peer_holders.iter());
    let mut agreed: Option<(&str, &PeerPairs)> = None;
    for holder in asked.peer_holders {
        let Some(node) = sighting.nodes.get(holder) else {
            continue;
        };
        let imex = match &node.imex {
            Ok(imex) => imex,
            Err(why) => {
                found.push((holder.clone(), Disagreement::Unseen(why.clone())));
                continue;
            }
        };
        if asked.imex_as_domain
            && let Ok(domain) = &node.domain
            && domain.peers != *imex
        {
            let (imex, domain) = (imex.clone(), domain.peers.clone());
            found.push((holder.clone(), Disagreement::ImexNotDomain { imex, domain }));
        }
        let held = sorted(imex.iter().map(|(_, peer)| peer));
        if asked.exact_peers && held != holders {
            let expected = holders.clone();
            found.push((
                holder.clone(),
                Disagreement::PeersNotHolders { held, expected },
            ));
        }
        match agreed {
            None => agreed = Some((holder, imex)),
            Some((first, theirs)) if theirs != imex => found.push((
                holder.clone(),
                Disagreement::PeersDiffer {
                    peers: imex.clone(),
                    first: first.to_owned(),
                    theirs: theirs.clone(),
                },
            )),
            Some(_) => {}
        }
    }
    found
}

/// **Status** and **slots** over the status the run read: every node it lists is one
/// of the run's, and no two share an index.
pub fn status_breaches(sighting: &Sighting) -> Vec<Violation> {
    let Some(status) = &sighting.status else {
        return Vec::new();
    };
    let mut found = Vec::new();
    let mut indexes: BTreeMap<Slot, Vec<&str>> = BTreeMap::new();
    for listed in &status.nodes {
        if let Some(index) = listed.index {
            indexes.entry(index).or_default().push(&listed.name);
        }
        if !sighting.nodes.contains_key(&listed.name) {
            found.push(Violation::new(
                Invariant::Status,
                Some(&listed.name),
                "listed in the domain's status, not one of the run's nodes",
            ));
        }
    }
    for (index, names) in indexes {
        if names.len() > 1 {
            found.push(Violation::new(
                Invariant::Slots,
                None,
                format!("the status gives index {index} to {names:?}"),
            ));
        }
    }
    found
}

/// One way the status falls short of whole. Shown in a loopback run's words; a cluster
/// run words them as one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StatusGap {
    NotReady(CrdPhase),
    Counts {
        ready: u32,
        total: u32,
        expected: u32,
    },
    Listed {
        listed: Vec<String>,
        expected: Vec<String>,
    },
    EntryNotReady {
        node: String,
        phase: CrdPhase,
    },
}

impl fmt::Display for StatusGap {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NotReady(phase) => write!(f, "status is {phase}"),
            Self::Counts {
                ready,
                total,
                expected,
            } => write!(f, "{ready}/{total} nodes ready, not {expected}/{expected}"),
            Self::Listed { listed, expected } => write!(f, "lists {listed:?}, not {expected:?}"),
            Self::EntryNotReady { node, phase } => write!(f, "{node} is {phase}"),
        }
    }
}

/// How `status` falls short of whole for a domain of `members`: not Ready, counts
/// other than the members', other nodes listed, a listed node not Ready. Empty when
/// whole.
pub fn status_gaps(status: &ComputeDomainStatus, members: &[String]) -> Vec<StatusGap> {
    let mut gaps = Vec::new();
    if status.status != CrdPhase::Ready {
        gaps.push(StatusGap::NotReady(status.status));
    }
    let expected = members.len() as u32;
    if status.ready_nodes != expected || status.total_nodes != expected {
        gaps.push(StatusGap::Counts {
            ready: status.ready_nodes,
            total: status.total_nodes,
            expected,
        });
    }
    let listed = sorted(status.nodes.iter().map(|n| &n.name));
    let expected = sorted(members.iter());
    if listed != expected {
        gaps.push(StatusGap::Listed { listed, expected });
    }
    for entry in status.nodes.iter().filter(|n| n.status != CrdPhase::Ready) {
        gaps.push(StatusGap::EntryNotReady {
            node: entry.name.clone(),
            phase: entry.status,
        });
    }
    gaps
}

fn sorted<'a>(names: impl Iterator<Item = &'a String>) -> Vec<String> {
    let mut names: Vec<String> = names.cloned().collect();
    names.sort_unstable();
    names
}

/// A Ready status listing `listed` Ready at their index: the fixture of this module's
/// tests and the cluster checks'.
#[cfg(test)]
pub(crate) fn ready_status(listed: &[(&str, Slot)]) -> ComputeDomainStatus {
    ComputeDomainStatus {
        status: CrdPhase::Ready,
        nodes: listed
            .iter()
            .map(|(name, index)| domaind_kube_api::crd::ComputeDomainNode {
                name: (*name).into(),
                ip_address: "127.0.0.1".into(),
                clique_id: "c.1".into(),
                index: Some(*index),
                status: CrdPhase::Ready,
            })
            .collect(),
        ready_nodes: listed.len() as u32,
        total_nodes: listed.len() as u32,
        conditions: Vec::new(),
        observed_generation: None,
        channel: None,
    }
}

#[cfg(test)]
mod tests {

    use super::*;

    fn names(nodes: &[&str]) -> Vec<String> {
        nodes.iter().map(|n| (*n).to_owned()).collect()
    }

    fn pairs(peers: &[(Slot, &str)]) -> PeerPairs {
        peers.iter().map(|(s, n)| (*s, (*n).to_owned())).collect()
    }

    /// n1, n2 and n3, each seeing all three Ready, with one peer set in its domain and
    /// its IMEX daemon; n4 holds no claim and is in no peer set.
    fn agreed() -> Sighting {
        let peers = pairs(&[(0, "n1"), (1, "n2"), (2, "n3")]);
        let mut nodes: BTreeMap<String, NodeSighting> = ["n1", "n2", "n3"]
            .into_iter()
            .map(|name| {
                let domain = DomainSighting {
                    members: names(&["n3", "n1", "n2"]),
                    lost: Vec::new(),
                    phase: Phase::Ready,
                    ready: 3,
                    total: 3,
                    slots: peers.clone(),
                    peers: peers.clone(),
                };
                let node = NodeSighting {
                    out: false,
                    domain: Ok(domain),
                    imex: Ok(peers.clone()),
                    judged: true,
                };
                (name.to_owned(), node)
            })
            .collect();
        let mut outsider = NodeSighting::unseen("holds no claim");
        outsider.out = true;
        nodes.insert("n4".into(), outsider);
        Sighting {
            nodes,
            status: Some(ready_status(&[("n1", 0), ("n2", 1), ("n3", 2)])),
        }
    }

    fn asked(members: &[String]) -> Agreement<'_> {
        Agreement {
            members,
            peer_holders: members,
            ready: true,
            exact_peers: true,
            imex_as_domain: true,
        }
    }

    fn node<'a>(sighting: &'a mut Sighting, name: &str) -> &'a mut NodeSighting {
        sighting.nodes.get_mut(name).unwrap()
    }

    fn domain<'a>(sighting: &'a mut Sighting, name: &str) -> &'a mut DomainSighting {
        node(sighting, name).domain.as_mut().unwrap()
    }

    fn found(sighting: &Sighting, members: &[String]) -> Vec<String> {
        disagreements(sighting, &asked(members))
            .into_iter()
            .map(|(node, why)| format!("{node}: {why}"))
            .collect()
    }

    #[test]
    fn members_that_agree_break_nothing() {
        let sighting = agreed();
        assert!(peer_set_breaches(&sighting).is_empty());
        assert!(status_breaches(&sighting).is_empty());
        let whole = sighting.status.as_ref().unwrap();
        assert!(status_gaps(whole, &names(&["n1", "n2", "n3"])).is_empty());
        assert!(found(&sighting, &names(&["n1", "n2", "n3"])).is_empty());
    }

    #[test]
    fn a_node_given_two_slots_breaks_slots_once_however_often_it_shows() {
        let mut sighting = agreed();
        let doubled = pairs(&[(0, "n1"), (1, "n2"), (2, "n2")]);
        domain(&mut sighting, "n2").peers = doubled.clone();
        node(&mut sighting, "n2").imex = Ok(doubled);
        let breaches = peer_set_breaches(&sighting);
        assert_eq!(
            breaches,
            vec![Violation::new(
                Invariant::Slots,
                Some("n2"),
                "its peer set gives n2 slots [1, 2]"
            )]
        );
    }

    #[test]
    fn a_slot_assigned_to_two_nodes_breaks_slots() {
        let mut sighting = agreed();
        domain(&mut sighting, "n1").slots = pairs(&[(0, "n1"), (1, "n2"), (1, "n3")]);
        let breaches = peer_set_breaches(&sighting);
        assert_eq!(breaches.len(), 1, "{breaches:?}");
        assert_eq!(breaches[0].invariant, Invariant::Slots);
        assert_eq!(
            breaches[0].detail,
            r#"its peer set gives slot 1 to ["n2", "n3"]"#
        );
    }

    #[test]
    fn a_peer_held_out_or_outside_the_run_breaks_isolation_where_judged() {
        let mut sighting = agreed();
        node(&mut sighting, "n1").imex = Ok(pairs(&[(0, "n1"), (3, "n4"), (4, "10.9.9.9")]));
        let details: Vec<String> = peer_set_breaches(&sighting)
            .into_iter()
            .inspect(|v| assert_eq!(v.invariant, Invariant::Isolation))
            .map(|v| v.detail)
            .collect();
        assert_eq!(
            details,
            [
                "its peer set maps slot 3 to n4, which holds no claim of the domain",
                "its peer set maps slot 4 to 10.9.9.9, not one of the run's nodes",
            ]
        );
        // An observer still catching up is not judged; its slots still are.
        node(&mut sighting, "n1").judged = false;
        assert!(peer_set_breaches(&sighting).is_empty());
    }

    #[test]
    fn the_domain_peer_set_is_judged_for_isolation_too() {
        let mut sighting = agreed();
        domain(&mut sighting, "n2").peers = pairs(&[(1, "n2"), (3, "n4")]);
        let breaches = peer_set_breaches(&sighting);
        assert!(
            breaches.iter().any(|v| v.invariant == Invariant::Isolation
                && v.node.as_deref() == Some("n2")
                && v.detail.contains("to n4")),
            "{breaches:?}"
        );
    }

    #[test]
    fn a_member_seeing_other_members_or_a_lost_one_disagrees() {
        let members = names(&["n1", "n2", "n3"]);
        let mut sighting = agreed();
        domain(&mut sighting, "n2").members = names(&["n1", "n2"]);
        domain(&mut sighting, "n3").lost = names(&["n2"]);
        assert_eq!(
            found(&sighting, &members),
            [
                r#"n2: sees members ["n1", "n2"], not ["n1", "n2", "n3"]"#,
                r#"n3: lists ["n2"] as lost"#,
            ]
        );
    }

    #[test]
    fn a_member_not_seeing_the_domain_ready_disagrees_where_asked() {
        let members = names(&["n1", "n2", "n3"]);
        let mut sighting = agreed();
        let n1 = domain(&mut sighting, "n1");
        (n1.phase, n1.ready) = (Phase::NotReady, 2);
        assert_eq!(
            found(&sighting, &members),
            ["n1: sees the domain NotReady (2/3 ready)"]
        );
        let lenient = Agreement {
            ready: false,
            ..asked(&members)
        };
        assert!(disagreements(&sighting, &lenient).is_empty());
    }

    #[test]
    fn a_member_the_run_cannot_see_disagrees_with_the_reason() {
        let members = names(&["n1", "n2", "n3"]);
        let mut sighting = agreed();
        *node(&mut sighting, "n3") = NodeSighting::unseen("no /state: refused");
        let found = found(&sighting, &members);
        assert_eq!(found, ["n3: no /state: refused", "n3: no /state: refused"]);
    }

    #[test]
    fn peer_sets_that_differ_or_miss_a_holder_disagree() {
        let members = names(&["n1", "n2", "n3"]);
        let mut sighting = agreed();
        let short = pairs(&[(0, "n1"), (1, "n2")]);
        domain(&mut sighting, "n3").peers = short.clone();
        node(&mut sighting, "n3").imex = Ok(short);
        let found = found(&sighting, &members);
        assert_eq!(found.len(), 2, "{found:?}");
        assert!(found[0].starts_with(r#"n3: its peer set holds ["n1", "n2"], not"#));
        assert!(
            found[1].starts_with("n3: its peer set [(0, \"n1\"), (1, \"n2\")] differs from n1's")
        );
        let loose = Agreement {
            exact_peers: false,
            ..asked(&members)
        };
        assert_eq!(disagreements(&sighting, &loose).len(), 1);
    }

    #[test]
    fn an_imex_daemon_off_its_domain_peer_set_or_down_disagrees() {
        let members = names(&["n1", "n2", "n3"]);
        let mut sighting = agreed();
        node(&mut sighting, "n1").imex = Ok(pairs(&[(0, "n1")]));
        node(&mut sighting, "n2").imex = Err("runs no IMEX daemon".into());
        let found = found(&sighting, &members);
        assert!(
            found
                .iter()
                .any(|f| f.starts_with("n1: its IMEX daemon runs with [(0, \"n1\")]")),
            "{found:?}"
        );
        assert!(
            found.contains(&"n2: runs no IMEX daemon".to_owned()),
            "{found:?}"
        );
        let unasked = Agreement {
            imex_as_domain: false,
            exact_peers: false,
            ..asked(&members)
        };
        // Without the domain's peer set to hold it to, n1 still differs from n3.
        let left: Vec<String> = disagreements(&sighting, &unasked)
            .into_iter()
            .map(|(node, why)| format!("{node}: {why}"))
            .collect();
        assert_eq!(left.len(), 2, "{left:?}");
        assert!(left[1].starts_with("n3: its peer set"), "{left:?}");
    }

    #[test]
    fn a_status_listing_a_stranger_or_an_index_twice_is_a_breach() {
        let mut sighting = agreed();
        sighting.status = Some(ready_status(&[("n1", 0), ("n2", 0), ("stranger", 2)]));
        let breaches = status_breaches(&sighting);
        assert_eq!(
            breaches,
            [
                Violation::new(
                    Invariant::Status,
                    Some("stranger"),
                    "listed in the domain's status, not one of the run's nodes"
                ),
                Violation::new(
                    Invariant::Slots,
                    None,
                    r#"the status gives index 0 to ["n1", "n2"]"#
                ),
            ]
        );
        sighting.status = None;
        assert!(status_breaches(&sighting).is_empty());
    }

    #[test]
    fn a_status_not_ready_short_of_a_member_or_listing_one_not_ready_has_gaps() {
        let members = names(&["n1", "n2", "n3"]);
        let mut short = ready_status(&[("n1", 0), ("n2", 1)]);
        short.status = CrdPhase::NotReady;
        short.nodes[1].status = CrdPhase::NotReady;
        let gaps: Vec<String> = status_gaps(&short, &members)
            .iter()
            .map(ToString::to_string)
            .collect();
        assert_eq!(
            gaps,
            [
                "status is NotReady",
                "2/2 nodes ready, not 3/3",
                r#"lists ["n1", "n2"], not ["n1", "n2", "n3"]"#,
                "n2 is NotReady",
            ]
        );
    }
}
