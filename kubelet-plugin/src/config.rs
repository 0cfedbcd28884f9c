//! What the kubelet plugin servers need to know: the driver name and where the kubelet
//! looks for sockets.

use std::fmt;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;

use domaind_kube_api::names::DEFAULT_DRIVER_NAME;

use super::device_health::{DeviceHealthFeed, no_device_health};
/// The kubelet's default `--root-dir` is /var/lib/kubelet; plugins keep their sockets here.
pub const DEFAULT_PLUGINS_DIR: &str = "/var/lib/kubelet/plugins";
/// The directory the kubelet's plugin watcher watches for registration sockets.
pub const DEFAULT_REGISTRY_DIR: &str = "/var/lib/kubelet/plugins_registry";
/// How long shutdown waits for calls in flight: a prepare waiting on its domain answers
/// within its own deadline (10 s), so this lets it do so.
pub const DEFAULT_DRAIN_TIMEOUT: Duration = Duration::from_secs(10);

/// A DRA driver name: a DNS subdomain of at most 63 characters, as `resource.k8s.io`
/// requires of the `driver` of devices and claims. It names the sockets, so it is checked
/// before it reaches a path.
#[derive(Clone, PartialEq, Eq, Hash)]
pub struct DriverName(String);

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "invalid DRA driver name {name:?}: {reason} (a driver name is a DNS subdomain of at most \
     63 characters: lowercase letters, digits, '-' and '.', each dot-separated part starting \
     and ending with a letter or digit, e.g. compute-domain.nvidia.com)"
)]
pub struct DriverNameError {
    name: String,
    reason: &'static str,
}

impl DriverName {
    pub const MAX_LEN: usize = 63;

    pub fn new(name: impl Into<String>) -> Result<Self, DriverNameError> {
        let name = name.into();
        match Self::problem(&name) {
            None => Ok(Self(name)),
            Some(reason) => Err(DriverNameError { name, reason }),
        }
    }

    fn problem(name: &str) -> Option<&'static str> {
        if name.is_empty() {
            return Some("it is empty");
        }
        if name.len() > Self::MAX_LEN {
            return Some("it is longer than 63 characters");
        }
        for label in name.split('.') {
            let bytes = label.as_bytes();
            let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
                return Some("it has an empty part between dots");
            };
            if !bytes
                .iter()
                .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || *b == b'-')
            {
                return Some("it has a character other than a-z, 0-9, '-' and '.'");
            }
            if *first == b'-' || *last == b'-' {
                return Some("a part starts or ends with '-'");
            }
        }
        None
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl Default for DriverName {
    fn default() -> Self {
        Self(DEFAULT_DRIVER_NAME.to_string())
    }
}

impl FromStr for DriverName {
    type Err = DriverNameError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for DriverName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl fmt::Debug for DriverName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{:?}", self.0)
    }
}

/// Where and as whom the kubelet plugin servers listen.
#[derive(Debug, Clone)]
pub struct PluginServerConfig {
    pub driver_name: DriverName,
    /// `<plugins_dir>/<driver>/dra.sock` serves the DRA API.
    pub plugins_dir: PathBuf,
    /// `<registry_dir>/<driver>-reg.sock` serves registration.
    pub registry_dir: PathBuf,
    /// Also serve gRPC health on this TCP address (Kubernetes grpc probes need a port).
    /// Port 0 picks a free one; [`RunningPluginServer::health_addr`] says which.
    ///
    /// [`RunningPluginServer::health_addr`]: super::RunningPluginServer::health_addr
    pub health_addr: Option<SocketAddr>,
    /// How long shutdown waits for calls in flight before stopping the servers anyway.
    pub drain_timeout: Duration,
    /// The devices' health the kubelet's `DRAResourceHealth` streams report. Default:
    /// none ([`no_device_health`]), so the kubelet has every device Unknown.
    pub device_health: DeviceHealthFeed,
}

impl Default for PluginServerConfig {
    fn default() -> Self {
        Self {
            driver_name: DriverName::default(),
            plugins_dir: PathBuf::from(DEFAULT_PLUGINS_DIR),
            registry_dir: PathBuf::from(DEFAULT_REGISTRY_DIR),
            health_addr: None,
            drain_timeout: DEFAULT_DRAIN_TIMEOUT,
            device_health: no_device_health(),
        }
    }
}

impl PluginServerConfig {
    /// `<plugins_dir>/<driver>/dra.sock`: the endpoint registration hands the kubelet.
    pub fn dra_socket(&self) -> PathBuf {
        self.plugins_dir
            .join(self.driver_name.as_str())
            .join("dra.sock")
    }

    /// `<registry_dir>/<driver>-reg.sock`: where the kubelet's plugin watcher finds us.
    pub fn registration_socket(&self) -> PathBuf {
        self.registry_dir
            .join(format!("{}-reg.sock", self.driver_name))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_dns_subdomains() {
        for name in [
            DEFAULT_DRIVER_NAME,
            "a",
            "gpu.example.com",
            "x-1.y2",
            &"a".repeat(63),
        ] {
            assert_eq!(DriverName::new(name).unwrap().as_str(), name);
        }
        assert_eq!(DriverName::default().as_str(), DEFAULT_DRIVER_NAME);
    }

    #[test]
    fn refuses_what_is_not_a_dns_subdomain_saying_why() {
        for (name, why) in [
            ("", "empty"),
            ("Compute.nvidia.com", "character"),
            ("a..b", "empty part"),
            (".a", "empty part"),
            ("a.", "empty part"),
            ("-a.b", "starts or ends"),
            ("a-.b", "starts or ends"),
            ("a/b", "character"),
            ("a_b", "character"),
            (&"a".repeat(64), "longer than 63"),
        ] {
            let error = DriverName::new(name).unwrap_err().to_string();
            assert!(error.contains(why), "{name:?}: {error}");
            assert!(error.contains(&format!("{name:?}")), "{error}");
        }
    }

    #[test]
    fn socket_paths_follow_the_kubelets_layout() {
        let config = PluginServerConfig::default();
        assert_eq!(
            config.dra_socket(),
            PathBuf::from("/var/lib/kubelet/plugins/compute-domain.nvidia.com/dra.sock")
        );
        assert_eq!(
            config.registration_socket(),
            PathBuf::from("/var/lib/kubelet/plugins_registry/compute-domain.nvidia.com-reg.sock")
        );
    }
}
