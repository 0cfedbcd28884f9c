//! A node's state as JSON (`GET /state`): what the demo's table and the chaos
//! harness read. Stable field names; new fields may be added.

use std::collections::BTreeMap;

use domaind_actors::NodeSnapshot;
use domaind_actors::actors::domain::DomainSnapshot;
use domaind_actors::model::{ChannelId, Isolation, NodeId, Phase, Slot};
use serde::{Deserialize, Serialize};

use domaind_checkpoint::Persistence;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeView {
    pub node: NodeId,
    /// The claims this node holds, by uid: admitted (resolved and checkpointed), whether
    /// or not their prepare has been answered yet.
    pub claims: Vec<String>,
    /// Those of `claims` whose prepare was answered with success: the rest are still
    /// waiting for their domain, or were refused after they were admitted (the kubelet
    /// prepares them again or unprepares them). Absent from daemons older than the
    /// field.
    #[serde(default)]
    pub prepared: Vec<String>,
    pub imex: ImexView,
    pub domains: Vec<DomainView>,
    /// Absent from daemons older than the field.
    #[serde(default)]
    pub gossip: GossipView,
    /// Absent from daemons older than the field.
    #[serde(default)]
    pub checkpoint: CheckpointView,
    /// Channel isolation: the prepared claims given a domain's own channel. What the
    /// chaos harness checks no pod of another domain ever holds.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub channels: Vec<HandedChannel>,
    /// The clique's shared IMEX domain, while this node holds a domain with
    /// `isolation: Channel`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shared_imex: Option<SharedImexView>,
}

/// A prepared claim of a sharing domain, and the channel its pod got.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct HandedChannel {
    pub claim: String,
    /// The ComputeDomain's uid.
    pub domain: String,
    pub channel: ChannelId,
}

/// The clique's shared IMEX domain as this node sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SharedImexView {
    pub uid: String,
    /// Nodes holding a sharing domain in this clique.
    pub members: Vec<NodeId>,
    pub lost: Vec<NodeId>,
    /// This node's slot in it.
    pub slot: Option<Slot>,
    pub local_ready: bool,
    /// The IMEX peer set this node applied: slot to node.
    pub peers: BTreeMap<Slot, NodeId>,
    /// Every sharing domain's channel as this node assigns them, by domain uid.
    pub channels: BTreeMap<String, ChannelId>,
}

/// Whether this node's prepared claims are on disk.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckpointView {
    /// False while the state directory refuses writes: claims are served from memory,
    /// and a restart now would forget those not yet written.
    pub persisted: bool,
    /// Why not, while not.
    #[serde(default)]
    pub error: Option<String>,
}

impl Default for CheckpointView {
    fn default() -> Self {
        Self {
            persisted: true,
            error: None,
        }
    }
}

impl From<&Persistence> for CheckpointView {
    fn from(persistence: &Persistence) -> Self {
        match persistence {
            Persistence::Persisted => Self::default(),
            Persistence::NotPersisted { error, .. } | Persistence::Refused { error } => Self {
                persisted: false,
                error: Some(error.clone()),
            },
        }
    }
}

/// What this node's gossip knows: which cluster it is in and who is live there. The
/// chaos harness and the tests check from it that no member belongs to another clique.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GossipView {
    /// The gossip cluster id: one per NVLink clique.
    pub cluster_id: String,
    /// Live members whose state carries a signed certificate, this node included, by
    /// name.
    pub members: Vec<String>,
    /// How much state chitchat keeps. Absent from daemons older than the field.
    #[serde(default)]
    pub state: GossipStateView,
}

/// The size of the gossip state a node keeps: dead members' states until chitchat
/// forgets them, deleted keys until their grace passes. A soak checks it stays flat.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GossipStateView {
    /// Node states kept, this node's included.
    pub nodes: usize,
    /// Keys over all of them, deleted ones still kept included.
    pub keys: usize,
    /// Bytes of those keys and values.
    pub bytes: usize,
}

