//! Faults on processes: SIGKILL a daemon alone or the whole node, SIGSTOP a daemon,
//! kill only its IMEX daemon, rolling graceful restarts and a rolling upgrade.
//!
//! The rack's IMEX runs under a runner of each node's own, as the chart installs it:
//! whatever happens to the daemon alone (killed, paused, stopped, upgraded) IMEX runs
//! on, its peers hold the node instead of dropping it, and the restarted daemon adopts
//! the same IMEX process.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use domaind_testbed::rack::http_get;

use nix::sys::signal::Signal;

use crate::harness::{DETECT_LIMIT, Harness, START_LIMIT, STOP_LIMIT, millis};
use crate::invariants::{Invariant, Life, Violation, dropped_by_all, held_by_all};
use crate::report::{FaultRecord, Outcome};
use crate::schedule::Step;

impl Harness {
    /// SIGKILL to the daemon alone; its IMEX lives on, so the survivors must hold it;
    /// down for the hold; restarted, it must adopt the same IMEX.
    pub(super) async fn daemon_kill(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let imex = self.imex_pids(target);
        let injected = Instant::now();
        if let Err(error) = tokio::task::block_in_place(|| self.rack.kill(target)) {
            self.liveness(Some(target), format!("SIGKILL failed: {error:#}"));
        }
        self.world.set_life(target, Life::Down, Instant::now());
        record.detect_ms = self
            .detect_held(target, injected, "its daemon was killed with SIGKILL")
            .await;
        self.hold(step.hold, |_, _, _| false).await;
        let ended = Instant::now();
        self.restart_node(target);
        let record = self
            .heal_fault(record, ended, "a restart after its daemon's SIGKILL")
            .await;
        self.check_imex_kept(target, &imex, "a SIGKILL of its daemon");
        record
    }

    /// SIGKILL to the whole node: the daemon, its IMEX runner and IMEX; down until the
    /// survivors dropped it and the hold passed; restarted with a new IMEX.
    pub(super) async fn node_kill(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let injected = Instant::now();
        if let Err(error) = tokio::task::block_in_place(|| self.rack.kill_node(target)) {
            self.liveness(Some(target), format!("SIGKILL failed: {error:#}"));
        }
        self.world.set_life(target, Life::Down, Instant::now());
        record.detect_ms = self
            .detect_drop(target, injected, "killed with SIGKILL, IMEX and all")
            .await;
        self.hold(step.hold, |_, _, _| false).await;
        let ended = Instant::now();
        self.restart_node(target);
        self.heal_fault(record, ended, "a restart after SIGKILL")
            .await
    }

    /// The IMEX pids the newest observation saw on `node`.
    fn imex_pids(&self, node: usize) -> Vec<u32> {
        self.last
            .as_ref()
            .map(|(_, o)| o.nodes[node].imex_pids.clone())
            .unwrap_or_default()
    }

    /// After a fault on `node`'s daemon alone (`what`): the same IMEX must run as
    /// before it (`before`), adopted, not replaced; otherwise IMEX died with a daemon
    /// it should outlive, which the harness did not do.
    fn check_imex_kept(&mut self, node: usize, before: &[u32], what: &str) {
        let after = self.imex_pids(node);
        if !before.is_empty() && after != before {
            let name = self.name(node);
            self.record(Violation::new(
                Invariant::Crash,
                Some(&name),
                format!(
                    "its IMEX daemon did not outlive {what}: pid {before:?} before, {after:?} after"
                ),
            ));
        }
    }

