//! The kubelet's gRPC APIs for DRA drivers, generated from our own .proto files (in
//! `proto/`) with the kubelet's package, service, message and field names and numbers,
//! so that the bytes on the wire are what the kubelet sends and expects.
//!
//! - [`dra::v1`] and [`dra::v1beta1`]: the `DRAPlugin` service a driver serves on its
//!   `dra.sock` (NodePrepareResources, NodeUnprepareResources). The two versions are
//!   identical on the wire today; they are distinct services because the kubelet
//!   calls them by their package.
//! - [`pluginregistration`]: the `Registration` service on the driver's socket in the
//!   kubelet's `plugins_registry` directory (GetInfo, NotifyRegistrationStatus).
//!
//! Each module has a `*_server` module (the trait to implement and the tonic service)
//! and a `*_client` module.

pub mod dra {
    /// `k8s.io.kubelet.pkg.apis.dra.v1`, served as `v1.DRAPlugin`.
    pub mod v1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/k8s.io.kubelet.pkg.apis.dra.v1.rs"
        ));
    }

    /// `k8s.io.kubelet.pkg.apis.dra.v1beta1`, served as `v1beta1.DRAPlugin`.
    pub mod v1beta1 {
        include!(concat!(
            env!("OUT_DIR"),
            "/k8s.io.kubelet.pkg.apis.dra.v1beta1.rs"
        ));
    }
}

/// `pluginregistration` (the kubelet's pluginregistration v1 API; its package carries no
/// version).
pub mod pluginregistration {
    include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));
}
