//! Domain: one per ComputeDomain with claims on this node.
//!
//! It publishes this node's advertisement, drives the IMEX daemon, keeps one ImexPeer
//! per remote member and one Channel per claim, and — while this node is the domain's
//! reporter — hands status documents to its StatusWriter. What to do is decided by
//! `rules::domain_core` from the gossip view, IMEX's reports and the time: this actor
//! feeds it and carries out the effects it returns.
//!
//! Supervised: if it stops unexpectedly it is restarted, and rebuilds its state from
//! gossip (its own last advertisement, its peers') and the checkpoint (its claims).

mod imex;
mod recompute;
mod report;

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use domaind_membership::Membership;
use tokio::time::Instant;
use tracing::{debug, info, warn};

use crate::actors::channel::{ChannelActor, WaitReady};
use crate::actors::imex_peer::{ImexPeerActor, PeerVerdict};
use crate::actors::imex_process::{
    ApplyPeers, ImexProcessActor, ImexReport, QueryNow, ReleaseImex,
};
use crate::actors::last_out::LastOut;
use crate::actors::sharing::{HeldChannels, Role, SharedImexProgress};
use crate::actors::status_writer::{PublishStatus, Retire, StatusWriterActor};
use crate::config::NodeConfig;
use crate::model::{ChannelId, DomainRef, NodeId, Phase, Slot};
use crate::outcome::{PrepareError, Prepared};
use crate::ports::{ClaimRecord, DomainEvent, Ports};
use crate::rules::channel_roles::SharingEffect;
use crate::rules::domain_core::{DomainCore, DomainEffect, PassInput, Restore};
use crate::rules::membership::{
    decode_advertisement, domain_key, encode_advertisement, status_key,
};
use crate::rules::peers::PeerSet;
use crate::rules::reporter::reporter;
use crate::rules::reporter_role::ReadOutcome;
use crate::rules::roster::{Change, Tenure, VerdictOutcome};
use crate::rules::status::DomainStatus;
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

/// The node moves to another clique: retract the advertisement and retire, as
/// [`Leave`] does, but leave the IMEX daemon running: the node hands it to the new
/// clique's domain (`imex_process::Handover`).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Retract;

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

/// How a domain's channel now is on this node, for the prepared devices' health.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct HealthChanged {
    pub domain: crate::model::DomainUid,
    pub health: crate::rules::channel_health::DomainHealth,
}

/// Where a domain tells the node what the node keeps for it.
#[derive(Debug, Clone)]
pub struct NodeListeners {
    /// Its slot, for the checkpoint.
    pub slots: Recipient<SlotChanged>,
    /// Its health, for the prepared devices.
    pub health: Recipient<HealthChanged>,
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
    health_listener: Recipient<HealthChanged>,
    restarts: u32,
    /// The shared IMEX domain: the node, told of its progress.
    shared_listener: Option<Recipient<SharedImexProgress>>,
    /// Every decision about members, slots, IMEX and readiness (`rules::domain_core`);
    /// this actor feeds it and carries out what it returns.
    core: DomainCore,

