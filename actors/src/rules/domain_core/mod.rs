//! A domain on this node as a state machine, one per role (`Role`): the exclusive
//! domain, the clique's shared IMEX domain and a sharing domain differ in who drives
//! IMEX and how the channel is decided, not in how members, slots and readiness are.
//!
//! The domain actor (`actors::domain`) feeds it what happened (a gossip view, its
//! IMEX's report, an ImexPeer's verdict, the shared IMEX domain's news, the time) and
//! carries out the [`DomainEffect`]s it returns, in order: messages to ImexPeers, to
//! the IMEX process, to the claims' channels and the node, events and timers. Nothing
//! here reads a clock or does I/O, so every decision is tested by feeding it inputs.
//!
//! The rules it applies are `roster`'s (who is a member), `slots`' and `local_imex`'s
//! (slots, the peer set, `imex_ready`), `readiness`'s, `channel_roles`' and
//! `reporter_role`'s; the pass itself is in `pass`, the IMEX daemon's side in `imex`,
//! the reporter's in `report`.

mod imex;
mod pass;
mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use tokio::time::Instant;

use crate::actors::channel::Progress;
use crate::actors::imex_peer::PeerSignal;
use crate::actors::imex_process::ImexReport;
use crate::actors::sharing::{Role, SharedFault, SharedImexProgress};
use crate::config::NodeConfig;
use crate::model::{Advertisement, ChannelId, DomainRef, DomainUid, NodeId, Sharing, Slot};
use crate::ports::DomainEvent;
use crate::rules::channel_health::DomainHealth;
use crate::rules::channel_roles::{SharedImexRole, SharingEffect, SharingRole};
use crate::rules::peer_health::Verdict;
use crate::rules::peers::PeerSet;
use crate::rules::readiness::Readiness;
use crate::rules::reporter_role::ReporterRole;
use crate::rules::roster::{Graces, Roster, Tenure, VerdictOutcome};
use crate::rules::slots::SlotAssignment;
use crate::rules::status::DomainStatus;

pub use pass::{Pass, PassInput};

/// What the domain actor carries out, in the order given.
#[derive(Debug, Clone, PartialEq)]
pub enum DomainEffect {
    /// The member's tenure is over: its ImexPeer is let go.
    RetirePeer(NodeId),
    /// Tell `node`'s ImexPeer of `tenure` (started if none speaks for that tenure).
    Signal {
        node: NodeId,
        tenure: Tenure,
        signal: PeerSignal,
    },
    /// Ask this node's IMEX daemon now, whatever its schedule says.
    QueryImex,
    /// Run this node's IMEX daemon with `peers`, as `version`.
    ApplyPeers {
        version: u64,
        peers: PeerSet,
        claims_in_use: bool,
    },
    /// This node's IMEX daemon has nothing to run with.
    ReleaseImex,
    /// This node's slot changed (for the checkpoint).
    SlotChanged(Option<Slot>),
    /// The claims' channels' new progress.
    Progress(Progress),
    /// The shared IMEX domain's news for the node.
    TellNode(SharedImexProgress),
    /// A sharing domain's counts and complaints.
    Sharing(SharingEffect),
    /// A Warning event: this node's IMEX daemon is failing, and why.
    ImexFailing(String),
    /// An event: this node's IMEX serves another config, kept for its claims, and why.
    ImexKept(String),
    /// The wait for an adopted IMEX is over: advertise again. `anew`: IMEX was
    /// started anew instead.
    AdoptionEnded { anew: bool },
    /// The adopted IMEX is ready but its peer set is too fresh: ask again at `at`.
    CheckAdoptionAt(Instant),
    /// Read the status as written, then [`DomainCore::read_finished`].
    ReadWritten,
    /// Another node reports: this node's status writer, if any, stops.
    StopWriter,
    /// This node is the reporter now: start a status writer for the tenure `term`,
    /// from the status as `written`. `adopted`: the members it listed that nobody here
    /// saw leave, listed lost from now on; `members`: how many there are now.
    StartWriter {
        term: u64,
        written: Option<DomainStatus>,
        adopted: Vec<NodeId>,
        members: usize,
    },
    /// Not reporting yet: the written status lists members not seen here.
    ReportHeld { unaccounted: Vec<NodeId> },
    /// Hand the status writer this document.
    PublishStatus(DomainStatus),
    /// Emit these events on the domain, in order.
    Events(Vec<DomainEvent>),
    /// Pass again at `at`.
    PassAt(Instant),
    /// Pass again soon.
    Pass,
    /// How the domain's channel now is on this node, for its pods' devices.
    Health(DomainHealth),
}

