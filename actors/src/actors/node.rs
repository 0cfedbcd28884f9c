//! Node: the root actor. Owns the configuration and the checkpoint, restores prepared
//! claims at start, routes prepare and unprepare calls to the domains, enforces one
//! domain per node (or several, all of `isolation: Channel`, and then runs the clique's
//! shared IMEX domain beside them), and starts the singletons (IMEX supervisor, gossip
//! bridge). Admin claims (`adminAccess`) are recorded and answered at once, and
//! otherwise left out of every rule here: they join no domain.

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use tracing::{error, info, warn};

use crate::actors::domain::{
    AddClaim, DomainActor, DomainSnapshot, GetDomainSnapshot, GossipChanged, Halt, HealthChanged,
    Leave, NodeListeners, RemoveClaim, SlotChanged, WaitClaim,
};
use crate::actors::gossip_bridge::GossipBridge;
use crate::actors::imex_process::{Detach, GetImexLifecycle, ImexLifecycle, ImexProcessActor};
use crate::actors::sharing::{HeldChannels, Role, SharedImexProgress};
use crate::config::NodeConfig;
use crate::health_board::{HealthView, PreparedDevice};
use crate::model::{AllocationMode, ClaimRef, DomainRef, DomainUid, Isolation};
use crate::outcome::{PrepareError, Prepared, domain_label};
use crate::ports::{
    Checkpoint, CheckpointChange, ClaimError, ClaimRecord, DomainEvent, PortError, Ports,
    PrepareState, Recorded,
};
use crate::rules::channel_health::DomainHealth;
use crate::rules::channels::shared_imex_uid;

mod clique;
pub use clique::{JoinClique, LeaveClique};

pub const PREPARES: &str = "domaind_prepare_total";
pub const CHECKPOINT_FAILURES: &str = "domaind_checkpoint_failures_total";

/// The kubelet's NodePrepareResources, for one claim: admits the claim (recorded in the
/// checkpoint before anything else happens) and answers once its readiness policy
/// holds. The caller then prepares the claim's devices and sends [`Complete`].
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<Prepared, PrepareError>")]
pub struct Prepare(pub ClaimRef);

/// The kubelet's NodeUnprepareResources, for one claim. Unknown claims succeed.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), PrepareError>")]
pub struct Unprepare(pub String);

/// Stop: graceful stops the IMEX daemon too; neither retracts advertisements (a
/// restarted node comes back into its domains).
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Shutdown {
    pub stop_imex: bool,
}

/// A graceful stop (SIGTERM): retract this node's advertisements so that peers drop it
/// at once instead of waiting for the failure detector, stop the IMEX daemon and wait
/// for it, and flush the checkpoint. Claims and slots stay checkpointed: a restarted
/// node rejoins its domains.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "()")]
pub struct Depart;

/// A prepare about to be answered with success: the claim is recorded as completed,
/// with the CDI device ids it was given, in one change. Resolves once that is recorded,
/// so that an answered prepare is never lost.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), PrepareError>")]
pub struct Complete {
    pub claim_uid: String,
    pub devices: Vec<String>,
    /// Channel isolation: the channel the claim was given.
    pub channel: Option<crate::model::ChannelId>,
}

#[derive(Debug, Message)]
#[rtype(result = "NodeSnapshot")]
pub struct GetSnapshot;

/// A node's state, for tests, the demo and chaos checks.
#[derive(Debug, Clone, PartialEq, Eq, MessageResponse)]
pub struct NodeSnapshot {
    pub node: String,
    pub claims: Vec<String>,
    pub domains: Vec<DomainSnapshot>,
    /// The clique's shared IMEX domain, while this node holds a domain of
    /// `isolation: Channel`.
    pub shared_imex: Option<DomainSnapshot>,
    pub imex: ImexLifecycle,
}

