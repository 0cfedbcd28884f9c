//! The run from start to report: the rack started and the domain formed, each step
//! of the schedule at its time with quiet watching in between, the final check that
//! the domain is whole, the graceful stop, and the report.

use std::time::{Duration, Instant};

use nix::sys::signal::Signal;

use super::{DOMAIN_NAME, FORM_LIMIT, Harness, NAMESPACE, RunConfig, START_LIMIT, STOP_LIMIT};
use crate::invariants::{Life, unsettled};
use crate::report::{FaultRecord, Outcome, Report};
use crate::schedule::{Schedule, Step};
use crate::soak::SoakReport;

/// Runs the harness; the report says whether the invariants held. An error means the
/// harness itself could not run (no binaries, no rack).
pub async fn run(config: RunConfig) -> anyhow::Result<Report> {
    let schedule = Schedule::generate_spaced(
        config.seed,
        config.nodes - config.spare,
        &config.scenario,
        config.duration,
        config.fault_gap,
    );
    let mut harness = Harness::start(config, &schedule)?;
    let rack_nodes = harness.rack.nodes().len();
    harness.say(&format!(
        "rack of {} nodes{} on 127.0.{}.1-{} in {} (logs: <dir>/node-*/domaind.log); network faults: {}",
        rack_nodes,
        cliques_note(harness.config.cliques, harness.config.nodes),
        harness.config.subnet,
        rack_nodes,
        harness.rack.spec().root.display(),
        harness.network_line()
    ));
    if schedule.kinds.iter().any(|k| k.needs_state_dir_mounts()) {
        harness.say(&format!("state directories: {}", harness.state_dirs_line()));
    }
    let formation = harness.form().await;
    let mut faults = Vec::new();
    match formation {
        Some(_) => {
            harness.phase_start = Instant::now();
            for step in &schedule.steps {
                let records = harness.run_step(step).await;
                faults.extend(records);
            }
            harness.finish().await;
        }
        None => {
            for step in &schedule.steps {
                faults.push(harness.not_run(step, "the domain never formed"));
            }
        }
    }
    harness.stop_all().await;
    Ok(harness.report(schedule, formation, faults))
}

impl Harness {
    /// Every node's own claim, prepared at once; the domain must form.
    async fn form(&mut self) -> Option<u64> {
        let started = Instant::now();
        if self
            .wait_until(START_LIMIT, |_, w, _| {
                w.nodes.iter().all(|n| n.life == Life::Up)
            })
            .await
            .is_none()
        {
            self.liveness(
                None,
                format!("the daemons were not all up within {START_LIMIT:?}"),
            );
            return None;
        }
        self.begin_other_cliques();
        self.say(&format!(
            "preparing one claim per node for ComputeDomain {NAMESPACE}/{DOMAIN_NAME} ({})",
            self.domain.uid
        ));
        let issued = Instant::now();
        for node in 0..self.world.nodes.len() {
            let claim = self.own_claim(node);
            self.begin_prepare(node, &claim);
        }
        if self.config.domains > 1 {
            self.say(&format!(
                "and one claim per node for each of {} more domains, every one with isolation: Channel",
                self.config.domains - 1
            ));
            self.begin_sharing_domains();
        }
        match self.wait_until(FORM_LIMIT, |h, w, o| h.settled(w, o)).await {
            Some(at) => {
                let ms = super::millis(issued, at);
                let nodes = self.world.nodes.len();
                let since_start = at.saturating_duration_since(started).as_secs_f64();
                self.say(&format!(
                    "formed: Ready {nodes}/{nodes} in {ms} ms ({since_start:.1} s after the daemons started)"
                ));
                if self.config.domains > 1 {
                    self.say(&format!("channels: {}", self.channels_line()));
                }
                self.finish_other_cliques().await;
                self.take_imports().await;
                self.say(&format!(
                    "imports: every member imports from every other member ({} held)",
                    self.imports.report.held_at_end
                ));
                Some(ms)
            }
            None => {
                self.record_unsettled("not whole after the prepares of formation");
                None
            }
        }
    }

