//! The real inventory: NVML, loaded from the NVIDIA driver at run time.

use std::ffi::OsStr;
use std::fmt;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    NVML_GPU_FABRIC_STATE_COMPLETED, NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    NVML_GPU_FABRIC_STATE_NOT_STARTED, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
};

use super::clique::format_cluster_uuid;
use super::fabric_ffi::{self, RawFabricInfo};
use super::{FabricInfo, FabricState, GpuError, GpuInfo, GpuInventory, NodeGpus};

/// The name the driver installs NVML under; found through the loader's search path.
pub const DEFAULT_NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// What NVML could not do.
#[derive(Debug, thiserror::Error)]
pub enum NvmlInventoryError {
    #[error(
        "NVML ({library}) is not available on this node: no NVIDIA driver? For machines \
         without GPUs use --gpu-topology FILE (a fake topology)"
    )]
    Unavailable {
        library: String,
        #[source]
        source: NvmlError,
    },
    #[error(
        "NVML ({library}) is installed but the NVIDIA driver is not loaded on this node: load \
         it (`modprobe nvidia`), or for machines without GPUs use --gpu-topology FILE (a fake \
         topology)"
    )]
    DriverNotLoaded { library: String },
    #[error("NVML ({library}) could not start: {source}")]
    Init {
        library: String,
        #[source]
        source: NvmlError,
    },
    #[error("NVML could not tell {what}: {source}")]
    Query {
        what: String,
        #[source]
        source: NvmlError,
    },
    #[error(
        "NVML reports fabric state {state} for GPU {index}, which this version of domaind does \
         not know: upgrade domaind for this driver"
    )]
    UnknownFabricState { index: u32, state: u8 },
}

/// The node's GPUs as the NVIDIA driver reports them.
///
/// Holds NVML open for its lifetime (NVML counts opens; dropping shuts it down).
pub struct NvmlInventory {
    nvml: Nvml,
    library: String,
}

impl fmt::Debug for NvmlInventory {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("NvmlInventory")
            .field("library", &self.library)
            .finish_non_exhaustive()
    }
}

impl NvmlInventory {
    /// Open NVML from [`DEFAULT_NVML_LIBRARY`].
    pub fn open() -> Result<Self, NvmlInventoryError> {
        Self::open_library(OsStr::new(DEFAULT_NVML_LIBRARY))
    }

    /// Open NVML from `library`: a name the loader searches for, or a path (a driver
    /// root mounted elsewhere in the container).
    pub fn open_library(library: &OsStr) -> Result<Self, NvmlInventoryError> {
        let name = library.to_string_lossy().into_owned();
        let nvml = Nvml::builder()
            .lib_path(library)
            .init()
            .map_err(|source| match source {
                // dlopen failed, or what it opened is not NVML.
                NvmlError::LibloadingError(_) | NvmlError::FailedToLoadSymbol(_) => {
                    NvmlInventoryError::Unavailable {
                        library: name.clone(),
                        source,
                    }
                }
                NvmlError::DriverNotLoaded => NvmlInventoryError::DriverNotLoaded {
                    library: name.clone(),
                },
                source => NvmlInventoryError::Init {
                    library: name.clone(),
                    source,
                },
            })?;
        Ok(Self {
            nvml,
            library: name,
        })
    }

    /// The library NVML was loaded from, as given.
    pub fn library(&self) -> &OsStr {
        OsStr::new(&self.library)
    }

    fn gpu(&self, index: u32) -> Result<GpuInfo, NvmlInventoryError> {
        let query = |what: &str| {
            let what = format!("the {what} of GPU {index}");
            move |source| NvmlInventoryError::Query { what, source }
        };
        let device = self.nvml.device_by_index(index).map_err(query("handle"))?;
        let fabric = fabric_from_answer(index, fabric_ffi::fabric_info(&device))?;
        Ok(GpuInfo {
            index,
            uuid: device.uuid().map_err(query("UUID"))?,
            name: device.name().map_err(query("name"))?,
            pci_bus_id: device.pci_info().map_err(query("PCI bus id"))?.bus_id,
            fabric,
        })
    }
}

