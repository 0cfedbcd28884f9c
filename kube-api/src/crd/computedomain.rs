//! `computedomains.resource.nvidia.com/v1beta1`: the spec users write, unchanged from
//! NVIDIA's driver so that existing manifests work, and the status domaind reports.

use kube::{CustomResource, KubeSchema};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::status::ComputeDomainStatus;

pub const GROUP: &str = "resource.nvidia.com";
pub const VERSION: &str = "v1beta1";

/// The spec is immutable: a ComputeDomain is recreated, never edited.
// Clippy takes the printer columns' `type_ = "integer"`, twice, for repeated attributes.
#[allow(clippy::duplicated_attributes)]
#[derive(CustomResource, KubeSchema, Deserialize, Serialize, Clone, Debug, PartialEq, Eq)]
#[kube(
    group = "resource.nvidia.com",
    version = "v1beta1",
    kind = "ComputeDomain",
    namespaced,
    status = "ComputeDomainStatus",
    shortname = "cd",
    printcolumn(name = "Status", type_ = "string", json_path = ".status.status"),
    printcolumn(name = "Ready", type_ = "integer", json_path = ".status.readyNodes"),
    printcolumn(name = "Nodes", type_ = "integer", json_path = ".status.totalNodes"),
    printcolumn(
        name = "Age",
        type_ = "date",
        json_path = ".metadata.creationTimestamp"
    )
)]
#[x_kube(validation = Rule::new("self == oldSelf").message("A computeDomain.spec is immutable"))]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::formats::kubernetes_formats)]
pub struct ComputeDomainSpec {
    /// Deprecated. 0 (the default) follows the workload; above 0, the domain is not
    /// Ready until this many nodes are.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub num_nodes: u32,
    pub channel: ComputeDomainChannelSpec,
}

/// The channel a workload's pods get.
#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainChannelSpec {
    /// The ResourceClaimTemplate the controller creates in the ComputeDomain's
    /// namespace; pods reference it.
    pub resource_claim_template: ResourceClaimTemplateRef,
    /// `Single`: the domain's channel; `All`: every channel.
    #[serde(default)]
    pub allocation_mode: ChannelAllocationMode,
}

#[derive(Deserialize, Serialize, Clone, Debug, PartialEq, Eq, JsonSchema)]
pub struct ResourceClaimTemplateRef {
    pub name: String,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ChannelAllocationMode {
    All,
    #[default]
    Single,
}
