//! Domain: one per ComputeDomain with claims on this node.
//!
//! It publishes this node's advertisement, turns the gossip view into members, slots,
//! the IMEX peer set and readiness (pure rules), drives the IMEX daemon, keeps one
//! ImexPeer per remote member and one Channel per claim, and — while this node is the
//! domain's reporter — hands status documents to its StatusWriter.
//!
//! Supervised: if it stops unexpectedly it is restarted, and rebuilds its state from
//! gossip (its own last advertisement, its peers') and the checkpoint (its claims).

mod channels;
mod imex;
mod recompute;
mod report;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use actix::prelude::*;
use domaind_membership::Membership;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::actors::channel::{ChannelActor, Progress, WaitReady};
use crate::actors::imex_peer::{ImexPeerActor, PeerSignal, PeerVerdict};
use crate::actors::imex_process::{
    ApplyPeers, ImexProcessActor, ImexReport, QueryNow, ReleaseImex,
};
use crate::actors::last_out::LastOut;
use crate::actors::sharing::{ChannelState, HeldChannels, Role, SharedImexProgress};
use crate::actors::status_writer::{PublishStatus, Retire, StatusWriterActor};
use crate::config::NodeConfig;
use crate::model::{
    Advertisement, ChannelId, DomainMember, DomainRef, NodeId, Phase, Sharing, Slot,
};
use crate::outcome::{PrepareError, Prepared};
use crate::ports::{ClaimRecord, DomainEvent, Ports};
use crate::rules::channel_roles::{
    AssignInput, FollowInput, SharedImexRole, SharingEffect, SharingRole,
};
use crate::rules::channels::sharing_domains;
use crate::rules::local_imex::{DaemonReport, Reconfigure, desired_peers, imex_ready, reconfigure};
use crate::rules::membership::{
    decode_advertisement, domain_key, domain_members, encode_advertisement, status_key,
};
use crate::rules::peer_health::{Advertised, LinkAnswer};
use crate::rules::peers::PeerSet;
use crate::rules::readiness::{Readiness, node_ready};
use crate::rules::reporter::{Announced, reporter};
use crate::rules::reporter_role::{
    ReadOutcome, ReporterInput, ReporterRole, ReporterStep, ReporterTiming,
};
use crate::rules::roster::{Change, Graces, Roster, Tenure, VerdictOutcome, slot_candidates};
use crate::rules::slots::{SlotAssignment, assign_slots};
use crate::rules::status_writes::StatusWrites;

pub const BAD_ADVERTISEMENTS: &str = "domaind_bad_advertisements_total";
/// Sharing domains that found every channel of the range taken, by this node's count.
pub const CHANNELS_EXHAUSTED: &str = "domaind_channels_exhausted_total";
/// A sharing domain whose channel moved after this node handed it to a pod.
pub const CHANNEL_CONFLICTS: &str = "domaind_channel_conflicts_total";

/// Gossip changed: the new live membership.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct GossipChanged(pub Arc<Membership>);

#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct AddClaim(pub ClaimRecord);

/// Returns how many claims remain.
#[derive(Debug, Message)]
#[rtype(result = "usize")]
pub struct RemoveClaim(pub String);

#[derive(Debug, Message)]
#[rtype(result = "Result<Prepared, PrepareError>")]
pub struct WaitClaim(pub String);

/// Retract the advertisement, stop IMEX, retire. The actor ends once the node drops
/// its address. `workload_gone`: the last claim left (not a node stopping with its
/// claims kept), so if no member remains, the status is written as vacated.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Leave {
    pub workload_gone: bool,
}

/// Retire now, as if the process died: retract nothing.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Halt;

/// Fault injection: stop as on an internal error, to be restarted by the supervisor.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Crash;

/// This node's slot in a domain changed (for the checkpoint).
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct SlotChanged {
    pub domain: crate::model::DomainUid,
    pub slot: Option<Slot>,
}

#[derive(Debug, Message)]
#[rtype(result = "DomainSnapshot")]
pub struct GetDomainSnapshot;

