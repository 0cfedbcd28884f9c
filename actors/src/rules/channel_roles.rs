//! A domain's two channel-isolation roles as state machines: the clique's shared IMEX
//! domain, which assigns every sharing domain of the clique its channel, and a sharing
//! domain, which follows that assignment. Each takes what the domain actor knows (the
//! gossip view's candidates, the roster, this node's IMEX, the time) and returns what
//! to advertise, what to tell and what to count; the actor carries it out. The rules
//! they apply are `rules::channels`'.

use std::collections::BTreeMap;
use std::time::Duration;

use tokio::time::Instant;

use crate::actors::sharing::{ChannelState, SharedFault, SharedImexProgress, new_faults};
use crate::model::{ChannelId, DomainUid, NodeId, Sharing};
use crate::rules::channels::{ChannelCandidate, assign_channels, confirmed};

/// The shared IMEX domain's memory between two passes.
#[derive(Debug, Clone, Default)]
pub struct SharedImexRole {
    /// Since when this node has assigned each domain its channel: a channel is
    /// confirmed only once it has been advertised here for the settle.
    assigned_at: BTreeMap<DomainUid, (ChannelId, Instant)>,
    /// The channels this node's pods hold (from the node).
    held_here: BTreeMap<DomainUid, ChannelId>,
    /// The progress last told to the node.
    told: Option<SharedImexProgress>,
}

/// What one pass of the shared IMEX domain knows.
#[derive(Debug, Clone)]
pub struct AssignInput<'a> {
    /// Every sharing domain of the clique, live or away (`sharing_domains`).
    pub candidates: &'a [ChannelCandidate],
    /// Channels in the range.
    pub capacity: ChannelId,
    /// The assignments the other members advertise.
    pub others: &'a [BTreeMap<DomainUid, ChannelId>],
    /// Members lost, and other members whose IMEX is failing: the shared domain's
    /// faults.
    pub lost: Vec<NodeId>,
    pub failing: Vec<NodeId>,
    /// This node's IMEX, as this pass judged it.
    pub local_ready: bool,
    pub imex_failing: bool,
    /// This node's IMEX failure episode and why, if one is going on.
    pub failure: Option<(u64, String)>,
    pub settle: Duration,
    pub now: Instant,
}

/// What a pass of the shared IMEX domain decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Assigned {
    /// To advertise.
    pub sharing: Sharing,
    /// When a channel still settling is due: a pass is wanted then.
    pub settles_at: Option<Instant>,
    /// To tell the node, when it differs from what was told last.
    pub tell: Option<SharedImexProgress>,
}

impl SharedImexRole {
    /// The node's pods now hold `held`; whether that changes anything.
    pub fn hold(&mut self, held: BTreeMap<DomainUid, ChannelId>) -> bool {
        let changed = self.held_here != held;
        self.held_here = held;
        changed
    }

    pub fn assign(&mut self, input: AssignInput<'_>) -> Assigned {
        let assignment = assign_channels(input.candidates, input.capacity);
        let now = input.now;
        let before = std::mem::take(&mut self.assigned_at);
        for (uid, channel) in &assignment.channels {
            let since = match before.get(uid) {
                Some((held, since)) if held == channel => *since,
                _ => now,
            };
            self.assigned_at.insert(uid.clone(), (*channel, since));
        }
        // Agreed by every node, and advertised here long enough.
        let mut agreed = confirmed(&assignment.channels, input.others.iter());
        let mut settles_at: Option<Instant> = None;
        agreed.retain(|uid, _| {
            let since = self.assigned_at.get(uid).map_or(now, |(_, since)| *since);
            let due = since + input.settle;
            if now < due {
                settles_at = Some(settles_at.map_or(due, |at| at.min(due)));
            }
            now >= due
        });
        let mut faults: BTreeMap<NodeId, SharedFault> = input
            .lost
            .into_iter()
            .map(|node| (node, SharedFault::Lost))
            .collect();
        for node in input.failing {
            faults.insert(node, SharedFault::ImexFailing);
        }
        let sharing = Sharing {
            channels: assignment.channels.clone(),
            held_channels: self.held_here.clone(),
            ..Sharing::default()
        };
        let progress = SharedImexProgress {
            local_ready: input.local_ready,
            imex_failing: input.imex_failing,
            assigned: assignment.channels,
            confirmed: agreed,
            exhausted: assignment.unassigned,
            faults,
            failure: input.failure,
        };
        let tell = (self.told.as_ref() != Some(&progress)).then(|| {
            self.told = Some(progress.clone());
            progress
        });
        Assigned {
            sharing,
            settles_at,
            tell,
        }
    }