pub struct NodeActor {
    config: Arc<NodeConfig>,
    ports: Ports,
    imex: Option<Addr<ImexProcessActor>>,
    bridge: Option<Addr<GossipBridge>>,
    domains: BTreeMap<DomainUid, Addr<DomainActor>>,
    /// The clique's shared IMEX domain, while a sharing domain is held.
    shared_imex: Option<Addr<DomainActor>>,
    /// Its latest progress, for sharing domains started later.
    shared_progress: Option<SharedImexProgress>,
    /// What the checkpoint holds once every change recorded so far is: kept here, so
    /// that the store only ever hears of changes.
    checkpoint: Checkpoint,
    /// Each domain's health here as it last judged it, for the prepared devices.
    health: BTreeMap<DomainUid, DomainHealth>,
    /// The clique this node moves to, between [`LeaveClique`] and [`JoinClique`].
    moving: Option<crate::model::CliqueId>,
}

impl std::fmt::Debug for NodeActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeActor")
            .field("node", &self.config.node)
            .finish_non_exhaustive()
    }
}

impl NodeActor {
    pub fn new(config: NodeConfig, ports: Ports) -> Self {
        Self {
            config: Arc::new(config),
            ports,
            imex: None,
            bridge: None,
            domains: BTreeMap::new(),
            shared_imex: None,
            shared_progress: None,
            checkpoint: Checkpoint::default(),
            health: BTreeMap::new(),
            moving: None,
        }
    }

    fn imex(&self) -> Addr<ImexProcessActor> {
        self.imex.clone().expect("started")
    }

    fn domain(&mut self, record: &ClaimRecord, ctx: &mut Context<Self>) -> Addr<DomainActor> {
        let uid = record.info.domain.uid.clone();
        if let Some(domain) = self.domains.get(&uid) {
            return domain.clone();
        }
        let role = match record.info.isolation {
            Isolation::ImexDomain => Role::Exclusive,
            Isolation::Channel => Role::Sharing,
        };
        let addr = self.start_domain(record.info.domain.clone(), role, ctx);
        if role == Role::Sharing {
            self.ensure_shared_imex(ctx);
            if let Some(progress) = &self.shared_progress {
                addr.do_send(progress.clone());
            }
        }
        self.domains.insert(uid, addr.clone());
        addr
    }

    fn start_domain(
        &self,
        domain: DomainRef,
        role: Role,
        ctx: &mut Context<Self>,
    ) -> Addr<DomainActor> {
        let (config, ports, imex) = (self.config.clone(), self.ports.clone(), self.imex());
        let listeners = NodeListeners {
            slots: ctx.address().recipient::<SlotChanged>(),
            health: ctx.address().recipient::<HealthChanged>(),
        };
        let progress =
            (role == Role::SharedImex).then(|| ctx.address().recipient::<SharedImexProgress>());
        Supervisor::start(move |_| {
            DomainActor::new(
                domain,
                config,
                ports,
                imex,
                listeners.clone(),
                role,
                progress,
            )
        })
    }

    /// The clique's shared IMEX domain on this node: started with the first sharing
    /// domain.
    fn ensure_shared_imex(&mut self, ctx: &mut Context<Self>) {
        if self.shared_imex.is_some() {
            return;
        }
        let clique = &self.config.clique;
        let domain = DomainRef {
            uid: shared_imex_uid(clique),
            namespace: String::new(),
            name: format!("shared IMEX domain of clique {clique}"),
            num_nodes: 0,
        };
        info!(node = %self.config.node, %clique, "joining the clique's shared IMEX domain");
        self.shared_imex = Some(self.start_domain(domain, Role::SharedImex, ctx));
        self.tell_held();
    }

    /// Tells the shared IMEX domain the channels this node's pods hold (answered
    /// prepares, as recorded), which it advertises.
    fn tell_held(&self) {
        let Some(shared) = &self.shared_imex else {
            return;
        };
        let held = self
            .checkpoint
            .claims
            .values()
            .filter(|r| r.state == PrepareState::PrepareCompleted && r.info.joins_domain())
            .filter_map(|r| Some((r.info.domain.uid.clone(), r.channel?)))
            .collect();
        shared.do_send(HeldChannels(held));
    }

    /// The claim already held here that keeps `info`'s domain off this node, if any:
    /// one domain per node, unless every domain on it shares the IMEX domain. Admin
    /// claims hold nothing against anyone.
    fn holder_against(&self, info: &crate::model::ClaimInfo) -> Option<&ClaimRecord> {
        self.checkpoint.claims.values().find(|held| {
            info.joins_domain()
                && held.info.joins_domain()
                && held.info.domain.uid != info.domain.uid
                && !(held.info.isolation == Isolation::Channel
                    && info.isolation == Isolation::Channel)
        })
    }

