//! [`ClaimSource`] for a cluster: the kubelet names a claim; we read the ResourceClaim,
//! its allocation on this node and its opaque config, and find the ComputeDomain the
//! config names in the watch-fed cache.
//!
//! What can go wrong, and whether asking again can help:
//!
//! | case | error |
//! |---|---|
//! | API server unreachable, slow, throttling, 5xx, RBAC missing | transient |
//! | ComputeDomain cache not synced yet | transient |
//! | claim gone, or recreated (another uid) | permanent |
//! | not allocated, another driver's, another node's | permanent |
//! | no config, malformed config, requests naming different domains | permanent |
//! | the named ComputeDomain does not exist (in the claim's namespace) | permanent |
//! | the ComputeDomain is in another namespace | permanent |
//! | an `isolation: Channel` domain already listing nodes of another clique | transient |
//! | admin and non-admin results in one claim; an admin result that is no channel | permanent |
//!
//! An admin claim (`adminAccess`) may name a ComputeDomain of any namespace, and is
//! not held to the clique rule: it joins nothing. The API server admits `adminAccess`
//! only in a namespace labelled `resource.kubernetes.io/admin-access: "true"`, which
//! is the grant; a monitoring namespace is never the workload's.
//!
//! A missing RBAC permission is transient: fixing the Role fixes the claim, with no
//! change to the claim. An unknown ComputeDomain is permanent once the cache has synced,
//! but a cache can trail the API server by a moment (a domain created just now, a
//! watch being re-established): before refusing, one live list of the claim's
//! namespace settles it. Only the claim's namespace: a domain elsewhere could not be
//! joined anyway (every namespace for an admin claim).

use std::time::Duration;

use ::kube::api::{Api, ListParams};
use ::kube::{Client, ResourceExt};
use async_trait::async_trait;
use domaind_actors::model::{ClaimInfo, ClaimRef, NodeId};
use domaind_actors::ports::{ClaimError, ClaimSource};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tokio::sync::watch;
use tracing::warn;

use super::BAD_CLAIMS;
use super::claim::allocated_claim;
use super::domains::{DomainCache, domain_ref};
use domaind_kube_api::api::bounded;
use domaind_kube_api::crd::ComputeDomain;

/// Resolves claims through the API server and the ComputeDomain cache.
#[derive(Clone)]
pub struct KubeClaimSource {
    pub(super) client: Client,
    pub(super) domains: DomainCache,
    pub(super) node: NodeId,
    pub(super) driver: String,
    pub(super) timeout: Duration,
    /// This node's NVLink clique, for domains that share the clique's IMEX domain; it
    /// follows the node when its fabric registers in another clique.
    pub(super) clique: watch::Receiver<String>,
}

// The client has no Debug of its own.
impl std::fmt::Debug for KubeClaimSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClaimSource")
            .field("node", &self.node)
            .field("driver", &self.driver)
            .field("domains", &self.domains)
            .finish_non_exhaustive()
    }
}

impl KubeClaimSource {
    pub fn new(
        client: Client,
        domains: DomainCache,
        node: impl Into<NodeId>,
        driver: impl Into<String>,
        timeout: Duration,
    ) -> Self {
        Self {
            client,
            domains,
            node: node.into(),
            driver: driver.into(),
            timeout,
            clique: watch::Sender::new(String::new()).subscribe(),
        }
    }

    /// This node's NVLink clique (`<clusterUUID>.<cliqueId>`, or empty without fabric),
    /// as it is at each claim.
    pub fn in_clique(mut self, clique: watch::Receiver<String>) -> Self {
        self.clique = clique;
        self
    }

