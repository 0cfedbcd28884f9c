//! A domain's roster as one node keeps it between recomputes: its members, the members
//! it lost and still lists, the members dropped from the IMEX peer set, the members a
//! written status listed that nobody here saw leave (adopted, see
//! [`crate::rules::takeover`]), and which ImexPeer tenure speaks for each remote member.
//!
//! Each recompute hands the roster the gossip view, and the roster says what changed:
//! - a member gone from the view but alive in gossip **left** (its last claim went): it
//!   is forgotten at once, no grace, never listed lost;
//! - a member gone from gossip altogether is **lost**: it stays listed, and keeps its
//!   slot and, until its ImexPeer drops it, its place in IMEX. So is a member whose
//!   daemon restarted (a newer gossip generation) and has not advertised again yet:
//!   the restart is no departure;
//! - a lost member whose IMEX outlives its daemon is **held** until its ImexPeer drops
//!   it: it counts as a member as it last advertised (Ready if it was), since the job's
//!   imports through it still work (`rules::peer_health`). Other lost members are
//!   listed NotReady and degrade the domain;
//! - a lost member advertising again is **back** (a held one once it says it is ready,
//!   or the rejoin grace is over: its new daemon catches up first); one alive in gossip without
//!   advertising for the rejoin grace has **left** (its restarted daemon has no claim
//!   of the domain any more);
//! - a lost member that is not back within the retention, and is not held, is
//!   **forgotten**; an adopted one likewise, or as soon as it shows up.
//!
//! **Tenures.** A remote member's ImexPeer has a tenure: opened when the member is first
//! seen, closed when it leaves or is forgotten. A lost member that comes back keeps its
//! tenure (its ImexPeer re-admits it); a member that left and comes back gets a new one.
//! The old ImexPeer lives on until its grace timer fires, and its verdict is about a
//! membership that is over: only the current tenure's verdict counts (the chaos harness
//! found a rejoined member dropped 30 s later by its old link grace). Tenures are never
//! reused, not even after [`Roster::clear`], because ImexPeers outlive a restart too.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{Advertisement, DomainMember, NodeId};
use crate::rules::peer_health::{Cause, Verdict};
use crate::rules::readiness::{Readiness, domain_readiness};
use crate::rules::slots::{SlotAssignment, SlotCandidate};
use crate::rules::status::{DomainStatus, NodeStatus, status_document, with_adopted};

/// Which ImexPeer speaks for a remote member: see the module documentation.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Tenure(u64);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LostMember {
    /// As last advertised: the status lists it, and it keeps its slot, from this.
    pub member: DomainMember,
    pub since: Instant,
    /// Since when gossip knows it alive again without its advertisement.
    pub alive_since: Option<Instant>,
}

/// How long the roster waits on members that went missing.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Graces {
    /// A lost member not back (and not held) this long is forgotten.
    pub retention: Duration,
    /// A lost member alive in gossip without advertising this long has left: a
    /// restarted daemon advertises its domains once it has read its checkpoint.
    pub rejoin: Duration,
}

/// A node the written status listed that nobody here saw leave.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Adopted {
    pub row: NodeStatus,
    pub since: Instant,
}

/// What one observation changed, in the order it was found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Change {
    /// Alive in gossip without advertising the domain: it left.
    Left(NodeId),
    /// Gone from gossip: it died. Its ImexPeer hears it (`tenure`).
    Lost { node: NodeId, tenure: Tenure },
    /// A lost member advertises the domain again.
    Back(NodeId),
    /// A lost member not back within the retention.
    Forgotten(NodeId),
    /// An adopted node showed up as a member, or its retention ran out.
    AdoptionEnded(NodeId),
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observation {
    pub changes: Vec<Change>,
    /// The members' names differ from the previous observation's.
    pub members_changed: bool,
}

/// What became of an ImexPeer's verdict.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum VerdictOutcome {
    /// From a tenure that is over: nothing changed.
    Retired,
    Dropped(Cause),
    Readmitted,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Roster {
    members: BTreeMap<NodeId, DomainMember>,
    lost: BTreeMap<NodeId, LostMember>,
    dropped: BTreeSet<NodeId>,
    adopted: BTreeMap<NodeId, Adopted>,
    /// Every node seen as a member since the last clear: their leaving or death was
    /// witnessed here, not just absent from a view still filling up.
    witnessed: BTreeSet<NodeId>,
    tenures: BTreeMap<NodeId, Tenure>,
    next_tenure: u64,
}

impl Roster {
    /// The live members, this node included.
    pub fn members(&self) -> &BTreeMap<NodeId, DomainMember> {
        &self.members
    }

    pub fn lost(&self) -> &BTreeMap<NodeId, LostMember> {
        &self.lost
    }

    /// Members dropped from the IMEX peer set by their ImexPeer's verdict.
    pub fn dropped(&self) -> &BTreeSet<NodeId> {
        &self.dropped
    }

    pub fn witnessed(&self) -> &BTreeSet<NodeId> {
        &self.witnessed
    }