/// What a restart of the domain on this node rebuilds from.
#[derive(Debug, Clone, PartialEq)]
pub struct Restore {
    /// This node's advertisement still in gossip: the actor restarted, the node did not.
    pub previous: Option<Advertisement>,
    /// This node's slot in the checkpoint.
    pub checkpoint_slot: Option<Slot>,
    /// The channel this node's pods were given, as the checkpoint has it.
    pub checkpoint_channel: Option<ChannelId>,
    /// This node's IMEX outlives its daemon (`Imex::outlives_node_daemon`).
    pub imex_outlives_daemon: bool,
    /// The wall clock, in ms: when this node joins, if it had not.
    pub now_ms: u64,
}

/// What only one role does, with the memory it keeps between passes.
#[derive(Debug)]
enum RoleState {
    /// Its own IMEX domain: drives the daemon, reports, has no channel.
    Exclusive,
    /// The clique's shared IMEX domain: drives the daemon, assigns the sharing
    /// domains' channels, reports nothing.
    SharedImex(SharedImexRole),
    /// Follows the shared IMEX domain's daemon and waits for its channel.
    Sharing(SharingRole),
}

#[derive(Debug)]
pub struct DomainCore {
    domain: DomainRef,
    config: Arc<NodeConfig>,
    role: RoleState,
    my_ad: Option<Advertisement>,
    /// A restarted daemon whose IMEX outlived it says nothing of this domain until its
    /// IMEX has answered (adopted, or started anew), or `imex_adoption_wait` has passed:
    /// its first advertisement then says what is true (ready), not "not ready yet",
    /// which would make the domain NotReady for a restart no job felt.
    awaiting_adoption: bool,
    /// When the peer set handed to IMEX last changed.
    peer_set_changed: Instant,
    /// This domain's claims were restored from the checkpoint: prepared before this
    /// process started, their jobs use the node's IMEX.
    resumed: bool,
    /// A kept IMEX (another config, left for the claims using it) was told, with why.
    imex_kept_told: Option<String>,
    roster: Roster,
    assignment: SlotAssignment,
    peer_set: PeerSet,
    peer_version: u64,
    imex_report: Option<ImexReport>,
    /// Each peer's link as last told to its ImexPeer.
    links: BTreeMap<NodeId, bool>,
    /// For each lost member, whether its ImexPeer was last told its daemon lives (a
    /// restarted daemon, a newer generation, that has not advertised yet).
    lost_daemon_alive: BTreeMap<NodeId, bool>,
    readiness: Option<Readiness>,
    progress: Option<Progress>,
    /// The live node names of the last gossip view.
    live_names: Option<BTreeSet<NodeId>>,
    /// When gossip last saw a node come or go, or the domain a member join or leave.
    membership_changed: Option<Instant>,
    /// The last IMEX failure episode told, kept across restarts of the actor: one
    /// event per episode, not per restart of the daemon.
    imex_episode_told: u64,
    /// The reporter role: settle, takeover, tenure, announcements. Its tenures' terms
    /// must differ from every earlier one's, across restarts of the actor.
    reporter: ReporterRole,
    /// The health last told ([`DomainEffect::Health`]).
    health: Option<DomainHealth>,
    /// A sharing domain: how the shared IMEX domain last said this node's daemon is.
    shared_imex: Option<SharedImexState>,
}

/// What a sharing domain knows of the daemon it follows.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SharedImexState {
    ready: bool,
    failing: bool,
    failure: Option<String>,
}

