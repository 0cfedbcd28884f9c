//! The stale-claim check's questions to the API server, and its event.
//!
//! Only a 404 whose body is a `Status` with reason `NotFound` counts as "gone": the
//! API server's answer for an object that does not exist. Anything else (timeouts,
//! 5xx, throttling, a missing RBAC permission, a 404 from something in front of the
//! API server) is a failed lookup, and a failed lookup releases nothing.
//!
//! The event is on the Node (its ResourceClaim and ComputeDomain may both be gone),
//! with the claim as the related object; being about a cluster-scoped object, it lands
//! in the `default` namespace, as the kubelet's node events do.

use std::time::Duration;

use ::kube::Client;
use ::kube::api::Api;
use ::kube::runtime::events::{Event, EventType as KubeEventType, Recorder, Reporter};
use async_trait::async_trait;
use domaind_actors::model::{ClaimRef, DomainRef};
use domaind_actors::ports::PortError;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::resource::v1::ResourceClaim;

use super::claim::allocated_claim;
use super::claims::KubeClaimSource;
use super::events::{EVENTS, NOTE_LIMIT, truncate};
use crate::events::EventType;
use crate::stale::{
    ClaimExistence, FoundClaim, FoundDomain, Lookup, StaleClaim, StaleClaimNotices, released_event,
};
use domaind_kube_api::api::{ApiError, bounded};
use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::names::NODE_REPORTING_CONTROLLER;

/// A lookup's answer from a GET.
fn lookup<T, F>(got: Result<T, ApiError>, found: impl FnOnce(T) -> F) -> Lookup<F> {
    match got {
        Ok(object) => Lookup::Found(found(object)),
        Err(ApiError::Status {
            code: 404, reason, ..
        }) if reason == "NotFound" => Lookup::NotFound,
        Err(error) => Lookup::Failed(error.to_string()),
    }
}

/// [`ClaimExistence`] over the API server, through the same client, ComputeDomain cache
/// and timeout that resolve claims for prepare: one GET per claim, and one per domain the
/// cache does not hold (a domain the cache holds exists).
#[async_trait]
impl ClaimExistence for KubeClaimSource {
    async fn claim(&self, claim: &ClaimRef) -> Lookup<FoundClaim> {
        let api = Api::<ResourceClaim>::namespaced(self.client.clone(), &claim.namespace);
        let got = bounded(
            format!("get ResourceClaim {}/{}", claim.namespace, claim.name),
            self.timeout,
            api.get(&claim.name),
        )
        .await;
        lookup(got, |found| FoundClaim {
            uid: found.metadata.uid.clone().unwrap_or_default(),
            // A claim of ours that is broken in some other way is still here.
            allocated_here: !allocated_claim(&found, &self.node, &self.driver)
                .is_err_and(|problem| problem.is_elsewhere()),
        })
    }

    async fn domain(&self, domain: &DomainRef) -> Lookup<FoundDomain> {
        if self.domains.by_uid(&domain.uid.0).is_some() {
            return Lookup::Found(domain.uid.0.clone());
        }
        let api = Api::<ComputeDomain>::namespaced(self.client.clone(), &domain.namespace);
        let got = bounded(
            format!("get ComputeDomain {}/{}", domain.namespace, domain.name),
            self.timeout,
            api.get(&domain.name),
        )
        .await;
        lookup(got, |found| found.metadata.uid.unwrap_or_default())
    }
}

/// [`StaleClaimNotices`]: an Event on this node's Node.
#[derive(Clone)]
pub struct KubeStaleClaimNotices {
    recorder: Recorder,
    node: String,
    timeout: Duration,
}

impl std::fmt::Debug for KubeStaleClaimNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeStaleClaimNotices")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl KubeStaleClaimNotices {
    pub fn new(client: Client, node: impl Into<String>, timeout: Duration) -> Self {
        let node = node.into();
        let reporter = Reporter {
            controller: NODE_REPORTING_CONTROLLER.into(),
            instance: Some(node.clone()),
        };
        Self {
            recorder: Recorder::new(client, reporter),
            node,
            timeout,
        }
    }
}

/// The Node as an event's subject; its uid is its name, as in the kubelet's events.
pub fn node_reference(node: &str) -> ObjectReference {
    ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(node.into()),
        uid: Some(node.into()),
        ..ObjectReference::default()
    }
}

/// What Kubernetes is told about a released claim.
pub fn released_kube_event(stale: &StaleClaim, node: &str) -> Event {
    let text = released_event(stale, node);
    Event {
        type_: match text.type_ {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        },
        reason: text.reason,
        note: Some(truncate(text.message, NOTE_LIMIT)),
        action: "ReleaseStaleClaim".into(),
        secondary: Some(ObjectReference {
            api_version: Some("resource.k8s.io/v1".into()),
            kind: Some("ResourceClaim".into()),
            namespace: Some(stale.claim.namespace.clone()),
            name: Some(stale.claim.name.clone()),
            uid: Some(stale.claim.uid.clone()),
            ..ObjectReference::default()
        }),
    }
}

#[async_trait]
impl StaleClaimNotices for KubeStaleClaimNotices {
    async fn released(&self, stale: &StaleClaim) -> Result<(), PortError> {
        let event = released_kube_event(stale, &self.node);
        let published = bounded(
            format!("record event {} on Node {}", event.reason, self.node),
            self.timeout,
            self.recorder.publish(&event, &node_reference(&self.node)),
        )
        .await;
        let outcome = if published.is_ok() { "ok" } else { "failed" };
        metrics::counter!(EVENTS, "outcome" => outcome).increment(1);
        published.map_err(super::port_error)
    }
}
