//! Faults on processes: SIGKILL a daemon, SIGSTOP it, kill only its IMEX daemon, and
//! rolling graceful restarts.

use std::time::Instant;

use nix::sys::signal::Signal;

use crate::harness::{DETECT_LIMIT, Harness, STOP_LIMIT, millis};
use crate::invariants::{Life, dropped_by_all};
use crate::report::{FaultRecord, Outcome};
use crate::schedule::Step;

impl Harness {
    /// SIGKILL; down until the survivors dropped it and the hold passed; restarted.
    pub(super) async fn kill(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let injected = Instant::now();
        if let Err(error) = tokio::task::block_in_place(|| self.rack.kill(target)) {
            self.liveness(Some(target), format!("SIGKILL failed: {error:#}"));
        }
        self.world.set_life(target, Life::Down, Instant::now());
        record.detect_ms = self
            .detect_drop(target, injected, "killed with SIGKILL")
            .await;
        self.hold(step.hold, |_, _, _| false).await;
        let ended = Instant::now();
        self.restart_node(target);
        self.heal_fault(record, ended, "a restart after SIGKILL")
            .await
    }

    fn restart_node(&mut self, node: usize) {
        match self.rack.start(node) {
            Ok(()) => self.world.set_life(node, Life::Starting, Instant::now()),
            Err(error) => self.liveness(Some(node), format!("cannot start it: {error:#}")),
        }
    }

    /// SIGSTOP for the hold (a short one may go unnoticed: a note, not a violation),
    /// then SIGCONT.
    pub(super) async fn pause(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let injected = Instant::now();
        if let Err(error) = self.rack.signal_group(target, Signal::SIGSTOP) {
            self.liveness(Some(target), format!("SIGSTOP failed: {error:#}"));
        }
        self.world.set_life(target, Life::Paused, Instant::now());
        let noticed = self
            .hold(step.hold, |_, w, o| dropped_by_all(w, o, target))
            .await;
        match noticed {
            Some(at) => record.detect_ms = Some(millis(injected, at)),
            None => record.notes.push(format!(
                "a {} ms pause went unnoticed",
                step.hold.as_millis()
            )),
        }
        let ended = Instant::now();
        if let Err(error) = self.rack.signal_group(target, Signal::SIGCONT) {
            self.liveness(Some(target), format!("SIGCONT failed: {error:#}"));
        }
        self.world.set_life(target, Life::Up, ended);
        self.heal_fault(record, ended, "SIGCONT").await
    }

    /// SIGKILL the node's IMEX daemon only; detected when a new one runs.
    pub(super) async fn imex_crash(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let pids = self
            .rack
            .imex_daemons()
            .map(|mut all| std::mem::take(&mut all[target]))
            .unwrap_or_default();
        if pids.is_empty() {
            self.liveness(Some(target), "no IMEX daemon ran to crash".into());
            record.outcome = Outcome::NotHealed;
            return record;
        }
        // Counted before the kill: the daemon may restart it before we look again.
        self.world.nodes[target].imex_crashes += 1;
        let injected = Instant::now();
        for pid in &pids {
            let _ =
                nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid as i32), Signal::SIGKILL);
        }
        let restarted = self
            .wait_until(DETECT_LIMIT, |_, _, o| {
                let now = &o.nodes[target].imex_pids;
                !now.is_empty() && !now.iter().any(|p| pids.contains(p))
            })
            .await;
        record.detect_ms = self.detection(target, injected, restarted, |_| {
            format!(
                "its IMEX daemon (pid {pids:?}) was killed and no new one ran within {}s",
                DETECT_LIMIT.as_secs()
            )
        });
        self.heal_fault(record, injected, "an IMEX daemon crash")
            .await
    }

    /// SIGTERM each target in turn (it retracts itself); each must exit, be dropped,
    /// start again and the domain heal before the next.
    pub(super) async fn rolling_restart(&mut self, step: &Step) -> Vec<FaultRecord> {
        let mut records = Vec::new();
        for &target in &step.targets {
            let mut record = self.record_for(step, &[target]);
            let injected = Instant::now();
            if let Err(error) = self.rack.begin_stop(target) {
                self.liveness(Some(target), format!("SIGTERM failed: {error:#}"));
            }
            self.world.set_life(target, Life::Stopping, Instant::now());
            record.detect_ms = self
                .detect_drop(
                    target,
                    injected,
                    "stopped with SIGTERM (it retracts itself)",
                )
                .await;
            let exited = self
                .wait_until(STOP_LIMIT, |_, w, _| w.nodes[target].life == Life::Down)
                .await;
            if exited.is_none() {
                self.liveness(
                    Some(target),
                    format!(
                        "did not exit within {}s of SIGTERM; killed",
                        STOP_LIMIT.as_secs()
                    ),
                );
                let _ = tokio::task::block_in_place(|| self.rack.kill(target));
                self.world.set_life(target, Life::Down, Instant::now());
            }
            let ended = Instant::now();
            self.restart_node(target);
            records.push(self.heal_fault(record, ended, "a graceful restart").await);
        }
        records
    }
}
