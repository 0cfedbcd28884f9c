//! What the node's certificate client asks of the cluster: submit one signing request
//! and wait for its answer. The Kubernetes adapter is `kube`; tests use a fake signer
//! that honours the same contract (it signs only what it approves).

use std::time::Duration;

use async_trait::async_trait;
use domaind_actors::ports::PortError;

/// The signer's answer to one request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Answer {
    /// The certificate, PEM.
    Issued(String),
    /// Denied (or approved and then refused): the condition's reason and message.
    Denied { reason: String, message: String },
}

#[async_trait]
pub trait Signer: Send + Sync {
    /// Submits `csr_pem` for `node`, asking for `lifetime`, and waits for the answer.
    /// `Err` is anything else (the API server, a timeout); the client retries each
    /// with its backoff, whatever its kind, since a node without a certificate has
    /// nothing better to do.
    async fn request(
        &self,
        node: &str,
        csr_pem: &str,
        lifetime: Duration,
    ) -> Result<Answer, PortError>;
}