    fn holds_sharing_claims(&self) -> bool {
        self.checkpoint
            .claims
            .values()
            .any(|r| r.info.joins_domain() && r.info.isolation == Isolation::Channel)
    }

    /// Applies `changes` here and hands them to the store, in this order: the store
    /// takes them in before this returns, so changes are recorded in the order they were
    /// made. No changes: waits for everything recorded before.
    fn record(
        &mut self,
        changes: Vec<CheckpointChange>,
    ) -> impl std::future::Future<Output = Result<(), PortError>> + use<> {
        for change in &changes {
            self.checkpoint.apply(change.clone());
        }
        self.publish_health();
        let recorded: Recorded = self.ports.checkpoint.record(changes);
        async move {
            let result = recorded.await;
            if let Err(error) = &result {
                metrics::counter!(CHECKPOINT_FAILURES).increment(1);
                error!(%error, "checkpoint not recorded");
            }
            result
        }
    }

    /// The prepared devices, each with its domain's health here: published on every
    /// change of either.
    fn publish_health(&mut self) {
        let shared_imex = self
            .shared_imex
            .is_some()
            .then(|| shared_imex_uid(&self.config.clique));
        self.health
            .retain(|uid, _| self.domains.contains_key(uid) || shared_imex.as_ref() == Some(uid));
        let devices = self
            .checkpoint
            .claims
            .values()
            .flat_map(|record| {
                let status = self.health.get(&record.info.domain.uid).cloned();
                record
                    .info
                    .devices
                    .iter()
                    .map(move |device| PreparedDevice {
                        claim: record.claim.clone(),
                        device: device.clone(),
                        domain: record.info.domain.clone(),
                        status: status.clone(),
                    })
            })
            .collect();
        let imex_failing = self
            .health
            .values()
            .find_map(|health| health.imex_failing.clone());
        self.ports.health.publish(HealthView {
            devices,
            imex_failing,
        });
    }

    /// Accepts a resolved claim: refuses a second domain, records, starts or joins the
    /// domain (an admin claim joins none). Returns what to wait on and the checkpoint
    /// record to await first.
    fn admit(
        &mut self,
        claim: ClaimRef,
        resolved: Result<crate::model::ClaimInfo, ClaimError>,
        ctx: &mut Context<Self>,
    ) -> Result<
        (
            Admitted,
            impl std::future::Future<Output = Result<(), PortError>> + use<>,
        ),
        PrepareError,
    > {
        let info = resolved.map_err(|error| match error {
            ClaimError::Permanent(message) => PrepareError::Permanent(message),
            ClaimError::Transient(message) => PrepareError::Transient(message),
        })?;
        // The IMEX supervisor goes with a departure (SIGTERM) or a shutdown. A claim
        // whose resolution was under way then must not join a domain the node is
        // leaving (nor start one without a supervisor): it is refused, unrecorded, and
        // the kubelet asks the restarted node.
        if self.imex.is_none() {
            return Err(PrepareError::Transient(format!(
                "node {} is shutting down; call again once it is back",
                self.config.node
            )));
        }
        self.refuse_while_moving()?;
        if info.joins_domain()
            && info.isolation == Isolation::Channel
            && info.allocation_mode == AllocationMode::All
        {
            return Err(PrepareError::Permanent(format!(
                "ComputeDomain {} has isolation Channel and allocationMode All: a domain sharing \
                 its IMEX domain gets its own channel only, never every channel; use \
                 allocationMode Single, or isolation IMEXDomain",
                domain_label(&info.domain.uid, &info.domain.namespace, &info.domain.name)
            )));
        }
        if let Some(active) = self.holder_against(&info) {
            let error = PrepareError::Busy {
                node: self.config.node.clone(),
                claim: format!("{}/{} ({})", claim.namespace, claim.name, claim.uid),
                requested: domain_label(
                    &info.domain.uid,
                    &info.domain.namespace,
                    &info.domain.name,
                ),
                active: domain_label(
                    &active.info.domain.uid,
                    &active.info.domain.namespace,
                    &active.info.domain.name,
                ),
                active_isolation: active.info.isolation,
                requested_isolation: info.isolation,
            };
            let (sink, domain, event) = (
                self.ports.events.clone(),
                info.domain.clone(),
                DomainEvent::PrepareRefused {
                    claim: claim.uid.clone(),
                    reason: error.to_string(),
                },
            );
            actix::spawn(async move {
                let _ = sink.emit(&domain, event).await;
            });
            return Err(error);
        }
        let record = ClaimRecord {
            policy: info.readiness.unwrap_or(self.config.default_readiness),
            claim,
            info,
            state: PrepareState::PrepareStarted,
            devices: Vec::new(),
            channel: None,
        };
        let recorded = self.record(vec![CheckpointChange::Claim(record.clone())]);
        if !record.info.joins_domain() {
            info!(claim = %record.claim.uid, domain = %record.info.domain, "admin claim admitted: it joins no domain");
            return Ok((
                Admitted::Admin(Prepared::admin(&record, &self.config.node)),
                recorded,
            ));
        }
        let domain = self.domain(&record, ctx);
        domain.do_send(AddClaim(record));
        Ok((Admitted::Domain(domain), recorded))
    }
}

