//! [`StatusSink`] for a cluster: server-side apply of the ComputeDomain's status
//! subresource.
//!
//! Apply with `force` and no resourceVersion cannot conflict: there is no 409 to
//! retry, whatever else writes. Only the domain's reporter of each NVLink clique writes
//! (the actors see to that), under its clique's field manager: it owns its clique's
//! rows of `status.nodes`, and the domain-wide fields are computed from every clique's
//! rows (`rules::status_cliques`). When two cliques write at once, each from a cache
//! without the other's latest rows, the domain-wide fields of the last write are stale:
//! [`KubeStatusSink::keep_domain_fields`] corrects them from the rows once the watch
//! has both. The controller, which never writes per-node status, applies under a field
//! manager of its own.
//!
//! The body carries the domain's uid: the API server refuses (422, uid immutable) an
//! apply to a ComputeDomain that was deleted and recreated under the same name, so a
//! late write never lands on its successor. A domain that is gone (deleted, or
//! recreated) is not an error: there is nothing left to report on.

use std::collections::BTreeMap;
use std::time::Duration;

use ::kube::Client;
use ::kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use async_trait::async_trait;
use domaind_actors::model::DomainRef;
use domaind_actors::ports::{PortError, StatusSink};
use domaind_actors::rules::status::{DomainStatus, digest};
use domaind_actors::rules::status_cliques::{clique_part, merged, other_cliques_rows};
use serde_json::json;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::domains::DomainCache;
use crate::contract::{domain_from_status, status_from_domain};
use domaind_kube_api::api::{ApiError, bounded};
use domaind_kube_api::crd::{ComputeDomain, GROUP, VERSION};
use domaind_kube_api::names::{
    DOMAIN_STATUS_FIELD_MANAGER, NODE_FIELD_MANAGER, status_field_manager,
};

/// Counts status writes by backend and outcome (`ok`, `failed`, `gone`).
pub const STATUS_WRITES: &str = "domaind_status_writes_total";

/// Corrections of a domain's domain-wide status fields after cliques wrote at once,
/// by `outcome` (`ok`, `failed`).
pub const STATUS_CORRECTIONS: &str = "domaind_status_domain_corrections_total";

#[derive(Clone)]
pub struct KubeStatusSink {
    client: Client,
    domains: DomainCache,
    timeout: Duration,
    /// This node's name and NVLink clique: whose rows it writes.
    node: String,
    clique: watch::Receiver<String>,
}

// The client has no Debug of its own.
impl std::fmt::Debug for KubeStatusSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStatusSink")
            .field("domains", &self.domains)
            .finish_non_exhaustive()
    }
}

impl KubeStatusSink {
    pub fn new(client: Client, domains: DomainCache, timeout: Duration) -> Self {
        Self {
            client,
            domains,
            timeout,
            node: String::new(),
            clique: watch::channel(String::new()).1,
        }
    }

    /// Writes as `node`, of the clique `clique` holds (without it: an unnamed node of
    /// the empty clique, which corrects nothing).
    pub fn for_node(mut self, node: impl Into<String>, clique: watch::Receiver<String>) -> Self {
        self.node = node.into();
        self.clique = clique;
        self
    }