fn fabric_from_answer(
    index: u32,
    answer: Result<Option<RawFabricInfo>, NvmlError>,
) -> Result<FabricInfo, NvmlInventoryError> {
    match answer {
        Ok(Some(raw)) => fabric_from_raw(index, raw),
        // No such call in this driver, or a GPU that has no fabric (an H100 without
        // NVSwitch): both mean no clique from this GPU, not a failure.
        Ok(None) | Err(NvmlError::NotSupported) => Ok(FabricInfo::not_supported()),
        Err(source) => Err(NvmlInventoryError::Query {
            what: format!("the NVLink fabric info of GPU {index}"),
            source,
        }),
    }
}

fn fabric_from_raw(index: u32, raw: RawFabricInfo) -> Result<FabricInfo, NvmlInventoryError> {
    let state = match u32::from(raw.state) {
        NVML_GPU_FABRIC_STATE_NOT_SUPPORTED => FabricState::NotSupported,
        NVML_GPU_FABRIC_STATE_NOT_STARTED => FabricState::NotStarted,
        NVML_GPU_FABRIC_STATE_IN_PROGRESS => FabricState::InProgress,
        NVML_GPU_FABRIC_STATE_COMPLETED => FabricState::Completed,
        _ => {
            return Err(NvmlInventoryError::UnknownFabricState {
                index,
                state: raw.state,
            });
        }
    };
    // The status is the registration's outcome, so it only has a meaning once done.
    let error = match state {
        FabricState::Completed => nvml_wrapper::error::nvml_try(raw.status)
            .err()
            .map(|error| error.to_string()),
        _ => None,
    };
    Ok(FabricInfo {
        state,
        cluster_uuid: format_cluster_uuid(&raw.cluster_uuid),
        clique_id: raw.clique_id,
        error,
    })
}

impl GpuInventory for NvmlInventory {
    fn inventory(&self) -> Result<NodeGpus, GpuError> {
        let count = self
            .nvml
            .device_count()
            .map_err(|source| NvmlInventoryError::Query {
                what: "the number of GPUs".into(),
                source,
            })?;
        let driver_version =
            self.nvml
                .sys_driver_version()
                .map_err(|source| NvmlInventoryError::Query {
                    what: "the driver version".into(),
                    source,
                })?;
        let gpus = (0..count)
            .map(|index| self.gpu(index))
            .collect::<Result<Vec<_>, _>>()?;
        for gpu in &gpus {
            if let Some(error) = &gpu.fabric.error {
                tracing::warn!(gpu = %gpu, %error, "NVLink fabric registration failed: this GPU is left out of the clique");
            }
        }
        Ok(NodeGpus {
            driver_version,
            gpus,
        })
    }
}

#[cfg(test)]
mod tests {
    use nvml_wrapper_sys::bindings::{
        nvmlReturn_enum_NVML_ERROR_UNKNOWN, nvmlReturn_enum_NVML_SUCCESS,
    };

    use super::*;

    const UUID_BYTES: [u8; 16] = [
        0x6d, 0x2c, 0x1b, 0x7e, 0x0a, 0x4f, 0x4e, 0x4b, 0x9d, 0x53, 0x2f, 0x8f, 0x5c, 0x3a, 0x9b,
        0x10,
    ];

    fn raw(state: u32, status: u32) -> RawFabricInfo {
        RawFabricInfo {
            cluster_uuid: UUID_BYTES,
            clique_id: 7,
            state: state as u8,
            status,
        }
    }

    #[test]
    fn a_completed_registration_keeps_cluster_and_clique() {
        let fabric = fabric_from_raw(
            0,
            raw(
                NVML_GPU_FABRIC_STATE_COMPLETED,
                nvmlReturn_enum_NVML_SUCCESS,
            ),
        )
        .unwrap();
        assert_eq!(
            fabric,
            FabricInfo::registered("6d2c1b7e-0a4f-4e4b-9d53-2f8f5c3a9b10", 7)
        );
    }

