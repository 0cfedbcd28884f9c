//! The kubelet's gRPC APIs for DRA drivers, generated from our own .proto files (in
//! `proto/`) with the kubelet's package, service, message and field names and numbers,
//! so that the bytes on the wire are what the kubelet sends and expects.
//!
//! - [`dra::v1`] and [`dra::v1beta1`]: the `DRAPlugin` service a driver serves on its
//!   `dra.sock` (NodePrepareResources, NodeUnprepareResources). The two versions are
//!   identical on the wire today; they are distinct services because the kubelet
//!   calls them by their package.
//! - [`dra_health`]: the `DRAResourceHealth` service on the same `dra.sock`
//!   (NodeWatchResources, a server stream of device health) in its three versions,
//!   `v1alpha1`, `v1beta1` and `v1`: the same messages in different packages.
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

pub mod dra_health {
    //! The kubelet's device-health API. Its packages are bare versions, so the services
    //! are `v1alpha1.DRAResourceHealth` and so on, the names registration offers too.

    /// `v1alpha1`: what kubelet 1.36 calls.
    pub mod v1alpha1 {
        include!(concat!(env!("OUT_DIR"), "/v1alpha1.rs"));
    }

    /// `v1beta1`.
    pub mod v1beta1 {
        include!(concat!(env!("OUT_DIR"), "/v1beta1.rs"));
    }

    /// `v1`.
    pub mod v1 {
        include!(concat!(env!("OUT_DIR"), "/v1.rs"));
    }
}

/// `pluginregistration` (the kubelet's pluginregistration v1 API; its package carries no
/// version).
pub mod pluginregistration {
    include!(concat!(env!("OUT_DIR"), "/pluginregistration.rs"));
}