impl DomainCore {
    pub fn new(domain: DomainRef, config: Arc<NodeConfig>, role: Role, now: Instant) -> Self {
        Self {
            domain,
            config,
            role: match role {
                Role::Exclusive => RoleState::Exclusive,
                Role::SharedImex => RoleState::SharedImex(SharedImexRole::default()),
                Role::Sharing => RoleState::Sharing(SharingRole::default()),
            },
            my_ad: None,
            awaiting_adoption: false,
            peer_set_changed: now,
            resumed: false,
            imex_kept_told: None,
            roster: Roster::default(),
            assignment: SlotAssignment::default(),
            peer_set: PeerSet::default(),
            peer_version: 0,
            imex_report: None,
            links: BTreeMap::new(),
            lost_daemon_alive: BTreeMap::new(),
            readiness: None,
            progress: None,
            live_names: None,
            membership_changed: None,
            imex_episode_told: 0,
            reporter: ReporterRole::default(),
            health: None,
            shared_imex: None,
        }
    }

    fn me(&self) -> &str {
        &self.config.node
    }

    fn has_fabric(&self) -> bool {
        self.config.clique.has_fabric()
    }

    /// Whether this role drives the node's IMEX daemon (a sharing domain follows the
    /// shared IMEX domain's).
    pub fn drives_imex(&self) -> bool {
        self.role() != Role::Sharing
    }

    pub fn role(&self) -> Role {
        match self.role {
            RoleState::Exclusive => Role::Exclusive,
            RoleState::SharedImex(_) => Role::SharedImex,
            RoleState::Sharing(_) => Role::Sharing,
        }
    }

    pub fn graces(&self) -> Graces {
        Graces {
            retention: self.config.lost_retention,
            rejoin: self.config.rejoin_grace,
        }
    }

    /// Rebuilds this node's advertisement after a (re)start; returns whether to wait
    /// for IMEX to answer before advertising (then [`DomainCore::give_up_adoption`]
    /// after `imex_adoption_wait`).
    pub fn restore(&mut self, restore: Restore) -> bool {
        let Restore {
            previous,
            checkpoint_slot,
            checkpoint_channel,
            imex_outlives_daemon,
            now_ms,
        } = restore;
        let preferred = previous.as_ref().and_then(|ad| ad.slot).or(checkpoint_slot);
        let sharing = match &mut self.role {
            RoleState::Exclusive => None,
            RoleState::SharedImex(_) => Some(Sharing::default()),
            // The channel its pods were given, or the one held before a restart.
            RoleState::Sharing(role) => {
                role.restore(checkpoint_channel);
                Some(Sharing {
                    channel: role.handed().or_else(|| {
                        previous
                            .as_ref()
                            .and_then(|ad| ad.sharing.as_ref())
                            .and_then(|s| s.channel)
                    }),
                    held: role.handed().is_some(),
                    ..Sharing::default()
                })
            }
        };
        // A slot in the checkpoint but none in gossip: this process restarted after
        // the domain had formed here, so an IMEX may be running to adopt.
        let restarted_here = previous.is_none() && checkpoint_slot.is_some();
        self.resumed = restarted_here;
        self.awaiting_adoption =
            restarted_here && self.has_fabric() && self.drives_imex() && imex_outlives_daemon;
        self.my_ad = Some(Advertisement {
            namespace: self.domain.namespace.clone(),
            name: self.domain.name.clone(),
            num_nodes: self.domain.num_nodes,
            ip: self.config.ip,
            clique: self.config.clique.clone(),
            slot: preferred,
            imex_ready: !self.has_fabric(),
            imex_failing: false,
            imex_outlives_daemon,
            joined_at_ms: previous.map_or(now_ms, |ad| ad.joined_at_ms),
            sharing,
        });
        self.awaiting_adoption
    }

    /// IMEX did not answer within `imex_adoption_wait`: whether this node was still
    /// waiting (and now advertises without it).
    pub fn give_up_adoption(&mut self) -> bool {
        std::mem::take(&mut self.awaiting_adoption)
    }

    /// Whether this node's advertisement waits for an adopted IMEX.
    pub fn awaiting_adoption(&self) -> bool {
        self.awaiting_adoption
    }

    /// A new gossip view's live node names.
    pub fn gossip_changed(&mut self, names: BTreeSet<NodeId>, now: Instant) {
        if self
            .live_names
            .as_ref()
            .is_some_and(|before| *before != names)
        {
            self.membership_changed = Some(now);
        }
        self.live_names = Some(names);
    }

    /// An ImexPeer's verdict; anything but [`VerdictOutcome::Retired`] wants a pass.
    pub fn verdict(&mut self, node: &str, tenure: Tenure, verdict: Verdict) -> VerdictOutcome {
        self.roster.verdict(node, tenure, verdict)
    }

