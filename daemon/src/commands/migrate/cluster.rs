//! The adapter: lists what `findings` reads, through `KUBECONFIG` or the in-cluster
//! config, as the API server returns it (JSON), page by page. Read only.

use std::time::Duration;

use anyhow::Context as _;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, GroupVersionKind, ListParams};
use serde_json::Value;

use super::findings::Inventory;
use domaind_kube_api::names::DOMAIN_LABEL;

const CRD: &str = "computedomains.resource.nvidia.com";
const PAGE: u32 = 500;

fn resource(group: &str, version: &str, kind: &str, plural: &str) -> ApiResource {
    ApiResource::from_gvk_with_plural(&GroupVersionKind::gvk(group, version, kind), plural)
}

/// Every object of `resource` in all namespaces matching `params`. A kind the API server
/// does not serve (404) is none: a cluster without the CRD has no ComputeDomains.
async fn list(
    client: &Client,
    resource: &ApiResource,
    params: ListParams,
    timeout: Duration,
) -> anyhow::Result<Vec<Value>> {
    let api: Api<DynamicObject> = Api::all_with(client.clone(), resource);
    let mut out = Vec::new();
    let mut params = params.limit(PAGE);
    // Bounded: a continue token that never ends would be a broken API server.
    for _ in 0..100_000 {
        let page = match tokio::time::timeout(timeout, api.list(&params)).await {
            Err(_) => anyhow::bail!("listing {} took longer than {timeout:?}", resource.plural),
            Ok(Err(kube::Error::Api(status))) if status.code == 404 => return Ok(out),
            Ok(result) => result.with_context(|| format!("cannot list {}", resource.plural))?,
        };
        for item in page.items {
            out.push(serde_json::to_value(item)?);
        }
        match page.metadata.continue_.filter(|c| !c.is_empty()) {
            Some(token) => params = params.continue_token(&token),
            None => return Ok(out),
        }
    }
    anyhow::bail!("listing {} did not end", resource.plural)
}

pub async fn inventory(driver: &str, timeout: Duration) -> anyhow::Result<Inventory> {
    let client = domaind_kube_api::client().await?;
    let all = ListParams::default;
    let crds = resource(
        "apiextensions.k8s.io",
        "v1",
        "CustomResourceDefinition",
        "customresourcedefinitions",
    );
    let crd = list(
        &client,
        &crds,
        all().fields(&format!("metadata.name={CRD}")),
        timeout,
    )
    .await?
    .into_iter()
    .next();
    let resource_api = |kind, plural| resource("resource.k8s.io", "v1", kind, plural);
    let slices = list(
        &client,
        &resource_api("ResourceSlice", "resourceslices"),
        all().fields(&format!("spec.driver={driver}")),
        timeout,
    )
    .await?;
    Ok(Inventory {
        compute_domains: list(
            &client,
            &resource(
                "resource.nvidia.com",
                "v1beta1",
                "ComputeDomain",
                "computedomains",
            ),
            all(),
            timeout,
        )
        .await?,
        claims: list(
            &client,
            &resource_api("ResourceClaim", "resourceclaims"),
            all(),
            timeout,
        )
        .await?,
        claim_templates: list(
            &client,
            &resource_api("ResourceClaimTemplate", "resourceclaimtemplates"),
            all(),
            timeout,
        )
        .await?,
        slices,
        daemon_sets: list(
            &client,
            &resource("apps", "v1", "DaemonSet", "daemonsets"),
            all(),
            timeout,
        )
        .await?,
        deployments: list(
            &client,
            &resource("apps", "v1", "Deployment", "deployments"),
            all(),
            timeout,
        )
        .await?,
        labelled_nodes: list(
            &client,
            &resource("", "v1", "Node", "nodes"),
            all().labels(DOMAIN_LABEL),
            timeout,
        )
        .await?,
        crd,
    })
}