/// A domain as one node sees it.
#[derive(Debug, Clone, PartialEq, Eq, MessageResponse)]
pub struct DomainSnapshot {
    pub domain: DomainRef,
    pub members: Vec<NodeId>,
    /// Members whose daemon went silent, listed NotReady.
    pub lost: Vec<NodeId>,
    /// Members whose daemon went silent while their IMEX lives on: counted as they
    /// last advertised (`rules::roster`).
    pub held: Vec<NodeId>,
    pub dropped: Vec<NodeId>,
    pub slots: BTreeMap<NodeId, Slot>,
    pub my_slot: Option<Slot>,
    pub peer_set: PeerSet,
    pub phase: Phase,
    pub ready: usize,
    pub total: usize,
    pub local_ready: bool,
    pub reporter: Option<NodeId>,
    pub claims: Vec<String>,
    /// How many times this actor was restarted by its supervisor.
    pub restarts: u32,
    /// Channel isolation: the domain's channel once confirmed (a sharing domain); every
    /// sharing domain's channel as assigned here (the shared IMEX domain).
    pub channel: Option<ChannelId>,
    pub channels: BTreeMap<crate::model::DomainUid, ChannelId>,
    pub isolation: crate::model::Isolation,
}

pub struct DomainActor {
    domain: DomainRef,
    config: Arc<NodeConfig>,
    ports: Ports,
    imex: Addr<ImexProcessActor>,
    slot_listener: Recipient<SlotChanged>,
    restarts: u32,
    role: Role,
    /// The shared IMEX domain: the node, told of its progress.
    shared_listener: Option<Recipient<SharedImexProgress>>,
    /// The shared IMEX domain's role (`Role::SharedImex`).
    shared_imex: SharedImexRole,
    /// A sharing domain's role (`Role::Sharing`).
    sharing: SharingRole,

    // Everything below is rebuilt on (re)start.
    claims: BTreeMap<String, (ClaimRecord, Addr<ChannelActor>)>,
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
    published: Option<String>,
    publishing: bool,
    /// Members, lost members, dropped and adopted ones (the rules of `rules::roster`).
    roster: Roster,
    /// Each remote member's ImexPeer, with the tenure it speaks for.
    peers: BTreeMap<NodeId, (Tenure, Addr<ImexPeerActor>)>,
    assignment: SlotAssignment,
    peer_set: PeerSet,
    peer_version: u64,
    imex_report: Option<ImexReport>,
    links: BTreeMap<NodeId, bool>,
    /// For each lost member, whether its ImexPeer was last told its daemon lives (a
    /// restarted daemon, a newer generation, that has not advertised yet).
    lost_daemon_alive: BTreeMap<NodeId, bool>,
    readiness: Option<Readiness>,
    progress: Option<Progress>,
    status_writer: Option<Addr<StatusWriterActor>>,
    recompute_scheduled: bool,
    retention_timer: Option<SpawnHandle>,
    leaving: bool,
    /// The newest gossip view, as the bridge delivered it.
    live: Option<Arc<Membership>>,
    /// The live node names of the last gossip view.
    live_names: Option<BTreeSet<NodeId>>,
    /// When gossip last saw a node come or go, or the domain a member join or leave.
    membership_changed: Option<Instant>,
    /// A recompute due when this node may start reporting.
    reporter_timer: Option<(Instant, SpawnHandle)>,
    /// The reporter role: settle, takeover, tenure, announcements. Kept across
    /// restarts of this actor: a new tenure's term must differ from every earlier one's.
    reporter: ReporterRole,
    /// The last IMEX failure episode told as an event, kept across restarts of this
    /// actor: one event per episode, not per restart of the daemon.
    imex_episode_told: u64,
}

impl std::fmt::Debug for DomainActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainActor")
            .field("domain", &self.domain.uid)
            .finish_non_exhaustive()
    }
}

impl DomainActor {
    pub fn new(
        domain: DomainRef,
        config: Arc<NodeConfig>,
        ports: Ports,
        imex: Addr<ImexProcessActor>,
        slot_listener: Recipient<SlotChanged>,
        role: Role,
        shared_listener: Option<Recipient<SharedImexProgress>>,
    ) -> Self {
        Self {
            domain,
            config,
            ports,
            imex,
            slot_listener,
            restarts: 0,
            role,
            shared_listener,
            shared_imex: SharedImexRole::default(),
            sharing: SharingRole::default(),
            claims: BTreeMap::new(),
            my_ad: None,
            awaiting_adoption: false,
            peer_set_changed: Instant::now(),
            resumed: false,
            imex_kept_told: None,
            published: None,
            publishing: false,
            roster: Roster::default(),
            peers: BTreeMap::new(),
            assignment: SlotAssignment::default(),
            peer_set: PeerSet::default(),
            peer_version: 0,
            imex_report: None,
            links: BTreeMap::new(),
            lost_daemon_alive: BTreeMap::new(),
            readiness: None,
            progress: None,
            status_writer: None,
            recompute_scheduled: false,
            retention_timer: None,
            leaving: false,
            live: None,
            live_names: None,
            membership_changed: None,
            reporter_timer: None,
            reporter: ReporterRole::default(),
            imex_episode_told: 0,
        }
    }