    // Everything below is rebuilt on (re)start.
    claims: BTreeMap<String, (ClaimRecord, Addr<ChannelActor>)>,
    published: Option<String>,
    publishing: bool,
    /// Each remote member's ImexPeer, with the tenure it speaks for.
    peers: BTreeMap<NodeId, (Tenure, Addr<ImexPeerActor>)>,
    status_writer: Option<Addr<StatusWriterActor>>,
    recompute_scheduled: bool,
    retention_timer: Option<SpawnHandle>,
    leaving: bool,
    /// The newest gossip view, as the bridge delivered it.
    live: Option<Arc<Membership>>,
    /// A recompute the core asked for at a time (the earliest wins).
    reporter_timer: Option<(Instant, SpawnHandle)>,
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
        listeners: NodeListeners,
        role: Role,
        shared_listener: Option<Recipient<SharedImexProgress>>,
    ) -> Self {
        Self {
            core: DomainCore::new(domain.clone(), config.clone(), role, Instant::now()),
            domain,
            config,
            ports,
            imex,
            slot_listener: listeners.slots,
            health_listener: listeners.health,
            restarts: 0,
            shared_listener,
            claims: BTreeMap::new(),
            published: None,
            publishing: false,
            peers: BTreeMap::new(),
            status_writer: None,
            recompute_scheduled: false,
            retention_timer: None,
            leaving: false,
            live: None,
            reporter_timer: None,
        }
    }

    fn me(&self) -> &str {
        &self.config.node
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
            let await_adoption = act.core.restore(Restore {
                previous,
                checkpoint_slot: checkpoint.slots.get(&act.domain.uid).copied(),
                checkpoint_channel: checkpoint
                    .claims
                    .values()
                    .filter(|r| r.info.domain.uid == act.domain.uid)
                    .find_map(|r| r.channel),
                imex_outlives_daemon: act.ports.imex.outlives_node_daemon(),
                now_ms: act.ports.clock.now_ms(),
            });
            if await_adoption {
                ctx.run_later(act.config.imex_adoption_wait, |act, ctx| {
                    if act.core.give_up_adoption() {
                        warn!(domain = %act.domain, wait = ?act.config.imex_adoption_wait, "IMEX did not answer in time after the restart; advertising without it");
                        act.schedule_recompute(ctx);
                    }
                });
            }
            for record in checkpoint.claims.into_values() {
                // An admin claim of the domain is no member of it.
                if record.info.domain.uid == act.domain.uid && record.info.joins_domain() {
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
        if let Some(progress) = self.core.progress() {
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
        if self.core.awaiting_adoption() {
            return;
        }
        let Some(ad) = self.core.advertisement() else {
            return;
        };
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

    /// The ImexPeer of `node`'s `tenure`, started if it has none yet.
    fn peer(&mut self, node: &str, tenure: Tenure, ctx: &mut Context<Self>) -> Addr<ImexPeerActor> {
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
        let core = &self.core;
        let readiness = core.readiness();
        let roster = core.roster();
        DomainSnapshot {
            domain: self.domain.clone(),
            members: roster.members().keys().cloned().collect(),
            lost: roster.unheld_lost().cloned().collect(),
            held: roster.held().cloned().collect(),
            dropped: roster.dropped().iter().cloned().collect(),
            slots: core.assignment().slots.clone(),
            my_slot: core.my_slot(),
            peer_set: core.peer_set().clone(),
            phase: readiness.map_or(Phase::NotReady, |r| r.phase),
            ready: readiness.map_or(0, |r| r.ready),
            total: readiness.map_or(0, |r| r.total),
            local_ready: core.progress().is_some_and(|p| p.local_ready),
            reporter: reporter(roster.members()).map(str::to_owned),
            claims: self.claims.keys().cloned().collect(),
            restarts: self.restarts,
            isolation: match core.role() {
                Role::Sharing => crate::model::Isolation::Channel,
                _ => crate::model::Isolation::ImexDomain,
            },
            channel: core.channel(),
            channels: core.channels(),
        }
    }

    fn reset(&mut self) {
        self.claims.clear();
        self.published = None;
        self.publishing = false;
        self.peers.clear();
        self.core.reset();
        self.status_writer = None;
        self.recompute_scheduled = false;
        self.retention_timer = None;
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
        self.core
            .gossip_changed(live.keys().cloned().collect(), Instant::now());
        self.live = Some(live);
        self.schedule_recompute(ctx);
    }
}

impl Handler<SharedImexProgress> for DomainActor {
    type Result = ();
    fn handle(&mut self, progress: SharedImexProgress, ctx: &mut Self::Context) {
        let effects = self.core.shared_progress(progress);
        self.carry_out(effects, ctx);
    }
}

impl Handler<HeldChannels> for DomainActor {
    type Result = ();
    fn handle(&mut self, HeldChannels(held): HeldChannels, ctx: &mut Self::Context) {
        if self.core.hold_channels(held) {
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
        info!(domain = %self.domain, workload_gone, "leaving the domain");
        if self.core.drives_imex() {
            self.imex.do_send(ReleaseImex);
        }
        self.retire(workload_gone)
    }
}

impl Handler<Retract> for DomainActor {
    type Result = ResponseActFuture<Self, ()>;
    fn handle(&mut self, _: Retract, _: &mut Self::Context) -> Self::Result {
        info!(domain = %self.domain, "leaving the domain in this clique; IMEX is kept for the next");
        self.retire(false)
    }
}

impl DomainActor {
    /// Retracts this node's keys and retires the status writer; the actor then does
    /// nothing more.
    fn retire(&mut self, workload_gone: bool) -> ResponseActFuture<Self, ()> {
        self.leaving = true;
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