    fn restart_node(&mut self, node: usize) {
        // After a node-kill the start waits for a new IMEX runner to serve.
        match tokio::task::block_in_place(|| self.rack.start(node)) {
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
        // Its IMEX runs on under the runner: peers that ask it find it and hold the
        // node; one whose IMEX could not vouch in time drops it.
        let noticed = self
            .hold(step.hold, |_, w, o| {
                held_by_all(w, o, target) || dropped_by_all(w, o, target)
            })
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

    /// SIGTERM each target in turn: with IMEX under the runner it stops without leaving
    /// its domains, so every survivor must hold it; it must exit, start again, adopt
    /// the same IMEX, and the domain heal before the next.
    pub(super) async fn rolling_restart(&mut self, step: &Step) -> Vec<FaultRecord> {
        let mut records = Vec::new();
        for &target in &step.targets {
            let mut record = self.record_for(step, &[target]);
            let imex = self.imex_pids(target);
            let injected = Instant::now();
            if let Err(error) = self.rack.begin_stop(target) {
                self.liveness(Some(target), format!("SIGTERM failed: {error:#}"));
            }
            self.world.set_life(target, Life::Stopping, Instant::now());
            record.detect_ms = self
                .detect_held(
                    target,
                    injected,
                    "stopped with SIGTERM, its IMEX running on",
                )
                .await;
            self.stopped(target).await;
            let ended = Instant::now();
            self.restart_node(target);
            records.push(self.heal_fault(record, ended, "a graceful restart").await);
            self.check_imex_kept(target, &imex, "its daemon's graceful restart");
        }
        records
    }

    /// A DaemonSet's rolling update: each target in turn stopped (SIGTERM), waited for,
    /// started and waited for until ready (run.json), the next at once, as
    /// `maxUnavailable: 1` paces it; then the domain must be whole, every IMEX the one
    /// that ran before, and nothing to detect: the peers' holding a node meanwhile is
    /// noted.
    pub(super) async fn upgrade(&mut self, step: &Step) -> FaultRecord {
        let mut record = self.record_for(step, &step.targets);
        let imex: Vec<Vec<u32>> = step.targets.iter().map(|t| self.imex_pids(*t)).collect();
        let mut held: BTreeSet<String> = BTreeSet::new();
        let mut note_held = |obs: &crate::observe::Observation| {
            for view in obs.nodes.iter().filter_map(|n| n.view.as_ref()) {
                for domain in &view.domains {
                    held.extend(domain.held.iter().cloned());
                }
            }
        };
        for &target in &step.targets {
            if let Err(error) = self.rack.begin_stop(target) {
                self.liveness(Some(target), format!("SIGTERM failed: {error:#}"));
            }
            self.world.set_life(target, Life::Stopping, Instant::now());
            let exited = self
                .wait_until(STOP_LIMIT, |_, w, o| {
                    note_held(o);
                    w.nodes[target].life == Life::Down
                })
                .await;
            if exited.is_none() {
                self.kill_unstopped(target);
            }
            self.restart_node(target);
            let ready = self
                .wait_until(START_LIMIT, |_, w, o| {
                    note_held(o);
                    w.nodes[target].life == Life::Up
                })
                .await;
            if ready.is_none() {
                self.liveness(
                    Some(target),
                    format!(
                        "upgraded, it was not ready within {}s",
                        START_LIMIT.as_secs()
                    ),
                );
                continue;
            }
            // As a DaemonSet paces its rolling update: on /readyz, which holds while a
            // node that adopted its IMEX catches up with its domains.
            let serving = Arc::new(AtomicBool::new(false));
            let poll = self
                .rack
                .node(target)
                .info()
                .map(|info| tokio::spawn(poll_readyz(info.http_addr, serving.clone())));
            let answered = self
                .wait_until(START_LIMIT, |_, _, o| {
                    note_held(o);
                    serving.load(Ordering::Relaxed)
                })
                .await;
            if let Some(poll) = poll {
                poll.abort();
            }
            if answered.is_none() {
                self.liveness(
                    Some(target),
                    format!(
                        "upgraded, its /readyz did not answer 200 within {}s",
                        START_LIMIT.as_secs()
                    ),
                );
            }
        }
        let ended = Instant::now();
        record.notes.push(format!(
            "{} daemons restarted in turn; held by a peer meanwhile: {}",
            step.targets.len(),
            if held.is_empty() {
                "none".to_owned()
            } else {
                held.iter().cloned().collect::<Vec<_>>().join(", ")
            }
        ));
        let record = self.heal_fault(record, ended, "a rolling upgrade").await;
        for (target, before) in step.targets.iter().zip(&imex) {
            self.check_imex_kept(*target, before, "a rolling upgrade");
        }
        record
    }

    /// Waits for a target sent SIGTERM to exit; past the limit it is a violation, and
    /// the daemon is killed.
    async fn stopped(&mut self, target: usize) {
        let exited = self
            .wait_until(STOP_LIMIT, |_, w, _| w.nodes[target].life == Life::Down)
            .await;
        if exited.is_none() {
            self.kill_unstopped(target);
        }
    }

    /// A daemon that did not exit within the limit of its SIGTERM: a violation, and
    /// SIGKILL (to the daemon alone: its IMEX is the runner's).
    fn kill_unstopped(&mut self, target: usize) {
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
}

/// Sets `serving` once the daemon at `http` answers `/readyz` with 200.
async fn poll_readyz(http: SocketAddr, serving: Arc<AtomicBool>) {
    loop {
        if matches!(http_get(http, "/readyz").await, Ok((200, _))) {
            serving.store(true, Ordering::Relaxed);
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}
