//! The report of a cluster run: the loopback run's per-kind table
//! ([`crate::report::write_outcomes`]) under a header of what ran where, and JSON.
//!
//! Detect and heal, per kind (the heal is always: one pod Running and Ready on each
//! node, the status Ready with exactly those nodes, every member's daemon agreeing,
//! a controller holding the Lease; [`super::checks::unwhole`]):
//! - daemon-delete: where IMEX outlives the daemon (an IMEX runner), detect, another
//!   member holds the node (its daemon silent, its IMEX vouched for), and the node
//!   must stay Ready in the status and counted by every member throughout, with the
//!   same IMEX process; without a runner, detect, another member's daemon (or the
//!   status) stops counting the node. Heal from the deletion, once a new daemon
//!   serves the node.
//! - imex-crash: detect, the node's daemon started a new IMEX daemon; heal from the
//!   kill.
//! - drain: detect, the domain dropped the node (the status and every other member);
//!   heal from the uncordon.
//! - pod-delete: detect, the node's daemon released the deleted pod's claim; heal from
//!   the deletion, once the replacement pod serves on the node.
//! - controller-restart: detect, a new controller runs; heal from the deletion, once a
//!   new controller holds the Lease.
//! - upgrade: the node DaemonSet's rolling update (or, with `--local-daemons`, each
//!   daemon stopped and started in turn, the next once the last is ready): nothing to
//!   detect; every node kept throughout as in daemon-delete; heal from the rollout's
//!   end.
//!
//! With `--local-daemons` the jobs' imports are held through each node's imex-sim
//! ([`super::imports`]) and counted per kind (IMPORTS); only imex-crash may break one.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use serde::Serialize;

use crate::report::{
    CrashRecord, FaultRecord, ImportsReport, KindReport, ViolationRecord, write_outcomes,
};
use crate::schedule::{FaultKind, Schedule};

#[derive(Debug, Clone, Serialize)]
pub struct ClusterReport {
    pub seed: u64,
    pub namespace: String,
    pub nodes: Vec<String>,
    /// How the daemons and the controller were reached.
    pub access: String,
    pub workload: String,
    pub scenario: Vec<FaultKind>,
    pub duration_s: u64,
    /// Workload created → the domain whole.
    pub formation_ms: Option<u64>,
    pub elapsed_ms: u64,
    pub grace_ms: u64,
    pub observations: u64,
    pub kinds: Vec<KindReport>,
    pub faults: Vec<FaultRecord>,
    pub violations: Vec<ViolationRecord>,
    pub crashes: Vec<CrashRecord>,
    /// The domain's events over the run, by reason.
    pub events: BTreeMap<String, u32>,
    /// The workload stand-in's imports, where the access held them (`--local-daemons`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub imports: Option<ImportsReport>,
    /// Whether everything the run made was deleted, and what was left otherwise.
    pub cleanup: String,
    pub schedule: Schedule,
    /// SIGINT or SIGTERM cut the run short (it cleaned up all the same).
    pub interrupted: bool,
    /// No violation, no crash, and not interrupted.
    pub ok: bool,
}

impl ClusterReport {
    pub fn table(&self) -> String {
        let mut out = String::new();
        let _ = writeln!(
            out,
            "domaind-chaos --cluster: {} nodes ({}), scenario {}, seed {}, {} s of faults ({} observations, each checked)",
            self.nodes.len(),
            self.nodes.join(", "),
            self.scenario
                .iter()
                .map(|k| k.name())
                .collect::<Vec<_>>()
                .join(","),
            self.seed,
            self.duration_s,
            self.observations
        );
        let _ = writeln!(out, "namespace {}: {}", self.namespace, self.workload);
        let _ = writeln!(out, "daemons and controller: {}", self.access);
        if let Some(ms) = self.formation_ms {
            let _ = writeln!(out, "formation: Ready {0}/{0} in {ms} ms", self.nodes.len());
        }
        if !self.events.is_empty() {
            let events: Vec<String> = self
                .events
                .iter()
                .map(|(reason, count)| format!("{reason} {count}"))
                .collect();
            let _ = writeln!(out, "domain events: {}", events.join(", "));
        }
        match &self.imports {
            Some(imports) => {
                let (allowed, violating) = imports.counts();
                let _ = writeln!(
                    out,
                    "imports: {} taken, {} checked, {} held at the end; broken: {allowed} by \
                     faults that may break them, {violating} otherwise",
                    imports.taken, imports.checked, imports.held_at_end
                );
            }
            None => {
                let _ = writeln!(out, "imports: not held (the access cannot)");
            }
        }
        let _ = writeln!(out, "clean-up: {}", self.cleanup);
        if self.interrupted {
            let _ = writeln!(
                out,
                "interrupted: the faults after the interruption were not injected"
            );
        }
        write_outcomes(
            &mut out,
            &self.kinds,
            &self.faults,
            &self.violations,
            &self.crashes,
        );
        out
    }
}
