//! NVML's fabric query, called through the raw binding.
//!
//! Why unsafe: nvml-wrapper's safe API has no `nvmlDeviceGetGpuFabricInfoV`, and the
//! node's clique exists only there. Calling a foreign function is unsafe in Rust, so
//! this module is the one place in domaind allowed to (the workspace denies
//! `unsafe_code`). It also avoids the binding's convenience method, which panics when
//! the driver lacks the symbol: the function pointer is looked at first.
#![allow(unsafe_code)]

use nvml_wrapper::Device;
use nvml_wrapper::error::{NvmlError, nvml_try};
use nvml_wrapper_sys::bindings::{
    nvmlGpuFabricInfo_v2_t, nvmlGpuFabricInfo_v3_t,
    nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH, nvmlReturn_t,
};

/// The driver's answer, not yet interpreted.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct RawFabricInfo {
    pub cluster_uuid: [u8; 16],
    pub clique_id: u32,
    /// `NVML_GPU_FABRIC_STATE_*`.
    pub state: u8,
    /// The registration's own result, meaningful once `state` is completed.
    pub status: nvmlReturn_t,
}

/// `NVML_STRUCT_VERSION(GpuFabricInfo, N)`: the struct's size with its version in the
/// top byte, so the driver knows how much it may write.
const fn struct_version<T>(version: u32) -> u32 {
    size_of::<T>() as u32 | (version << 24)
}

const FABRIC_INFO_V3: u32 = struct_version::<nvmlGpuFabricInfo_v3_t>(3);
const FABRIC_INFO_V2: u32 = struct_version::<nvmlGpuFabricInfo_v2_t>(2);

/// Ask the driver for `device`'s fabric registration.
///
/// `Ok(None)`: this driver has no `nvmlDeviceGetGpuFabricInfoV`, so no GPU of the
/// node can report fabric. A driver that knows only the v2 struct gets asked again
/// with it: v2 is the leading part of v3, so the same buffer serves.
pub(super) fn fabric_info(device: &Device<'_>) -> Result<Option<RawFabricInfo>, NvmlError> {
    let Ok(get_fabric_info) = device.nvml().lib().nvmlDeviceGetGpuFabricInfoV.as_ref() else {
        return Ok(None);
    };
    // SAFETY: `handle` is only unsafe so that callers think about its lifetime; it is
    // used below while `device`, and the `Nvml` it borrows, are alive.
    let handle = unsafe { device.handle() };
    let mut info = nvmlGpuFabricInfo_v3_t {
        version: FABRIC_INFO_V3,
        clusterUuid: [0; 16],
        status: 0,
        cliqueId: 0,
        state: 0,
        healthMask: 0,
        healthSummary: 0,
    };
    // SAFETY: the pointer came from the library that NVML was initialised from and is
    // still loaded (`Nvml` outlives `device`); `handle` is a live device handle; `info`
    // is an initialised v3 struct whose version field tells the driver its size, and
    // the driver writes only within it during the call.
    let mut code = unsafe { get_fabric_info(handle, &mut info) };
    if code == nvmlReturn_enum_NVML_ERROR_ARGUMENT_VERSION_MISMATCH {
        info.version = FABRIC_INFO_V2;
        // SAFETY: as above; the v3 buffer is larger than the v2 struct the version
        // now announces, so the driver's writes stay inside it.
        code = unsafe { get_fabric_info(handle, &mut info) };
    }
    nvml_try(code)?;
    Ok(Some(RawFabricInfo {
        cluster_uuid: info.clusterUuid,
        clique_id: info.cliqueId,
        state: info.state,
        status: info.status,
    }))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn struct_versions_match_nvml_h() {
        // nvml.h: sizeof | (N << 24). The sizes follow from the C layout (4-byte
        // alignment, the trailing char padded), which the binding mirrors.
        assert_eq!(FABRIC_INFO_V3, 0x0300_0000 | 40);
        assert_eq!(FABRIC_INFO_V2, 0x0200_0000 | 36);
    }
}
