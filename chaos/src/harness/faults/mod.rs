//! The fault injectors, a module per family: what each does to the rack, how
//! long it holds, how it ends, and what counts as its detection. Each ends in the one
//! heal tail (`Harness::heal_fault`), so every fault is healed, timed and checked
//! the same way.

mod certs;
mod churn;
mod disk;
mod domains;
mod imex_port;
mod network;
mod process;

use std::time::Instant;

use super::Harness;
use crate::report::{FaultRecord, Outcome};
use crate::schedule::{FaultKind, Step};

impl Harness {
    /// Injects `step`'s fault, holds it, ends it and waits for the heal: one record a
    /// target for a rolling restart, one otherwise.
    pub(super) async fn inject(&mut self, step: &Step) -> Vec<FaultRecord> {
        match step.kind {
            FaultKind::DaemonKill => vec![self.daemon_kill(step).await],
            FaultKind::NodeKill => vec![self.node_kill(step).await],
            FaultKind::Pause => vec![self.pause(step).await],
            FaultKind::ImexCrash => vec![self.imex_crash(step).await],
            FaultKind::Restart => self.rolling_restart(step).await,
            FaultKind::Upgrade => vec![self.upgrade(step).await],
            FaultKind::Partition => vec![self.partition(step).await],
            FaultKind::Loss => vec![self.loss(step).await],
            FaultKind::Churn => vec![self.churn(step).await],
            FaultKind::CertRotate => vec![self.cert_rotate(step).await],
            FaultKind::ImexPort => vec![self.imex_port(step).await],
            FaultKind::DiskFull => vec![self.disk_full(step).await],
            FaultKind::DomainChurn => vec![self.domain_churn(step).await],
            // The command line refuses them for a loopback rack; a schedule made
            // elsewhere may still hold one.
            FaultKind::DaemonDelete
            | FaultKind::Drain
            | FaultKind::PodDelete
            | FaultKind::ControllerRestart => {
                let mut record = self.not_run(step, "a fault of cluster runs (--cluster)");
                record.outcome = Outcome::Skipped("a fault of cluster runs (--cluster)".into());
                vec![record]
            }
        }
    }

    /// The record of `step` that was not injected, and why.
    pub(super) fn not_run(&self, step: &Step, reason: &str) -> FaultRecord {
        FaultRecord {
            step: step.index,
            kind: step.kind,
            targets: step.targets.iter().map(|t| self.name(*t)).collect(),
            planned_at_ms: step.at.as_millis() as u64,
            injected_at_ms: None,
            detect_ms: None,
            heal_ms: None,
            outcome: Outcome::NotRun(reason.into()),
            notes: Vec::new(),
        }
    }

    /// The record of `step` on `targets`, injected now; healed until shown otherwise.
    fn record_for(&self, step: &Step, targets: &[usize]) -> FaultRecord {
        FaultRecord {
            step: step.index,
            kind: step.kind,
            targets: targets.iter().map(|t| self.name(*t)).collect(),
            planned_at_ms: step.at.as_millis() as u64,
            injected_at_ms: Some(
                Instant::now()
                    .saturating_duration_since(self.phase_start)
                    .as_millis() as u64,
            ),
            detect_ms: None,
            heal_ms: None,
            outcome: Outcome::Healed,
            notes: Vec::new(),
        }
    }
}

/// A fault that could not be made: not injected after all.
fn skipped(mut record: FaultRecord, error: anyhow::Error) -> FaultRecord {
    record.injected_at_ms = None;
    record.outcome = Outcome::Skipped(format!("{error:#}"));
    record
}
