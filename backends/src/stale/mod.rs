//! Stale checkpointed claims: a claim this node prepared whose ResourceClaim or
//! ComputeDomain no longer exists. The kubelet unprepares a claim when its pod goes;
//! when that happens while the daemon is down (or the claim is force-deleted), nothing
//! ever unprepares it, and since a node serves one ComputeDomain at a time the
//! leftover claim would make the node refuse every other domain for good.
//!
//! [`StaleClaimChecker`] asks about every checkpointed claim at start-up and then
//! periodically, judges the answers with [`rule::stale_claims`] (pure), and releases
//! the stale ones through the kubelet's own unprepare path ([`NodeClaims`]: the node
//! actor's `Unprepare`, then the claim's CDI spec), with an event and a metric. What it
//! asks and whom it tells are backend adapters: the Kubernetes API server
//! (`crate::kube::stale`) or the local backend's files (`crate::local::stale`).

pub mod rule;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use async_trait::async_trait;
use domaind_actors::model::{ClaimRef, DomainRef, DomainUid};
use domaind_actors::ports::{ClaimRecord, PortError};
use domaind_actors::{GetClaims, NodeActor};
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use rule::{FoundClaim, FoundDomain, Lookup, StaleClaim, StaleReason, Verdicts, stale_claims};

use crate::events::{EventText, NodeEventReason};
use domaind_kubelet_plugin::NodePlugin;

/// Stale claims released, by `reason` ([`StaleReason::label`]).
pub const STALE_CLAIMS_RELEASED: &str = "domaind_stale_claims_released_total";

/// Checks, by `outcome`: `clean` (every claim decided), `undecided` (a lookup failed:
/// those claims are kept and asked about again next time), `failed` (a release failed,
/// or the node's claims could not be read).
pub const STALE_CLAIM_CHECKS: &str = "domaind_stale_claim_checks_total";

/// What the cluster says about the objects a checkpointed claim names. Answers
/// [`Lookup::NotFound`] only when it is certain; anything else it cannot tell is
/// [`Lookup::Failed`].
#[async_trait]
pub trait ClaimExistence: Send + Sync {
    async fn claim(&self, claim: &ClaimRef) -> Lookup<FoundClaim>;
    async fn domain(&self, domain: &DomainRef) -> Lookup<FoundDomain>;
}

/// The node's side: its checkpointed claims, and how one is released.
#[async_trait]
pub trait PreparedClaims: Send + Sync {
    async fn claims(&self) -> Result<Vec<ClaimRecord>, PortError>;
    /// Releases a claim as an unprepare would. A claim already gone succeeds.
    async fn release(&self, claim: &ClaimRef) -> Result<(), PortError>;
}

/// Whom a release is told to (an event).
#[async_trait]
pub trait StaleClaimNotices: Send + Sync {
    async fn released(&self, stale: &StaleClaim) -> Result<(), PortError>;
}

/// The event's text, the same for every backend.
pub fn released_event(stale: &StaleClaim, node: &str) -> EventText {
    let event = NodeEventReason::StaleClaimReleased;
    EventText::new(
        event.status(),
        event.as_str(),
        format!(
            "node {node} released {stale}; it was prepared here and never unprepared (the \
             daemon was down when it went, or it was force-deleted), and the node can serve \
             another ComputeDomain now"
        ),
    )
}

/// What one check did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    pub released: Vec<StaleClaim>,
    /// `(claim uid, why)`: kept, for want of a definite answer.
    pub undecided: Vec<(String, String)>,
    /// `(claim uid, why)`: stale, but the release failed; tried again next check.
    pub failed: Vec<(String, PortError)>,
}

/// Releases stale checkpointed claims; see the module.
#[derive(Clone)]
pub struct StaleClaimChecker {
    existence: Arc<dyn ClaimExistence>,
    node: Arc<dyn PreparedClaims>,
    notices: Arc<dyn StaleClaimNotices>,
}

impl std::fmt::Debug for StaleClaimChecker {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaleClaimChecker").finish_non_exhaustive()
    }
}

impl StaleClaimChecker {
    pub fn new(
        existence: Arc<dyn ClaimExistence>,
        node: Arc<dyn PreparedClaims>,
        notices: Arc<dyn StaleClaimNotices>,
    ) -> Self {
        Self {
            existence,
            node,
            notices,
        }
    }