    fn me(&self) -> &str {
        &self.config.node
    }

    fn has_fabric(&self) -> bool {
        self.config.clique.has_fabric()
    }

    /// Rebuilds from the checkpoint (claims, last slot) and gossip (our previous
    /// advertisement, if this is a restart of the actor within a running node).
    fn rebuild(&mut self, ctx: &mut Context<Self>) {
        let checkpoint = self.ports.checkpoint.clone();
        ctx.wait(async move { checkpoint.load().await }.into_actor(self).map(|loaded, act, ctx| {
            let checkpoint = match loaded {
                Ok(checkpoint) => checkpoint,
                Err(error) => {
                    warn!(domain = %act.domain, %error, "checkpoint unreadable; rebuilding from gossip alone");
                    Default::default()
                }
            };
            let previous = act
                .ports
                .gossip
                .live()
                .get(act.me())
                .and_then(|m| m.keys.get(&domain_key(&act.domain.uid)).cloned())
                .and_then(|v| decode_advertisement(&v).ok());
            let preferred = previous
                .as_ref()
                .and_then(|ad| ad.slot)
                .or_else(|| checkpoint.slots.get(&act.domain.uid).copied());
            let sharing = match act.role {
                Role::Exclusive => None,
                Role::SharedImex => Some(Sharing::default()),
                // The channel its pods were given, or the one held before a restart.
                Role::Sharing => {
                    act.sharing.restore(
                        checkpoint
                            .claims
                            .values()
                            .filter(|r| r.info.domain.uid == act.domain.uid)
                            .find_map(|r| r.channel),
                    );
                    Some(Sharing {
                        channel: act.sharing.handed().or_else(|| {
                            previous
                                .as_ref()
                                .and_then(|ad| ad.sharing.as_ref())
                                .and_then(|s| s.channel)
                        }),
                        held: act.sharing.handed().is_some(),
                        ..Sharing::default()
                    })
                }
            };
            // A slot in the checkpoint but none in gossip: this process restarted
            // after the domain had formed here, so an IMEX may be running to adopt.
            let restarted_here =
                previous.is_none() && checkpoint.slots.contains_key(&act.domain.uid);
            act.resumed = restarted_here;
            if restarted_here
                && act.has_fabric()
                && act.role != Role::Sharing
                && act.ports.imex.outlives_node_daemon()
            {
                act.awaiting_adoption = true;
                ctx.run_later(act.config.imex_adoption_wait, |act, ctx| {
                    if std::mem::take(&mut act.awaiting_adoption) {
                        warn!(domain = %act.domain, wait = ?act.config.imex_adoption_wait, "IMEX did not answer in time after the restart; advertising without it");
                        act.schedule_recompute(ctx);
                    }
                });
            }
            act.my_ad = Some(Advertisement {
                namespace: act.domain.namespace.clone(),
                name: act.domain.name.clone(),
                num_nodes: act.domain.num_nodes,
                ip: act.config.ip,
                clique: act.config.clique.clone(),
                slot: preferred,
                imex_ready: !act.has_fabric(),
                imex_failing: false,
                imex_outlives_daemon: act.ports.imex.outlives_node_daemon(),
                joined_at_ms: previous
                    .map(|ad| ad.joined_at_ms)
                    .unwrap_or_else(|| act.ports.clock.now_ms()),
                sharing,
            });
            for record in checkpoint.claims.into_values() {
                if record.info.domain.uid == act.domain.uid {
                    act.add_claim(record, ctx);
                }
            }
            act.recompute(ctx);
        }));
    }

    fn add_claim(&mut self, record: ClaimRecord, ctx: &mut Context<Self>) {
        if self.claims.contains_key(&record.claim.uid) {
            return;
        }
        let channel = ChannelActor::new(
            record.clone(),
            self.config.node.clone(),
            self.config.prepare_deadline,
        )
        .start();
        if let Some(progress) = &self.progress {
            channel.do_send(progress.clone());
        }
        info!(domain = %self.domain, claim = %record.claim.uid, "claim joined the domain on this node");
        self.claims
            .insert(record.claim.uid.clone(), (record, channel));
        self.schedule_recompute(ctx);
    }

    fn schedule_recompute(&mut self, ctx: &mut Context<Self>) {
        if !self.recompute_scheduled && !self.leaving {
            self.recompute_scheduled = true;
            ctx.notify(Recompute);
        }
    }

