//! Ports: everything the actors need from outside, as traits. Real adapters live
//! where their dependencies are (the node's wiring: gossip, the clock, Kubernetes,
//! IMEX, files), so the core builds without them. Fakes are in [`crate::testing`].

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use futures::future::BoxFuture;
use futures::stream::BoxStream;
use serde::{Deserialize, Serialize};

use domaind_membership::Membership;

use crate::model::{
    ChannelId, ClaimInfo, ClaimRef, DomainRef, DomainUid, NodeId, ReadinessPolicy, Slot,
};
use crate::rules::peers::PeerSet;
use crate::rules::status::DomainStatus;

pub use crate::port_error::{ErrorKind, PortError};

/// This node's gossip membership.
#[async_trait]
pub trait Gossip: Send + Sync + 'static {
    fn node(&self) -> NodeId;
    /// Publishes a key of this node.
    async fn set(&self, key: &str, value: &str);
    /// Deletes a key of this node; peers see the deletion.
    async fn delete(&self, key: &str);
    /// Live members (this node included) and their keys.
    fn live(&self) -> Membership;
    /// Snapshots of `live()`, starting with the current one; a slow reader skips to
    /// the newest, so bursts of changes cost one snapshot.
    fn updates(&self) -> BoxStream<'static, Membership>;
}

/// What the local IMEX daemon reports.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ImexStatus {
    /// The daemon process is running.
    pub running: bool,
    /// It reports READY: connected to every peer it can resolve.
    pub ready: bool,
    /// Its connection to each peer, by slot.
    pub links: BTreeMap<Slot, bool>,
    /// Why the daemon is not running, reported once, by the first query after it
    /// ended on its own: its exit status and what it printed last.
    pub exited: Option<String>,
    /// The running daemon serves another config than this node would write, and was
    /// kept because prepared claims use it ([`Imex::claims_in_use`]): why. It is
    /// replaced once they are gone (the domain stops it).
    pub kept: Option<String>,
    /// The running daemon was adopted (a previous node daemon started it), not started
    /// by this one: jobs may be using it.
    pub adopted: bool,
    /// An adopted daemon still serves peers beyond those this node asked for: the
    /// node's view of its domain is filling in after the restart.
    pub catching_up: bool,
}

/// The local `nvidia-imex` daemon (or its simulator).
#[async_trait]
pub trait Imex: Send + Sync + 'static {
    /// Writes the configuration for `peers` and starts the daemon.
    async fn start(&self, peers: &PeerSet) -> Result<(), PortError>;
    /// Applies a new peer set to the running daemon: rewrites the name mapping and
    /// reloads (DNS-names mode), or restarts (IPs mode).
    async fn apply(&self, peers: &PeerSet) -> Result<(), PortError>;
    /// Asks the running daemon to re-resolve and reconnect.
    async fn reload(&self) -> Result<(), PortError>;
    async fn status(&self) -> Result<ImexStatus, PortError>;
    async fn stop(&self) -> Result<(), PortError>;
    /// Resolves once a daemon has exited on its own and no `status` has reported that
    /// exit yet (at once if one already did); a `stop` is no such exit. The caller
    /// then asks `status`, which says why. Polls grow slow while all is well, so a
    /// crash must not wait for one: an adapter that runs the daemon as its child
    /// learns of the exit from the child itself.
    async fn exited(&self);
    /// Whether the daemon outlives this process (a runner keeps it, and the next
    /// process adopts it): then a stop of the node daemon is no departure, and leaves
    /// the daemon and the node's place in its domains as they are.
    fn outlives_node_daemon(&self) -> bool {
        false
    }
    /// Told before each start: whether prepared claims on this node use its IMEX (the
    /// domain resumes claims restored from the checkpoint). A daemon found running
    /// that cannot be adopted (another config, another version) is then kept, not
    /// replaced: replacing it would clean up every import of its jobs.
    fn claims_in_use(&self, _in_use: bool) {}
    /// Told when the daemon starts failing (a failure episode begins: it exited, or
    /// could not start, after a healthy run or none). An NVLink fabric that registered
    /// again is one cause, so the node reads its clique again then.
    fn failing(&self, _episode: u64) {}
}

/// Where a domain's status is written (the ComputeDomain's status, or a file).
#[async_trait]
pub trait StatusSink: Send + Sync + 'static {
    async fn write(&self, domain: &DomainRef, status: &DomainStatus) -> Result<(), PortError>;
    /// The status as last written by anyone, `None` if nothing was. A node taking the
    /// reporter role compares it with what it sees, so as not to drop members it has
    /// not heard of yet; the last node to leave reads it to tell whether the status
    /// still lists nodes.
    async fn read(&self, domain: &DomainRef) -> Result<Option<DomainStatus>, PortError>;
}

