//! What the kubelet asks of a node, in our words. The gRPC servers translate both DRA
//! versions into these calls and back, so the node's logic never sees a protobuf.

use async_trait::async_trait;
use domaind_actors::model::ClaimRef;
use domaind_actors::ports::{ErrorKind, PortError};

/// One device a prepared claim was given, as the kubelet reports it to the runtime.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PreparedDevice {
    /// The claim's requests this device satisfies (`channel`).
    pub request_names: Vec<String>,
    /// The ResourceSlice pool: the node.
    pub pool_name: String,
    /// The device the scheduler allocated, e.g. `channel-0`.
    pub device_name: String,
    /// Fully qualified CDI ids: `k8s.compute-domain.nvidia.com/claim=<name>`.
    pub cdi_device_ids: Vec<String>,
}

/// Why one claim was not prepared or unprepared: goes into the claim's `error` field of
/// the response, never the gRPC status, so the other claims of a request still get
/// their answers.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct ClaimFailure {
    /// What is wrong and, for permanent failures, what to fix.
    pub message: String,
    /// The kubelet calls again in any case; this says whether calling again can help,
    /// for logs and metrics.
    pub retryable: bool,
}

impl ClaimFailure {
    pub fn retryable(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: true,
        }
    }

    pub fn permanent(message: impl Into<String>) -> Self {
        Self {
            message: message.into(),
            retryable: false,
        }
    }
}

/// A failed release or prepare seen from outside the kubelet (the stale claim checker):
/// whether calling again can help is the port error's kind.
impl From<ClaimFailure> for PortError {
    fn from(failure: ClaimFailure) -> Self {
        let kind = if failure.retryable {
            ErrorKind::Transient
        } else {
            ErrorKind::Permanent
        };
        PortError::from_source(kind, failure)
    }
}

/// The node, as the DRA servers see it. Calls for different claims run concurrently;
/// calls for the same claim may too, and must be safe.
#[async_trait]
pub trait NodePlugin: Send + Sync + 'static {
    /// Prepares a claim allocated to this node: answers once the claim's readiness
    /// policy holds, or with a retryable failure that says what it waits for.
    async fn prepare(&self, claim: ClaimRef) -> Result<Vec<PreparedDevice>, ClaimFailure>;

    /// Releases a claim. A claim this node does not know succeeds.
    async fn unprepare(&self, claim: ClaimRef) -> Result<(), ClaimFailure>;
}