    pub fn adopted(&self) -> &BTreeMap<NodeId, Adopted> {
        &self.adopted
    }

    pub fn admitted(&self, node: &str) -> bool {
        !self.dropped.contains(node)
    }

    pub fn tenure(&self, node: &str) -> Option<Tenure> {
        self.tenures.get(node).copied()
    }

    /// The current tenure of `node`'s ImexPeer, opening one if it has none.
    pub fn peer(&mut self, node: &str) -> Tenure {
        if let Some(tenure) = self.tenures.get(node) {
            return *tenure;
        }
        let tenure = Tenure(self.next_tenure);
        self.next_tenure += 1;
        self.tenures.insert(node.to_owned(), tenure);
        tenure
    }

    /// Takes the domain's members in gossip (`view`, this node's own entry replaced by
    /// `own`, which is always a member) and says what changed. `generation`: the
    /// generation gossip knows a node alive with, with or without the domain's key.
    pub fn observe(
        &mut self,
        own: DomainMember,
        mut view: BTreeMap<NodeId, DomainMember>,
        generation: impl Fn(&str) -> Option<u64>,
        now: Instant,
        graces: Graces,
    ) -> Observation {
        let me = own.node.clone();
        view.insert(me.clone(), own);
        let mut changes = Vec::new();

        let departed: Vec<(NodeId, DomainMember)> = self
            .members
            .iter()
            .filter(|(node, _)| !view.contains_key(*node))
            .map(|(node, member)| (node.clone(), member.clone()))
            .collect();
        for (node, member) in departed {
            match generation(&node) {
                Some(alive) if alive == member.generation => {
                    self.tenures.remove(&node);
                    self.dropped.remove(&node);
                    changes.push(Change::Left(node));
                }
                restarted => {
                    let tenure = self.peer(&node);
                    let alive_since = restarted.map(|_| now);
                    self.lost.insert(
                        node.clone(),
                        LostMember {
                            member,
                            since: now,
                            alive_since,
                        },
                    );
                    changes.push(Change::Lost { node, tenure });
                }
            }
        }
        // A held member whose daemon restarted advertises again before its new daemon
        // has caught up (its gossip view fills in, its IMEX is adopted): not ready yet,
        // though its IMEX never stopped. Taken back only once it says ready, or the
        // rejoin grace is over: a restart of a daemon shows in no readiness.
        let catching_up: Vec<NodeId> = view
            .iter()
            .filter(|(node, member)| {
                self.lost.get(*node).is_some_and(|lost| {
                    self.is_held(node, lost)
                        && member.generation != lost.member.generation
                        && !member.ad.imex_ready
                        && now.duration_since(lost.alive_since.unwrap_or(now)) < graces.rejoin
                })
            })
            .map(|(node, _)| node.clone())
            .collect();
        for node in &catching_up {
            view.remove(node);
        }
        for node in view.keys().filter(|node| **node != me) {
            if self.lost.remove(node).is_some() {
                changes.push(Change::Back(node.clone()));
            }
            self.peer(node);
        }
        for (node, lost) in &mut self.lost {
            lost.alive_since = match generation(node) {
                Some(_) => Some(lost.alive_since.unwrap_or(now)),
                None => None,
            };
        }
        let rejoined_elsewhere: Vec<NodeId> = self
            .lost
            .iter()
            .filter(|(_, lost)| {
                lost.alive_since
                    .is_some_and(|since| now.duration_since(since) >= graces.rejoin)
            })
            .map(|(node, _)| node.clone())
            .collect();
        for node in rejoined_elsewhere {
            self.lost.remove(&node);
            self.tenures.remove(&node);
            self.dropped.remove(&node);
            changes.push(Change::Left(node));
        }
        let forgotten: Vec<NodeId> = self
            .lost
            .iter()
            .filter(|(node, lost)| {
                now.duration_since(lost.since) >= graces.retention && !self.is_held(node, lost)
            })
            .map(|(node, _)| node.clone())
            .collect();
        for node in forgotten {
            self.lost.remove(&node);
            self.tenures.remove(&node);
            self.dropped.remove(&node);
            changes.push(Change::Forgotten(node));
        }
        self.witnessed.extend(view.keys().cloned());
        self.adopted.retain(|node, adopted| {
            let keep =
                !view.contains_key(node) && now.duration_since(adopted.since) < graces.retention;
            if !keep {
                changes.push(Change::AdoptionEnded(node.clone()));
            }
            keep
        });

        let members_changed = !self.members.keys().eq(view.keys());
        self.members = view;
        Observation {
            changes,
            members_changed,
        }
    }

    fn is_held(&self, node: &str, lost: &LostMember) -> bool {
        lost.member.ad.imex_outlives_daemon && !self.dropped.contains(node)
    }

    /// Lost members held: their IMEX outlives their daemon, and their ImexPeer has
    /// not dropped them.
    pub fn held(&self) -> impl Iterator<Item = &NodeId> {
        self.lost
            .iter()
            .filter(|(node, lost)| self.is_held(node, lost))
            .map(|(node, _)| node)
    }

