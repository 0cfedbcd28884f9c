//! Rack mode (off by default, as CoreWeave runs it): a ComputeDomain per NVLink clique,
//! created when Nodes carrying a new clique label value appear, so that workloads only
//! reference the clique's claim template.
//!
//! Names: a clique's CD is named after the label value. A value that is already a
//! DNS-1123 subdomain in lower case (what GPU feature discovery writes,
//! `<clusterUUID>.<cliqueId>`) is the name as it is. Any other value is lowercased,
//! every run of characters outside `[a-z0-9]` becomes one `-`, `-` is trimmed from the
//! ends, and `-` and the CRC-32 of the original value (8 hex digits) are appended, so
//! that two values that sanitise alike still get two domains. Its template is
//! `imex-channel-<name>`, as CoreWeave names its racks'.
//!
//! A clique's CD is created again if deleted while the clique's nodes are there, and is
//! never deleted by the controller: a clique whose nodes are gone for maintenance keeps
//! its domain and its workloads' manifests keep working when they return. A CD of that
//! name that we did not create is left alone.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt as _;
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::PostParams;
use kube::core::PartialObjectMeta;
use kube::runtime::reflector::{self, Store};
use kube::runtime::{WatchStreamExt as _, watcher};
use kube::{Api, Client, ResourceExt as _};
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use crate::backoff::reconcile_backoff;
use domaind_kube_api::crd::{
    ChannelAllocationMode, ComputeDomain, ComputeDomainChannelSpec, ComputeDomainSpec,
    ResourceClaimTemplateRef,
};
use domaind_kube_api::names::{MANAGED_BY, MANAGED_BY_LABEL};

/// The prefix of a clique domain's template name.
pub const TEMPLATE_PREFIX: &str = "imex-channel-";
/// How often the domains are checked even when no node changed (a deleted CD is
/// recreated within this).
const RESYNC: Duration = Duration::from_secs(60);
/// How long a burst of node changes is let pass before looking.
const BURST: Duration = Duration::from_millis(500);

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RackSettings {
    /// Where the clique domains are created.
    pub namespace: String,
    /// The node label whose values are cliques.
    pub label: String,
}

/// The CD name for a clique label value (see the module's documentation).
pub fn domain_name(clique: &str) -> String {
    if is_dns_subdomain(clique) {
        return clique.to_string();
    }
    let mut name = String::with_capacity(clique.len() + 9);
    for c in clique.chars().flat_map(char::to_lowercase) {
        if c.is_ascii_lowercase() || c.is_ascii_digit() {
            name.push(c);
        } else if !name.ends_with('-') {
            name.push('-');
        }
    }
    let trimmed = name.trim_matches('-');
    let checksum = crc32fast::hash(clique.as_bytes());
    if trimmed.is_empty() {
        format!("clique-{checksum:08x}")
    } else {
        format!("{trimmed}-{checksum:08x}")
    }
}

/// Lower-case alphanumerics and `-` in dot-separated labels, each starting and ending
/// alphanumeric, at most 253 characters.
fn is_dns_subdomain(name: &str) -> bool {
    let label_ok = |label: &str| {
        !label.is_empty()
            && label.len() <= 63
            && label
                .chars()
                .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
            && !label.starts_with('-')
            && !label.ends_with('-')
    };
    !name.is_empty() && name.len() <= 253 && name.split('.').all(label_ok)
}

/// The CD for a clique.
pub fn desired_domain(clique: &str, settings: &RackSettings) -> ComputeDomain {
    let name = domain_name(clique);
    let mut cd = ComputeDomain::new(
        &name,
        ComputeDomainSpec {
            num_nodes: 0,
            channel: ComputeDomainChannelSpec {
                resource_claim_template: ResourceClaimTemplateRef {
                    name: format!("{TEMPLATE_PREFIX}{name}"),
                },
                allocation_mode: ChannelAllocationMode::Single,
            },
            isolation: Default::default(),
        },
    );
    cd.metadata = ObjectMeta {
        name: Some(name),
        namespace: Some(settings.namespace.clone()),
        // A label value is a valid label value: the clique's nodes and its domain
        // answer the same selector.
        labels: Some(BTreeMap::from([
            (settings.label.clone(), clique.to_string()),
            (MANAGED_BY_LABEL.to_string(), MANAGED_BY.to_string()),
        ])),
        ..ObjectMeta::default()
    };
    cd
}

/// The cliques among `cliques` that have no CD among `existing` (names in the rack
/// namespace).
pub fn missing<'a>(cliques: &'a BTreeSet<String>, existing: &BTreeSet<String>) -> Vec<&'a str> {
    cliques
        .iter()
        .filter(|clique| !existing.contains(&domain_name(clique)))
        .map(String::as_str)
        .collect()
}

/// Creates the CDs of `cliques`; one that appeared meanwhile is fine. Returns the names
/// of the CDs that exist now (created, or found created).
pub async fn create_domains(
    api: &Api<ComputeDomain>,
    cliques: &[&str],
    settings: &RackSettings,
) -> Result<Vec<String>, kube::Error> {
    let mut present = vec![];
    for clique in cliques {
        let cd = desired_domain(clique, settings);
        match api.create(&PostParams::default(), &cd).await {
            Ok(_) => {
                ::metrics::counter!(crate::metrics::RACK_DOMAINS_CREATED).increment(1);
                info!(clique = %clique, cd = %cd.name_any(), namespace = %settings.namespace, "ComputeDomain created for a new clique");
            }
            Err(kube::Error::Api(status)) if status.code == 409 => {}
            Err(error) => return Err(error),
        }
        present.push(cd.name_any());
    }
    Ok(present)
}

