//! How the harness reaches the node daemons and the controller of a cluster: the one
//! part of a cluster run that differs between environments, behind one trait.
//!
//! - [`crate::cluster::pods::PodAccess`] (a real cluster, the default): the daemons
//!   are the chart's DaemonSet pods and the controller its Deployment's. Deleting a
//!   daemon deletes its pod (the DaemonSet makes a new one); the IMEX daemon is stopped
//!   by `domaind imex kill` run in the daemon's container (pods/exec); `/state`, which
//!   listens on the node's loopback only, is read through a port-forward to the
//!   daemon's pod (host network: its loopback is the node's).
//! - [`crate::cluster::local::LocalAccess`] (`--local-daemons`): a cluster whose nodes
//!   are kubelets on this machine with no container runtime that runs anything, as
//!   `../shared/kube` makes them. The harness plays the DaemonSet and the Deployment:
//!   it runs one `domaind run --backend kube` per node, serving the kubelet's plugin
//!   directories, and one `domaind controller`, as processes; deleting a daemon stops
//!   its process (SIGTERM, as the kubelet would) and starts a new one with the same
//!   state directory (a hostPath survives its pod), and `/state` is read directly.
//!   Each node's IMEX runs under an IMEX runner of its own, as the chart's runner
//!   DaemonSet keeps it, and the workload's pods are stood in for by imports through
//!   each node's imex-sim ([`JobImports`]).
//!
//! Everything else (the ComputeDomain, the workload, cordons and evictions, the
//! invariants read from the API server) goes through the API server alike.

use std::collections::BTreeMap;

use async_trait::async_trait;
use domaind_node::run::NodeView;

/// A daemon as the harness last saw it: which process (or pod) serves a node, so that
/// a new one is told from the one before.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DaemonInstance {
    /// The pod's name and uid, or the process id.
    pub id: String,
    /// Restarts of the same instance that the harness did not cause: a container's
    /// restart count, or for a process, its exits on its own.
    pub restarts: u32,
}

/// The node daemons and the controller of the cluster under test.
#[async_trait]
pub trait ClusterAccess: Send {
    /// One line for the report: how the daemons are reached and faults injected.
    fn describe(&self) -> String;

    /// Makes sure every node of `nodes` has a daemon (starting them where the harness
    /// plays the DaemonSet) and the controller runs.
    async fn start(&mut self, nodes: &[String]) -> anyhow::Result<()>;

    /// The daemon serving `node` now, if any.
    async fn daemon(&mut self, node: &str) -> anyhow::Result<Option<DaemonInstance>>;

    /// `node`'s `/state`.
    async fn state(&mut self, node: &str) -> anyhow::Result<NodeView>;

    /// Deletes `node`'s daemon as its DaemonSet's pod would be deleted (a graceful
    /// stop), and has a new one started in its place. Returns once the deletion is
    /// issued; [`Self::daemon`] tells when the new one runs.
    async fn delete_daemon(&mut self, node: &str) -> anyhow::Result<()>;

    /// Kills `node`'s IMEX daemon (the node daemon must start it again); the pids
    /// killed.
    async fn stop_imex(&mut self, node: &str) -> anyhow::Result<Vec<u32>>;

    /// Restarts the controller: deletes its pods (or stops its process) and has new
    /// ones started. Returns the identities that were running.
    async fn restart_controller(&mut self) -> anyhow::Result<Vec<String>>;

    /// The controller instances running now (pod names or process ids), ready ones
    /// only.
    async fn controllers(&mut self) -> anyhow::Result<Vec<String>>;

    /// The controller's leader-election Lease: `(namespace, name)`. A restarted
    /// controller has healed once one of [`Self::controllers`] holds it.
    fn controller_lease(&self) -> (String, String);

    /// Whether `node`'s IMEX outlives its node daemon (an IMEX runner keeps it): a
    /// deletion or an upgrade of the daemon must then leave the node in the domain,
    /// its IMEX the same process, and the jobs' imports whole.
    async fn imex_outlives_daemon(&mut self, node: &str) -> anyhow::Result<bool>;

    /// The pids of `node`'s IMEX daemons, where the harness can see them; `None` where
    /// it cannot (another machine's processes).
    async fn imex_pids(&mut self, node: &str) -> anyhow::Result<Option<Vec<u32>>>;

    /// Starts a rolling update of the daemons of `nodes`, as the node DaemonSet's
    /// (`maxUnavailable: 1`): one node at a time, each new daemon ready before the next
    /// is stopped. [`Self::rolled`] follows it.
    async fn roll_daemons(&mut self, nodes: &[String]) -> anyhow::Result<()>;

    /// Whether the rolling update has replaced every daemon. Where the harness plays
    /// the DaemonSet, each call also moves it on.
    async fn rolled(&mut self) -> anyhow::Result<bool>;

    /// The workload stand-in's imports, where this access can hold them; `None` where
    /// it cannot (a real IMEX's imports are its jobs' own).
    fn job_imports(&mut self) -> Option<&mut dyn JobImports>;

    /// Stops what [`Self::start`] started; nothing for daemons the harness found.
    async fn stop(&mut self);
}

/// What became of an import the workload stand-in holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ImportState {
    Whole,
    /// Broken, as its IMEX says, and the exporting node it names.
    Broken {
        why: String,
        exporter: Option<String>,
    },
    /// Gone with its IMEX (restarted), or its IMEX could not say.
    Lost(String),
}

/// Memory imports held as a job's pods would hold them, through each node's IMEX.
#[async_trait]
pub trait JobImports: Send {
    /// `node`'s job imports from every node of `from`, as soon as its IMEX is linked to
    /// each; the import's id in `node`'s IMEX.
    async fn import(&mut self, node: &str, from: &[String]) -> anyhow::Result<u64>;

    /// What became of each import of `held` (`(node, id)`).
    async fn check(&mut self, held: &[(String, u64)]) -> BTreeMap<(String, u64), ImportState>;
}
