//! [`StatusSink`] for a cluster: server-side apply of the ComputeDomain's status
//! subresource.
//!
//! Apply with `force` and no resourceVersion cannot conflict: there is no 409 to
//! retry, whatever else writes. Only the domain's reporter writes (the actors see to
//! that), so the node's field manager owns the status fields, and the controller,
//! which never writes per-node status, applies under a field manager of its own.
//!
//! The body carries the domain's uid: the API server refuses (422, uid immutable) an
//! apply to a ComputeDomain that was deleted and recreated under the same name, so a
//! late write never lands on its successor. A domain that is gone (deleted, or
//! recreated) is not an error: there is nothing left to report on.

use std::time::Duration;

use ::kube::Client;
use ::kube::api::{Api, ApiResource, DynamicObject, Patch, PatchParams};
use async_trait::async_trait;
use domaind_actors::model::DomainRef;
use domaind_actors::ports::{PortError, StatusSink};
use domaind_actors::rules::status::DomainStatus;
use serde_json::json;
use time::OffsetDateTime;
use tracing::{debug, info};

use super::domains::DomainCache;
use crate::contract::{domain_from_status, status_from_domain};
use domaind_kube_api::api::{ApiError, bounded};
use domaind_kube_api::crd::{ComputeDomain, GROUP, VERSION};
use domaind_kube_api::names::NODE_FIELD_MANAGER;

/// Counts status writes by backend and outcome (`ok`, `failed`, `gone`).
pub const STATUS_WRITES: &str = "domaind_status_writes_total";

#[derive(Clone)]
pub struct KubeStatusSink {
    client: Client,
    domains: DomainCache,
    timeout: Duration,
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
        }
    }
}

fn count(outcome: &'static str) {
    metrics::counter!(STATUS_WRITES, "backend" => "kube", "outcome" => outcome).increment(1);
}

/// The apply body: identity (the uid makes it conditional) and the status.
pub fn status_apply_body(
    domain: &DomainRef,
    status: &domaind_kube_api::crd::ComputeDomainStatus,
) -> serde_json::Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "ComputeDomain",
        "metadata": {
            "name": domain.name,
            "namespace": domain.namespace,
            "uid": domain.uid.0,
        },
        "status": status,
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
        let document = status_from_domain(
            status,
            cached.status.as_ref(),
            cached.metadata.generation,
            OffsetDateTime::now_utc(),
        );
        // The answer is read as any object: a write that landed is not a failure
        // because the domain's spec would not decode into our type.
        let api = Api::<DynamicObject>::namespaced_with(
            self.client.clone(),
            &domain.namespace,
            &ApiResource::erase::<ComputeDomain>(&()),
        );
        let body = status_apply_body(domain, &document);
        let applied = bounded(
            format!("apply the status of ComputeDomain {domain}"),
            self.timeout,
            api.patch_status(
                &domain.name,
                &PatchParams::apply(NODE_FIELD_MANAGER).force(),
                &Patch::Apply(&body),
            ),
        )
        .await;
        match applied {
            Ok(_) => {
                count("ok");
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
    /// fresh as any read (another node's write may land right after either).
    async fn read(&self, domain: &DomainRef) -> Result<Option<DomainStatus>, PortError> {
        match self.domains.by_uid(&domain.uid.0) {
            Some(cached) => Ok(cached.status.as_ref().map(domain_from_status)),
            None if self.domains.is_synced() => Ok(None),
            None => Err(PortError::transient(format!(
                "status of {domain} not read: the ComputeDomain cache has not synced yet"
            ))),
        }
    }
}
