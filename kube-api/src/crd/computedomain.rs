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
#[x_kube(
    validation = Rule::new("self == oldSelf").message("A computeDomain.spec is immutable"),
    validation = Rule::new("!has(self.isolation) || self.isolation != 'Channel' || self.channel.allocationMode != 'All'")
        .message("isolation Channel gives each pod its domain's own channel: it cannot be combined with channel.allocationMode All")
)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::formats::kubernetes_formats)]
pub struct ComputeDomainSpec {
    /// Deprecated. 0 (the default) follows the workload; above 0, the domain is not
    /// Ready until this many nodes are.
    #[serde(default)]
    #[schemars(range(min = 0))]
    pub num_nodes: u32,
    pub channel: ComputeDomainChannelSpec,
    /// domaind's, not in NVIDIA's CRD: how this domain is kept apart from others.
    /// `IMEXDomain` (the default, NVIDIA's behaviour): the domain owns its nodes' IMEX
    /// daemons, one ComputeDomain per node. `Channel`: the nodes' IMEX daemons form one
    /// IMEX domain per NVLink clique, shared by every ComputeDomain of this mode there,
    /// and each gets its own channel: several may hold pods on one node, each sharing
    /// memory only with its own pods.
    #[serde(default, skip_serializing_if = "ComputeDomainIsolation::is_default")]
    pub isolation: ComputeDomainIsolation,
}

#[derive(Deserialize, Serialize, Clone, Copy, Debug, Default, PartialEq, Eq, JsonSchema)]
pub enum ComputeDomainIsolation {
    #[default]
    #[serde(rename = "IMEXDomain")]
    ImexDomain,
    Channel,
}

impl ComputeDomainIsolation {
    pub fn is_default(&self) -> bool {
        *self == Self::ImexDomain
    }
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