/// Something users should see about a domain (Kubernetes Events on the CD).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum DomainEvent {
    NodeJoined {
        node: NodeId,
    },
    NodeLost {
        node: NodeId,
    },
    Ready {
        message: String,
    },
    NotReady {
        message: String,
    },
    PrepareRefused {
        claim: String,
        reason: String,
    },
    /// A node found damaged records in its checkpoint at start and set them aside;
    /// `lost_claims` were left out (and, with the API server, rebuilt from it).
    CheckpointDamaged {
        node: NodeId,
        records: usize,
        lost_claims: Vec<String>,
    },
    /// A node cannot write its state directory: it serves prepares from memory.
    StateNotPersisted {
        node: NodeId,
        error: String,
    },
    /// A node writes its state directory again: what it held in memory is on disk.
    StatePersisted {
        node: NodeId,
    },
    /// `node`'s IMEX daemon serves another config than this release would write, and
    /// is left running because prepared claims use it; it is replaced once none does.
    ImexKept {
        node: NodeId,
        reason: String,
    },
    /// `node`'s IMEX daemon keeps failing (exits, or cannot start) and is restarted
    /// with backoff; `reason` is the first failure's. Once per failure episode.
    ImexFailing {
        node: NodeId,
        reason: String,
    },
    /// A node of the clique's shared IMEX domain (channel isolation) is faulty: every
    /// domain sharing it is told, since its pods' IMEX reconfigures too.
    SharedImexFault {
        node: NodeId,
        /// "lost", "IMEX failing".
        fault: String,
        clique: String,
    },
    /// `node`'s NVLink fabric registered again in another clique: it left the domain
    /// in clique `from` (its peers there saw it leave) and rejoins it in clique `to`.
    /// Told on every domain the node holds a claim of.
    CliqueMoved {
        node: NodeId,
        from: String,
        to: String,
    },
}

#[async_trait]
pub trait EventSink: Send + Sync + 'static {
    async fn emit(&self, domain: &DomainRef, event: DomainEvent) -> Result<(), PortError>;
}

/// Why a claim could not be resolved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ClaimError {
    /// Will not get better by asking again: bad config, namespace mismatch, unknown CD.
    #[error("{0}")]
    Permanent(String),
    /// May get better: the API is unreachable, the CD not yet in the cache.
    #[error("{0}")]
    Transient(String),
}

/// Resolves a prepared claim to its domain.
#[async_trait]
pub trait ClaimSource: Send + Sync + 'static {
    async fn resolve(&self, claim: &ClaimRef) -> Result<ClaimInfo, ClaimError>;
}

/// How far a claim's prepare got.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub enum PrepareState {
    /// Accepted and joining its domain; the kubelet has not had a success yet.
    #[default]
    PrepareStarted,
    /// Answered with success at least once.
    PrepareCompleted,
}

/// A claim this node has accepted, as the checkpoint keeps it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClaimRecord {
    pub claim: ClaimRef,
    pub info: ClaimInfo,
    pub policy: ReadinessPolicy,
    #[serde(default)]
    pub state: PrepareState,
    /// The CDI device ids the claim was given (filled by the DRA plugin).
    #[serde(default)]
    pub devices: Vec<String>,
    /// Channel isolation: the channel the claim was given (its domain's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<ChannelId>,
}

/// What survives a daemon restart.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Checkpoint {
    /// By claim UID.
    pub claims: BTreeMap<String, ClaimRecord>,
    /// The slot this node last held in each domain: its preference when it rejoins.
    pub slots: BTreeMap<DomainUid, Slot>,
}

/// One change to what survives a restart. A store records changes, not whole
/// checkpoints: what a prepare costs on disk must not grow with the claims held.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum CheckpointChange {
    /// A claim accepted or updated: its whole record, which replaces any earlier one.
    Claim(ClaimRecord),
    /// A claim released, by uid.
    ClaimGone(String),
    /// The slot this node holds in a domain.
    Slot { domain: DomainUid, slot: Slot },
    /// The node no longer holds a slot in this domain.
    SlotGone(DomainUid),
}

impl Checkpoint {
    /// The checkpoint after `change`.
    pub fn apply(&mut self, change: CheckpointChange) {
        match change {
            CheckpointChange::Claim(record) => {
                self.claims.insert(record.claim.uid.clone(), record);
            }
            CheckpointChange::ClaimGone(uid) => {
                self.claims.remove(&uid);
            }
            CheckpointChange::Slot { domain, slot } => {
                self.slots.insert(domain, slot);
            }
            CheckpointChange::SlotGone(domain) => {
                self.slots.remove(&domain);
            }
        }
    }
}

/// A record's completion: resolves once the changes are recorded.
pub type Recorded = BoxFuture<'static, Result<(), PortError>>;

#[async_trait]
pub trait CheckpointStore: Send + Sync + 'static {
    /// What was recorded before this process started. Called once, before any
    /// [`record`](Self::record).
    async fn load(&self) -> Result<Checkpoint, PortError>;

    /// Records `changes`. They are taken in before this returns, so calls are recorded
    /// in the order they were made, whenever their futures are polled; the future
    /// resolves once they (and everything taken before them) are recorded. With no
    /// changes it is a barrier: it resolves once everything taken before is.
    fn record(&self, changes: Vec<CheckpointChange>) -> Recorded;
}

/// Wall-clock time, for seniority (`joined_at_ms`). Timeouts use tokio's clock.
pub trait Clock: Send + Sync + 'static {
    fn now_ms(&self) -> u64;
}

/// Every port a node needs.
#[derive(Clone)]
pub struct Ports {
    pub gossip: Arc<dyn Gossip>,
    pub imex: Arc<dyn Imex>,
    pub status: Arc<dyn StatusSink>,
    pub events: Arc<dyn EventSink>,
    pub claims: Arc<dyn ClaimSource>,
    pub checkpoint: Arc<dyn CheckpointStore>,
    pub clock: Arc<dyn Clock>,
    /// Where the node publishes its prepared devices' health (not I/O: a view its
    /// readers, the kubelet plugin and the backend, subscribe to).
    pub health: crate::health_board::HealthBoard,
}

impl std::fmt::Debug for Ports {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ports")
            .field("node", &self.gossip.node())
            .finish_non_exhaustive()
    }
}