    /// Runs one step of the schedule: waits for its time, injects, holds, ends, heals.
    async fn run_step(&mut self, step: &Step) -> Vec<FaultRecord> {
        if let Some(reason) = self.missing_control(step.kind) {
            let mut record = self.not_run(step, &reason);
            record.outcome = Outcome::Skipped(reason);
            return vec![record];
        }
        // Past twice the planned duration (and a minute), the run is too far behind
        // to be the schedule it was asked for: stop injecting, say so.
        let cutoff = self.phase_start + self.config.duration * 2 + Duration::from_secs(60);
        if Instant::now() > cutoff {
            return vec![self.not_run(step, "the run fell too far behind its schedule")];
        }
        let due = self.phase_start + step.at;
        let now = Instant::now();
        if due > now {
            self.quiet(due - now).await;
        }
        self.current = Some((step.kind, step.index));
        let records = self.inject(step).await;
        self.imports_hit(step, &records);
        self.check_imports().await;
        if records.iter().all(|r| r.outcome == Outcome::Healed) {
            self.take_imports().await;
        }
        self.current = None;
        for record in &records {
            self.say(&fault_line(record));
        }
        records
    }

    /// Waits with no fault under way. The domain healed before, and nothing should
    /// take it apart now: if it stays apart for longer than the isolation grace (a
    /// blip of a loaded machine is not a verdict), what is wrong becomes violations.
    async fn quiet(&mut self, duration: Duration) {
        let grace = self.config.isolation_grace;
        let mut apart = Apart::new(grace);
        let mut broken = Vec::new();
        self.hold(duration, |h, w, o| {
            if apart.past_grace(h.settled(w, o), o.at) && broken.is_empty() {
                broken = unsettled(w, o);
            }
            false
        })
        .await;
        for mut reason in broken {
            reason.detail = format!(
                "came apart with no fault under way, for over {grace:?}: {}",
                reason.detail
            );
            self.record(reason);
        }
    }

    /// After the last fault: the domain must be whole (agreement, status true).
    async fn finish(&mut self) {
        let since = Instant::now();
        if self.heal(since, "the faults stopped").await.is_some() {
            self.say("faults over: every member agrees and the status is true");
        }
        self.check_imports().await;
        let (allowed, violating) = self.imports.report.counts();
        self.say(&format!(
            "imports: {} held unbroken at the end; {allowed} broken by faults that may break \
             them, {violating} otherwise",
            self.imports.report.held_at_end
        ));
    }

    /// Stops every daemon gracefully, then checks once more that every prepared
    /// claim is in its checkpoint.
    async fn stop_all(&mut self) {
        for node in 0..self.world.nodes.len() {
            if self.world.nodes[node].life == Life::Paused {
                let _ = self.rack.signal_group(node, Signal::SIGCONT);
                self.world.set_life(node, Life::Up, Instant::now());
            }
            if matches!(self.world.nodes[node].life, Life::Up | Life::Starting) {
                let _ = self.rack.begin_stop(node);
                self.world.set_life(node, Life::Stopping, Instant::now());
            }
        }
        let stopped = self
            .wait_until(STOP_LIMIT, |_, w, _| {
                w.nodes.iter().all(|n| n.life == Life::Down)
            })
            .await;
        if stopped.is_none() {
            self.liveness(
                None,
                format!(
                    "daemons did not stop within {}s of SIGTERM",
                    STOP_LIMIT.as_secs()
                ),
            );
        }
        tokio::task::block_in_place(|| self.rack.stop_all(Duration::from_secs(5)));
        self.tick().await;
    }