    /// The ComputeDomain with `uid`: from the cache, or, when the cache does not have
    /// it, from one live list of `namespace` (of every namespace: `None`).
    async fn domain(
        &self,
        uid: &str,
        namespace: Option<&str>,
    ) -> Result<Option<ComputeDomain>, ClaimError> {
        if let Some(cd) = self.domains.by_uid(uid) {
            return Ok(Some((*cd).clone()));
        }
        // Just after a start the watch's first list may be on its way: worth a short
        // wait rather than a failed prepare.
        if !self.domains.wait_synced(self.timeout).await {
            return Err(ClaimError::Transient(format!(
                "the ComputeDomain cache has not synced with the API server yet, so \
                 ComputeDomain uid {uid} cannot be looked up; call again (if this lasts: is \
                 the ComputeDomain CRD installed, and may domaind list and watch \
                 computedomains?)"
            )));
        }
        if let Some(cd) = self.domains.by_uid(uid) {
            return Ok(Some((*cd).clone()));
        }
        let (api, scope) = match namespace {
            Some(namespace) => (
                Api::<ComputeDomain>::namespaced(self.client.clone(), namespace),
                format!("in {namespace}"),
            ),
            None => (
                Api::<ComputeDomain>::all(self.client.clone()),
                "in every namespace".to_owned(),
            ),
        };
        let listed = bounded(
            format!("list ComputeDomains {scope}"),
            self.timeout,
            api.list(&ListParams::default()),
        )
        .await
        .map_err(|e| ClaimError::Transient(e.to_string()))?;
        Ok(listed
            .items
            .into_iter()
            .find(|cd| cd.metadata.uid.as_deref() == Some(uid)))
    }
}

/// The clique of another NVLink clique that `cd`'s status already lists, if `cd` shares
/// its clique's IMEX domain (`isolation: Channel`) and this node is in `clique`. Such a
/// domain's channel is chosen by each clique's shared IMEX domain on its own, so its
/// pods in two cliques would be two domains under one name, each reported over the
/// other. Pods of one clique cannot share memory with another's anyway (no NVLink
/// between them): the claim waits until the other clique's pods are gone.
pub fn spans_cliques(cd: &ComputeDomain, clique: &str) -> Option<String> {
    if cd.spec.isolation != domaind_kube_api::crd::ComputeDomainIsolation::Channel {
        return None;
    }
    cd.status
        .as_ref()?
        .nodes
        .iter()
        .map(|n| n.clique_id.as_str())
        .find(|other| !other.is_empty() && *other != clique)
        .map(str::to_owned)
}

/// A permanent refusal that is the claim's fault: counted, logged once here.
fn bad(claim: &ClaimRef, reason: &'static str, message: String) -> ClaimError {
    metrics::counter!(BAD_CLAIMS, "reason" => reason).increment(1);
    warn!(claim = %claim.uid, %reason, %message, "claim refused");
    ClaimError::Permanent(message)
}