    /// The shared IMEX domain's news (a sharing domain): a new failure episode is told
    /// on this domain too.
    pub fn shared_progress(&mut self, progress: SharedImexProgress) -> Vec<DomainEffect> {
        let mut effects = Vec::new();
        let shared_imex = Some(SharedImexState {
            ready: progress.local_ready,
            failing: progress.imex_failing,
            failure: progress.failure.as_ref().map(|(_, reason)| reason.clone()),
        });
        let daemon_changed = self.shared_imex != shared_imex;
        self.shared_imex = shared_imex;
        if let Some((episode, reason)) = &progress.failure
            && *episode > self.imex_episode_told
        {
            self.imex_episode_told = *episode;
            effects.push(DomainEffect::ImexFailing(format!(
                "{reason} (the shared IMEX domain of clique {}: every ComputeDomain sharing it on this node is touched)",
                self.config.clique
            )));
        }
        // A sharing domain passes again when its channel moves, or when the daemon it
        // follows changes: its pods' health is that daemon's.
        let pass = match &mut self.role {
            RoleState::Sharing(role) => role.progress(progress) || daemon_changed,
            _ => false,
        };
        if pass {
            effects.push(DomainEffect::Pass);
        }
        effects
    }

    /// The channels the node's pods hold (the shared IMEX domain): whether a pass is
    /// wanted.
    pub fn hold_channels(&mut self, held: BTreeMap<DomainUid, ChannelId>) -> bool {
        match &mut self.role {
            RoleState::SharedImex(role) => role.hold(held),
            _ => false,
        }
    }

    pub fn advertisement(&self) -> Option<&Advertisement> {
        self.my_ad.as_ref()
    }

    pub fn roster(&self) -> &Roster {
        &self.roster
    }

    pub fn assignment(&self) -> &SlotAssignment {
        &self.assignment
    }

    pub fn my_slot(&self) -> Option<Slot> {
        self.assignment.slot_of(self.me())
    }

    pub fn peer_set(&self) -> &PeerSet {
        &self.peer_set
    }

    pub fn readiness(&self) -> Option<&Readiness> {
        self.readiness.as_ref()
    }

    pub fn progress(&self) -> Option<&Progress> {
        self.progress.as_ref()
    }

    /// A sharing domain's reporter: the shared IMEX domain's faults not announced yet,
    /// but for the losses of this domain's own members (NodeLost events already).
    fn shared_faults(&mut self) -> Vec<(NodeId, SharedFault)> {
        let lost = self.roster.lost();
        match &mut self.role {
            RoleState::Sharing(role) => role.new_faults(|node| lost.contains_key(node)),
            _ => Vec::new(),
        }
    }

    /// The channel this domain is known by on this node: confirmed (a sharing domain).
    pub fn channel(&self) -> Option<ChannelId> {
        match &self.role {
            RoleState::Sharing(role) => role.state(&self.domain.uid).confirmed(),
            _ => None,
        }
    }

    /// Every sharing domain's channel as assigned here (the shared IMEX domain).
    pub fn channels(&self) -> BTreeMap<DomainUid, ChannelId> {
        match self.role {
            RoleState::SharedImex(_) => self
                .my_ad
                .as_ref()
                .and_then(|ad| ad.sharing.as_ref())
                .map(|s| s.channels.clone())
                .unwrap_or_default(),
            _ => BTreeMap::new(),
        }
    }

    /// Forgets what a restart rebuilds. Kept: the peer set (the daemon still runs with
    /// it, and an unchanged set after the rebuild must not reconfigure it), its version,
    /// the told failure episode, the reporter's last term, what the pods hold and
    /// the tenures handed out (ImexPeers of before may still speak).
    pub fn reset(&mut self) {
        self.my_ad = None;
        self.awaiting_adoption = false;
        self.roster.clear();
        self.assignment = SlotAssignment::default();
        self.imex_report = None;
        self.links.clear();
        self.lost_daemon_alive.clear();
        self.readiness = None;
        self.progress = None;
        match &mut self.role {
            RoleState::Exclusive => {}
            RoleState::SharedImex(role) => role.reset(),
            RoleState::Sharing(role) => role.reset(),
        }
        self.reporter.reset();
        self.health = None;
    }
}

#[cfg(test)]
mod tests;