    /// One forced server-side apply of the status subresource as `manager`; `what` the
    /// write is, for the error.
    async fn apply(
        &self,
        domain: &DomainRef,
        what: &str,
        manager: &str,
        body: &serde_json::Value,
    ) -> Result<DynamicObject, ApiError> {
        // The answer is read as any object: a write that landed is not a failure
        // because the domain's spec would not decode into our type.
        let api = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            &domain.namespace,
            &ApiResource::erase::<ComputeDomain>(&()),
        );
        bounded(
            format!("{what} the status of ComputeDomain {domain} ({manager})"),
            self.timeout,
            api.patch_status(
                &domain.name,
                &PatchParams::apply(manager).force(),
                &Patch::Apply(body),
            ),
        )
        .await
    }

    /// Keeps the domain-wide fields of the domains spanning cliques that this node
    /// corrects ([`corrector`]) equal to what every clique's rows say, until `stop`: on
    /// every change the watch brings, such a domain whose fields differ from its rows
    /// is corrected by one apply of those fields alone (no rows: they stay their
    /// cliques').
    pub async fn keep_domain_fields(self, stop: CancellationToken) {
        let mut changes = self.domains.changes();
        let mut corrected = BTreeMap::new();
        loop {
            self.correct_every_domain(&mut corrected).await;
            // A change that came with the stop is still looked at: what it asked for
            // was seen before the stop.
            tokio::select! {
                biased;
                changed = changes.changed() => if changed.is_err() { return },
                () = stop.cancelled() => return,
            }
        }
    }

    /// `corrected`: the rows (their digest) each domain was last corrected for, by uid.
    /// The same rows are corrected once: should what the server keeps ever differ from
    /// what was applied, a correction on every watch event would be a write storm.
    async fn correct_every_domain(&self, corrected: &mut BTreeMap<String, String>) {
        corrected.retain(|uid, _| self.domains.by_uid(uid).is_some());
        for cd in self.domains.snapshot() {
            let Some(written) = cd.status.as_ref() else {
                continue;
            };
            // Most domains do not list this node: skip them before converting anything.
            if !written.nodes.iter().any(|n| n.name == self.node) {
                continue;
            }
            let rows = domain_from_status(written);
            if corrector(&rows) != Some(self.node.as_str()) {
                continue;
            }
            let Some(domain) = super::domains::domain_ref(&cd) else {
                continue;
            };
            let right = domain_wide(&rows, domain.num_nodes);
            let fields =
                |d: &DomainStatus| (d.status, d.ready_nodes, d.total_nodes, d.message.clone());
            if fields(&right) == fields(&rows) {
                continue;
            }
            let rows_digest = digest(&right);
            if corrected.get(&domain.uid.0) == Some(&rows_digest) {
                continue;
            }
            if self.correct_domain_fields(&domain, &cd, &right).await {
                corrected.insert(domain.uid.0.clone(), rows_digest);
            }
        }
    }

    /// Whether the correction landed (or the domain is gone).
    async fn correct_domain_fields(
        &self,
        domain: &DomainRef,
        cached: &ComputeDomain,
        right: &DomainStatus,
    ) -> bool {
        let mut document = status_from_domain(
            right,
            cached.status.as_ref(),
            cached.metadata.generation,
            OffsetDateTime::now_utc(),
        );
        // The rows and the channel stay their writers'.
        document.nodes.clear();
        document.channel = None;
        let mut body = status_apply_body(domain, &document);
        if let Some(status) = body["status"].as_object_mut() {
            status.remove("nodes");
            status.remove("channel");
        }
        let applied = self
            .apply(domain, "correct", DOMAIN_STATUS_FIELD_MANAGER, &body)
            .await;
        let outcome = match &applied {
            Ok(_) => "ok",
            Err(error) if gone(error) => "ok",
            Err(_) => "failed",
        };
        metrics::counter!(STATUS_CORRECTIONS, "outcome" => outcome).increment(1);
        match applied {
            Ok(_) => {
                debug!(%domain, message = %right.message, "domain-wide status corrected from every clique's rows");
                true
            }
            Err(error) if gone(&error) => true,
            Err(error) => {
                warn!(%domain, %error, "domain-wide status not corrected; the next change tries again");
                false
            }
        }
    }

    /// Once this clique's manager has written, the manager that wrote the whole status
    /// before per-clique managers existed gives up its fields: what it alone held
    /// (rows of nodes gone since) would otherwise stay listed forever.
    async fn release_whole_status_manager(&self, domain: &DomainRef, answer: &DynamicObject) {
        let held = answer
            .metadata
            .managed_fields
            .iter()
            .flatten()
            .any(|entry| {
                entry.manager.as_deref() == Some(NODE_FIELD_MANAGER)
                    && entry.subresource.as_deref() == Some("status")
            });
        if !held {
            return;
        }
        let released = self
            .apply(domain, "release", NODE_FIELD_MANAGER, &identity(domain))
            .await;
        match released {
            Ok(_) => {
                info!(%domain, "status rows now owned per clique; the whole-status manager released")
            }
            Err(error) if gone(&error) => {}
            Err(error) => {
                warn!(%domain, %error, "the whole-status manager not released; the next write tries again")
            }
        }
    }
}

fn count(outcome: &'static str) {
    metrics::counter!(STATUS_WRITES, "backend" => "kube", "outcome" => outcome).increment(1);
}