    #[test]
    fn a_failed_registration_carries_the_drivers_reason() {
        let fabric = fabric_from_raw(
            0,
            raw(
                NVML_GPU_FABRIC_STATE_COMPLETED,
                nvmlReturn_enum_NVML_ERROR_UNKNOWN,
            ),
        )
        .unwrap();
        assert_eq!(fabric.state, FabricState::Completed);
        let reason = fabric.error.expect("a failed registration says why");
        assert_eq!(reason, NvmlError::Unknown.to_string());
    }

    #[test]
    fn the_status_of_an_unfinished_registration_is_ignored() {
        for (state, expected) in [
            (
                NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
                FabricState::NotSupported,
            ),
            (NVML_GPU_FABRIC_STATE_NOT_STARTED, FabricState::NotStarted),
            (NVML_GPU_FABRIC_STATE_IN_PROGRESS, FabricState::InProgress),
        ] {
            let fabric =
                fabric_from_raw(0, raw(state, nvmlReturn_enum_NVML_ERROR_UNKNOWN)).unwrap();
            assert_eq!(fabric.state, expected);
            assert_eq!(fabric.error, None, "{expected}");
        }
    }

    #[test]
    fn an_h100_without_nvlink_fabric_is_in_the_empty_clique() {
        // Drivers answer for such a GPU in one of three ways; all mean "no fabric".
        let answers = [
            Err(NvmlError::NotSupported),
            Ok(None),
            Ok(Some(raw(
                NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
                nvmlReturn_enum_NVML_SUCCESS,
            ))),
        ];
        let mut gpus = Vec::new();
        for (index, answer) in (0..).zip(answers) {
            let fabric = fabric_from_answer(index, answer).unwrap();
            assert_eq!(fabric.state, FabricState::NotSupported);
            gpus.push(GpuInfo {
                index,
                uuid: format!("GPU-{index}"),
                name: "NVIDIA H100 80GB HBM3".into(),
                pci_bus_id: format!("00000000:{index:02X}:00.0"),
                fabric,
            });
        }
        let node = NodeGpus {
            driver_version: "570.86.15".into(),
            gpus,
        };
        assert_eq!(
            node.clique(),
            Ok(domaind_actors::model::CliqueId::default())
        );
    }

    #[test]
    fn other_fabric_query_failures_are_errors_naming_the_gpu() {
        let error = fabric_from_answer(3, Err(NvmlError::GpuLost)).unwrap_err();
        let message = error.to_string();
        assert!(
            message.starts_with("NVML could not tell the NVLink fabric info of GPU 3: "),
            "{message}"
        );
    }

    #[test]
    fn an_unknown_state_is_an_error_naming_the_gpu() {
        let error = fabric_from_raw(2, raw(9, nvmlReturn_enum_NVML_SUCCESS)).unwrap_err();
        let message = error.to_string();
        assert!(message.contains("state 9 for GPU 2"), "{message}");
    }

    #[test]
    fn a_missing_library_is_one_clear_line_not_a_panic() {
        let error =
            NvmlInventory::open_library(OsStr::new("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
        assert!(
            matches!(error, NvmlInventoryError::Unavailable { .. }),
            "{error:?}"
        );
        let chain = format!("{:#}", anyhow::Error::new(error));
        assert!(
            chain.starts_with(
                "NVML (/nonexistent/libnvidia-ml.so.1) is not available on this node: no NVIDIA \
                 driver? For machines without GPUs use --gpu-topology FILE (a fake topology)"
            ),
            "{chain}"
        );
        assert!(!chain.contains('\n'), "{chain}");
    }

    #[test]
    fn a_library_that_is_not_nvml_is_unavailable() {
        // libc loads fine but has no nvmlInit_v2.
        let error = NvmlInventory::open_library(OsStr::new("libc.so.6")).unwrap_err();
        assert!(
            matches!(error, NvmlInventoryError::Unavailable { .. }),
            "{error:?}"
        );
        assert!(
            error
                .to_string()
                .contains("NVML (libc.so.6) is not available")
        );
    }
}