/// What an admitted claim's prepare waits on before it is answered.
enum Admitted {
    /// Its domain's readiness, as its readiness policy asks.
    Domain(Addr<DomainActor>),
    /// Nothing: an admin claim, answered from its record.
    Admin(Prepared),
}

impl Actor for NodeActor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        self.imex = Some(Supervisor::start({
            let (imex, config) = (self.ports.imex.clone(), self.config.clone());
            move |_| ImexProcessActor::new(imex, &config)
        }));
        self.bridge = Some(
            GossipBridge::new(
                self.ports.gossip.clone(),
                ctx.address().recipient().downgrade(),
            )
            .start(),
        );
        let store = self.ports.checkpoint.clone();
        ctx.wait(async move { store.load().await }.into_actor(self).map(|loaded, act, ctx| {
            match loaded {
                Ok(checkpoint) => {
                    info!(node = %act.config.node, claims = checkpoint.claims.len(), "checkpoint restored");
                    act.checkpoint = checkpoint;
                }
                Err(error) => {
                    metrics::counter!(CHECKPOINT_FAILURES).increment(1);
                    error!(%error, "checkpoint unreadable; starting with no prepared claims");
                }
            }
            let records: Vec<ClaimRecord> = act
                .checkpoint
                .claims
                .values()
                .filter(|r| r.info.joins_domain())
                .cloned()
                .collect();
            for record in records {
                let domain = act.domain(&record, ctx);
                domain.do_send(AddClaim(record));
            }
        }));
    }
}

impl Supervised for ImexProcessActor {}

impl Handler<Prepare> for NodeActor {
    type Result = ResponseActFuture<Self, Result<Prepared, PrepareError>>;

    fn handle(&mut self, Prepare(claim): Prepare, _: &mut Self::Context) -> Self::Result {
        let uid = claim.uid.clone();
        if let Some(record) = self
            .checkpoint
            .claims
            .get(&uid)
            .filter(|r| !r.info.joins_domain())
        {
            let prepared = Prepared::admin(record, &self.config.node);
            let recorded = self.record(Vec::new());
            return Box::pin(
                async move {
                    recorded.await.map_err(not_recorded)?;
                    answer(Admitted::Admin(prepared), uid).await
                }
                .into_actor(self),
            );
        }
        let known = self
            .checkpoint
            .claims
            .get(&uid)
            .and_then(|r| self.domains.get(&r.info.domain.uid))
            .cloned();
        if let Some(domain) = known {
            // A claim is only answered once it is recorded: the record that admitted it
            // may have failed, or be in flight still.
            let recorded = self.record(Vec::new());
            return Box::pin(
                async move {
                    recorded.await.map_err(not_recorded)?;
                    wait(domain, uid).await
                }
                .into_actor(self),
            );
        }
        let claims = self.ports.claims.clone();
        let resolving = claim.clone();
        Box::pin(
            async move { claims.resolve(&resolving).await }
                .into_actor(self)
                .then(move |resolved, act, ctx| {
                    let admitted = act.admit(claim, resolved, ctx);
                    async move {
                        let (admitted, recorded) = admitted?;
                        recorded.await.map_err(not_recorded)?;
                        answer(admitted, uid).await
                    }
                    .into_actor(act)
                }),
        )
    }
}

