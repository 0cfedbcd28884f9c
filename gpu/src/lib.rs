//! The node's GPUs and the NVLink clique they belong to.
//!
//! [`GpuInventory`] is the port; [`NvmlInventory`] asks the NVIDIA driver through NVML,
//! [`TopologyInventory`] is a fake that reads a topology file, for machines without
//! GPUs (the demo, the chaos harness, tests). Both produce the same [`NodeGpus`], and
//! the node's clique comes from one pure function, [`node_clique`], so the rule is the
//! same whichever adapter answers.

mod clique;
mod driver_root;
mod fabric_ffi;
mod nvml;
mod topology;

use std::fmt;

use domaind_actors::model::CliqueId;
use serde::{Deserialize, Serialize};

pub use clique::{CliqueError, format_cluster_uuid, is_cluster_uuid, node_clique};
pub use driver_root::{
    DEFAULT_DRIVER_ROOT, DRIVER_ROOT_LIBRARY_DIRS, DriverRootSearch, driver_root_candidates,
};
pub use nvml::{DEFAULT_NVML_LIBRARY, NvmlInventory, NvmlInventoryError};
pub use topology::{
    FAKE_DRIVER_VERSION, FAKE_GPU_NAME, GPUS_PER_SIMULATED_NODE, Topology, TopologyError,
    TopologyInventory,
};

/// What a node's GPUs are, at one moment.
///
/// Calls may block (NVML talks to the driver): call them off the actor thread.
/// The inventory `domaind run` (and `domaind gpus`) reads: the fake topology file's
/// entry for `node` when there is one, else NVML, looked for as `--nvml-library` and
/// `--driver-root` say.
pub fn open_inventory(
    gpu_topology: Option<&std::path::Path>,
    node: &str,
    nvml_library: &std::path::Path,
    driver_root: &std::path::Path,
) -> anyhow::Result<Box<dyn GpuInventory>> {
    use anyhow::Context as _;
    Ok(match gpu_topology {
        Some(path) => Box::new(
            TopologyInventory::open(path, node)
                .with_context(|| format!("cannot use the GPU topology file {}", path.display()))?,
        ),
        // The error says where NVML was looked for and what to pass instead.
        None => Box::new(
            NvmlInventory::open_searching(nvml_library, Some(driver_root))
                .context("cannot read this node's GPUs")?,
        ),
    })
}

pub trait GpuInventory: Send + Sync {
    /// The node's GPUs and driver version.
    fn inventory(&self) -> Result<NodeGpus, GpuError>;

    /// The node's clique: `<clusterUUID>.<cliqueId>`, or the empty clique for a node
    /// without NVLink fabric (a member that does nothing).
    fn clique(&self) -> Result<CliqueId, GpuError> {
        Ok(self.inventory()?.clique()?)
    }
}

/// The GPUs of one node, as NVML or the topology file describes them.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct NodeGpus {
    pub driver_version: String,
    pub gpus: Vec<GpuInfo>,
}

impl NodeGpus {
    /// See [`node_clique`].
    pub fn clique(&self) -> Result<CliqueId, CliqueError> {
        node_clique(&self.gpus)
    }
}

/// One GPU.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct GpuInfo {
    /// NVML's index on this node.
    pub index: u32,
    /// `GPU-…`, unique across machines.
    pub uuid: String,
    /// e.g. "NVIDIA GB200".
    pub name: String,
    /// e.g. "00000008:01:00.0".
    pub pci_bus_id: String,
    /// A GPU without NVLink fabric may leave this out of a topology file.
    #[serde(default)]
    pub fabric: FabricInfo,
}

impl fmt::Display for GpuInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "GPU {} ({})", self.index, self.uuid)
    }
}

/// A GPU's registration with the NVLink fabric (NVML's `nvmlGpuFabricInfo_v3_t`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub struct FabricInfo {
    pub state: FabricState,
    /// Lowercase hyphenated UUID; empty, or the nil UUID, while the GPU is in no
    /// cluster.
    #[serde(default)]
    pub cluster_uuid: String,
    #[serde(default)]
    pub clique_id: u32,
    /// Why registration failed, once `state` is `Completed`; `None` when it succeeded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

impl FabricInfo {
    /// A GPU with no NVLink fabric at all (a PCIe card, an H100 without NVSwitch).
    pub fn not_supported() -> Self {
        Self {
            state: FabricState::NotSupported,
            cluster_uuid: String::new(),
            clique_id: 0,
            error: None,
        }
    }

    /// A GPU whose registration completed without error.
    pub fn registered(cluster_uuid: impl Into<String>, clique_id: u32) -> Self {
        Self {
            state: FabricState::Completed,
            cluster_uuid: cluster_uuid.into(),
            clique_id,
            error: None,
        }
    }
}

impl Default for FabricInfo {
    fn default() -> Self {
        Self::not_supported()
    }
}

/// `NVML_GPU_FABRIC_STATE_*`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub enum FabricState {
    NotSupported,
    NotStarted,
    InProgress,
    Completed,
}

impl fmt::Display for FabricState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::NotSupported => "not supported",
            Self::NotStarted => "not started",
            Self::InProgress => "in progress",
            Self::Completed => "completed",
        })
    }
}

/// Why the inventory or the clique could not be had.
#[derive(Debug, thiserror::Error)]
pub enum GpuError {
    #[error(transparent)]
    Nvml(#[from] NvmlInventoryError),
    #[error(transparent)]
    Topology(#[from] TopologyError),
    #[error(transparent)]
    Clique(#[from] CliqueError),
}

impl GpuError {
    /// Asking again later may succeed: fabric registration is still under way.
    pub fn is_transient(&self) -> bool {
        matches!(self, Self::Clique(error) if error.is_transient())
    }

    /// What went wrong, in a word: a metric's label.
    pub fn kind(&self) -> &'static str {
        match self {
            Self::Nvml(_) => "nvml",
            Self::Topology(_) => "topology",
            Self::Clique(CliqueError::InProgress { .. }) => "registering",
            Self::Clique(CliqueError::Disagree { .. }) => "gpus_disagree",
        }
    }
}
