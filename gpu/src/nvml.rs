//! The real inventory: NVML, loaded from the NVIDIA driver at run time.

use std::ffi::OsStr;
use std::fmt;
use std::path::Path;

use nvml_wrapper::Nvml;
use nvml_wrapper::error::NvmlError;
use nvml_wrapper_sys::bindings::{
    NVML_GPU_FABRIC_STATE_COMPLETED, NVML_GPU_FABRIC_STATE_IN_PROGRESS,
    NVML_GPU_FABRIC_STATE_NOT_STARTED, NVML_GPU_FABRIC_STATE_NOT_SUPPORTED,
};

use super::clique::format_cluster_uuid;
use super::driver_root::{DriverRootSearch, driver_root_candidates};
use super::fabric_ffi::{self, RawFabricInfo};
use super::{FabricInfo, FabricState, GpuError, GpuInfo, GpuInventory, NodeGpus};

/// The name the driver installs NVML under; found through the loader's search path.
pub const DEFAULT_NVML_LIBRARY: &str = "libnvidia-ml.so.1";

/// What NVML could not do.
#[derive(Debug, thiserror::Error)]
pub enum NvmlInventoryError {
    /// No loadable NVML: the one line a user sees when the driver's files are missing.
    #[error(
        "NVML ({library}) is not available on this node: {reason}{searched}. On a GPU node, \
         mount the NVIDIA driver's files (the chart's node.driverRoot, seen at --driver-root) \
         or pass --nvml-library PATH; for machines without GPUs use --gpu-topology FILE (a \
         fake topology)"
    )]
    Unavailable {
        library: String,
        /// The loader's own words: the innermost cause, so that the line says it once.
        reason: String,
        searched: DriverRootSearch,
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
                        reason: innermost_cause(&source),
                        searched: DriverRootSearch::NotSearched,
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

    /// Open NVML from `library` through the loader's search path and, when that finds
    /// none and `library` is a bare name, from the library directories of
    /// `driver_root` (the driver's files mounted into the container).
    pub fn open_searching(
        library: &Path,
        driver_root: Option<&Path>,
    ) -> Result<Self, NvmlInventoryError> {
        let not_on_search_path = match Self::open_library(library.as_os_str()) {
            Err(error @ NvmlInventoryError::Unavailable { .. }) => error,
            found_or_other_failure => return found_or_other_failure,
        };
        let Some(root) = driver_root else {
            return Err(not_on_search_path);
        };
        let candidates = driver_root_candidates(library, root);
        if candidates.is_empty() {
            return Err(not_on_search_path);
        }
        if !root.is_dir() {
            return Err(not_on_search_path.searched(DriverRootSearch::Missing(root.into())));
        }
        let mut first_unloadable = None;
        for candidate in candidates.iter().filter(|path| path.exists()) {
            match Self::open_library(candidate.as_os_str()) {
                // A file that is there but does not load (another architecture, a broken
                // link) says more than "not found": keep its error.
                Err(error @ NvmlInventoryError::Unavailable { .. }) => {
                    first_unloadable.get_or_insert(error);
                }
                found_or_other_failure => return found_or_other_failure,
            }
        }
        Err(first_unloadable.unwrap_or_else(|| {
            not_on_search_path.searched(DriverRootSearch::NotFound(root.into()))
        }))
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

impl NvmlInventoryError {
    fn searched(self, search: DriverRootSearch) -> Self {
        match self {
            Self::Unavailable {
                library, reason, ..
            } => Self::Unavailable {
                library,
                reason,
                searched: search,
            },
            other => other,
        }
    }
}

/// nvml-wrapper's loading errors repeat their cause in their own text: the last cause
/// alone is the loader's message.
fn innermost_cause(error: &NvmlError) -> String {
    let mut cause: &dyn std::error::Error = error;
    while let Some(next) = std::error::Error::source(cause) {
        cause = next;
    }
    cause.to_string()
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

    /// The whole line a user reads, as `main` prints errors (anyhow's `{:#}`).
    fn line(error: NvmlInventoryError) -> String {
        format!("{:#}", anyhow::Error::new(error))
    }

    /// A bare name that no loader search path holds, to exercise the driver root search.
    const ABSENT: &str = "libnvidia-ml-domaind-test.so.1";

    #[test]
    fn a_missing_library_is_one_clear_line_not_a_panic() {
        let error =
            NvmlInventory::open_library(OsStr::new("/nonexistent/libnvidia-ml.so.1")).unwrap_err();
        assert!(
            matches!(error, NvmlInventoryError::Unavailable { .. }),
            "{error:?}"
        );
        let line = line(error);
        assert!(
            line.starts_with(
                "NVML (/nonexistent/libnvidia-ml.so.1) is not available on this node: \
                 /nonexistent/libnvidia-ml.so.1: cannot open shared object file"
            ),
            "{line}"
        );
        assert!(
            line.ends_with(
                ". On a GPU node, mount the NVIDIA driver's files (the chart's \
                 node.driverRoot, seen at --driver-root) or pass --nvml-library PATH; for \
                 machines without GPUs use --gpu-topology FILE (a fake topology)"
            ),
            "{line}"
        );
        // The loader's message once, not nvml-wrapper's copy of it and then the original.
        assert_eq!(
            line.matches("cannot open shared object file").count(),
            1,
            "{line}"
        );
        assert!(!line.contains('\n'), "{line}");
    }

    #[test]
    fn without_a_driver_root_the_search_path_is_all_there_is() {
        let error = NvmlInventory::open_searching(Path::new(ABSENT), None).unwrap_err();
        let line = line(error);
        assert!(
            line.starts_with(&format!("NVML ({ABSENT}) is not available on this node: ")),
            "{line}"
        );
        assert!(!line.contains("driver root"), "{line}");
    }

    #[test]
    fn a_driver_root_that_is_not_mounted_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("driver-root");
        let error = NvmlInventory::open_searching(Path::new(ABSENT), Some(&root)).unwrap_err();
        let line = line(error);
        assert!(
            line.contains(&format!(
                "cannot open shared object file: No such file or directory; nothing is \
                 mounted at {}. On a GPU node, mount",
                root.display()
            )),
            "{line}"
        );
    }

    #[test]
    fn a_driver_root_without_nvml_lists_where_it_was_looked_for() {
        let root = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(root.path().join("usr/lib64")).unwrap();
        let error =
            NvmlInventory::open_searching(Path::new(ABSENT), Some(root.path())).unwrap_err();
        let line = line(error);
        assert!(
            line.contains(&format!(
                "; nor is it in the driver root {} (usr/lib64, usr/lib/x86_64-linux-gnu, \
                 usr/lib/aarch64-linux-gnu, lib64, lib/x86_64-linux-gnu, \
                 lib/aarch64-linux-gnu). On a GPU node",
                root.path().display()
            )),
            "{line}"
        );
    }

    #[test]
    fn a_file_in_the_driver_root_that_does_not_load_is_the_error() {
        let root = tempfile::tempdir().unwrap();
        let dir = root.path().join("usr/lib/x86_64-linux-gnu");
        std::fs::create_dir_all(&dir).unwrap();
        let broken = dir.join(ABSENT);
        std::fs::write(&broken, b"not a shared object").unwrap();
        let error =
            NvmlInventory::open_searching(Path::new(ABSENT), Some(root.path())).unwrap_err();
        match &error {
            NvmlInventoryError::Unavailable {
                library, searched, ..
            } => {
                assert_eq!(library, &broken.display().to_string());
                assert_eq!(searched, &DriverRootSearch::NotSearched);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn a_path_is_not_searched_for_in_the_driver_root() {
        let root = tempfile::tempdir().unwrap();
        let error = NvmlInventory::open_searching(
            Path::new("/nonexistent/libnvidia-ml.so.1"),
            Some(root.path()),
        )
        .unwrap_err();
        assert!(!line(error).contains("driver root"));
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