    /// One check of every checkpointed claim.
    pub async fn check(&self) -> CheckReport {
        let mut report = CheckReport::default();
        let records = match self.node.claims().await {
            Ok(records) => records,
            Err(error) => {
                metrics::counter!(STALE_CLAIM_CHECKS, "outcome" => "failed").increment(1);
                warn!(%error, "cannot read this node's claims to look for stale ones");
                return report;
            }
        };
        // A node with no claims costs the API server nothing.
        if records.is_empty() {
            metrics::counter!(STALE_CLAIM_CHECKS, "outcome" => "clean").increment(1);
            return report;
        }
        let mut claims = BTreeMap::new();
        let mut domains: BTreeMap<DomainUid, &DomainRef> = BTreeMap::new();
        for record in &records {
            claims.insert(
                record.claim.uid.clone(),
                self.existence.claim(&record.claim).await,
            );
            domains
                .entry(record.info.domain.uid.clone())
                .or_insert(&record.info.domain);
        }
        let mut found = BTreeMap::new();
        for (uid, domain) in domains {
            found.insert(uid, self.existence.domain(domain).await);
        }
        let verdicts = stale_claims(&records, &claims, &found);
        for (claim, why) in &verdicts.undecided {
            warn!(%claim, %why, "cannot tell whether a checkpointed claim still exists; keeping it");
        }
        report.undecided = verdicts.undecided;
        for stale in verdicts.stale {
            // Its own task: a release is not cut in half (node actor done, CDI spec
            // left) when the checker is stopped.
            let node = self.node.clone();
            let claim = stale.claim.clone();
            let released = tokio::spawn(async move { node.release(&claim).await })
                .await
                .unwrap_or_else(|e| {
                    Err(PortError::permanent("the release panicked").with_source(e))
                });
            match released {
                Ok(()) => {
                    metrics::counter!(STALE_CLAIMS_RELEASED, "reason" => stale.reason.label())
                        .increment(1);
                    info!(claim = %stale, "stale claim released");
                    if let Err(error) = self.notices.released(&stale).await {
                        warn!(%error, "the stale claim's release was not recorded as an event");
                    }
                    report.released.push(stale);
                }
                Err(error) => {
                    warn!(claim = %stale, %error, "stale claim not released; trying again at the next check");
                    report.failed.push((stale.claim.uid.clone(), error));
                }
            }
        }
        let outcome = if !report.failed.is_empty() {
            "failed"
        } else if !report.undecided.is_empty() {
            "undecided"
        } else {
            "clean"
        };
        metrics::counter!(STALE_CLAIM_CHECKS, "outcome" => outcome).increment(1);
        report
    }

    /// Checks now, then every `interval`, until `stop`.
    pub async fn run(self, interval: Duration, stop: CancellationToken) {
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = self.check() => {}
            }
            tokio::select! {
                () = stop.cancelled() => return,
                () = tokio::time::sleep(interval) => {}
            }
        }
    }
}

/// [`PreparedClaims`] of a running node: the node actor's checkpointed claims, released
/// through the DRA plugin's unprepare (the kubelet's path: the node actor forgets the
/// claim and leaves its domain with the last one, then the CDI spec is removed).
pub struct NodeClaims {
    node: Addr<NodeActor>,
    plugin: Arc<dyn NodePlugin>,
}

impl std::fmt::Debug for NodeClaims {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("NodeClaims").finish_non_exhaustive()
    }
}

impl NodeClaims {
    pub fn new(node: Addr<NodeActor>, plugin: Arc<dyn NodePlugin>) -> Self {
        Self { node, plugin }
    }
}

#[async_trait]
impl PreparedClaims for NodeClaims {
    async fn claims(&self) -> Result<Vec<ClaimRecord>, PortError> {
        self.node
            .send(GetClaims)
            .await
            .map_err(|e| PortError::permanent("the node is shutting down").with_source(e))
    }

    async fn release(&self, claim: &ClaimRef) -> Result<(), PortError> {
        self.plugin
            .unprepare(claim.clone())
            .await
            .map_err(PortError::from)
    }
}

#[cfg(test)]
mod tests;