    fn report(
        &mut self,
        schedule: Schedule,
        formation_ms: Option<u64>,
        faults: Vec<FaultRecord>,
    ) -> Report {
        let kinds = Report::summarise(
            &self.config.scenario,
            &faults,
            self.findings.violations(),
            self.findings.crashes(),
            Some(&self.imports.report.broken),
        );
        let soak = self.soak_report();
        let mut kept_files = None;
        if self.config.keep_files
            && let Some(tmp) = self.tmp.take()
        {
            let kept = tmp.keep();
            self.say(&format!("the rack's files are kept in {}", kept.display()));
            kept_files = Some(kept);
        }
        Report {
            seed: self.config.seed,
            nodes: self.config.nodes,
            cliques: self.config.cliques,
            domains: self.config.domains,
            scenario: self.config.scenario.clone(),
            duration_s: self.config.duration.as_secs(),
            domaind: self.config.domaind.display().to_string(),
            formation_ms,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            network: self.network_line(),
            isolation_grace_ms: self.config.isolation_grace.as_millis() as u64,
            observations: self.observations,
            kinds,
            faults,
            violations: self.findings.violations().to_vec(),
            crashes: self.findings.crashes().to_vec(),
            imports: self.imports.report.clone(),
            schedule,
            kept_files,
            ok: self.findings.ok() && soak.as_ref().is_none_or(SoakReport::ok),
            soak,
        }
    }
}

/// How long the domain has been apart while no fault was under way.
struct Apart {
    grace: Duration,
    since: Option<Instant>,
}

impl Apart {
    fn new(grace: Duration) -> Self {
        Self { grace, since: None }
    }

    /// One observation at `at`, whole or not: whether the domain has now been apart
    /// without a break for the grace or longer.
    fn past_grace(&mut self, whole: bool, at: Instant) -> bool {
        if whole {
            self.since = None;
            return false;
        }
        let since = *self.since.get_or_insert(at);
        at.saturating_duration_since(since) >= self.grace
    }
}

/// How the rack is split, when it is: said in the first progress line.
fn cliques_note(cliques: usize, per_clique: usize) -> String {
    if cliques < 2 {
        return String::new();
    }
    format!(
        " in {cliques} cliques of {per_clique} (faults in the first; each other clique forms its own domain)"
    )
}

/// The progress line of a fault's record.
fn fault_line(record: &FaultRecord) -> String {
    record.progress_line("(every link of the rack)")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schedule::FaultKind;

    #[test]
    fn a_blip_shorter_than_the_grace_is_not_apart() {
        let grace = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let mut apart = Apart::new(grace);
        assert!(!apart.past_grace(false, at(0)));
        assert!(!apart.past_grace(false, at(4_800)));
        // Whole again: the next break starts its own count.
        assert!(!apart.past_grace(true, at(5_000)));
        assert!(!apart.past_grace(false, at(5_200)));
        assert!(!apart.past_grace(false, at(10_000)));
        assert!(apart.past_grace(false, at(10_200)));
        assert!(apart.past_grace(false, at(12_000)));
        assert!(!apart.past_grace(true, at(12_200)));
    }

    fn record(targets: &[&str], detect_ms: Option<u64>, heal_ms: Option<u64>) -> FaultRecord {
        FaultRecord {
            step: 3,
            kind: FaultKind::NodeKill,
            targets: targets.iter().map(|t| (*t).to_owned()).collect(),
            planned_at_ms: 1_000,
            injected_at_ms: Some(1_100),
            detect_ms,
            heal_ms,
            outcome: Outcome::Healed,
            notes: Vec::new(),
        }
    }

    #[test]
    fn fault_lines_say_what_was_measured_and_noted() {
        assert_eq!(
            fault_line(&record(&["node-02"], Some(1_450), Some(2_310))),
            "node-kill node-02: detect 1450 ms, heal 2310 ms"
        );
        let mut loss = record(&[], None, None);
        loss.kind = FaultKind::Loss;
        loss.notes = vec!["7% loss for 9000 ms".into(), "dropped".into()];
        assert_eq!(
            fault_line(&loss),
            "loss (every link of the rack): detect -, heal - (7% loss for 9000 ms; dropped)"
        );
    }
}