    /// The actor restarted: what was told and the settles start again; what the pods
    /// hold is still true.
    pub fn reset(&mut self) {
        self.told = None;
        self.assigned_at.clear();
    }
}

/// A sharing domain's memory between two passes.
#[derive(Debug, Clone, Default)]
pub struct SharingRole {
    /// The shared IMEX domain's progress on this node.
    shared: Option<SharedImexProgress>,
    /// The channel this node handed to a pod: it never moves while pods hold it.
    handed: Option<ChannelId>,
    /// Whether the exhaustion was counted, once per episode.
    exhausted_counted: bool,
    /// On the reporter: the shared IMEX domain's faults announced.
    faults_announced: Option<BTreeMap<NodeId, SharedFault>>,
}

/// What one pass of a sharing domain knows.
#[derive(Debug, Clone, Copy)]
pub struct FollowInput<'a> {
    pub domain: &'a DomainUid,
    /// A node without NVLink fabric has no IMEX to wait for.
    pub has_fabric: bool,
    /// Whether this node holds claims of the domain (pods to hand the channel to).
    pub holds_claims: bool,
    /// The channel this node advertised last.
    pub advertised: Option<ChannelId>,
}

/// What a pass of a sharing domain decided.
#[derive(Debug, Clone, PartialEq)]
pub struct Followed {
    pub imex_ready: bool,
    pub imex_failing: bool,
    /// To advertise.
    pub sharing: Sharing,
    pub state: ChannelState,
    pub effects: Vec<SharingEffect>,
}

/// What a sharing domain's pass asks the actor to count and say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SharingEffect {
    /// Every channel of the range is taken: once per episode.
    Exhausted,
    /// The confirmed channel moved while this node's pods hold the old one.
    ChannelMoved { before: ChannelId, now: ChannelId },
}

impl SharingRole {
    /// The channel this node's pods were given, as the checkpoint has it.
    pub fn restore(&mut self, handed: Option<ChannelId>) {
        self.handed = handed;
    }

    pub fn handed(&self) -> Option<ChannelId> {
        self.handed
    }

    /// The shared IMEX domain's news; whether it changes anything.
    pub fn progress(&mut self, progress: SharedImexProgress) -> bool {
        if self.shared.as_ref() == Some(&progress) {
            return false;
        }
        self.shared = Some(progress);
        true
    }

    pub fn state(&self, domain: &DomainUid) -> ChannelState {
        ChannelState::of(domain, self.shared.as_ref())
    }

    /// The channel a status document carries: the confirmed one, or the one handed out.
    pub fn status_channel(&self, domain: &DomainUid) -> Option<ChannelId> {
        self.state(domain).confirmed().or(self.handed)
    }

    /// IMEX readiness is the shared IMEX domain's on this node; the channel is the one
    /// it assigns, held (advertised) until it is confirmed.
    pub fn follow(&mut self, input: FollowInput<'_>) -> Followed {
        let mut effects = Vec::new();
        let shared = self.shared.as_ref();
        let imex_failing = shared.is_some_and(|p| p.imex_failing);
        let state = ChannelState::of(input.domain, shared);
        // A member is ready once its pods can share memory: the shared IMEX domain is
        // ready here and the domain's channel is confirmed (or already handed out, so
        // that a newcomer to the shared domain not yet agreeing does not blink it). A
        // Ready status then always carries the channel.
        let imex_ready = (!input.has_fabric || shared.is_some_and(|p| p.local_ready))
            && (state.confirmed().is_some() || self.handed.is_some());
        // A channel handed to a pod is advertised as held until the domain leaves the
        // node: it outranks any domain not held (`rules::channels`).
        if let Some(confirmed) = state.confirmed()
            && input.holds_claims
        {
            if let Some(before) = self.handed
                && before != confirmed
            {
                effects.push(SharingEffect::ChannelMoved {
                    before,
                    now: confirmed,
                });
            }
            self.handed = Some(confirmed);
        }
        let channel = match (self.handed, &state) {
            (Some(handed), _) => Some(handed),
            (None, ChannelState::Unassigned) => input.advertised,
            (None, _) => state.held(),
        };
        let sharing = Sharing {
            channel,
            held: self.handed.is_some(),
            ..Sharing::default()
        };
        if state == ChannelState::Exhausted {
            if !self.exhausted_counted {
                self.exhausted_counted = true;
                effects.push(SharingEffect::Exhausted);
            }
        } else {
            self.exhausted_counted = false;
        }
        Followed {
            imex_ready,
            imex_failing,
            sharing,
            state,
            effects,
        }
    }

