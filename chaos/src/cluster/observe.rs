//! One look at a cluster run: what the API server says (the ComputeDomain and its
//! status, the template, the run's pods and claims, the controller's Lease, the run's
//! events) and what each chosen node's daemon says (`/state`), gathered into one
//! [`ClusterObservation`]. The reads are not one snapshot: a pod listed Running may be
//! gone by the time its node's `/state` is read. The checks allow for it
//! ([`super::checks`]).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Instant;

use domaind_kube_api::crd::{ComputeDomain, ComputeDomainStatus};
use domaind_node::run::NodeView;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Node, Pod};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt as _};

use super::access::{ClusterAccess, DaemonInstance};
use super::workload::{CLAIM_NAME, DOMAIN_NAME, Workload};

/// A pod of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodSeen {
    pub name: String,
    pub uid: String,
    pub node: Option<String>,
    pub phase: String,
    pub ready: bool,
    pub deleting: bool,
    /// The name of the claim made for it from the domain's template.
    pub claim: Option<String>,
}

impl PodSeen {
    /// Running, ready and not being deleted: its claim was prepared on its node.
    pub fn serving(&self) -> bool {
        self.phase == "Running" && self.ready && !self.deleting
    }
}

/// A claim of the run.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimSeen {
    pub name: String,
    pub uid: String,
    pub allocated: bool,
}

/// A chosen node's daemon.
#[derive(Debug, Clone)]
pub struct DaemonSeen {
    pub instance: Option<DaemonInstance>,
    pub view: Result<NodeView, String>,
}

/// The ComputeDomain.
#[derive(Debug, Clone)]
pub struct DomainSeen {
    pub uid: String,
    pub status: Option<ComputeDomainStatus>,
    pub deleting: bool,
}

#[derive(Debug, Clone)]
pub struct ClusterObservation {
    pub at: Instant,
    pub domain: Option<DomainSeen>,
    pub template_exists: bool,
    pub pods: Vec<PodSeen>,
    pub claims: Vec<ClaimSeen>,
    pub daemons: BTreeMap<String, DaemonSeen>,
    /// Ready controller instances; `Err` when they could not be listed.
    pub controllers: Result<Vec<String>, String>,
    /// Whether the controller's Lease exists (a controller may run without leader
    /// election), and who holds it.
    pub lease_exists: bool,
    pub lease_holder: Option<String>,
    /// The chosen nodes that are cordoned.
    pub cordoned: BTreeSet<String>,
    /// Reasons of the domain's events, with their counts.
    pub events: BTreeMap<String, u32>,
    /// API reads that failed this time (the rest of the observation stands).
    pub errors: Vec<String>,
}

impl ClusterObservation {
    pub fn view(&self, node: &str) -> Option<&NodeView> {
        self.daemons.get(node).and_then(|d| d.view.as_ref().ok())
    }

    pub fn claim_uid(&self, name: &str) -> Option<&str> {
        self.claims
            .iter()
            .find(|c| c.name == name)
            .map(|c| c.uid.as_str())
    }

    /// The run's pods that are not being deleted, by node.
    pub fn pods_on(&self, node: &str) -> impl Iterator<Item = &PodSeen> {
        self.pods
            .iter()
            .filter(move |p| !p.deleting && p.node.as_deref() == Some(node))
    }
}

