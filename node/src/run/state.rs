//! A node's state as JSON (`GET /state`): what the demo's table and the chaos
//! harness read. Stable field names; new fields may be added.

use std::collections::BTreeMap;

use domaind_actors::NodeSnapshot;
use domaind_actors::model::{NodeId, Phase, Slot};
use serde::{Deserialize, Serialize};

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
    /// The IMEX peer set this node applied: slot to node.
    pub peers: BTreeMap<Slot, NodeId>,
    pub reporter: Option<NodeId>,
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
                    peers: d
                        .peer_set
                        .peers
                        .into_iter()
                        .map(|(slot, peer)| (slot, peer.node))
                        .collect(),
                    reporter: d.reporter,
                })
                .collect(),
            gossip: GossipView::default(),
        }
    }
}