    /// On the reporter: the shared IMEX domain's faults not announced yet, except the
    /// losses of this domain's own members (`own_lost`), which are NodeLost events
    /// already.
    pub fn new_faults(&mut self, own_lost: impl Fn(&NodeId) -> bool) -> Vec<(NodeId, SharedFault)> {
        let now = self
            .shared
            .as_ref()
            .map(|p| p.faults.clone())
            .unwrap_or_default();
        let before = self
            .faults_announced
            .replace(now.clone())
            .unwrap_or_default();
        new_faults(&before, &now)
            .into_iter()
            .filter(|(node, fault)| !(*fault == SharedFault::Lost && own_lost(node)))
            .collect()
    }

    /// The actor restarted: faults are announced anew by the next reporter.
    pub fn reset(&mut self) {
        self.faults_announced = None;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> DomainUid {
        DomainUid(s.into())
    }

    fn candidate(domain: &str, seniority: u64) -> ChannelCandidate {
        ChannelCandidate {
            uid: uid(domain),
            seniority,
            held: false,
            preferred: None,
        }
    }

    fn assign_input<'a>(
        candidates: &'a [ChannelCandidate],
        others: &'a [BTreeMap<DomainUid, ChannelId>],
        now: Instant,
    ) -> AssignInput<'a> {
        AssignInput {
            candidates,
            capacity: 2,
            others,
            lost: vec![],
            failing: vec![],
            local_ready: true,
            imex_failing: false,
            failure: None,
            settle: Duration::from_millis(300),
            now,
        }
    }

    #[test]
    fn a_channel_is_confirmed_once_every_node_agrees_and_it_has_settled() {
        let mut role = SharedImexRole::default();
        let candidates = [candidate("a", 1), candidate("b", 2)];
        let t0 = Instant::now();
        let first = role.assign(assign_input(&candidates, &[], t0));
        assert_eq!(first.sharing.channels.len(), 2);
        let told = first.tell.expect("the first pass tells");
        assert!(told.confirmed.is_empty(), "nothing settled yet: {told:?}");
        assert_eq!(first.settles_at, Some(t0 + Duration::from_millis(300)));

        // Another node advertises the same assignment; once settled, both confirm.
        let others = [first.sharing.channels.clone()];
        let later = t0 + Duration::from_millis(300);
        let settled = role.assign(assign_input(&candidates, &others, later));
        assert_eq!(settled.settles_at, None);
        assert_eq!(
            settled.tell.expect("news").confirmed,
            first.sharing.channels
        );
        // The same again: nothing new to tell.
        let again = role.assign(assign_input(&candidates, &others, later));
        assert_eq!(again.tell, None);
    }

    #[test]
    fn a_node_that_disagrees_keeps_a_channel_unconfirmed() {
        let mut role = SharedImexRole::default();
        let candidates = [candidate("a", 1)];
        let t0 = Instant::now();
        let mine = role
            .assign(assign_input(&candidates, &[], t0))
            .sharing
            .channels;
        let theirs: BTreeMap<DomainUid, ChannelId> = mine.keys().map(|k| (k.clone(), 1)).collect();
        assert_ne!(mine, theirs);
        let others = [theirs];
        let pass = role.assign(assign_input(
            &candidates,
            &others,
            t0 + Duration::from_secs(5),
        ));
        // Settled long since, yet still nothing confirmed: nothing new to tell.
        assert_eq!(pass.settles_at, None);
        assert_eq!(pass.tell, None);
    }

    #[test]
    fn faults_name_lost_members_and_failing_imex() {
        let mut role = SharedImexRole::default();
        let t0 = Instant::now();
        let mut input = assign_input(&[], &[], t0);
        input.lost = vec!["node-2".into()];
        input.failing = vec!["node-3".into()];
        let faults = role.assign(input).tell.expect("news").faults;
        assert_eq!(
            faults,
            BTreeMap::from([
                ("node-2".into(), SharedFault::Lost),
                ("node-3".into(), SharedFault::ImexFailing),
            ])
        );
    }

    #[test]
    fn held_channels_are_advertised_and_a_change_is_news() {
        let mut role = SharedImexRole::default();
        assert!(!role.hold(BTreeMap::new()));
        assert!(role.hold(BTreeMap::from([(uid("a"), 1)])));
        let pass = role.assign(assign_input(&[], &[], Instant::now()));
        assert_eq!(pass.sharing.held_channels, BTreeMap::from([(uid("a"), 1)]));
    }

    fn progress(domain: &str, assigned: Option<ChannelId>, confirmed: bool) -> SharedImexProgress {
        let channels: BTreeMap<DomainUid, ChannelId> =
            assigned.map(|c| (uid(domain), c)).into_iter().collect();
        SharedImexProgress {
            local_ready: true,
            imex_failing: false,
            assigned: channels.clone(),
            confirmed: if confirmed { channels } else { BTreeMap::new() },
            exhausted: if assigned.is_none() {
                vec![uid(domain)]
            } else {
                vec![]
            },
            faults: BTreeMap::new(),
            failure: None,
        }
    }

    fn follow_input(domain: &DomainUid) -> FollowInput<'_> {
        FollowInput {
            domain,
            has_fabric: true,
            holds_claims: true,
            advertised: None,
        }
    }

    #[test]
    fn a_sharing_domain_is_ready_once_its_channel_is_confirmed_and_then_holds_it() {
        let domain = uid("a");
        let mut role = SharingRole::default();
        assert!(role.progress(progress("a", Some(3), false)));
        let waiting = role.follow(follow_input(&domain));
        assert!(!waiting.imex_ready);
        assert_eq!(waiting.sharing.channel, Some(3));
        assert!(!waiting.sharing.held);

        role.progress(progress("a", Some(3), true));
        let ready = role.follow(follow_input(&domain));
        assert!(ready.imex_ready);
        assert!(ready.sharing.held);
        assert_eq!(role.handed(), Some(3));
        assert_eq!(role.status_channel(&domain), Some(3));
    }

    #[test]
    fn a_confirmed_channel_that_moves_under_held_pods_is_said() {
        let domain = uid("a");
        let mut role = SharingRole::default();
        role.restore(Some(3));
        role.progress(progress("a", Some(4), true));
        let moved = role.follow(follow_input(&domain));
        assert_eq!(
            moved.effects,
            vec![SharingEffect::ChannelMoved { before: 3, now: 4 }]
        );
    }

    #[test]
    fn exhaustion_is_counted_once_per_episode() {
        let domain = uid("a");
        let mut role = SharingRole::default();
        role.progress(progress("a", None, false));
        let effects = |role: &mut SharingRole| role.follow(follow_input(&domain)).effects;
        assert_eq!(effects(&mut role), vec![SharingEffect::Exhausted]);
        assert_eq!(effects(&mut role), vec![]);
        role.progress(progress("a", Some(1), false));
        assert_eq!(effects(&mut role), vec![]);
        role.progress(progress("a", None, false));
        assert_eq!(effects(&mut role), vec![SharingEffect::Exhausted]);
    }

    #[test]
    fn faults_are_announced_once_and_own_losses_not_at_all() {
        let mut role = SharingRole::default();
        let mut news = progress("a", Some(1), true);
        news.faults = BTreeMap::from([
            ("node-2".into(), SharedFault::Lost),
            ("node-9".into(), SharedFault::Lost),
        ]);
        role.progress(news);
        let own = |node: &NodeId| node == "node-2";
        assert_eq!(
            role.new_faults(own),
            vec![("node-9".to_string(), SharedFault::Lost)]
        );
        assert_eq!(role.new_faults(own), vec![]);
        role.reset();
        assert_eq!(role.new_faults(own).len(), 1);
    }
}