    /// The lost members listed NotReady: all but the held ones.
    pub fn unheld_lost(&self) -> impl Iterator<Item = &NodeId> {
        self.lost
            .iter()
            .filter(|(node, lost)| !self.is_held(node, lost))
            .map(|(node, _)| node)
    }

    /// The members as readiness and the status count them: the live ones and the
    /// held ones; and the lost ones that are not held.
    fn counted(
        &self,
    ) -> (
        BTreeMap<NodeId, DomainMember>,
        BTreeMap<NodeId, Advertisement>,
    ) {
        let mut members = self.members.clone();
        let mut lost = BTreeMap::new();
        for (node, missing) in &self.lost {
            if self.is_held(node, missing) {
                members.insert(node.clone(), missing.member.clone());
            } else {
                lost.insert(node.clone(), missing.member.ad.clone());
            }
        }
        (members, lost)
    }

    /// This node's advertisement changed after the observation (its slot, its IMEX
    /// readiness): the roster lists what it will publish.
    pub fn update_own(&mut self, me: &str, ad: Advertisement) {
        if let Some(own) = self.members.get_mut(me) {
            own.ad = ad;
        }
    }

    /// An ImexPeer's verdict; it changes only who is dropped, and only if `tenure` is
    /// the node's current one.
    pub fn verdict(&mut self, node: &str, tenure: Tenure, verdict: Verdict) -> VerdictOutcome {
        if self.tenures.get(node) != Some(&tenure) {
            return VerdictOutcome::Retired;
        }
        match verdict {
            Verdict::Drop(cause) => {
                self.dropped.insert(node.to_owned());
                VerdictOutcome::Dropped(cause)
            }
            Verdict::Readmit => {
                self.dropped.remove(node);
                VerdictOutcome::Readmitted
            }
        }
    }

    /// Lists `rows` lost from `now` on (the takeover's adoptions).
    pub fn adopt(&mut self, rows: Vec<NodeStatus>, now: Instant) {
        for row in rows {
            self.adopted
                .insert(row.name.clone(), Adopted { row, since: now });
        }
    }

    /// When the next lost or adopted node is due to be forgotten, or a lost one alive
    /// again without advertising is due to have left.
    pub fn next_expiry(&self, graces: Graces) -> Option<Instant> {
        let rejoins = self
            .lost
            .values()
            .filter_map(|lost| lost.alive_since)
            .map(|since| since + graces.rejoin);
        self.lost
            .iter()
            .filter(|(node, lost)| !self.is_held(node, lost))
            .map(|(_, lost)| lost.since)
            .chain(self.adopted.values().map(|adopted| adopted.since))
            .map(|since| since + graces.retention)
            .chain(rejoins)
            .min()
    }

    /// Who takes part in slots and the IMEX peer set: the members, and the lost ones
    /// not dropped yet (within their grace they keep their slot and their IMEX place).
    pub fn imex_members(&self) -> BTreeMap<NodeId, DomainMember> {
        let mut members = self.members.clone();
        for (node, lost) in &self.lost {
            if !self.dropped.contains(node) {
                members.insert(node.clone(), lost.member.clone());
            }
        }
        members
    }

    /// The domain's readiness, as prepares wait on it: adopted nodes are not counted,
    /// as nothing says they were ever part of this IMEX domain.
    pub fn readiness(&self, assignment: &SlotAssignment, num_nodes: u32) -> Readiness {
        let (members, lost) = self.counted();
        let lost: BTreeSet<NodeId> = lost.into_keys().collect();
        domain_readiness(
            &members,
            assignment,
            |node: &str| self.admitted(node),
            &lost,
            num_nodes,
        )
    }

    /// The status document: `readiness` is [`Roster::readiness`]'s; adopted nodes count
    /// as lost in the status (listed NotReady, the domain degraded).
    pub fn status_document(
        &self,
        assignment: &SlotAssignment,
        readiness: &Readiness,
        num_nodes: u32,
    ) -> DomainStatus {
        let (members, lost_ads) = self.counted();
        if self.adopted.is_empty() {
            return status_document(&members, &lost_ads, assignment, readiness);
        }
        let lost_names: BTreeSet<NodeId> = lost_ads
            .keys()
            .chain(self.adopted.keys())
            .cloned()
            .collect();
        let with_lost = domain_readiness(
            &members,
            assignment,
            |node: &str| self.admitted(node),
            &lost_names,
            num_nodes,
        );
        let rows: Vec<NodeStatus> = self.adopted.values().map(|a| a.row.clone()).collect();
        with_adopted(
            status_document(&members, &lost_ads, assignment, &with_lost),
            &rows,
        )
    }

    /// Forgets everything, as on a restart of the domain, but not which tenures were
    /// handed out: the ImexPeers of before may still speak.
    pub fn clear(&mut self) {
        *self = Self {
            next_tenure: self.next_tenure,
            ..Self::default()
        };
    }
}

