//! What a prepare call answers.

use serde::{Deserialize, Serialize};

use crate::model::{AllocatedDevice, AllocationMode, DomainRef, DomainUid, NodeId, Slot};

/// A prepared claim: what the DRA plugin turns into CDI devices.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Prepared {
    pub claim_uid: String,
    pub domain: DomainRef,
    pub node: NodeId,
    pub allocation_mode: AllocationMode,
    pub slot: Option<Slot>,
    /// As the claim source resolved them.
    pub devices: Vec<AllocatedDevice>,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PrepareError {
    /// One IMEX daemon per node: a node serves one domain at a time.
    #[error(
        "node {node} already serves ComputeDomain {active}; claim {claim} asks for ComputeDomain \
         {requested}. A node serves one ComputeDomain at a time: schedule the pod on another \
         node, or wait until the pods of {active} on this node are gone"
    )]
    Busy {
        node: NodeId,
        claim: String,
        requested: String,
        active: String,
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
