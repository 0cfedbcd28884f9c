//! What a prepare call answers.

use serde::{Deserialize, Serialize};

use crate::model::{
    AllocatedDevice, AllocationMode, ChannelId, DomainRef, DomainUid, Isolation, NodeId, Slot,
};

/// A prepared claim: what the DRA plugin turns into CDI devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    pub claim_uid: String,
    pub domain: DomainRef,
    pub node: NodeId,
    pub allocation_mode: AllocationMode,
    pub slot: Option<Slot>,
    /// Channel isolation: the domain's channel; `None`: the default channel.
    pub channel: Option<ChannelId>,
    /// As the claim source resolved them.
    pub devices: Vec<AllocatedDevice>,
    /// An admin claim (`adminAccess`): answered without joining the domain, so no slot
    /// and no channel of the domain's; it gets the channels it was allocated.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub admin_access: bool,
}

impl Prepared {
    /// The answer to an admin claim: at once, from its record alone, since it waits
    /// for no domain.
    pub fn admin(record: &crate::ports::ClaimRecord, node: &NodeId) -> Self {
        Self {
            claim_uid: record.claim.uid.clone(),
            domain: record.info.domain.clone(),
            node: node.clone(),
            allocation_mode: record.info.allocation_mode,
            slot: None,
            channel: None,
            devices: record.info.devices.clone(),
            admin_access: true,
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// One IMEX daemon per node: a node serves one domain at a time, or several that
    /// all share the clique's IMEX domain (`isolation: Channel`).
    #[error(
        "node {node} already serves ComputeDomain {active} (isolation {active_isolation}); \
         claim {claim} asks for ComputeDomain {requested} (isolation {requested_isolation}). \
         A node serves one ComputeDomain at a time unless every ComputeDomain on it has \
         isolation Channel: schedule the pod on another node, or wait until the pods of \
         {active} on this node are gone"
    )]
    Busy {
        node: NodeId,
        claim: String,
        requested: String,
        active: String,
        active_isolation: Isolation,
        requested_isolation: Isolation,
    },
    /// Asking again will not help: the claim or its domain is wrong.
    #[error("{0}")]
    Permanent(String),
    /// Not ready yet; the kubelet should call again.
    #[error("{0}")]
    NotReady(String),
    /// A dependency failed; the kubelet should call again.
    #[error("{0}")]
    Transient(String),
}

impl PrepareError {
    pub fn retryable(&self) -> bool {
        matches!(self, Self::NotReady(_) | Self::Transient(_))
    }
}

pub(crate) fn domain_label(uid: &DomainUid, namespace: &str, name: &str) -> String {
    format!("{namespace}/{name} ({uid})")
}
