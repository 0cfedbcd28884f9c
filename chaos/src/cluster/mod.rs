//! `domaind-chaos run --cluster`: the chaos run against a real cluster, through the
//! API server of `KUBECONFIG`.
//!
//! The run makes a namespace of its own, one ComputeDomain in it and a workload of one
//! pod per chosen node (a Deployment or a Job, any image), each pod taking a channel of
//! the domain, and waits for the domain to form. Then it injects the faults of a
//! seeded [`crate::schedule::Schedule`] that exist on a cluster, one at a time, each
//! healed before the next: a node daemon deleted (`daemon-delete`), the IMEX daemon
//! killed inside it (`imex-crash`), a node cordoned and the run's pods evicted from it
//! (`drain`), a workload pod deleted (`pod-delete`), the controller restarted
//! (`controller-restart`). It checks the [`checks`] on every observation, reports
//! detection and heal times per kind, and exits non-zero on any violation. At the end
//! it deletes what it made and checks that every claim was released and the
//! ComputeDomain's finalizer let go.
//!
//! One module a concern:
//! - `access`: the one part that differs per environment (pods on a real cluster,
//!   processes on `../shared/kube`): `pods`, `local`;
//! - `workload`: the objects the run makes; `plan`: which nodes, and `--dry-run`;
//! - `observe`: one look at the cluster; `checks`: the invariants over it;
//! - `harness`: the run, from formation to clean-up; `faults`: the injectors;
//! - `report`: the table and JSON.

pub mod access;
pub mod checks;
mod faults;
mod harness;
pub mod local;
pub mod observe;
pub mod plan;
pub mod pods;
pub mod report;
pub mod workload;

use std::path::PathBuf;
use std::time::Duration;

pub use harness::{cleanup_after_interrupt, run};

use crate::schedule::FaultKind;
use workload::WorkloadKind;

/// Which nodes the run takes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeChoice {
    /// These, by name.
    Named(Vec<String>),
    /// `count` Ready, schedulable nodes of one NVLink clique among those matching the
    /// label selector.
    Selected { selector: String, count: usize },
}

/// How the daemons and the controller are reached ([`access`]).
#[derive(Debug, Clone)]
pub enum AccessChoice {
    /// The chart's pods: where it is installed, and the release.
    Pods {
        namespace: String,
        release: Option<String>,
        /// The controller's leader-election Lease (the chart's
        /// `controller.leaderElection.leaseName`).
        lease_name: String,
    },
    /// Processes on this machine, for the kube scripts' nodes under this prefix.
    Local {
        kube_state_dir: PathBuf,
        domaind: PathBuf,
    },
}

/// What to run.
#[derive(Debug, Clone)]
pub struct ClusterConfig {
    pub nodes: NodeChoice,
    /// The run's own namespace: it must not exist yet.
    pub namespace: String,
    pub image: String,
    pub workload: WorkloadKind,
    pub gpus_per_pod: u32,
    pub scenario: Vec<FaultKind>,
    pub seed: u64,
    pub duration: Duration,
    pub access: AccessChoice,
    /// How long a breach may last before it is a violation (the reads of one
    /// observation are not one snapshot).
    pub grace: Duration,
    /// Workload created → domain whole.
    pub form_limit: Duration,
    /// Fault ended → domain whole again.
    pub heal_limit: Duration,
    /// Print what would be done; create nothing.
    pub dry_run: bool,
    /// Leave the namespace and its objects (and with `--local-daemons`, the daemons'
    /// files) behind.
    pub keep: bool,
    pub quiet: bool,
    /// With `--local-daemons`: the daemons' and the controller's `--log`.
    pub daemon_log: String,
}