    fn publish(&mut self, ctx: &mut Context<Self>) {
        if self.awaiting_adoption {
            return;
        }
        let Some(ad) = &self.my_ad else { return };
        let encoded = encode_advertisement(ad);
        if self.publishing || self.published.as_deref() == Some(encoded.as_str()) || self.leaving {
            return;
        }
        self.publishing = true;
        let gossip = self.ports.gossip.clone();
        let key = domain_key(&self.domain.uid);
        let value = encoded.clone();
        ctx.spawn(
            async move { gossip.set(&key, &value).await }
                .into_actor(self)
                .map(move |(), act, ctx| {
                    act.publishing = false;
                    act.published = Some(encoded);
                    // Changed again while we were publishing: publish the newest.
                    act.publish(ctx);
                }),
        );
    }

    /// The ImexPeer of `node`'s current tenure, started if it has none yet.
    fn peer(&mut self, node: &str, ctx: &mut Context<Self>) -> Addr<ImexPeerActor> {
        let tenure = self.roster.peer(node);
        if let Some((held, peer)) = self.peers.get(node)
            && *held == tenure
        {
            return peer.clone();
        }
        let verdicts = ctx.address().recipient::<PeerVerdict>().downgrade();
        let peer =
            ImexPeerActor::new(node.to_owned(), tenure, self.config.peer_health, verdicts).start();
        self.peers.insert(node.to_owned(), (tenure, peer.clone()));
        peer
    }

    fn snapshot(&self) -> DomainSnapshot {
        let readiness = self.readiness.clone();
        DomainSnapshot {
            domain: self.domain.clone(),
            members: self.roster.members().keys().cloned().collect(),
            lost: self.roster.unheld_lost().cloned().collect(),
            held: self.roster.held().cloned().collect(),
            dropped: self.roster.dropped().iter().cloned().collect(),
            slots: self.assignment.slots.clone(),
            my_slot: self.assignment.slot_of(self.me()),
            peer_set: self.peer_set.clone(),
            phase: readiness.as_ref().map_or(Phase::NotReady, |r| r.phase),
            ready: readiness.as_ref().map_or(0, |r| r.ready),
            total: readiness.as_ref().map_or(0, |r| r.total),
            local_ready: self.progress.as_ref().is_some_and(|p| p.local_ready),
            reporter: reporter(self.roster.members()).map(str::to_owned),
            claims: self.claims.keys().cloned().collect(),
            restarts: self.restarts,
            isolation: match self.role {
                Role::Sharing => crate::model::Isolation::Channel,
                _ => crate::model::Isolation::ImexDomain,
            },
            channel: match self.role {
                Role::Sharing => self.sharing.state(&self.domain.uid).confirmed(),
                _ => None,
            },
            channels: match self.role {
                Role::SharedImex => self
                    .my_ad
                    .as_ref()
                    .and_then(|ad| ad.sharing.as_ref())
                    .map(|s| s.channels.clone())
                    .unwrap_or_default(),
                _ => BTreeMap::new(),
            },
        }
    }

    fn reset(&mut self) {
        self.claims.clear();
        self.my_ad = None;
        self.awaiting_adoption = false;
        self.published = None;
        self.publishing = false;
        self.roster.clear();
        self.peers.clear();
        self.assignment = SlotAssignment::default();
        // Keep the peer set: the daemon still runs with it, and an unchanged set after
        // the rebuild must not reconfigure it.
        self.imex_report = None;
        self.links.clear();
        self.lost_daemon_alive.clear();
        self.readiness = None;
        self.progress = None;
        self.status_writer = None;
        self.recompute_scheduled = false;
        self.retention_timer = None;
        self.reporter.reset();
        self.shared_imex.reset();
        self.sharing.reset();
    }
}

#[derive(Debug, Message)]
#[rtype(result = "()")]
struct Recompute;

impl Actor for DomainActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        info!(domain = %self.domain, node = %self.config.node, "domain started on this node");
        self.rebuild(ctx);
    }
}

impl Supervised for DomainActor {
    fn restarting(&mut self, _: &mut Self::Context) {
        self.restarts += 1;
        warn!(domain = %self.domain, restarts = self.restarts, "domain actor restarting; rebuilding from gossip and the checkpoint");
        self.reset();
    }
}

impl Handler<Recompute> for DomainActor {
    type Result = ();
    fn handle(&mut self, _: Recompute, ctx: &mut Self::Context) {
        self.recompute_scheduled = false;
        self.recompute(ctx);
    }
}

impl Handler<GossipChanged> for DomainActor {
    type Result = ();
    fn handle(&mut self, GossipChanged(live): GossipChanged, ctx: &mut Self::Context) {
        let names: BTreeSet<NodeId> = live.keys().cloned().collect();
        if self
            .live_names
            .as_ref()
            .is_some_and(|before| *before != names)
        {
            self.membership_changed = Some(Instant::now());
        }
        self.live_names = Some(names);
        self.live = Some(live);
        self.schedule_recompute(ctx);
    }
}