/// The node that corrects a domain's domain-wide fields when its rows span cliques:
/// the ready row with the smallest name (the smallest of all when none is ready), so
/// that one node of the whole domain does it. `None` for a domain of one clique, whose
/// reporter writes the whole truth with its detailed reasons.
pub fn corrector(rows: &DomainStatus) -> Option<&str> {
    let mut cliques = rows.nodes.iter().map(|n| n.clique_id.as_str());
    let first = cliques.next()?;
    if cliques.all(|c| c == first) {
        return None;
    }
    rows.nodes
        .iter()
        .filter(|n| n.status == domaind_actors::model::Phase::Ready)
        .map(|n| n.name.as_str())
        .min()
        .or_else(|| rows.nodes.iter().map(|n| n.name.as_str()).min())
}

/// The domain-wide fields every clique's `rows` say.
pub fn domain_wide(rows: &DomainStatus, num_nodes: u32) -> DomainStatus {
    let mut none = rows.clone();
    none.nodes.clear();
    merged(&none, &rows.nodes, num_nodes)
}

/// The apply body: identity (the uid makes it conditional) and the status.
pub fn status_apply_body(
    domain: &DomainRef,
    status: &domaind_kube_api::crd::ComputeDomainStatus,
) -> serde_json::Value {
    let mut body = identity(domain);
    body["status"] = json!(status);
    body
}

/// An apply body with the domain's identity and nothing else: applied, its manager
/// gives up every field it held.
fn identity(domain: &DomainRef) -> serde_json::Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "ComputeDomain",
        "metadata": {
            "name": domain.name,
            "namespace": domain.namespace,
            "uid": domain.uid.0,
        },
    })
}

fn gone(error: &ApiError) -> bool {
    match error {
        ApiError::Status { code: 404, .. } => true,
        ApiError::Status {
            code: 422, message, ..
        } => message.contains("metadata.uid"),
        _ => false,
    }
}

#[async_trait]
impl StatusSink for KubeStatusSink {
    async fn write(&self, domain: &DomainRef, status: &DomainStatus) -> Result<(), PortError> {
        let cached = self.domains.by_uid(&domain.uid.0);
        if cached.is_none() {
            if self.domains.is_synced() {
                count("gone");
                debug!(%domain, "ComputeDomain gone; status not written");
                return Ok(());
            }
            count("failed");
            // Without the cache there is no previous status (the Ready condition's
            // transition time) nor generation: wait for it rather than write a worse
            // document. The status writer retries.
            return Err(PortError::transient(format!(
                "status of {domain} not written: the ComputeDomain cache has not synced yet"
            )));
        }
        let cached = cached.expect("checked above");
        let clique = self.clique.borrow().clone();
        let others = cached
            .status
            .as_ref()
            .map(|written| other_cliques_rows(&domain_from_status(written), &clique, status))
            .unwrap_or_default();
        let whole = merged(status, &others, domain.num_nodes);
        let mut document = status_from_domain(
            &whole,
            cached.status.as_ref(),
            cached.metadata.generation,
            OffsetDateTime::now_utc(),
        );
        // Only this clique's rows: a row applied here would be this manager's too, and
        // would stay after its own clique dropped it.
        document
            .nodes
            .retain(|row| status.nodes.iter().any(|mine| mine.name == row.name));
        let applied = self
            .apply(
                domain,
                "apply",
                &status_field_manager(&clique),
                &status_apply_body(domain, &document),
            )
            .await;
        match applied {
            Ok(answer) => {
                count("ok");
                self.release_whole_status_manager(domain, &answer).await;
                Ok(())
            }
            Err(error) if gone(&error) => {
                count("gone");
                info!(%domain, %error, "ComputeDomain deleted or recreated; status not written");
                Ok(())
            }
            Err(error) => {
                count("failed");
                Err(super::port_error(error))
            }
        }
    }

    /// From the watch cache: it trails the API server by a watch event, which is as
    /// fresh as any read (another node's write may land right after either). This
    /// clique's rows only: other cliques' nodes are never in this node's view.
    async fn read(&self, domain: &DomainRef) -> Result<Option<DomainStatus>, PortError> {
        match self.domains.by_uid(&domain.uid.0) {
            Some(cached) => Ok(cached
                .status
                .as_ref()
                .map(|written| clique_part(&domain_from_status(written), &self.clique.borrow()))),
            None if self.domains.is_synced() => Ok(None),
            None => Err(PortError::transient(format!(
                "status of {domain} not read: the ComputeDomain cache has not synced yet"
            ))),
        }
    }
}