impl From<domaind_gossip::StateSize> for GossipStateView {
    fn from(size: domaind_gossip::StateSize) -> Self {
        Self {
            nodes: size.nodes,
            keys: size.keys,
            bytes: size.bytes,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ImexView {
    pub running: bool,
    pub starts: u32,
    /// Starts after the daemon exited on its own.
    pub restarts: u32,
    /// Why the daemon last failed: exited on its own (status, last output) or could
    /// not be started (a port taken, a missing binary).
    #[serde(default)]
    pub last_failure: Option<String>,
    /// How long the restart now waiting waits, in milliseconds.
    #[serde(default)]
    pub restart_delay_ms: Option<u64>,
    /// The daemon is failing: it exited or could not start, and no daemon has stayed
    /// up 10 s since (`domaind_imex_failing`).
    #[serde(default)]
    pub failing: bool,
    /// Failures in a row: starts refused and daemons that exited (0 when not failing).
    #[serde(default)]
    pub failures_in_a_row: u32,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct DomainView {
    pub uid: String,
    pub namespace: String,
    pub name: String,
    pub phase: Phase,
    pub ready: usize,
    pub total: usize,
    /// This node's slot.
    pub slot: Option<Slot>,
    /// This node's IMEX daemon is ready for the current peer set.
    pub local_ready: bool,
    /// Live members advertising the domain, as this node sees them.
    pub members: Vec<NodeId>,
    /// Members that died and are listed NotReady.
    pub lost: Vec<NodeId>,
    /// Members whose daemon is silent while their IMEX lives on: counted as they last
    /// advertised. Absent from daemons older than the field.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub held: Vec<NodeId>,
    /// The IMEX peer set this node applied: slot to node (empty for a domain with
    /// `isolation: Channel`: the shared IMEX domain has it).
    pub peers: BTreeMap<Slot, NodeId>,
    pub reporter: Option<NodeId>,
    /// `spec.isolation`. Absent from daemons older than the field.
    #[serde(default)]
    pub isolation: Isolation,
    /// `isolation: Channel`: the domain's channel, once confirmed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<ChannelId>,
}

impl From<NodeSnapshot> for NodeView {
    fn from(snapshot: NodeSnapshot) -> Self {
        Self {
            node: snapshot.node,
            claims: snapshot.claims,
            // The snapshot does not say; `/state` asks the node for its records.
            prepared: Vec::new(),
            imex: ImexView {
                running: snapshot.imex.running,
                starts: snapshot.imex.starts,
                restarts: snapshot.imex.restarts,
                last_failure: snapshot.imex.last_failure,
                restart_delay_ms: snapshot.imex.restart_delay.map(|d| d.as_millis() as u64),
                failing: snapshot.imex.failing.is_some(),
                failures_in_a_row: snapshot.imex.failures_in_a_row,
            },
            domains: snapshot
                .domains
                .into_iter()
                .map(|d| DomainView {
                    uid: d.domain.uid.0,
                    namespace: d.domain.namespace,
                    name: d.domain.name,
                    phase: d.phase,
                    ready: d.ready,
                    total: d.total,
                    slot: d.my_slot,
                    local_ready: d.local_ready,
                    members: d.members,
                    lost: d.lost,
                    held: d.held,
                    peers: peers(d.peer_set),
                    reporter: d.reporter,
                    isolation: d.isolation,
                    channel: d.channel,
                })
                .collect(),
            gossip: GossipView::default(),
            checkpoint: CheckpointView::default(),
            channels: Vec::new(),
            shared_imex: snapshot.shared_imex.map(shared_imex_view),
        }
    }
}

fn shared_imex_view(d: DomainSnapshot) -> SharedImexView {
    SharedImexView {
        uid: d.domain.uid.0,
        members: d.members,
        lost: d.lost,
        slot: d.my_slot,
        local_ready: d.local_ready,
        peers: peers(d.peer_set),
        channels: d.channels.into_iter().map(|(uid, c)| (uid.0, c)).collect(),
    }
}

fn peers(set: domaind_actors::rules::peers::PeerSet) -> BTreeMap<Slot, NodeId> {
    set.peers
        .into_iter()
        .map(|(slot, peer)| (slot, peer.node))
        .collect()
}
