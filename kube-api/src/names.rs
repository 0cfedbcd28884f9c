//! The names other components and existing tools match on. NVIDIA's driver uses the
//! same driver name, finalizer, labels, device class and request name, so manifests
//! and tools written for it keep working; the node daemons and the controller take
//! them from here, so they cannot drift apart.

/// The DRA driver name of ComputeDomain channels (the ComputeDomain half of NVIDIA's
/// driver), which manifests and the kubelet already use; `--driver-name` by default.
pub const DEFAULT_DRIVER_NAME: &str = "compute-domain.nvidia.com";

/// The device class of the channel a workload's pods get.
pub const DEFAULT_CHANNEL_DEVICE_CLASS: &str = "compute-domain-default-channel.nvidia.com";

/// The one request of a domain's claim template, as NVIDIA's driver names it: the node
/// daemons prepare the channel of the request of this name.
pub const CHANNEL_REQUEST: &str = "channel";

/// The IMEX channel every domain's claims get in `Single` mode.
pub const DOMAIN_CHANNEL: u32 = 0;

/// The name of IMEX channel `channel`'s device in a node's pool.
pub fn channel_device(channel: u32) -> String {
    format!("channel-{channel}")
}

/// The IMEX channel a device of a node's pool is, from its name: the inverse of
/// [`channel_device`], so `channel-01` or `channel-+1` is none.
pub fn channel_of_device(name: &str) -> Option<u32> {
    let channel = name.strip_prefix("channel-")?.parse().ok()?;
    (channel_device(channel) == name).then_some(channel)
}

/// GPU feature discovery's node label: the node's `<clusterUUID>.<cliqueId>`.
pub const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";

/// On every ComputeDomain the controller serves, until no node is a member any more.
/// NVIDIA's driver's name: a CD it left behind is released by us too.
pub const FINALIZER: &str = "resource.nvidia.com/computeDomain";

/// On the templates we create (and the claims made from them): the CD's uid. The owned
/// templates watch selects on it.
pub const DOMAIN_LABEL: &str = "resource.nvidia.com/computeDomain";
/// NVIDIA's driver tells workload templates from its own daemon templates with this
/// label.
pub const TARGET_LABEL: &str = "resource.nvidia.com/computeDomainTarget";
pub const TARGET_WORKLOAD: &str = "Workload";
pub const MANAGED_BY_LABEL: &str = "app.kubernetes.io/managed-by";
pub const MANAGED_BY: &str = "domaind-controller";

/// The node daemons' server-side-apply field manager (CD status, ResourceSlices).
pub const NODE_FIELD_MANAGER: &str = "domaind-node";

/// The field manager of a clique's rows of a ComputeDomain's `status.nodes` (a list
/// keyed by name): each clique's reporter applies its own rows, and an apply drops only
/// the rows its own manager no longer lists. Before it, one manager
/// ([`NODE_FIELD_MANAGER`]) wrote the whole status, so a domain spanning cliques
/// showed only the last writer's.
pub fn status_field_manager(clique: &str) -> String {
    format!("{NODE_FIELD_MANAGER}/clique/{clique}")
}

/// The field manager that corrects a ComputeDomain's domain-wide status fields (phase,
/// counts, `Ready`) from every clique's rows, when two cliques wrote at once.
pub const DOMAIN_STATUS_FIELD_MANAGER: &str = "domaind-node/domain";

/// The node daemons' field manager of a ResourceClaim's `status.devices` entries, one
/// per driver name: an apply drops what its manager no longer sets, so two releases of
/// different drivers with devices in one claim would otherwise remove each other's.
pub fn claim_status_field_manager(driver: &str) -> String {
    format!("{NODE_FIELD_MANAGER}/{driver}")
}

/// The controller's server-side-apply field manager. With `conditions` a map keyed by
/// `type`, neither it nor the node daemons' removes what the other wrote.
pub const CONTROLLER_FIELD_MANAGER: &str = "domaind-controller";

/// `reportingController` of the node daemons' Events.
pub const NODE_REPORTING_CONTROLLER: &str = "domaind";

/// The status condition the controller owns (its reasons:
/// [`crate::reasons::TemplateReadyReason`]).
pub const TEMPLATE_READY: &str = "TemplateReady";

/// The signerName of gossip node certificates: the controller signs the
/// CertificateSigningRequests that name it, the node daemons ask under it. Under the
/// GitHub organisation's domain, which is ours; `kubernetes.io/` is Kubernetes' own.
pub const GOSSIP_SIGNER: &str = "domaind.github.io/gossip-node";

/// The usages a gossip node certificate is requested and issued with, in the API's
/// spelling: ECDSA keys sign (no key encipherment, an RSA key-transport usage), and
/// every node is both the TLS client and the server of its peers.
pub const GOSSIP_CERT_USAGES: [&str; 3] = ["digital signature", "server auth", "client auth"];

/// The `spec.extra` key the API server fills with the node a pod-bound ServiceAccount
/// token's pod runs on. A token not bound to a pod has none.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// The one DNS name every node certificate carries besides its node's, for IMEX in
/// DNS-names mode: `domaind_gossip::identity::IMEX_SHARED_NAME`, which says why (the
/// controller has no gossip; a test in the node crate ties the two).
pub const IMEX_SHARED_NAME: &str = "imex.domaind.invalid";

/// The ConfigMap the controller keeps equal to the gossip CA's certificate, and its key;
/// the node daemons mount it. Never the key.
pub const GOSSIP_CA_BUNDLE: &str = "domaind-gossip-ca-bundle";
pub const GOSSIP_CA_BUNDLE_KEY: &str = "ca.crt";

/// The controller's default Secret (type `kubernetes.io/tls`) holding the gossip CA.
pub const GOSSIP_CA_SECRET: &str = "domaind-gossip-ca";

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_channel_device_names_its_channel_and_nothing_else_does() {
        for channel in [0, 7, 2047] {
            assert_eq!(channel_of_device(&channel_device(channel)), Some(channel));
        }
        for name in [
            "channel-",
            "channel-01",
            "channel-+1",
            "channel-x",
            "daemon-0",
            "channel-0 ",
        ] {
            assert_eq!(channel_of_device(name), None, "{name:?}");
        }
    }
}
