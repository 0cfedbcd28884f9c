//! Node: the root actor. Owns the configuration and the checkpoint, restores prepared
//! claims at start, routes prepare and unprepare calls to the domains, enforces one
//! domain per node, and starts the singletons (IMEX supervisor, gossip bridge).

use std::collections::BTreeMap;
use std::sync::Arc;

use actix::prelude::*;
use tracing::{error, info, warn};

use crate::actors::domain::{
    AddClaim, DomainActor, DomainSnapshot, GetDomainSnapshot, GossipChanged, Halt, Leave,
    RemoveClaim, SlotChanged, WaitClaim,
};
use crate::actors::gossip_bridge::GossipBridge;
use crate::actors::imex_process::{Detach, GetImexLifecycle, ImexLifecycle, ImexProcessActor};
use crate::config::NodeConfig;
use crate::model::{ClaimRef, DomainUid};
use crate::outcome::{PrepareError, Prepared, domain_label};
use crate::ports::{
    Checkpoint, CheckpointStore, ClaimError, ClaimRecord, DomainEvent, PortError, Ports,
    PrepareState,
};

pub const PREPARES: &str = "domaind_prepare_total";
pub const CHECKPOINT_FAILURES: &str = "domaind_checkpoint_failures_total";

/// The kubelet's NodePrepareResources, for one claim.
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

/// The CDI device ids a prepared claim was given, for the checkpoint.
#[derive(Debug, Clone, Message)]
#[rtype(result = "Result<(), PrepareError>")]
pub struct RecordDevices {
    pub claim_uid: String,
    pub devices: Vec<String>,
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
    pub imex: ImexLifecycle,
}

/// Saves checkpoints in the order they were made, newest wins.
struct CheckpointSaver {
    store: Arc<dyn CheckpointStore>,
    saved: tokio::sync::Mutex<u64>,
    /// The version last saved, readable without waiting for a save in flight.
    saved_version: std::sync::atomic::AtomicU64,
}

impl CheckpointSaver {
    async fn save(&self, version: u64, checkpoint: Checkpoint) -> Result<(), PortError> {
        let mut saved = self.saved.lock().await;
        if version <= *saved {
            return Ok(());
        }
        self.store.save(&checkpoint).await?;
        *saved = version;
        self.saved_version
            .store(version, std::sync::atomic::Ordering::Release);
        Ok(())
    }

    fn saved_version(&self) -> u64 {
        self.saved_version
            .load(std::sync::atomic::Ordering::Acquire)
    }
}

pub struct NodeActor {
    config: Arc<NodeConfig>,
    ports: Ports,
    imex: Option<Addr<ImexProcessActor>>,
    bridge: Option<Addr<GossipBridge>>,
    domains: BTreeMap<DomainUid, Addr<DomainActor>>,
    checkpoint: Checkpoint,
    version: u64,
    saver: Arc<CheckpointSaver>,
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
        let saver = Arc::new(CheckpointSaver {
            store: ports.checkpoint.clone(),
            saved: tokio::sync::Mutex::new(0),
            saved_version: Default::default(),
        });
        Self {
            config: Arc::new(config),
            ports,
            imex: None,
            bridge: None,
            domains: BTreeMap::new(),
            checkpoint: Checkpoint::default(),
            version: 0,
            saver,
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
        let (domain, config, ports, imex) = (
            record.info.domain.clone(),
            self.config.clone(),
            self.ports.clone(),
            self.imex(),
        );
        let slots = ctx.address().recipient::<SlotChanged>();
        let addr = Supervisor::start(move |_| DomainActor::new(domain, config, ports, imex, slots));
        self.domains.insert(uid, addr.clone());
        addr
    }

    /// The domain this node serves, if any (one at a time).
    fn active_domain(&self) -> Option<&ClaimRecord> {
        self.checkpoint.claims.values().next()
    }

    fn save(&mut self) -> impl std::future::Future<Output = Result<(), PortError>> + use<> {
        self.version += 1;
        let (saver, version, checkpoint) =
            (self.saver.clone(), self.version, self.checkpoint.clone());
        async move {
            let result = saver.save(version, checkpoint).await;
            if let Err(error) = &result {
                metrics::counter!(CHECKPOINT_FAILURES).increment(1);
                error!(%error, "checkpoint not saved");
            }
            result
        }
    }

    /// Accepts a resolved claim: refuses a second domain, records, starts or joins the
    /// domain. Returns the domain to wait on and the checkpoint save to await first.
    fn admit(
        &mut self,
        claim: ClaimRef,
        resolved: Result<crate::model::ClaimInfo, ClaimError>,
        ctx: &mut Context<Self>,
    ) -> Result<
        (
            Addr<DomainActor>,
            impl std::future::Future<Output = Result<(), PortError>> + use<>,
        ),
        PrepareError,
    > {
        let info = resolved.map_err(|error| match error {
            ClaimError::Permanent(message) => PrepareError::Permanent(message),
            ClaimError::Transient(message) => PrepareError::Transient(message),
        })?;
        if let Some(active) = self
            .active_domain()
            .filter(|a| a.info.domain.uid != info.domain.uid)
        {
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
        };
        self.checkpoint
            .claims
            .insert(record.claim.uid.clone(), record.clone());
        let domain = self.domain(&record, ctx);
        domain.do_send(AddClaim(record));
        let save = self.save();
        Ok((domain, save))
    }
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
            let records: Vec<ClaimRecord> = act.checkpoint.claims.values().cloned().collect();
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
        let known = self
            .checkpoint
            .claims
            .get(&uid)
            .and_then(|r| self.domains.get(&r.info.domain.uid))
            .cloned();
        if let Some(domain) = known {
            // A claim is only answered once it is on disk: an earlier save may have
            // failed.
            let behind = self.saver.saved_version() < self.version;
            let save = behind.then(|| self.save());
            return Box::pin(
                async move {
                    if let Some(save) = save {
                        save.await.map_err(not_recorded)?;
                    }
                    wait(domain, uid.clone())
                        .await
                        .map(|prepared| (uid, prepared))
                }
                .into_actor(self)
                .then(complete),
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
                        let (domain, save) = admitted?;
                        save.await.map_err(not_recorded)?;
                        wait(domain, uid.clone())
                            .await
                            .map(|prepared| (uid, prepared))
                    }
                    .into_actor(act)
                })
                .then(complete),
        )
    }
}