fn not_recorded(error: PortError) -> PrepareError {
    PrepareError::Transient(format!("cannot record the prepared claim: {error}"))
}

async fn answer(admitted: Admitted, uid: String) -> Result<Prepared, PrepareError> {
    match admitted {
        Admitted::Domain(domain) => wait(domain, uid).await,
        Admitted::Admin(prepared) => {
            metrics::counter!(PREPARES, "outcome" => "prepared").increment(1);
            Ok(prepared)
        }
    }
}

async fn wait(domain: Addr<DomainActor>, uid: String) -> Result<Prepared, PrepareError> {
    let result = domain.send(WaitClaim(uid)).await.unwrap_or_else(|_| {
        Err(PrepareError::Transient(
            "the domain is restarting; call again".into(),
        ))
    });
    let outcome = match &result {
        Ok(_) => "prepared",
        Err(e) if e.retryable() => "retry",
        Err(_) => "refused",
    };
    metrics::counter!(PREPARES, "outcome" => outcome).increment(1);
    result
}

impl Handler<Unprepare> for NodeActor {
    type Result = ResponseActFuture<Self, Result<(), PrepareError>>;

    fn handle(&mut self, Unprepare(uid): Unprepare, _: &mut Self::Context) -> Self::Result {
        let Some(record) = self.checkpoint.claims.get(&uid) else {
            return Box::pin(actix::fut::ready(Ok(())));
        };
        if !record.info.joins_domain() {
            // It joined nothing: only its record goes.
            let gone = self.record(vec![CheckpointChange::ClaimGone(uid)]);
            return Box::pin(
                async move {
                    gone.await.map_err(|e| {
                        PrepareError::Transient(format!("cannot record the unprepared claim: {e}"))
                    })
                }
                .into_actor(self),
            );
        }
        let domain_uid = record.info.domain.uid.clone();
        let domain = self.domains.get(&domain_uid).cloned();
        // Recorded now, not once the domain has answered: a prepare of the same claim
        // arriving meanwhile is recorded after it, as it happened.
        let gone = self.record(vec![CheckpointChange::ClaimGone(uid.clone())]);
        self.tell_held();
        Box::pin(
            async move {
                let remaining = match domain {
                    Some(domain) => domain.send(RemoveClaim(uid)).await.unwrap_or(0),
                    None => 0,
                };
                (remaining, gone.await)
            }
            .into_actor(self)
            .then(move |(remaining, gone), act, _| {
                let domain_left = remaining == 0
                    && !act
                        .checkpoint
                        .claims
                        .values()
                        .any(|r| r.info.joins_domain() && r.info.domain.uid == domain_uid);
                let mut changes = Vec::new();
                if domain_left {
                    if let Some(domain) = act.domains.remove(&domain_uid) {
                        domain.do_send(Leave {
                            workload_gone: true,
                        });
                    }
                    if act.checkpoint.slots.contains_key(&domain_uid) {
                        changes.push(CheckpointChange::SlotGone(domain_uid));
                    }
                    if !act.holds_sharing_claims()
                        && let Some(shared) = act.shared_imex.take()
                    {
                        info!(node = %act.config.node, "leaving the clique's shared IMEX domain: no sharing domain is held here any more");
                        shared.do_send(Leave {
                            workload_gone: false,
                        });
                        act.shared_progress = None;
                        let uid = shared_imex_uid(&act.config.clique);
                        if act.checkpoint.slots.contains_key(&uid) {
                            changes.push(CheckpointChange::SlotGone(uid));
                        }
                    }
                }
                if domain_left {
                    act.publish_health();
                }
                let slot_gone = (!changes.is_empty()).then(|| act.record(changes));
                async move {
                    let slot_gone = match slot_gone {
                        Some(recorded) => recorded.await,
                        None => Ok(()),
                    };
                    gone.and(slot_gone).map_err(|e| {
                        PrepareError::Transient(format!("cannot record the unprepared claim: {e}"))
                    })
                }
                .into_actor(act)
            }),
        )
    }
}

