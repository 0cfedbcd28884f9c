//! In-memory fakes of every port. Each honours its port's contract, records what it
//! was asked, and can be told to fail.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use domaind_membership::{Member, Membership};
use futures::StreamExt;
use futures::stream::BoxStream;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;

use crate::model::{ClaimInfo, ClaimRef, DomainRef, NodeId, Slot};
use crate::ports::{
    Checkpoint, CheckpointChange, CheckpointStore, ClaimError, ClaimSource, Clock, DomainEvent,
    EventSink, Gossip, Imex, ImexStatus, PortError, Recorded, StatusSink,
};
use crate::rules::peers::PeerSet;
use crate::rules::status::DomainStatus;

/// Runs `test` in an actix system on a paused, single-threaded tokio runtime: actors'
/// timers and the test's sleeps advance together, in no real time.
pub fn run_paused_actix<F: std::future::Future<Output = ()>>(test: impl FnOnce() -> F) {
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("runtime")
    });
    system.block_on(test());
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// A failure to inject: the next `remaining` calls fail with `error`.
#[derive(Debug, Default)]
struct Failure {
    remaining: u32,
    error: Option<PortError>,
}

impl Failure {
    /// A timeout's kind, the failure most tests mean: the core retries it as it always
    /// did. [`Self::of`] injects another kind.
    fn transient(remaining: u32, message: &str) -> Self {
        Self::of(remaining, PortError::transient(message))
    }

    fn of(remaining: u32, error: PortError) -> Self {
        Self {
            remaining,
            error: Some(error),
        }
    }

    fn take(&mut self) -> Result<(), PortError> {
        if self.remaining == 0 {
            return Ok(());
        }
        self.remaining -= 1;
        Err(self
            .error
            .clone()
            .unwrap_or_else(|| PortError::transient("injected failure")))
    }
}

// ---------------------------------------------------------------------------
// Gossip

/// A gossip network in memory: every node sees every other's keys at once. Killing a
/// node removes it, as a failure detector's verdict would. Pausing one (SIGSTOP) hides
/// it from the others, as their failure detectors would, while its own view stands
/// still; resuming brings it back as it was, and shows it the newest view at once.
#[derive(Debug, Clone)]
pub struct FakeGossipNet {
    members: Arc<watch::Sender<Membership>>,
    paused: Arc<Mutex<BTreeMap<NodeId, Paused>>>,
}

/// A paused node: its own entry, kept from the others, and the view it stopped at.
#[derive(Debug, Clone)]
struct Paused {
    member: Member,
    view: Membership,
}

impl Default for FakeGossipNet {
    fn default() -> Self {
        Self {
            members: Arc::new(watch::channel(Membership::new()).0),
            paused: Arc::default(),
        }
    }
}

impl FakeGossipNet {
    /// Adds `node` (generation `generation`) and returns its handle.
    pub fn join(&self, node: &str, generation: u64) -> FakeGossip {
        self.members.send_modify(|m| {
            m.insert(
                node.to_owned(),
                Member {
                    node: node.to_owned(),
                    generation,
                    gossip_addr: "127.0.0.1:7946".parse().expect("valid address"),
                    keys: BTreeMap::new(),
                },
            );
        });
        FakeGossip {
            net: self.clone(),
            node: node.to_owned(),
            calls: Arc::default(),
        }
    }

    /// Removes a node, as the failure detector would declare it dead.
    pub fn kill(&self, node: &str) {
        lock(&self.paused).remove(node);
        self.members.send_modify(|m| {
            m.remove(node);
        });
    }

    /// The node stops (SIGSTOP): the others declare it dead, and it hears nothing
    /// until [`Self::resume`]. What it publishes meanwhile waits for the resume.
    pub fn pause(&self, node: &str) {
        let view = self.snapshot();
        let Some(member) = view.get(node).cloned() else {
            return;
        };
        lock(&self.paused).insert(node.to_owned(), Paused { member, view });
        self.members.send_modify(|m| {
            m.remove(node);
        });
    }

    /// The paused node runs again: the others see it back with its keys, and it sees
    /// the newest view.
    pub fn resume(&self, node: &str) {
        let Some(paused) = lock(&self.paused).remove(node) else {
            return;
        };
        self.members.send_modify(|m| {
            m.insert(node.to_owned(), paused.member);
        });
    }

    fn is_paused(&self, node: &str) -> bool {
        lock(&self.paused).contains_key(node)
    }

