//! The DRA API versions we serve (prepare and unprepare; device health), and the names
//! the kubelet knows them by.

use std::fmt;
use std::str::FromStr;

/// A version of the kubelet's `DRAPlugin` service. Both are served on one socket; the
/// kubelet picks one from what registration offers (v1 when it has both). Ordered newest
/// first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum DraVersion {
    V1,
    V1beta1,
}

impl DraVersion {
    pub const ALL: [DraVersion; 2] = [DraVersion::V1, DraVersion::V1beta1];

    /// `v1`, `v1beta1`: for flags, logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            DraVersion::V1 => "v1",
            DraVersion::V1beta1 => "v1beta1",
        }
    }

    /// How registration names it in `supported_versions`: `v1.DRAPlugin`.
    pub fn registration_name(self) -> &'static str {
        match self {
            DraVersion::V1 => "v1.DRAPlugin",
            DraVersion::V1beta1 => "v1beta1.DRAPlugin",
        }
    }

    /// The gRPC service name, e.g. `k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin`.
    pub fn service_name(self) -> &'static str {
        use domaind_kubelet_api::dra::{v1, v1beta1};
        match self {
            DraVersion::V1 => v1::dra_plugin_server::SERVICE_NAME,
            DraVersion::V1beta1 => v1beta1::dra_plugin_server::SERVICE_NAME,
        }
    }

    /// The version a `supported_versions` entry names, if we know it.
    pub fn from_registration_name(name: &str) -> Option<DraVersion> {
        Self::ALL
            .into_iter()
            .find(|version| version.registration_name() == name)
    }
}

impl fmt::Display for DraVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A version of the kubelet's `DRAResourceHealth` service, all served on `dra.sock`.
/// Kubelet 1.36 calls v1alpha1 on every DRA plugin, offered or not; later kubelets call
/// the newest one registration offers (v1, once it exists; v1beta1 on the branch that
/// had it), and v1alpha1 until 1.40. Ordered newest first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum HealthVersion {
    V1,
    V1beta1,
    V1alpha1,
}

impl HealthVersion {
    pub const ALL: [HealthVersion; 3] = [
        HealthVersion::V1,
        HealthVersion::V1beta1,
        HealthVersion::V1alpha1,
    ];

    /// `v1`, `v1beta1`, `v1alpha1`: for logs and metric labels.
    pub fn as_str(self) -> &'static str {
        match self {
            HealthVersion::V1 => "v1",
            HealthVersion::V1beta1 => "v1beta1",
            HealthVersion::V1alpha1 => "v1alpha1",
        }
    }

    /// The gRPC service name, which is also how registration offers it:
    /// `v1alpha1.DRAResourceHealth` (the package is the bare version).
    pub fn service_name(self) -> &'static str {
        use domaind_kubelet_api::dra_health::{v1, v1alpha1, v1beta1};
        match self {
            HealthVersion::V1 => v1::dra_resource_health_server::SERVICE_NAME,
            HealthVersion::V1beta1 => v1beta1::dra_resource_health_server::SERVICE_NAME,
            HealthVersion::V1alpha1 => v1alpha1::dra_resource_health_server::SERVICE_NAME,
        }
    }
}

impl fmt::Display for HealthVersion {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown DRA version {0:?}: expected v1 or v1beta1")]
pub struct UnknownDraVersion(String);

impl FromStr for DraVersion {
    type Err = UnknownDraVersion;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|version| version.as_str() == s)
            .ok_or_else(|| UnknownDraVersion(s.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip() {
        for version in DraVersion::ALL {
            assert_eq!(version.as_str().parse::<DraVersion>(), Ok(version));
            assert_eq!(
                DraVersion::from_registration_name(version.registration_name()),
                Some(version)
            );
            assert!(
                version
                    .service_name()
                    .ends_with(&format!(".{}.DRAPlugin", version))
            );
        }
        assert!("v2".parse::<DraVersion>().is_err());
        assert_eq!(
            DraVersion::from_registration_name("v1alpha4.DRAPlugin"),
            None
        );
    }

    #[test]
    fn health_service_names_are_the_bare_versions() {
        for version in HealthVersion::ALL {
            assert_eq!(
                version.service_name(),
                format!("{version}.DRAResourceHealth")
            );
        }
    }
}