/// Reads everything the checks need, once.
pub async fn observe(
    client: &Client,
    access: &mut dyn ClusterAccess,
    workload: &Workload,
) -> ClusterObservation {
    let namespace = &workload.namespace;
    let mut errors: Vec<String> = Vec::new();
    let note = |errors: &mut Vec<String>, what: &str, error: kube::Error| {
        errors.push(format!("{what}: {error}"))
    };

    let domains = Api::<ComputeDomain>::namespaced(client.clone(), namespace);
    let domain = match domains.get_opt(DOMAIN_NAME).await {
        Ok(found) => found.map(|d| DomainSeen {
            uid: d.uid().unwrap_or_default(),
            deleting: d.metadata.deletion_timestamp.is_some(),
            status: d.status,
        }),
        Err(error) => {
            note(&mut errors, "ComputeDomain", error);
            None
        }
    };
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), namespace);
    let template_exists = match templates.get_opt(&workload.template_name()).await {
        Ok(found) => found.is_some(),
        Err(error) => {
            note(&mut errors, "ResourceClaimTemplate", error);
            false
        }
    };
    let selector = ListParams::default().labels(&workload.pod_selector());
    let pods = match Api::<Pod>::namespaced(client.clone(), namespace)
        .list(&selector)
        .await
    {
        Ok(list) => list.items.iter().map(pod_seen).collect(),
        Err(error) => {
            note(&mut errors, "pods", error);
            Vec::new()
        }
    };
    let claims = match Api::<ResourceClaim>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await
    {
        Ok(list) => list
            .items
            .iter()
            .map(|c| ClaimSeen {
                name: c.name_any(),
                uid: c.uid().unwrap_or_default(),
                allocated: c.status.as_ref().is_some_and(|s| s.allocation.is_some()),
            })
            .collect(),
        Err(error) => {
            note(&mut errors, "resourceclaims", error);
            Vec::new()
        }
    };
    let nodes = Api::<Node>::all(client.clone());
    let mut cordoned = BTreeSet::new();
    for name in &workload.nodes {
        match nodes.get_opt(name).await {
            Ok(Some(node)) => {
                if node.spec.and_then(|s| s.unschedulable).unwrap_or(false) {
                    cordoned.insert(name.clone());
                }
            }
            Ok(None) => errors.push(format!("node {name} is gone")),
            Err(error) => note(&mut errors, "nodes", error),
        }
    }
    let (lease_namespace, lease_name) = access.controller_lease();
    let (lease_exists, lease_holder) =
        match Api::<Lease>::namespaced(client.clone(), &lease_namespace)
            .get_opt(&lease_name)
            .await
        {
            Ok(lease) => (
                lease.is_some(),
                lease
                    .and_then(|l| l.spec)
                    .and_then(|s| s.holder_identity)
                    .filter(|h| !h.is_empty()),
            ),
            Err(error) => {
                note(&mut errors, "controller Lease", error);
                (true, None)
            }
        };
    let events = match &domain {
        Some(seen) => domain_events(client, namespace, &seen.uid)
            .await
            .unwrap_or_else(|error| {
                errors.push(format!("events: {error}"));
                BTreeMap::new()
            }),
        None => BTreeMap::new(),
    };
    let controllers = access
        .controllers()
        .await
        .map_err(|error| format!("{error:#}"));
    let mut daemons = BTreeMap::new();
    for name in &workload.nodes {
        let instance = access.daemon(name).await.unwrap_or_else(|error| {
            errors.push(format!("the daemon of {name}: {error:#}"));
            None
        });
        let view = match &instance {
            Some(_) => access
                .state(name)
                .await
                .map_err(|error| format!("{error:#}")),
            None => Err("no daemon".to_owned()),
        };
        daemons.insert(name.clone(), DaemonSeen { instance, view });
    }
    ClusterObservation {
        at: Instant::now(),
        domain,
        template_exists,
        pods,
        claims,
        daemons,
        controllers,
        lease_exists,
        lease_holder,
        cordoned,
        events,
        errors,
    }
}

fn pod_seen(pod: &Pod) -> PodSeen {
    let status = pod.status.as_ref();
    PodSeen {
        name: pod.name_any(),
        uid: pod.uid().unwrap_or_default(),
        node: pod.spec.as_ref().and_then(|s| s.node_name.clone()),
        phase: status.and_then(|s| s.phase.clone()).unwrap_or_default(),
        ready: status
            .and_then(|s| s.conditions.as_ref())
            .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True")),
        deleting: pod.metadata.deletion_timestamp.is_some(),
        claim: status
            .and_then(|s| s.resource_claim_statuses.as_ref())
            .and_then(|claims| claims.iter().find(|c| c.name == CLAIM_NAME))
            .and_then(|c| c.resource_claim_name.clone()),
    }
}

/// The domain's events (events.k8s.io, `regarding` the domain), counted by reason.
async fn domain_events(
    client: &Client,
    namespace: &str,
    uid: &str,
) -> Result<BTreeMap<String, u32>, kube::Error> {
    let list = Api::<Event>::namespaced(client.clone(), namespace)
        .list(&ListParams::default())
        .await?;
    let mut counts = BTreeMap::new();
    for event in list.items {
        if event.regarding.as_ref().and_then(|r| r.uid.as_deref()) != Some(uid) {
            continue;
        }
        let Some(reason) = event.reason else { continue };
        let count = event
            .series
            .as_ref()
            .map_or(1, |s| s.count.max(1) as u32)
            .max(event.deprecated_count.unwrap_or(1).max(1) as u32);
        *counts.entry(reason).or_insert(0) += count;
    }
    Ok(counts)
}