fn not_recorded(error: PortError) -> PrepareError {
    PrepareError::Transient(format!("cannot record the prepared claim: {error}"))
}

/// Marks a claim completed in the checkpoint the first time it is answered with
/// success; the answer waits for that save.
fn complete(
    result: Result<(String, Prepared), PrepareError>,
    act: &mut NodeActor,
    _: &mut Context<NodeActor>,
) -> impl ActorFuture<NodeActor, Output = Result<Prepared, PrepareError>> + use<> {
    let mut save = None;
    if let Ok((uid, _)) = &result
        && let Some(record) = act.checkpoint.claims.get_mut(uid)
        && record.state != PrepareState::PrepareCompleted
    {
        record.state = PrepareState::PrepareCompleted;
        save = Some(act.save());
    }
    async move {
        let (_, prepared) = result?;
        if let Some(save) = save {
            save.await.map_err(not_recorded)?;
        }
        Ok(prepared)
    }
    .into_actor(act)
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
        let Some(record) = self.checkpoint.claims.remove(&uid) else {
            return Box::pin(actix::fut::ready(Ok(())));
        };
        let domain_uid = record.info.domain.uid.clone();
        let domain = self.domains.get(&domain_uid).cloned();
        Box::pin(
            async move {
                match domain {
                    Some(domain) => domain.send(RemoveClaim(uid)).await.unwrap_or(0),
                    None => 0,
                }
            }
            .into_actor(self)
            .then(move |remaining, act, _| {
                if remaining == 0
                    && !act
                        .checkpoint
                        .claims
                        .values()
                        .any(|r| r.info.domain.uid == domain_uid)
                {
                    if let Some(domain) = act.domains.remove(&domain_uid) {
                        domain.do_send(Leave {
                            workload_gone: true,
                        });
                    }
                    act.checkpoint.slots.remove(&domain_uid);
                }
                let save = act.save();
                async move {
                    save.await.map_err(|e| {
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
        for domain in self.domains.values() {
            domain.do_send(msg.clone());
        }
    }
}

impl Handler<SlotChanged> for NodeActor {
    type Result = ();
    fn handle(&mut self, SlotChanged { domain, slot }: SlotChanged, ctx: &mut Self::Context) {
        if !self.domains.contains_key(&domain) {
            return;
        }
        match slot {
            Some(slot) => self.checkpoint.slots.insert(domain, slot),
            None => self.checkpoint.slots.remove(&domain),
        };
        let save = self.save();
        ctx.spawn(
            async move {
                if let Err(error) = save.await {
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
        let domains = std::mem::take(&mut self.domains);
        // The supervisor stops polling and restarting; the daemon is stopped here, so
        // that this call returns only once it is gone.
        if let Some(imex) = self.imex.take() {
            imex.do_send(Detach { stop_daemon: false });
        }
        self.bridge = None;
        let flush = (self.saver.saved_version() < self.version).then(|| self.save());
        let imex = self.ports.imex.clone();
        Box::pin(
            async move {
                for domain in domains.values() {
                    let _ = domain
                        .send(Leave {
                            workload_gone: false,
                        })
                        .await;
                }
                if let Err(error) = imex.stop().await {
                    warn!(%error, "IMEX daemon did not stop cleanly");
                }
                if let Some(flush) = flush {
                    // Already counted and logged by save().
                    let _ = flush.await;
                }
            }
            .into_actor(self)
            .map(|(), act, ctx| {
                info!(node = %act.config.node, "node departed");
                ctx.stop();
            }),
        )
    }
}

impl Handler<RecordDevices> for NodeActor {
    type Result = ResponseActFuture<Self, Result<(), PrepareError>>;

    fn handle(&mut self, msg: RecordDevices, _: &mut Self::Context) -> Self::Result {
        let changed = match self.checkpoint.claims.get_mut(&msg.claim_uid) {
            Some(record) if record.devices != msg.devices => {
                record.devices = msg.devices;
                true
            }
            _ => false,
        };
        let save = changed.then(|| self.save());
        Box::pin(
            async move {
                match save {
                    Some(save) => save.await.map_err(not_recorded),
                    None => Ok(()),
                }
            }
            .into_actor(self),
        )
    }
}

impl Handler<GetSnapshot> for NodeActor {
    type Result = ResponseFuture<NodeSnapshot>;
    fn handle(&mut self, _: GetSnapshot, _: &mut Self::Context) -> Self::Result {
        let domains: Vec<Addr<DomainActor>> = self.domains.values().cloned().collect();
        let imex = self.imex.clone();
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
            NodeSnapshot {
                node,
                claims,
                domains: snapshots,
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