/// The distinct clique values of the nodes in `nodes`.
fn cliques(nodes: &Store<PartialObjectMeta<Node>>, label: &str) -> BTreeSet<String> {
    nodes
        .state()
        .iter()
        .filter_map(|node| node.labels().get(label).cloned())
        .filter(|value| !value.is_empty())
        .collect()
}

/// Watches Nodes carrying the clique label and keeps a CD per clique until `stop`.
/// `domains` is the controller's store of ComputeDomains.
pub async fn run(
    client: Client,
    settings: RackSettings,
    domains: Store<ComputeDomain>,
    stop: CancellationToken,
) {
    // Metadata only: the label is all we read of a Node.
    let nodes_api: Api<PartialObjectMeta<Node>> = Api::all(client.clone());
    let cds: Api<ComputeDomain> = Api::namespaced(client, &settings.namespace);
    let (reader, writer) = reflector::store();
    let config = watcher::Config::default().labels(&settings.label);
    // The store fills only while its stream is polled: a task of its own polls it and
    // says when a node appeared or changed.
    let changed = Arc::new(Notify::new());
    let watching = tokio::spawn({
        let changed = changed.clone();
        async move {
            let changes = watcher(nodes_api, config)
                .default_backoff()
                .reflect(writer)
                .applied_objects();
            futures::pin_mut!(changes);
            while let Some(change) = changes.next().await {
                match change {
                    Ok(_) => changed.notify_one(),
                    Err(error) => warn!(%error, "watching Nodes for cliques"),
                }
            }
        }
    });
    let _stop_watching = AbortOnDrop(watching);
    tokio::select! {
        _ = stop.cancelled() => return,
        ready = async {
            tokio::join!(reader.wait_until_ready(), domains.wait_until_ready())
        } => {
            if ready.0.is_err() || ready.1.is_err() {
                return;
            }
        }
    }
    let mut backoff = reconcile_backoff();
    // Created by us and not yet in the controller's store, which learns of them by its
    // watch a moment later: not created twice meanwhile. Forgotten once the store has
    // them (so that a deletion is seen and repaired) or after a resync period.
    let mut created: BTreeMap<String, tokio::time::Instant> = BTreeMap::new();
    loop {
        let mut existing: BTreeSet<String> = domains
            .state()
            .iter()
            .filter(|cd| cd.namespace().as_deref() == Some(settings.namespace.as_str()))
            .map(|cd| cd.name_any())
            .collect();
        let now = tokio::time::Instant::now();
        created.retain(|name, at| !existing.contains(name) && now.duration_since(*at) < RESYNC);
        existing.extend(created.keys().cloned());
        let cliques = cliques(&reader, &settings.label);
        let wanted = missing(&cliques, &existing);
        let wait = match create_domains(&cds, &wanted, &settings).await {
            Ok(present) => {
                backoff.succeed();
                created.extend(present.into_iter().map(|name| (name, now)));
                RESYNC
            }
            Err(error) => {
                let retry_in = backoff.fail();
                warn!(%error, ?retry_in, "cannot create the ComputeDomains of new cliques");
                retry_in
            }
        };
        tokio::select! {
            _ = stop.cancelled() => return,
            _ = tokio::time::sleep(wait) => {}
            _ = changed.notified() => {
                // Nodes come in bursts (a rack of 18 joins at once): let the burst
                // pass, then look once.
                tokio::time::sleep(BURST).await;
            }
        }
    }
}

/// Stops the node watch when rack mode stops, however it stops.
struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domaind_kube_api::names::CLIQUE_LABEL;

    #[test]
    fn gfd_clique_values_are_names_as_they_are() {
        let clique = "1ea0c1b6-1f0a-4d0b-9a1e-6e2f1c3b4a5d.32766";
        assert_eq!(domain_name(clique), clique);
        let cd = desired_domain(
            clique,
            &RackSettings {
                namespace: "gpu-operator".into(),
                label: CLIQUE_LABEL.into(),
            },
        );
        assert_eq!(
            cd.spec.channel.resource_claim_template.name,
            format!("imex-channel-{clique}")
        );
        assert_eq!(cd.labels()[CLIQUE_LABEL], clique);
        assert_eq!(cd.metadata.namespace.as_deref(), Some("gpu-operator"));
    }

    #[test]
    fn other_values_are_sanitised_and_told_apart_by_a_checksum() {
        let upper = domain_name("S0-011-US-WEST-01A");
        assert!(upper.starts_with("s0-011-us-west-01a-"), "{upper}");
        assert_eq!(upper.len(), "s0-011-us-west-01a-".len() + 8);
        assert!(is_dns_subdomain(&upper));
        // Alike once sanitised, still two domains.
        assert_ne!(domain_name("rack_1"), domain_name("rack.-1_"));
        assert_ne!(domain_name("Rack"), domain_name("rack"));
        assert!(domain_name("rack_1").starts_with("rack-1-"));
        let empty = domain_name("___");
        assert!(
            empty.starts_with("clique-") && is_dns_subdomain(&empty),
            "{empty}"
        );
        assert!(is_dns_subdomain(&domain_name("-a..b-")));
        // Stable: the same value gives the same name on every replica and restart.
        assert_eq!(domain_name("rack_1"), domain_name("rack_1"));
    }

    #[test]
    fn only_cliques_without_a_domain_are_missing() {
        let cliques: BTreeSet<String> = ["a.1", "b.2", "Rack_3"].map(String::from).into();
        let existing: BTreeSet<String> = ["a.1".to_string(), domain_name("Rack_3")].into();
        assert_eq!(missing(&cliques, &existing), vec!["b.2"]);
    }
}