#[async_trait]
impl ClaimSource for KubeClaimSource {
    async fn resolve(&self, asked: &ClaimRef) -> Result<ClaimInfo, ClaimError> {
        let label = format!("claim {}/{} ({})", asked.namespace, asked.name, asked.uid);
        let api = Api::<ResourceClaim>::namespaced(self.client.clone(), &asked.namespace);
        let claim = bounded(
            format!("get ResourceClaim {}/{}", asked.namespace, asked.name),
            self.timeout,
            api.get_opt(&asked.name),
        )
        .await
        .map_err(|e| ClaimError::Transient(e.to_string()))?
        .ok_or_else(|| {
            ClaimError::Permanent(format!(
                "{label} does not exist in the API server: it was deleted"
            ))
        })?;
        let uid = claim.uid().unwrap_or_default();
        if uid != asked.uid {
            return Err(bad(
                asked,
                "uid_mismatch",
                format!(
                    "{label}: the ResourceClaim of that name now has uid {uid}: it was deleted \
                     and recreated, and the kubelet asks for the old one"
                ),
            ));
        }
        let allocated = allocated_claim(&claim, &self.node, &self.driver)
            .map_err(|problem| bad(asked, problem.reason(), format!("{label}: {problem}")))?;

        let admin = allocated.admin_access;
        let cd = self
            .domain(
                &allocated.domain_uid,
                (!admin).then_some(asked.namespace.as_str()),
            )
            .await?
            .ok_or_else(|| {
                let message = if admin {
                    format!(
                        "{label} (adminAccess) names ComputeDomain uid {} (its config's \
                         domainID), and no ComputeDomain has that uid: name an existing \
                         ComputeDomain's uid",
                        allocated.domain_uid
                    )
                } else {
                    format!(
                        "{label} names ComputeDomain uid {} (its config's domainID), and no \
                         ComputeDomain in namespace {} has that uid: create the claim from the \
                         template of an existing ComputeDomain of its namespace",
                        allocated.domain_uid, asked.namespace
                    )
                };
                bad(asked, "unknown_domain", message)
            })?;
        let domain = domain_ref(&cd).ok_or_else(|| {
            ClaimError::Transient(format!(
                "ComputeDomain uid {} has no name or namespace in the cache",
                allocated.domain_uid
            ))
        })?;
        if !admin && domain.namespace != asked.namespace {
            return Err(bad(
                asked,
                "namespace_mismatch",
                format!(
                    "{label} is in namespace {} but its ComputeDomain {}/{} is in {}: a claim can \
                     only join a ComputeDomain of its own namespace",
                    asked.namespace, domain.namespace, domain.name, domain.namespace
                ),
            ));
        }
        let clique = self.clique.borrow().clone();
        if let Some(other) = spans_cliques(&cd, &clique).filter(|_| !admin) {
            metrics::counter!(BAD_CLAIMS, "reason" => "spans_cliques").increment(1);
            let message = format!(
                "{label}: ComputeDomain {}/{} has isolation Channel and already runs in NVLink \
                 clique {other}; this node is in clique {:?}. A domain sharing its clique's IMEX \
                 domain gets its channel there and cannot span cliques (no memory is shared \
                 across cliques anyway): schedule its pods in one clique (a node affinity on \
                 the clique label), or wait until its pods in {other} are gone",
                domain.namespace, domain.name, clique
            );
            warn!(claim = %asked.uid, %message, "claim refused for now");
            return Err(ClaimError::Transient(message));
        }
        Ok(ClaimInfo {
            domain,
            allocation_mode: allocated.allocation_mode,
            readiness: allocated.readiness,
            devices: allocated.devices,
            isolation: crate::contract::isolation(cd.spec.isolation),
            admin_access: admin,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domaind_kube_api::crd::{
        ComputeDomainChannelSpec, ComputeDomainIsolation, ComputeDomainNode, ComputeDomainSpec,
        ComputeDomainStatus, Phase, ResourceClaimTemplateRef,
    };

    fn cd(isolation: ComputeDomainIsolation, cliques: &[&str]) -> ComputeDomain {
        let mut cd = ComputeDomain::new(
            "cd",
            ComputeDomainSpec {
                num_nodes: 0,
                channel: ComputeDomainChannelSpec {
                    resource_claim_template: ResourceClaimTemplateRef { name: "t".into() },
                    allocation_mode: Default::default(),
                },
                isolation,
            },
        );
        cd.status = Some(ComputeDomainStatus {
            status: Phase::Ready,
            nodes: cliques
                .iter()
                .enumerate()
                .map(|(i, clique)| ComputeDomainNode {
                    name: format!("n{i}"),
                    ip_address: "10.0.0.1".into(),
                    clique_id: (*clique).into(),
                    index: None,
                    status: Phase::Ready,
                })
                .collect(),
            ready_nodes: 0,
            total_nodes: 0,
            conditions: Vec::new(),
            observed_generation: None,
            channel: None,
        });
        cd
    }

    #[test]
    fn a_sharing_domain_listing_another_clique_is_spanning() {
        let spanning = cd(ComputeDomainIsolation::Channel, &["u.1", "u.2"]);
        assert_eq!(spans_cliques(&spanning, "u.1"), Some("u.2".into()));
        assert_eq!(
            spans_cliques(&cd(ComputeDomainIsolation::Channel, &["u.1", ""]), "u.1"),
            None,
            "a node without fabric is in no clique"
        );
        assert_eq!(
            spans_cliques(&cd(ComputeDomainIsolation::ImexDomain, &["u.2"]), "u.1"),
            None,
            "an exclusive domain is not checked"
        );
        let mut vacated = cd(ComputeDomainIsolation::Channel, &[]);
        assert_eq!(spans_cliques(&vacated, "u.1"), None);
        vacated.status = None;
        assert_eq!(spans_cliques(&vacated, "u.1"), None);
    }
}