impl Handler<GossipChanged> for NodeActor {
    type Result = ();
    fn handle(&mut self, msg: GossipChanged, _: &mut Self::Context) {
        for domain in self.domains.values().chain(&self.shared_imex) {
            domain.do_send(msg.clone());
        }
    }
}

impl Handler<SharedImexProgress> for NodeActor {
    type Result = ();
    fn handle(&mut self, progress: SharedImexProgress, _: &mut Self::Context) {
        if self.shared_imex.is_none() {
            return;
        }
        let sharing: Vec<&DomainUid> = self
            .checkpoint
            .claims
            .values()
            .filter(|r| r.info.joins_domain() && r.info.isolation == Isolation::Channel)
            .map(|r| &r.info.domain.uid)
            .collect();
        for (uid, domain) in &self.domains {
            if sharing.contains(&uid) {
                domain.do_send(progress.clone());
            }
        }
        self.shared_progress = Some(progress);
    }
}

impl Handler<HealthChanged> for NodeActor {
    type Result = ();
    fn handle(&mut self, HealthChanged { domain, health }: HealthChanged, _: &mut Self::Context) {
        let shared_imex =
            self.shared_imex.is_some() && domain == shared_imex_uid(&self.config.clique);
        if !self.domains.contains_key(&domain) && !shared_imex {
            return;
        }
        self.health.insert(domain, health);
        self.publish_health();
    }
}

impl Handler<SlotChanged> for NodeActor {
    type Result = ();
    fn handle(&mut self, SlotChanged { domain, slot }: SlotChanged, ctx: &mut Self::Context) {
        let shared_imex =
            self.shared_imex.is_some() && domain == shared_imex_uid(&self.config.clique);
        if !self.domains.contains_key(&domain) && !shared_imex {
            return;
        }
        let change = match slot {
            Some(slot) => CheckpointChange::Slot { domain, slot },
            None => CheckpointChange::SlotGone(domain),
        };
        let recorded = self.record(vec![change]);
        ctx.spawn(
            async move {
                if let Err(error) = recorded.await {
                    warn!(%error, "slot not checkpointed");
                }
            }
            .into_actor(self),
        );
    }
}

impl Handler<Shutdown> for NodeActor {
    type Result = ();
    fn handle(&mut self, Shutdown { stop_imex }: Shutdown, ctx: &mut Self::Context) {
        info!(node = %self.config.node, stop_imex, "node stopping");
        for (_, domain) in std::mem::take(&mut self.domains) {
            domain.do_send(Halt);
        }
        if let Some(shared) = self.shared_imex.take() {
            shared.do_send(Halt);
        }
        self.imex().do_send(Detach {
            stop_daemon: stop_imex,
        });
        self.imex = None;
        self.bridge = None;
        ctx.stop();
    }
}

impl Handler<Depart> for NodeActor {
    type Result = ResponseActFuture<Self, ()>;

    fn handle(&mut self, _: Depart, _: &mut Self::Context) -> Self::Result {
        info!(node = %self.config.node, domains = self.domains.len(), "node departing");
        let mut domains: Vec<Addr<DomainActor>> =
            std::mem::take(&mut self.domains).into_values().collect();
        domains.extend(self.shared_imex.take());
        // The supervisor stops polling and restarting; the daemon is stopped here, so
        // that this call returns only once it is gone.
        if let Some(imex) = self.imex.take() {
            imex.do_send(Detach { stop_daemon: false });
        }
        self.bridge = None;
        let flush = self.record(Vec::new());
        let imex = self.ports.imex.clone();
        // With IMEX kept by a runner, a stop is a restart: the daemon runs on, the
        // node's pods keep their imports, and the next process takes over. Leaving the
        // domains would make every peer drop the node from its IMEX config.
        let restart_in_place = imex.outlives_node_daemon();
        if restart_in_place {
            info!(node = %self.config.node, "IMEX outlives this process (runner): not leaving the domains, not stopping IMEX");
        }
        Box::pin(
            async move {
                if !restart_in_place {
                    for domain in &domains {
                        let _ = domain
                            .send(Leave {
                                workload_gone: false,
                            })
                            .await;
                    }
                    if let Err(error) = imex.stop().await {
                        warn!(%error, "IMEX daemon did not stop cleanly");
                    }
                }
                // Already counted and logged by record().
                let _ = flush.await;
            }
            .into_actor(self)
            .map(|(), act, ctx| {
                info!(node = %act.config.node, "node departed");
                ctx.stop();
            }),
        )
    }
}