impl Handler<SharedImexProgress> for DomainActor {
    type Result = ();
    fn handle(&mut self, progress: SharedImexProgress, ctx: &mut Self::Context) {
        if let Some((episode, reason)) = &progress.failure
            && *episode > self.imex_episode_told
        {
            self.imex_episode_told = *episode;
            self.tell_imex_failing(format!(
                "{reason} (the shared IMEX domain of clique {}: every ComputeDomain sharing it on this node is touched)",
                self.config.clique
            ));
        }
        if self.sharing.progress(progress) {
            self.schedule_recompute(ctx);
        }
    }
}

impl Handler<HeldChannels> for DomainActor {
    type Result = ();
    fn handle(&mut self, HeldChannels(held): HeldChannels, ctx: &mut Self::Context) {
        if self.shared_imex.hold(held) {
            self.schedule_recompute(ctx);
        }
    }
}

impl Handler<AddClaim> for DomainActor {
    type Result = ();
    fn handle(&mut self, AddClaim(record): AddClaim, ctx: &mut Self::Context) {
        self.add_claim(record, ctx);
    }
}

impl Handler<RemoveClaim> for DomainActor {
    type Result = usize;
    fn handle(&mut self, RemoveClaim(uid): RemoveClaim, _: &mut Self::Context) -> usize {
        if self.claims.remove(&uid).is_some() {
            info!(domain = %self.domain, claim = %uid, "claim left the domain on this node");
        }
        self.claims.len()
    }
}

impl Handler<WaitClaim> for DomainActor {
    type Result = ResponseFuture<Result<Prepared, PrepareError>>;
    fn handle(&mut self, WaitClaim(uid): WaitClaim, _: &mut Self::Context) -> Self::Result {
        let channel = self.claims.get(&uid).map(|(_, c)| c.clone());
        Box::pin(async move {
            match channel {
                Some(channel) => channel.send(WaitReady).await.unwrap_or_else(|_| {
                    Err(PrepareError::Transient(
                        "the claim's channel stopped; call again".into(),
                    ))
                }),
                None => Err(PrepareError::Transient(format!(
                    "claim {uid} is not registered with its domain yet; call again"
                ))),
            }
        })
    }
}

impl Handler<Leave> for DomainActor {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, Leave { workload_gone }: Leave, _: &mut Self::Context) -> Self::Result {
        self.leaving = true;
        info!(domain = %self.domain, workload_gone, "leaving the domain");
        if self.role != Role::Sharing {
            self.imex.do_send(ReleaseImex);
        }
        let gossip = self.ports.gossip.clone();
        let uid = self.domain.uid.clone();
        let status_writer = self.status_writer.take();
        let last_out = workload_gone.then(|| LastOut {
            domain: self.domain.clone(),
            me: self.config.node.clone(),
            clique: self.config.clique.clone(),
            gossip: self.ports.gossip.clone(),
            sink: self.ports.status.clone(),
            events: self.ports.events.clone(),
            within: self.config.last_out_watch,
        });
        Box::pin(
            async move {
                // Before anything else: no write of this node's reporter may land after
                // the vacated status.
                if let Some(writer) = status_writer {
                    let _ = writer.send(Retire).await;
                }
                gossip.delete(&domain_key(&uid)).await;
                gossip.delete(&status_key(&uid)).await;
                if let Some(last_out) = last_out {
                    // Detached: it outlives this actor, which retires now.
                    actix::spawn(last_out.run());
                }
            }
            .into_actor(self)
            // Not ctx.stop(): the supervisor would restart us while anyone holds our
            // address. Retired, we stop by ourselves once the node lets go of us.
            .map(|(), act, _| act.reset()),
        )
    }
}

impl Handler<Halt> for DomainActor {
    type Result = ();
    fn handle(&mut self, _: Halt, _: &mut Self::Context) {
        self.leaving = true;
        self.reset();
    }
}

impl Handler<Crash> for DomainActor {
    type Result = ();
    fn handle(&mut self, _: Crash, ctx: &mut Self::Context) {
        warn!(domain = %self.domain, "domain actor crashing (fault injection)");
        ctx.stop();
    }
}

impl Handler<GetDomainSnapshot> for DomainActor {
    type Result = DomainSnapshot;
    fn handle(&mut self, _: GetDomainSnapshot, _: &mut Self::Context) -> DomainSnapshot {
        self.snapshot()
    }
}