    /// Sets a key on another node's behalf (to play a peer in a test).
    pub fn set_key_of(&self, node: &str, key: &str, value: &str) {
        self.edit_keys(node, |keys| {
            keys.insert(key.to_owned(), value.to_owned());
        });
    }

    pub fn delete_key_of(&self, node: &str, key: &str) {
        self.edit_keys(node, |keys| {
            keys.remove(key);
        });
    }

    /// Edits `node`'s keys where they are: in the shared view, or held back with a
    /// paused node (which sees its own edits, as a node sees its own state).
    fn edit_keys(&self, node: &str, edit: impl Fn(&mut BTreeMap<String, String>)) {
        if let Some(paused) = lock(&self.paused).get_mut(node) {
            edit(&mut paused.member.keys);
            if let Some(own) = paused.view.get_mut(node) {
                edit(&mut own.keys);
            }
            return;
        }
        self.members.send_modify(|m| {
            if let Some(member) = m.get_mut(node) {
                edit(&mut member.keys);
            }
        });
    }

    pub fn snapshot(&self) -> Membership {
        self.members.borrow().clone()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum GossipCall {
    Set { key: String, value: String },
    Delete { key: String },
}

/// One node's handle on a [`FakeGossipNet`].
#[derive(Debug, Clone)]
pub struct FakeGossip {
    net: FakeGossipNet,
    node: NodeId,
    calls: Arc<Mutex<Vec<GossipCall>>>,
}

impl FakeGossip {
    pub fn calls(&self) -> Vec<GossipCall> {
        lock(&self.calls).clone()
    }
}

#[async_trait]
impl Gossip for FakeGossip {
    fn node(&self) -> NodeId {
        self.node.clone()
    }
    async fn set(&self, key: &str, value: &str) {
        lock(&self.calls).push(GossipCall::Set {
            key: key.to_owned(),
            value: value.to_owned(),
        });
        self.net.set_key_of(&self.node, key, value);
    }
    async fn delete(&self, key: &str) {
        lock(&self.calls).push(GossipCall::Delete {
            key: key.to_owned(),
        });
        self.net.delete_key_of(&self.node, key);
    }
    fn live(&self) -> Membership {
        match lock(&self.net.paused).get(&self.node) {
            Some(paused) => paused.view.clone(),
            None => self.net.snapshot(),
        }
    }
    fn updates(&self) -> BoxStream<'static, Membership> {
        let (net, node) = (self.net.clone(), self.node.clone());
        // A paused node hears nothing; the resume is a change that it hears.
        WatchStream::new(self.net.members.subscribe())
            .filter(move |_| std::future::ready(!net.is_paused(&node)))
            .boxed()
    }
}

// ---------------------------------------------------------------------------
// IMEX

/// One simulated IMEX daemon.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct DaemonState {
    pub running: bool,
    /// A hung daemon runs but answers no query.
    pub hung: bool,
    pub peers: PeerSet,
    /// Why it stopped running, until a status query reports it.
    pub exited: Option<String>,
    /// Which start of the fabric's daemons this is: a start that finds the daemon
    /// running with the same peers adopts it, as the real adapter does, and keeps the
    /// instance. A peer's imports of this node's memory survive only the same one.
    pub instance: u64,
    /// It was started with another config than a start would write now (an upgrade
    /// changed it): a start finds it unadoptable.
    pub other_config: bool,
    /// It was kept although unadoptable, for the claims using it: why.
    pub kept: Option<String>,
    /// The last start adopted it rather than starting it.
    pub adopted: bool,
}

#[derive(Debug, Default)]
struct FabricState {
    daemons: BTreeMap<NodeId, DaemonState>,
    cut: BTreeSet<(NodeId, NodeId)>,
    /// Daemons are kept by a runner: they outlive the node daemon.
    kept_by_runner: bool,
    instances: u64,
}

/// The IMEX daemons of a simulated rack. Like real IMEX, a daemon is READY when it is
/// connected to every peer in its configuration; here, connected means the peer's
/// daemon runs, lists this node among its own peers, and the link is not cut.
#[derive(Debug, Clone, Default)]
pub struct FakeImexFabric {
    state: Arc<Mutex<FabricState>>,
    /// Woken on every crash, as a child's exit wakes the real adapter.
    exits: Arc<tokio::sync::Notify>,
}

fn link(a: &str, b: &str) -> (NodeId, NodeId) {
    if a <= b {
        (a.to_owned(), b.to_owned())
    } else {
        (b.to_owned(), a.to_owned())
    }
}