/// The slot assignment's view of `members`.
pub fn slot_candidates(members: &BTreeMap<NodeId, DomainMember>) -> Vec<SlotCandidate> {
    members
        .values()
        .map(|member| SlotCandidate {
            node: member.node.clone(),
            joined_at_ms: member.ad.joined_at_ms,
            preferred: member.ad.slot,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{Phase, Slot};
    use crate::rules::fixtures::{self, advertisement};
    use crate::rules::readiness::NotReadyReason;
    use proptest::prelude::*;

    const RETENTION: Duration = Duration::from_secs(600);
    const REJOIN: Duration = Duration::from_secs(10);
    const GRACES: Graces = Graces {
        retention: RETENTION,
        rejoin: REJOIN,
    };
    const ME: &str = "me";

    fn member(node: &str, slot: Option<Slot>, generation: u64) -> DomainMember {
        let ad = Advertisement {
            slot,
            imex_ready: true,
            ..advertisement()
        };
        DomainMember {
            generation,
            ..fixtures::member(node, ad)
        }
    }

    fn view(nodes: &[&str]) -> BTreeMap<NodeId, DomainMember> {
        nodes
            .iter()
            .enumerate()
            .map(|(i, n)| ((*n).to_owned(), member(n, Some(i as Slot + 1), 1)))
            .collect()
    }

    fn observe(roster: &mut Roster, nodes: &[&str], alive: &[&str], now: Instant) -> Observation {
        let alive: BTreeSet<NodeId> = alive.iter().map(|n| (*n).to_owned()).collect();
        roster.observe(
            member(ME, Some(0), 1),
            view(nodes),
            |n: &str| (n == ME || alive.contains(n)).then_some(1),
            now,
            GRACES,
        )
    }

    fn row(name: &str) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            ip_address: "10.0.0.9".into(),
            clique_id: "c.0".into(),
            index: Some(9),
            status: Phase::Ready,
        }
    }

    fn lost(node: &str, tenure: Tenure) -> Change {
        Change::Lost {
            node: node.into(),
            tenure,
        }
    }

    #[test]
    fn a_member_alive_without_the_key_left_and_one_gone_from_gossip_is_lost() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        let first = observe(&mut roster, &["a", "b"], &["a", "b"], t0);
        assert!(first.members_changed);
        assert!(first.changes.is_empty());
        let b = roster.tenure("b").unwrap();
        assert_eq!(roster.tenure(ME), None, "this node has no ImexPeer");

        // a is still in gossip without the key; b is gone from gossip.
        let next = observe(&mut roster, &[], &["a"], t0);
        assert_eq!(next.changes, vec![Change::Left("a".into()), lost("b", b)]);
        assert!(next.members_changed);
        assert_eq!(roster.members().keys().collect::<Vec<_>>(), vec![ME]);
        assert_eq!(roster.lost().keys().collect::<Vec<_>>(), vec!["b"]);
        assert_eq!(roster.tenure("a"), None, "a left: its ImexPeer is retired");
        assert_eq!(roster.tenure("b"), Some(b), "b's ImexPeer hears it died");
        assert!(!observe(&mut roster, &[], &["a"], t0).members_changed);
    }

    #[test]
    fn a_lost_member_keeps_its_slot_and_is_listed_until_the_retention() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        observe(&mut roster, &["a", "b"], &["a", "b"], t0);
        observe(&mut roster, &["a"], &["a"], t0);
        assert_eq!(roster.next_expiry(GRACES), Some(t0 + RETENTION));
        let imex = roster.imex_members();
        assert_eq!(imex.keys().collect::<Vec<_>>(), vec!["a", "b", ME]);
        assert_eq!(imex["b"].ad.slot, Some(2), "b keeps the slot it advertised");
        let assignment = crate::rules::slots::assign_slots(&slot_candidates(&imex), 18);
        let readiness = roster.readiness(&assignment, 0);
        assert_eq!(
            readiness.reason,
            Some(NotReadyReason::Degraded {
                lost: vec!["b".into()]
            })
        );
        let document = roster.status_document(&assignment, &readiness, 0);
        let b = document.nodes.iter().find(|n| n.name == "b").unwrap();
        assert_eq!((b.index, b.status), (Some(2), Phase::NotReady));

        // Dropped by its ImexPeer, it leaves IMEX but stays listed.
        let tenure = roster.tenure("b").unwrap();
        roster.verdict("b", tenure, Verdict::Drop(Cause::GossipDead));
        assert!(!roster.imex_members().contains_key("b"));
        assert!(roster.lost().contains_key("b"));

        let almost = t0 + RETENTION - Duration::from_millis(1);
        assert!(
            observe(&mut roster, &["a"], &["a"], almost)
                .changes
                .is_empty()
        );
        let changes = observe(&mut roster, &["a"], &["a"], t0 + RETENTION).changes;
        assert_eq!(changes, vec![Change::Forgotten("b".into())]);
        assert!(roster.lost().is_empty() && roster.dropped().is_empty());
        assert_eq!(roster.tenure("b"), None);
        assert_eq!(roster.next_expiry(GRACES), None);
    }

    /// A daemon restarted (a newer generation) and has not advertised yet: lost, not
    /// left, so that nothing is reconfigured for a restart; if it does not advertise
    /// within the rejoin grace, its claims are gone and it left.
    #[test]
    fn a_restarted_member_is_lost_until_it_advertises_or_the_rejoin_grace_ends() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        observe(&mut roster, &["a", "b"], &["a", "b"], t0);
        let b = roster.tenure("b").unwrap();
        let restarted = |n: &str| match n {
            "b" => Some(2),
            _ => Some(1),
        };
        let changes = roster
            .observe(member(ME, Some(0), 1), view(&["a"]), restarted, t0, GRACES)
            .changes;
        assert_eq!(changes, vec![lost("b", b)]);
        assert_eq!(roster.lost()["b"].alive_since, Some(t0));
        assert_eq!(roster.next_expiry(GRACES), Some(t0 + REJOIN));
        // Back, advertising with its new generation: the same tenure.
        let mut back = view(&["a", "b"]);
        back.get_mut("b").unwrap().generation = 2;
        let changes = roster
            .observe(
                member(ME, Some(0), 1),
                back,
                restarted,
                t0 + REJOIN / 2,
                GRACES,
            )
            .changes;
        assert_eq!(changes, vec![Change::Back("b".into())]);
        assert_eq!(roster.tenure("b"), Some(b));

        // Restarted again, and never advertises: it left once the grace is over.
        let restarted_again = |n: &str| match n {
            "b" => Some(3),
            _ => Some(1),
        };
        let t1 = t0 + REJOIN;
        roster.observe(
            member(ME, Some(0), 1),
            view(&["a"]),
            restarted_again,
            t1,
            GRACES,
        );
        let almost = t1 + REJOIN - Duration::from_millis(1);
        let changes = roster
            .observe(
                member(ME, Some(0), 1),
                view(&["a"]),
                restarted_again,
                almost,
                GRACES,
            )
            .changes;
        assert!(changes.is_empty(), "{changes:?}");
        let changes = roster
            .observe(
                member(ME, Some(0), 1),
                view(&["a"]),
                restarted_again,
                t1 + REJOIN,
                GRACES,
            )
            .changes;
        assert_eq!(changes, vec![Change::Left("b".into())]);
        assert!(roster.lost().is_empty());
        assert_eq!(roster.tenure("b"), None);
    }

    /// A lost member whose IMEX outlives its daemon counts as a member, as it last
    /// advertised, until its ImexPeer drops it; it is not forgotten while held.
    #[test]
    fn a_held_member_keeps_the_domain_ready_until_it_is_dropped() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        let mut nodes = view(&["a", "b"]);
        for member in nodes.values_mut() {
            member.ad.imex_outlives_daemon = true;
        }
        let alive = |n: &str| (n != "b").then_some(1);
        roster.observe(member(ME, Some(0), 1), nodes.clone(), alive, t0, GRACES);
        nodes.remove("b");
        roster.observe(member(ME, Some(0), 1), nodes.clone(), alive, t0, GRACES);
        assert!(roster.lost().contains_key("b"));
        assert_eq!(roster.held().count(), 1);
        let assignment =
            crate::rules::slots::assign_slots(&slot_candidates(&roster.imex_members()), 18);
        let readiness = roster.readiness(&assignment, 0);
        assert!(readiness.is_ready(), "{readiness}");
        assert_eq!(readiness.total, 3);
        let document = roster.status_document(&assignment, &readiness, 0);
        let b = document.nodes.iter().find(|n| n.name == "b").unwrap();
        assert_eq!((b.index, b.status), (Some(2), Phase::Ready));
        assert_eq!(roster.next_expiry(GRACES), None, "held: never forgotten");
        let later = t0 + RETENTION * 2;
        let changes = roster
            .observe(member(ME, Some(0), 1), nodes.clone(), alive, later, GRACES)
            .changes;
        assert!(changes.is_empty(), "{changes:?}");

        // Its IMEX stopped answering: dropped, then the domain is degraded.
        let tenure = roster.tenure("b").unwrap();
        roster.verdict("b", tenure, Verdict::Drop(Cause::GossipDead));
        assert_eq!(roster.held().count(), 0);
        let readiness = roster.readiness(&assignment, 0);
        assert_eq!(
            readiness.reason,
            Some(NotReadyReason::Degraded {
                lost: vec!["b".into()]
            })
        );
        let changes = roster
            .observe(member(ME, Some(0), 1), nodes, alive, later, GRACES)
            .changes;
        assert_eq!(changes, vec![Change::Forgotten("b".into())]);
    }

    /// A held member's restarted daemon advertises not-ready while it catches up: it
    /// stays held (Ready as it last advertised) until it says ready, or until the
    /// rejoin grace is over, when it is back as it is.
    #[test]
    fn a_held_member_catching_up_after_a_restart_stays_held_until_it_says_ready() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        let mut nodes = view(&["a", "b"]);
        for member in nodes.values_mut() {
            member.ad.imex_outlives_daemon = true;
        }
        let alive = |generation: u64| move |n: &str| Some(if n == "b" { generation } else { 1 });
        roster.observe(member(ME, Some(0), 1), nodes.clone(), alive(1), t0, GRACES);
        let mut without_b = nodes.clone();
        without_b.remove("b");
        roster.observe(
            member(ME, Some(0), 1),
            without_b,
            |n: &str| (n != "b").then_some(1),
            t0,
            GRACES,
        );
        assert_eq!(roster.held().count(), 1);

        let mut catching_up = nodes.clone();
        let b = catching_up.get_mut("b").unwrap();
        b.generation = 2;
        b.ad.imex_ready = false;
        let t1 = t0 + Duration::from_secs(3);
        let changes = roster
            .observe(
                member(ME, Some(0), 1),
                catching_up.clone(),
                alive(2),
                t1,
                GRACES,
            )
            .changes;
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(roster.held().collect::<Vec<_>>(), vec!["b"]);
        assert!(!roster.members().contains_key("b"));
        let assignment =
            crate::rules::slots::assign_slots(&slot_candidates(&roster.imex_members()), 18);
        assert!(roster.readiness(&assignment, 0).is_ready());

        let mut ready = catching_up.clone();
        ready.get_mut("b").unwrap().ad.imex_ready = true;
        let changes = roster
            .observe(
                member(ME, Some(0), 1),
                ready,
                alive(2),
                t1 + Duration::from_millis(300),
                GRACES,
            )
            .changes;
        assert_eq!(changes, vec![Change::Back("b".into())]);
        assert_eq!(roster.members()["b"].generation, 2);

        // Another restart that never gets ready: back as it is once the grace is over.
        let mut without_b = nodes.clone();
        without_b.remove("b");
        let t2 = t1 + Duration::from_secs(1);
        roster.observe(
            member(ME, Some(0), 1),
            without_b,
            |n: &str| (n != "b").then_some(1),
            t2,
            GRACES,
        );
        let mut stuck = catching_up;
        stuck.get_mut("b").unwrap().generation = 3;
        let changes = roster
            .observe(member(ME, Some(0), 1), stuck.clone(), alive(3), t2, GRACES)
            .changes;
        assert!(changes.is_empty(), "{changes:?}");
        assert_eq!(roster.next_expiry(GRACES), Some(t2 + REJOIN));
        let changes = roster
            .observe(member(ME, Some(0), 1), stuck, alive(3), t2 + REJOIN, GRACES)
            .changes;
        assert_eq!(changes, vec![Change::Back("b".into())]);
        assert!(!roster.readiness(&assignment, 0).is_ready());
    }

    /// The bug the chaos harness found: a member that left and rejoined was dropped
    /// 30 s later by the link grace its old ImexPeer had started.
    #[test]
    fn only_the_current_tenure_speaks_for_a_member() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        observe(&mut roster, &["a"], &["a"], t0);
        let first = roster.tenure("a").unwrap();
        observe(&mut roster, &[], &["a"], t0);
        observe(&mut roster, &["a"], &["a"], t0);
        let second = roster.tenure("a").unwrap();
        assert_ne!(first, second, "a member that left and came back");

        let before = roster.clone();
        assert_eq!(
            roster.verdict("a", first, Verdict::Drop(Cause::ImexLinkDown)),
            VerdictOutcome::Retired
        );
        assert_eq!(roster, before);
        assert_eq!(
            roster.verdict("a", second, Verdict::Drop(Cause::ImexLinkDown)),
            VerdictOutcome::Dropped(Cause::ImexLinkDown)
        );
        assert!(!roster.admitted("a"));
        assert_eq!(
            roster.verdict("a", second, Verdict::Readmit),
            VerdictOutcome::Readmitted
        );
        assert!(roster.admitted("a"));

        // A lost member that comes back keeps its ImexPeer: it is the one to re-admit it.
        observe(&mut roster, &[], &[], t0);
        let changes = observe(&mut roster, &["a"], &["a"], t0).changes;
        assert_eq!(changes, vec![Change::Back("a".into())]);
        assert_eq!(roster.tenure("a"), Some(second));
    }

    #[test]
    fn tenures_are_not_reused_after_a_restart() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        observe(&mut roster, &["a"], &["a"], t0);
        let before_restart = roster.tenure("a").unwrap();
        roster.clear();
        assert!(roster.members().is_empty() && roster.witnessed().is_empty());
        observe(&mut roster, &["a"], &["a"], t0);
        assert_ne!(roster.tenure("a"), Some(before_restart));
        assert_eq!(
            roster.verdict("a", before_restart, Verdict::Drop(Cause::GossipDead)),
            VerdictOutcome::Retired
        );
    }

    #[test]
    fn adopted_nodes_are_listed_lost_until_they_show_up_or_are_forgotten() {
        let t0 = Instant::now();
        let mut roster = Roster::default();
        observe(&mut roster, &["a"], &["a"], t0);
        roster.adopt(vec![row("c"), row("d")], t0);
        assert_eq!(roster.next_expiry(GRACES), Some(t0 + RETENTION));

        let assignment =
            crate::rules::slots::assign_slots(&slot_candidates(&roster.imex_members()), 18);
        // Prepares do not wait on them: nothing says they were ever in this IMEX domain.
        let readiness = roster.readiness(&assignment, 0);
        assert!(readiness.is_ready(), "{readiness}");
        let document = roster.status_document(&assignment, &readiness, 0);
        assert_eq!(document.status, Phase::NotReady);
        assert_eq!(document.message, "2/4 nodes ready, lost: c, d");
        let c = document.nodes.iter().find(|n| n.name == "c").unwrap();
        assert_eq!((c.index, c.status), (Some(9), Phase::NotReady));

        let changes = observe(&mut roster, &["a", "c"], &["a", "c"], t0).changes;
        assert_eq!(changes, vec![Change::AdoptionEnded("c".into())]);
        let changes = observe(&mut roster, &["a", "c"], &["a", "c"], t0 + RETENTION).changes;
        assert_eq!(changes, vec![Change::AdoptionEnded("d".into())]);
        assert!(roster.adopted().is_empty());
    }

    /// One step of the domain's life, as the actor feeds the roster.
    #[derive(Debug, Clone)]
    enum Op {
        /// The remote nodes advertising the domain (a mask over `NODES`), those gone
        /// from gossip among the rest, a new advertisement seed, and time passing.
        Observe {
            present: u8,
            dead: u8,
            generation: u64,
            after_ms: u64,
        },
        /// A verdict about `node` from one of the tenures it ever had (`pick`).
        Verdict {
            node: usize,
            pick: usize,
            drop: bool,
        },
        /// The takeover adopts `node` (if nobody here saw it as a member).
        Adopt { node: usize },
        /// The domain actor restarts.
        Clear,
    }

    const NODES: [&str; 5] = ["a", "b", "c", "d", "e"];
    /// Short, so that ops reach it.
    const SHORT_RETENTION: Duration = Duration::from_secs(10);
    const SHORT: Graces = Graces {
        retention: SHORT_RETENTION,
        rejoin: Duration::from_secs(3),
    };

    fn op() -> impl Strategy<Value = Op> {
        prop_oneof![
            // Half-second steps: some land exactly on the end of a retention.
            6 => (any::<u8>(), any::<u8>(), 1u64..4, (0u64..8).prop_map(|n| n * 500)).prop_map(
                |(present, dead, generation, after_ms)| Op::Observe { present, dead, generation, after_ms }
            ),
            3 => (0..NODES.len(), any::<usize>(), any::<bool>())
                .prop_map(|(node, pick, drop)| Op::Verdict { node, pick, drop }),
            1 => (0..NODES.len()).prop_map(|node| Op::Adopt { node }),
            1 => Just(Op::Clear),
        ]
    }

    fn in_mask(mask: u8, i: usize) -> bool {
        mask & (1 << i) != 0
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        /// Runs random histories and checks, after every step:
        /// (a) a node whose advertisement is in the view is a member: never lost,
        ///     forgotten, left or adopted, whatever came before;
        /// (b) a verdict from a tenure that is over changes nothing, and a current one
        ///     changes only who is dropped;
        /// and what the actor relies on: the departed are classified by gossip's
        /// liveness, a lost member is kept for exactly the retention, tenures are
        /// never handed out twice, this node is always a member, and the dropped,
        /// lost, adopted and member sets fit together.
        #[test]
        fn roster_histories_keep_their_invariants(ops in proptest::collection::vec(op(), 1..80)) {
            let mut roster = Roster::default();
            let mut now = Instant::now();
            // Every tenure handed out, to whom; and those over.
            let mut issued: BTreeMap<Tenure, NodeId> = BTreeMap::new();
            let mut over: BTreeSet<Tenure> = BTreeSet::new();
            for op in ops {
                match op {
                    Op::Observe { present, dead, generation, after_ms } => {
                        now += Duration::from_millis(after_ms);
                        let fresh: BTreeMap<NodeId, DomainMember> = NODES
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| in_mask(present, *i))
                            .map(|(i, n)| ((*n).to_owned(), member(n, Some(i as Slot + 1), generation)))
                            .collect();
                        let alive: BTreeSet<NodeId> = NODES
                            .iter()
                            .enumerate()
                            .filter(|(i, _)| in_mask(present, *i) || !in_mask(dead, *i))
                            .map(|(_, n)| (*n).to_owned())
                            .collect();
                        let before = roster.clone();
                        let observation = roster.observe(
                            member(ME, Some(0), 1),
                            fresh.clone(),
                            // Alive nodes keep the generation they had: none restarts.
                            |n: &str| {
                                let had = before
                                    .members()
                                    .get(n)
                                    .or(before.lost().get(n).map(|lost| &lost.member))
                                    .map_or(generation, |m| m.generation);
                                (n == ME || alive.contains(n)).then_some(had)
                            },
                            now,
                            SHORT,
                        );

                        // (a)
                        for node in fresh.keys() {
                            prop_assert_eq!(&roster.members()[node], &fresh[node]);
                            prop_assert!(!roster.lost().contains_key(node));
                            prop_assert!(!roster.adopted().contains_key(node));
                            prop_assert!(roster.imex_members().contains_key(node));
                            prop_assert!(roster.tenure(node).is_some(), "{} has no ImexPeer", node);
                            for change in &observation.changes {
                                let named = match change {
                                    Change::Left(n) | Change::Forgotten(n) | Change::Lost { node: n, .. } => n,
                                    Change::Back(_) | Change::AdoptionEnded(_) => continue,
                                };
                                prop_assert_ne!(named, node, "{:?} of a fresh member", change);
                            }
                        }
                        prop_assert!(roster.members().contains_key(ME));
                        prop_assert_eq!(roster.members().len(), fresh.len() + 1);
                        prop_assert_eq!(
                            observation.members_changed,
                            !before.members().keys().eq(roster.members().keys())
                        );

                        // The departed: left if alive, lost if not.
                        for node in before.members().keys().filter(|n| !fresh.contains_key(*n) && *n != ME) {
                            if alive.contains(node) {
                                prop_assert!(observation.changes.contains(&Change::Left(node.clone())));
                                prop_assert!(!roster.lost().contains_key(node));
                                prop_assert_eq!(roster.tenure(node), None);
                            } else {
                                let tenure = before.tenure(node).expect("a member has a tenure");
                                prop_assert!(observation.changes.contains(&lost(node, tenure)));
                            }
                        }
                        // Kept for exactly the retention, from when it was lost, unless
                        // alive again without advertising for the rejoin grace.
                        for (node, was) in before.lost() {
                            let expired = now.duration_since(was.since) >= SHORT_RETENTION;
                            let left = alive.contains(node)
                                && was.alive_since.is_some_and(|at| now.duration_since(at) >= SHORT.rejoin);
                            match roster.lost().get(node) {
                                Some(is) => {
                                    prop_assert!(!expired && !left);
                                    prop_assert_eq!(&is.member, &was.member);
                                    prop_assert_eq!(is.since, was.since);
                                    prop_assert_eq!(is.alive_since.is_some(), alive.contains(node));
                                }
                                None => prop_assert!(
                                    expired || fresh.contains_key(node) || alive.contains(node)
                                ),
                            }
                        }
                        for (node, is) in roster.lost() {
                            prop_assert!(now.duration_since(is.since) < SHORT_RETENTION);
                            // Within its grace a lost member keeps its slot unless dropped.
                            prop_assert_eq!(
                                roster.imex_members().get(node).map(|m| m.ad.slot),
                                roster.admitted(node).then_some(is.member.ad.slot)
                            );
                        }
                        if let Some(expiry) = roster.next_expiry(SHORT) {
                            prop_assert!(expiry > now);
                        }
                    }
                    Op::Verdict { node, pick, drop } => {
                        let node = NODES[node];
                        let tenures: Vec<Tenure> = issued
                            .iter()
                            .filter(|(_, n)| n.as_str() == node)
                            .map(|(t, _)| *t)
                            .collect();
                        if tenures.is_empty() {
                            continue;
                        }
                        let tenure = tenures[pick % tenures.len()];
                        let verdict = if drop { Verdict::Drop(Cause::ImexLinkDown) } else { Verdict::Readmit };
                        let before = roster.clone();
                        let outcome = roster.verdict(node, tenure, verdict);
                        if before.tenure(node) == Some(tenure) {
                            prop_assert_ne!(outcome, VerdictOutcome::Retired);
                            prop_assert_eq!(roster.admitted(node), !drop);
                            prop_assert_eq!(roster.members(), before.members());
                            prop_assert_eq!(roster.lost(), before.lost());
                            prop_assert_eq!(roster.adopted(), before.adopted());
                        } else {
                            // (b)
                            prop_assert!(over.contains(&tenure));
                            prop_assert_eq!(outcome, VerdictOutcome::Retired);
                            prop_assert_eq!(&roster, &before);
                        }
                    }
                    Op::Adopt { node } => {
                        // As the takeover does: only nodes nobody here saw as a member.
                        let node = NODES[node];
                        if !roster.witnessed().contains(node) {
                            roster.adopt(vec![row(node)], now);
                        }
                    }
                    Op::Clear => roster.clear(),
                }

                // Tenures: never handed out twice, never current again once over.
                for node in NODES {
                    if let Some(tenure) = roster.tenure(node) {
                        prop_assert!(!over.contains(&tenure), "{:?} reused", tenure);
                        let holder = issued.entry(tenure).or_insert_with(|| node.to_owned());
                        prop_assert_eq!(holder.as_str(), node);
                    }
                }
                for (tenure, node) in &issued {
                    if roster.tenure(node) != Some(*tenure) {
                        over.insert(*tenure);
                    }
                }
                for node in roster.dropped() {
                    prop_assert!(roster.tenure(node).is_some(), "{} dropped without an ImexPeer", node);
                }
                for node in roster.lost().keys().chain(roster.adopted().keys()) {
                    prop_assert!(!roster.members().contains_key(node));
                }
            }
        }
    }
}
