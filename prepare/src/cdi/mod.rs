//! The CDI writer: the spec files that tell the container runtime which IMEX channel
//! device nodes a prepared claim's containers get.
//!
//! One spec per claim, `<cdi dir>/k8s.<driver>-claim_<claim uid>.json`, of kind
//! `k8s.<driver>/claim` and with one device: `<uid>-channel-<N>` holding the domain's
//! channel (allocation mode Single) or `<uid>-all-channels` holding every channel the
//! caller lists (All). The device nodes carry their numbers (the major of
//! `nvidia-caps-imex-channels`, the channel as minor), so the runtime creates them in
//! the container without looking at the host. The kubelet passes the fully qualified
//! device ids, `k8s.<driver>/claim=<device>`, to the runtime.
//!
//! We write our own types: the format is small, and the Rust CDI crate brings in a
//! few hundred dependencies. Tests check the output against the CNCF schema.

mod error;
mod names;
mod spec;
#[cfg(test)]
mod tests;
mod writer;

pub use error::CdiError;
pub use names::{CLASS, ClaimUid, Kind, check_device_name};
pub use spec::{CDI_VERSION, ContainerEdits, Device, DeviceNode, DeviceType, Spec};
pub use writer::{
    CHANNEL_DEVICE_DIR, CdiWriter, ClaimChannels, DEFAULT_CDI_DIR, channel_device_path,
};