impl FakeImexFabric {
    pub fn daemon(&self, node: &str) -> FakeImex {
        FakeImex {
            node: node.to_owned(),
            fabric: self.clone(),
            calls: Arc::default(),
            failure: Arc::default(),
            claims_in_use: Arc::default(),
        }
    }

    pub fn state_of(&self, node: &str) -> Option<DaemonState> {
        lock(&self.state).daemons.get(node).cloned()
    }

    /// From now on the daemons outlive their node daemon, as under an IMEX runner.
    pub fn keep_daemons(&self) {
        lock(&self.state).kept_by_runner = true;
    }

    /// `node`'s running daemon now serves another config than a start would write, as
    /// after an upgrade that changed the config.
    pub fn change_config(&self, node: &str) {
        if let Some(d) = lock(&self.state).daemons.get_mut(node) {
            d.other_config = true;
        }
    }

    /// The daemon exits, as on a crash.
    pub fn crash(&self, node: &str) {
        if let Some(d) = lock(&self.state).daemons.get_mut(node) {
            d.running = false;
            d.exited = Some("crashed (FakeImexFabric::crash)".into());
        }
        self.exits.notify_waiters();
    }

    /// Whether `node`'s daemon exited and no status query reported it yet.
    fn unreported_exit(&self, node: &str) -> bool {
        lock(&self.state)
            .daemons
            .get(node)
            .is_some_and(|d| d.exited.is_some())
    }

    pub fn hang(&self, node: &str, hung: bool) {
        if let Some(d) = lock(&self.state).daemons.get_mut(node) {
            d.hung = hung;
        }
    }

    pub fn cut(&self, a: &str, b: &str) {
        lock(&self.state).cut.insert(link(a, b));
    }

    pub fn heal(&self) {
        lock(&self.state).cut.clear();
    }