impl Handler<Complete> for NodeActor {
    // Not tied to the actor: once the completion is taken in by the store, its answer
    // must reach the caller even if the node stops meanwhile (a SIGTERM's departure),
    // or a prepare recorded as completed would be answered as refused.
    type Result = ResponseFuture<Result<(), PrepareError>>;

    fn handle(&mut self, msg: Complete, _: &mut Self::Context) -> Self::Result {
        let Some(record) = self.checkpoint.claims.get(&msg.claim_uid) else {
            // Unprepared while its devices were being made: nothing to answer for.
            let refused = PrepareError::Transient(format!(
                "claim {} was unprepared while it was being prepared; call again",
                msg.claim_uid
            ));
            return Box::pin(std::future::ready(Err(refused)));
        };
        let changes = if record.state == PrepareState::PrepareCompleted
            && record.devices == msg.devices
            && record.channel == msg.channel
        {
            Vec::new()
        } else {
            let mut completed = record.clone();
            completed.state = PrepareState::PrepareCompleted;
            completed.devices = msg.devices;
            completed.channel = msg.channel;
            vec![CheckpointChange::Claim(completed)]
        };
        let recorded = self.record(changes);
        self.tell_held();
        Box::pin(async move { recorded.await.map_err(not_recorded) })
    }
}

impl Handler<GetSnapshot> for NodeActor {
    type Result = ResponseFuture<NodeSnapshot>;
    fn handle(&mut self, _: GetSnapshot, _: &mut Self::Context) -> Self::Result {
        let domains: Vec<Addr<DomainActor>> = self.domains.values().cloned().collect();
        let imex = self.imex.clone();
        let shared_imex = self.shared_imex.clone();
        let node = self.config.node.clone();
        let claims = self.checkpoint.claims.keys().cloned().collect();
        Box::pin(async move {
            let mut snapshots = Vec::new();
            for domain in domains {
                if let Ok(snapshot) = domain.send(GetDomainSnapshot).await {
                    snapshots.push(snapshot);
                }
            }
            let imex = match imex {
                Some(imex) => imex.send(GetImexLifecycle).await.unwrap_or_default(),
                None => ImexLifecycle::default(),
            };
            let shared_imex = match shared_imex {
                Some(shared) => shared.send(GetDomainSnapshot).await.ok(),
                None => None,
            };
            NodeSnapshot {
                node,
                claims,
                domains: snapshots,
                shared_imex,
                imex,
            }
        })
    }
}

/// Test and chaos access to a domain actor of this node.
#[derive(Debug, Message)]
#[rtype(result = "Option<Addr<DomainActor>>")]
pub struct GetDomain(pub DomainUid);

impl Handler<GetDomain> for NodeActor {
    type Result = Option<Addr<DomainActor>>;
    fn handle(&mut self, GetDomain(uid): GetDomain, _: &mut Self::Context) -> Self::Result {
        self.domains.get(&uid).cloned()
    }
}

/// The claims this node holds, as checkpointed: for the stale-claim check, which asks
/// the API server about each and releases those gone through [`Unprepare`]. Answered
/// once the checkpoint is restored.
#[derive(Debug, Clone, Copy, Message)]
#[rtype(result = "Vec<ClaimRecord>")]
pub struct GetClaims;

impl Handler<GetClaims> for NodeActor {
    type Result = MessageResult<GetClaims>;
    fn handle(&mut self, _: GetClaims, _: &mut Self::Context) -> Self::Result {
        MessageResult(self.checkpoint.claims.values().cloned().collect())
    }
}
