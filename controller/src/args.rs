//! `domaind controller`'s flags. Each has an environment fallback, so that a Deployment
//! can pass its pod name and namespace through the downward API.

use std::time::Duration;

use clap::{ArgAction, Args};

use crate::leader::Timing;
use crate::reconcile;
use domaind_kube_api::args::{ControllerHttp, HttpArgs, KubeArgs};
use domaind_kube_api::names::{
    CLIQUE_LABEL, DEFAULT_CHANNEL_DEVICE_CLASS, GOSSIP_CA_BUNDLE, GOSSIP_CA_SECRET,
};

#[derive(Debug, Clone, Args)]
pub struct ControllerArgs {
    #[command(flatten)]
    pub kube: KubeArgs,

    #[command(flatten)]
    pub http: HttpArgs<ControllerHttp>,

    /// The DeviceClass of the templates' `channel` request.
    #[arg(long, env = "DOMAIND_DEVICE_CLASS", default_value = DEFAULT_CHANNEL_DEVICE_CLASS)]
    pub device_class: String,

    /// Elect a leader through a Lease, so that several replicas can run and only one
    /// acts. `--leader-elect=false` for a single replica (it acts at once).
    #[arg(long, env = "DOMAIND_LEADER_ELECT", default_value_t = true, action = ArgAction::Set, value_name = "BOOL")]
    pub leader_elect: bool,

    /// The Lease's name.
    #[arg(long, env = "DOMAIND_LEASE_NAME", default_value = "domaind-controller")]
    pub lease_name: String,

    /// The Lease's namespace. Default: the pod's own namespace in a cluster, or the
    /// kubeconfig context's namespace.
    #[arg(long, env = "DOMAIND_LEASE_NAMESPACE")]
    pub lease_namespace: Option<String>,

    /// This replica's identity in the Lease, unique among replicas. Default: the pod
    /// name (POD_NAME), else the host name and process id.
    #[arg(long, env = "POD_NAME")]
    pub leader_identity: Option<String>,

    /// How long a Lease is honoured after its holder last renewed it; a replica that
    /// dies is replaced after this. Whole seconds.
    #[arg(long, env = "DOMAIND_LEASE_DURATION", default_value = "15s", value_parser = humantime::parse_duration)]
    pub lease_duration: Duration,

    /// How long the leader goes on acting without a successful renewal. Shorter than
    /// --lease-duration, so that it stops before anyone else may start.
    #[arg(long, env = "DOMAIND_RENEW_DEADLINE", default_value = "10s", value_parser = humantime::parse_duration)]
    pub renew_deadline: Duration,

    /// How often candidates look at the Lease and the leader renews it. Shorter than
    /// --renew-deadline.
    #[arg(long, env = "DOMAIND_RETRY_PERIOD", default_value = "2s", value_parser = humantime::parse_duration)]
    pub retry_period: Duration,

    /// How often a ComputeDomain being deleted checks whether its claims are gone.
    #[arg(long, env = "DOMAIND_DELETION_POLL", default_value = "5s", value_parser = humantime::parse_duration)]
    pub deletion_poll: Duration,

    /// How often a ComputeDomain whose template name is taken looks again whether the
    /// name came free.
    #[arg(long, env = "DOMAIND_CONFLICT_RECHECK", default_value = "30s", value_parser = humantime::parse_duration)]
    pub conflict_recheck: Duration,

    /// How often every ComputeDomain is reconciled even when nothing changed.
    #[arg(long, env = "DOMAIND_RESYNC", default_value = "10m", value_parser = humantime::parse_duration)]
    pub resync: Duration,

    /// Rack mode: create a ComputeDomain per NVLink clique when Nodes with a new
    /// --rack-label value appear, in --rack-namespace.
    #[arg(long, env = "DOMAIND_RACK_MODE", requires = "rack_namespace")]
    pub rack_mode: bool,

    /// The namespace the rack mode's ComputeDomains are created in.
    #[arg(long, env = "DOMAIND_RACK_NAMESPACE")]
    pub rack_namespace: Option<String>,

    /// The Node label whose values are cliques.
    #[arg(long, env = "DOMAIND_RACK_LABEL", default_value = CLIQUE_LABEL)]
    pub rack_label: String,

    /// How long a graceful stop (SIGTERM) may take: in-flight reconciles finish, then the
    /// Lease is released so that the other replica takes over at once.
    #[arg(long, env = "DOMAIND_SHUTDOWN_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,

    /// The node daemons' ServiceAccount: sign the gossip node certificates it requests
    /// (CertificateSigningRequests of signerName domaind.github.io/gossip-node). Unset:
    /// no signer runs.
    #[arg(long, env = "DOMAIND_NODE_SERVICE_ACCOUNT")]
    pub node_service_account: Option<String>,

    /// The node daemons' ServiceAccount's namespace. Default: --gossip-ca-namespace's.
    #[arg(long, env = "DOMAIND_NODE_SERVICE_ACCOUNT_NAMESPACE")]
    pub node_service_account_namespace: Option<String>,

    /// The Secret (type kubernetes.io/tls) holding the gossip CA the signer signs with;
    /// made if missing. Only the controller should be able to read it.
    #[arg(long, env = "DOMAIND_GOSSIP_CA_SECRET", default_value = GOSSIP_CA_SECRET)]
    pub gossip_ca_secret: String,

    /// The ConfigMap the signer keeps equal to the CA's certificate (key ca.crt), for
    /// the nodes to mount.
    #[arg(long, env = "DOMAIND_GOSSIP_CA_BUNDLE", default_value = GOSSIP_CA_BUNDLE)]
    pub gossip_ca_bundle: String,

    /// The namespace of the CA Secret and its bundle. Default: the pod's own namespace in
    /// a cluster, or the kubeconfig context's namespace.
    #[arg(long, env = "DOMAIND_GOSSIP_CA_NAMESPACE")]
    pub gossip_ca_namespace: Option<String>,

    /// How long a node certificate is valid: the lifetime of one whose request names
    /// none, and the most a request may ask for. Nodes renew at two thirds of it.
    #[arg(long, env = "DOMAIND_NODE_CERT_LIFETIME", default_value = "24h", value_parser = parse_lifetime)]
    pub node_cert_lifetime: Duration,
}

/// At least the 10 minutes the API server allows `expirationSeconds` to ask for.
fn parse_lifetime(value: &str) -> Result<Duration, String> {
    let lifetime = humantime::parse_duration(value).map_err(|e| e.to_string())?;
    if lifetime < Duration::from_secs(600) {
        return Err("a node certificate lives at least 10m".into());
    }
    Ok(lifetime)
}

impl ControllerArgs {
    pub fn election_timing(&self) -> Timing {
        Timing {
            duration: self.lease_duration,
            renew_deadline: self.renew_deadline,
            retry_period: self.retry_period,
        }
    }

    pub fn reconcile_timing(&self) -> reconcile::Timing {
        reconcile::Timing {
            resync: self.resync,
            deletion_poll: self.deletion_poll,
            conflict_recheck: self.conflict_recheck,
            api_timeout: self.kube.kube_api_timeout,
        }
    }
}

/// The identity when none is given: unique per process on a host.
pub fn default_identity() -> String {
    let host = std::env::var("HOSTNAME")
        .ok()
        .filter(|h| !h.is_empty())
        .or_else(|| {
            std::fs::read_to_string("/proc/sys/kernel/hostname")
                .ok()
                .map(|h| h.trim().to_string())
        })
        .unwrap_or_else(|| "domaind-controller".into());
    format!("{host}_{}", std::process::id())
}