    fn status_of(&self, node: &str) -> Result<ImexStatus, PortError> {
        let mut state = lock(&self.state);
        if let Some(d) = state.daemons.get_mut(node).filter(|d| !d.running) {
            return Ok(ImexStatus {
                exited: d.exited.take(),
                ..ImexStatus::default()
            });
        }
        let Some(me) = state.daemons.get(node) else {
            return Ok(ImexStatus::default());
        };
        if me.hung {
            return Err(PortError::transient(format!(
                "IMEX on {node} does not answer"
            )));
        }
        let links: BTreeMap<Slot, bool> = me
            .peers
            .peers
            .iter()
            .filter(|(_, p)| p.node != node)
            .map(|(slot, p)| {
                let up = !state.cut.contains(&link(node, &p.node))
                    && state
                        .daemons
                        .get(&p.node)
                        .is_some_and(|d| d.running && d.peers.contains(node));
                (*slot, up)
            })
            .collect();
        Ok(ImexStatus {
            running: true,
            ready: links.values().all(|up| *up),
            links,
            exited: None,
            kept: me.kept.clone(),
            adopted: me.adopted,
            catching_up: false,
        })
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImexCall {
    Start(PeerSet),
    Apply(PeerSet),
    Reload,
    Status,
    Stop,
}

/// A node's IMEX daemon on a [`FakeImexFabric`].
#[derive(Debug, Clone)]
pub struct FakeImex {
    node: NodeId,
    fabric: FakeImexFabric,
    calls: Arc<Mutex<Vec<ImexCall>>>,
    failure: Arc<Mutex<Failure>>,
    claims_in_use: Arc<std::sync::atomic::AtomicBool>,
}

impl FakeImex {
    pub fn calls(&self) -> Vec<ImexCall> {
        lock(&self.calls).clone()
    }

    pub fn count(&self, what: fn(&ImexCall) -> bool) -> usize {
        lock(&self.calls).iter().filter(|c| what(c)).count()
    }

    /// The next `times` starts or applies fail.
    pub fn fail_next(&self, times: u32, message: &str) {
        *lock(&self.failure) = Failure::transient(times, message);
    }

    fn record(&self, call: ImexCall) {
        lock(&self.calls).push(call);
    }
}

#[async_trait]
impl Imex for FakeImex {
    async fn start(&self, peers: &PeerSet) -> Result<(), PortError> {
        self.record(ImexCall::Start(peers.clone()));
        lock(&self.failure).take()?;
        let mut state = lock(&self.fabric.state);
        let in_use = self
            .claims_in_use
            .load(std::sync::atomic::Ordering::Relaxed);
        let running = state.daemons.get(&self.node).filter(|d| d.running);
        // As the real adapter: the same config is adopted; another is kept while
        // claims use it, replaced otherwise.
        let (adopted, kept) = match running {
            Some(d) if d.other_config && in_use => (
                Some(d.instance),
                Some("started with another config (FakeImexFabric::change_config)".to_owned()),
            ),
            Some(d) if !d.other_config && d.peers == *peers => (Some(d.instance), None),
            _ => (None, None),
        };
        let other_config = kept.is_some();
        let instance = match adopted {
            Some(instance) => instance,
            None => {
                state.instances += 1;
                state.instances
            }
        };
        state.daemons.insert(
            self.node.clone(),
            DaemonState {
                running: true,
                hung: false,
                peers: peers.clone(),
                exited: None,
                instance,
                other_config,
                kept,
                adopted: adopted.is_some(),
            },
        );
        Ok(())
    }

    async fn apply(&self, peers: &PeerSet) -> Result<(), PortError> {
        self.record(ImexCall::Apply(peers.clone()));
        lock(&self.failure).take()?;
        let mut state = lock(&self.fabric.state);
        match state.daemons.get_mut(&self.node).filter(|d| d.running) {
            Some(d) => {
                d.peers = peers.clone();
                Ok(())
            }
            None => Err(PortError::transient("IMEX is not running")),
        }
    }

    async fn reload(&self) -> Result<(), PortError> {
        self.record(ImexCall::Reload);
        Ok(())
    }

    async fn status(&self) -> Result<ImexStatus, PortError> {
        self.record(ImexCall::Status);
        self.fabric.status_of(&self.node)
    }

    async fn stop(&self) -> Result<(), PortError> {
        self.record(ImexCall::Stop);
        if let Some(d) = lock(&self.fabric.state).daemons.get_mut(&self.node) {
            d.running = false;
        }
        Ok(())
    }

    fn outlives_node_daemon(&self) -> bool {
        lock(&self.fabric.state).kept_by_runner
    }

    fn claims_in_use(&self, in_use: bool) {
        self.claims_in_use
            .store(in_use, std::sync::atomic::Ordering::Relaxed);
    }

    async fn exited(&self) {
        loop {
            // Armed before the check, so that a crash in between still wakes us.
            let notified = self.fabric.exits.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.fabric.unreported_exit(&self.node) {
                return;
            }
            notified.await;
        }
    }
}

// ---------------------------------------------------------------------------
// Status and events

/// One status write, and who made it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StatusWrite {
    pub writer: NodeId,
    pub domain: DomainRef,
    pub status: DomainStatus,
}

/// A status store shared by every node of a test; each node writes through its own
/// handle ([`FakeStatusSink::for_node`]).
#[derive(Debug, Clone, Default)]
pub struct FakeStatusSink {
    writer: NodeId,
    writes: Arc<Mutex<Vec<StatusWrite>>>,
    failure: Arc<Mutex<Failure>>,
    read_failure: Arc<Mutex<Failure>>,
}

impl FakeStatusSink {
    pub fn for_node(&self, node: &str) -> Self {
        Self {
            writer: node.to_owned(),
            writes: self.writes.clone(),
            failure: self.failure.clone(),
            read_failure: self.read_failure.clone(),
        }
    }

    pub fn writes(&self) -> Vec<StatusWrite> {
        lock(&self.writes).clone()
    }

    /// The last status written for a domain.
    pub fn latest(&self, domain: &str) -> Option<StatusWrite> {
        lock(&self.writes)
            .iter()
            .rev()
            .find(|w| w.domain.uid.0 == domain)
            .cloned()
    }

    pub fn fail_next(&self, times: u32, message: &str) {
        *lock(&self.failure) = Failure::transient(times, message);
    }

    /// Fails the next `times` writes with `error`, of whatever kind it is.
    pub fn fail_next_with(&self, times: u32, error: PortError) {
        *lock(&self.failure) = Failure::of(times, error);
    }

    /// Fails the next `times` reads (writes are failed by [`Self::fail_next`]).
    pub fn fail_next_reads(&self, times: u32, message: &str) {
        *lock(&self.read_failure) = Failure::transient(times, message);
    }
}

#[async_trait]
impl StatusSink for FakeStatusSink {
    async fn write(&self, domain: &DomainRef, status: &DomainStatus) -> Result<(), PortError> {
        lock(&self.failure).take()?;
        lock(&self.writes).push(StatusWrite {
            writer: self.writer.clone(),
            domain: domain.clone(),
            status: status.clone(),
        });
        Ok(())
    }

    async fn read(&self, domain: &DomainRef) -> Result<Option<DomainStatus>, PortError> {
        lock(&self.read_failure).take()?;
        Ok(self.latest(&domain.uid.0).map(|w| w.status))
    }
}

#[derive(Debug, Clone, Default)]
pub struct FakeEventSink {
    events: Arc<Mutex<Vec<(DomainRef, DomainEvent)>>>,
    failure: Arc<Mutex<Failure>>,
}

impl FakeEventSink {
    pub fn events(&self) -> Vec<(DomainRef, DomainEvent)> {
        lock(&self.events).clone()
    }

    pub fn fail_next(&self, times: u32, message: &str) {
        *lock(&self.failure) = Failure::transient(times, message);
    }
}

#[async_trait]
impl EventSink for FakeEventSink {
    async fn emit(&self, domain: &DomainRef, event: DomainEvent) -> Result<(), PortError> {
        lock(&self.failure).take()?;
        lock(&self.events).push((domain.clone(), event));
        Ok(())
    }
}

// ---------------------------------------------------------------------------
// Claims and checkpoint

/// Claims by UID, shared by every node of a test.
#[derive(Debug, Clone, Default)]
pub struct FakeClaimSource {
    claims: Arc<Mutex<BTreeMap<String, Result<ClaimInfo, ClaimError>>>>,
    lookups: Arc<Mutex<Vec<String>>>,
}

impl FakeClaimSource {
    pub fn insert(&self, uid: &str, result: Result<ClaimInfo, ClaimError>) {
        lock(&self.claims).insert(uid.to_owned(), result);
    }

    pub fn lookups(&self) -> Vec<String> {
        lock(&self.lookups).clone()
    }
}

#[async_trait]
impl ClaimSource for FakeClaimSource {
    async fn resolve(&self, claim: &ClaimRef) -> Result<ClaimInfo, ClaimError> {
        lock(&self.lookups).push(claim.uid.clone());
        lock(&self.claims)
            .get(&claim.uid)
            .cloned()
            .unwrap_or_else(|| {
                Err(ClaimError::Transient(format!(
                    "claim {}/{} ({}) not found",
                    claim.namespace, claim.name, claim.uid
                )))
            })
    }
}

/// A checkpoint kept in memory; it outlives the node that wrote it, as a file would.
/// Like the file store, it takes every change in, in call order, and a failed record
/// leaves its changes taken but not saved: the next record that succeeds saves them.
#[derive(Debug, Clone, Default)]
pub struct FakeCheckpointStore {
    taken: Arc<Mutex<Checkpoint>>,
    saved: Arc<Mutex<Option<Checkpoint>>>,
    saves: Arc<Mutex<usize>>,
    failure: Arc<Mutex<Failure>>,
}

impl FakeCheckpointStore {
    /// A store whose last saved checkpoint is `checkpoint`, as a node finds it at start.
    pub fn holding(checkpoint: Checkpoint) -> Self {
        let store = Self::default();
        *lock(&store.taken) = checkpoint.clone();
        *lock(&store.saved) = Some(checkpoint);
        store
    }

    pub fn saved(&self) -> Option<Checkpoint> {
        lock(&self.saved).clone()
    }

    pub fn saves(&self) -> usize {
        *lock(&self.saves)
    }

    pub fn fail_next(&self, times: u32, message: &str) {
        *lock(&self.failure) = Failure::transient(times, message);
    }
}

#[async_trait]
impl CheckpointStore for FakeCheckpointStore {
    async fn load(&self) -> Result<Checkpoint, PortError> {
        let saved = lock(&self.saved).clone().unwrap_or_default();
        *lock(&self.taken) = saved.clone();
        Ok(saved)
    }

    fn record(&self, changes: Vec<CheckpointChange>) -> Recorded {
        let mut taken = lock(&self.taken);
        for change in changes {
            taken.apply(change);
        }
        let result = lock(&self.failure).take().map(|()| {
            *lock(&self.saves) += 1;
            *lock(&self.saved) = Some(taken.clone());
        });
        Box::pin(std::future::ready(result))
    }
}

/// Wall-clock milliseconds that follow tokio's (pausable) clock from a fixed start.
#[derive(Debug, Clone)]
pub struct FakeClock {
    start: tokio::time::Instant,
    base_ms: u64,
}

impl FakeClock {
    pub fn new(base_ms: u64) -> Self {
        Self {
            start: tokio::time::Instant::now(),
            base_ms,
        }
    }
}

impl Clock for FakeClock {
    fn now_ms(&self) -> u64 {
        self.base_ms + self.start.elapsed().as_millis() as u64
    }
}
