//! The cluster run from start to report: the namespace, the daemons and controller
//! checked (or started, locally), the domain formed, each step of the schedule at its
//! time with quiet watching in between, the final check, the clean-up and its checks.

mod imports;
mod namespace;

use imports::ClusterImports;
pub use namespace::cleanup_after_interrupt;
use namespace::{TEARDOWN_LIMIT, delete_namespace, make_access, preflight, uncordon_ours};

use std::collections::{BTreeMap, BTreeSet};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use domaind_kube_api::crd::ComputeDomain;
use domaind_testkit::poll_every;
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::batch::v1::Job;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams, PropagationPolicy};
use kube::{Client, ResourceExt as _};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use super::access::{ClusterAccess, DaemonInstance};
use super::checks::{Expected, Persistent, breaches, unwhole};
use super::local::{LocalAccess, LocalConfig};
use super::observe::{ClusterObservation, observe};
use super::report::ClusterReport;
use super::workload::{CORDON_ANNOTATION, DOMAIN_NAME, WORKLOAD_NAME, Workload, WorkloadKind};
use super::{AccessChoice, ClusterConfig, plan};
use crate::harness::findings::Findings;
use crate::invariants::{Invariant, Violation};
use crate::report::{FaultRecord, Outcome, Report};
use crate::schedule::{FaultKind, Schedule, Step};

/// Between observations (each takes some API calls and a `/state` per node).
pub(super) const TICK: Duration = Duration::from_millis(500);
/// Fault → survivors notice (the design holds itself to 5 s; a real API server and
/// kubelet add their own delays).
pub(super) const DETECT_LIMIT: Duration = Duration::from_secs(60);
/// The run under way: the cluster, what the run made and did, and what it saw.
pub(super) struct ClusterRun {
    pub(super) config: ClusterConfig,
    pub(super) client: Client,
    pub(super) access: Box<dyn ClusterAccess>,
    /// With `--local-daemons`, the daemons' files. After `access`: dropped (a run
    /// interrupted) once the daemons are gone; kept when the run failed.
    files: Option<tempfile::TempDir>,
    pub(super) workload: Workload,
    pub(super) started: Instant,
    phase_start: Instant,
    domain_uid: String,
    /// Every claim uid of the run seen so far.
    known_claims: BTreeSet<String>,
    breaches: Persistent,
    /// Breaches of wholeness with no fault under way.
    apart: Persistent,
    findings: Findings,
    pub(super) current: Option<(FaultKind, usize)>,
    observations: u64,
    /// Each node's daemon as last seen: a new one the harness did not ask for, or a
    /// restart, is a crash.
    daemons_seen: BTreeMap<String, DaemonInstance>,
    /// Nodes whose daemon the harness deleted: a new instance is expected.
    pub(super) replacing: BTreeSet<String>,
    controllers_seen: BTreeSet<String>,
    /// The harness restarted the controller: instances may go.
    pub(super) controller_restarting: bool,
    pub(super) last: Option<ClusterObservation>,
    /// The workload stand-in's imports, where the access holds them.
    pub(super) imports: ClusterImports,
    /// The domain's events as last seen while it existed (they only grow).
    events_seen: BTreeMap<String, u32>,
    /// Cancelled on SIGINT or SIGTERM: no more faults, straight to the clean-up.
    stop: CancellationToken,
    /// The clean-up is under way: its waits and checks run, interrupted or not.
    cleaning: bool,
}

/// Runs a cluster run; the report says whether the invariants held (`None`: a dry
/// run). An error means the run could not start (no cluster, no nodes, the namespace
/// taken). Once `stop` is cancelled the run injects nothing more, cuts the fault under
/// way short (a cordoned node is uncordoned), and cleans up as at its end.
pub async fn run(
    config: ClusterConfig,
    stop: CancellationToken,
) -> anyhow::Result<Option<ClusterReport>> {
    let client = Client::try_default()
        .await
        .context("cannot reach the cluster (KUBECONFIG)")?;
    let nodes = plan::resolve(&client, &config.nodes).await?;
    if nodes.len() < 2 {
        bail!("a cluster run needs at least 2 nodes");
    }
    let workload = Workload {
        namespace: config.namespace.clone(),
        nodes: nodes.clone(),
        image: config.image.clone(),
        kind: config.workload,
        gpus_per_pod: config.gpus_per_pod,
    };
    let schedule = Schedule::generate(config.seed, nodes.len(), &config.scenario, config.duration);
    let (access, files) = make_access(&config, &client)?;
    if config.dry_run {
        print!(
            "{}",
            plan::describe(&workload, &schedule, &access.describe())
        );
        return Ok(None);
    }
    preflight(&client, &config.namespace).await?;
    let now = Instant::now();
    let mut run = ClusterRun {
        config,
        client,
        access,
        files,
        workload,
        started: now,
        phase_start: now,
        domain_uid: String::new(),
        known_claims: BTreeSet::new(),
        breaches: Persistent::default(),
        apart: Persistent::default(),
        findings: Findings::default(),
        current: None,
        observations: 0,
        daemons_seen: BTreeMap::new(),
        replacing: BTreeSet::new(),
        controllers_seen: BTreeSet::new(),
        controller_restarting: false,
        last: None,
        imports: ClusterImports::default(),
        events_seen: BTreeMap::new(),
        stop,
        cleaning: false,
    };
    run.say(&format!(
        "nodes {}; namespace {}; daemons and controller: {}",
        nodes.join(", "),
        run.workload.namespace,
        run.access.describe()
    ));
    run.start_imports();
    let formation = match run.form().await {
        Ok(formation) => formation,
        Err(error) => {
            run.liveness(format!("the run could not start: {error:#}"));
            None
        }
    };
    if formation.is_some() {
        run.take_imports().await;
    }
    let mut faults = Vec::new();
    match formation {
        Some(_) => {
            run.phase_start = Instant::now();
            for step in &schedule.steps {
                if run.interrupted() {
                    faults.push(run.record_for(step, Outcome::NotRun("interrupted".into())));
                    continue;
                }
                faults.push(run.run_step(step).await);
            }
            if !run.interrupted() {
                run.finish().await;
            }
        }
        None => {
            for step in &schedule.steps {
                faults
                    .push(run.record_for(step, Outcome::NotRun("the domain never formed".into())));
            }
        }
    }
    run.cleaning = true;
    let cleanup = run.clean_up().await;
    let report = run.report(schedule, formation, faults, cleanup);
    // The daemons' logs and state are the evidence of a failed run.
    let failed = !report.violations.is_empty() || !report.crashes.is_empty();
    if let Some(dir) = run.files.take()
        && (failed || run.config.keep)
    {
        let kept = dir.keep();
        run.say(&format!(
            "the daemons' and the controller's files are kept in {}",
            kept.display()
        ));
    }
    Ok(Some(report))
}

/// Cordons `node` for the run `by` (annotated, so that a clean-up finds it), or
/// uncordons it (`None`).
pub(super) async fn set_cordon(
    client: &Client,
    node: &str,
    by: Option<&str>,
) -> anyhow::Result<()> {
    let patch = json!({
        "metadata": {"annotations": {CORDON_ANNOTATION: by}},
        "spec": {"unschedulable": by.is_some()},
    });
    Api::<Node>::all(client.clone())
        .patch(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .with_context(|| {
            format!(
                "cannot {} {node}",
                if by.is_some() { "cordon" } else { "uncordon" }
            )
        })?;
    Ok(())
}

impl ClusterRun {
    pub(super) fn say(&self, line: &str) {
        if !self.config.quiet {
            eprintln!("[{:>6.1}s] {line}", self.started.elapsed().as_secs_f64());
        }
    }

    fn expected_parts(&self) -> (String, Vec<String>, BTreeSet<String>) {
        (
            self.domain_uid.clone(),
            self.workload.nodes.clone(),
            self.known_claims.clone(),
        )
    }

    /// Why the domain is not whole in `obs` (empty: whole).
    pub(super) fn unwhole(&self, obs: &ClusterObservation) -> Vec<Violation> {
        let (domain, nodes, known) = self.expected_parts();
        unwhole(
            obs,
            &Expected {
                domain: &domain,
                nodes: &nodes,
                known_claims: &known,
            },
        )
    }

    /// Interrupted, and not yet cleaning up: waits end at once.
    pub(super) fn interrupted(&self) -> bool {
        self.stop.is_cancelled() && !self.cleaning
    }

    pub(super) fn record(&mut self, violation: Violation) {
        // A fault cut short by an interruption proves nothing either way.
        if self.interrupted() {
            return;
        }
        let at_ms = self.started.elapsed().as_millis() as u64;
        if let Some(line) = self.findings.record(violation, at_ms, self.current) {
            self.say(&line);
        }
    }

    pub(super) fn liveness(&mut self, detail: String) {
        self.record(Violation::new(Invariant::Liveness, None, detail));
    }

    /// One observation, checked.
    pub(super) async fn tick(&mut self) -> ClusterObservation {
        let obs = observe(&self.client, self.access.as_mut(), &self.workload).await;
        self.observations += 1;
        if self.domain_uid.is_empty()
            && let Some(domain) = &obs.domain
        {
            self.domain_uid = domain.uid.clone();
        }
        self.known_claims
            .extend(obs.claims.iter().map(|c| c.uid.clone()));
        self.check_instances(&obs);
        let (domain, nodes, known) = self.expected_parts();
        let found = breaches(
            &obs,
            &Expected {
                domain: &domain,
                nodes: &nodes,
                known_claims: &known,
            },
        );
        let grace = self.config.grace;
        for violation in self.breaches.confirm(found, obs.at, grace) {
            self.record(violation);
        }
        if obs.domain.is_some() && !obs.events.is_empty() {
            self.events_seen = obs.events.clone();
        }
        self.last = Some(obs.clone());
        obs
    }

    /// A daemon replaced or restarted, or a controller gone, that the harness did not
    /// cause: a crash.
    fn check_instances(&mut self, obs: &ClusterObservation) {
        let mut crashes = Vec::new();
        for (node, seen) in &obs.daemons {
            let Some(instance) = &seen.instance else {
                continue;
            };
            if let Some(before) = self.daemons_seen.get(node) {
                if before.id == instance.id && instance.restarts > before.restarts {
                    crashes.push(Violation::new(
                        Invariant::Crash,
                        Some(node),
                        format!(
                            "its daemon {} restarted on its own (restart {})",
                            instance.id, instance.restarts
                        ),
                    ));
                } else if before.id != instance.id && !self.replacing.remove(node) {
                    crashes.push(Violation::new(
                        Invariant::Crash,
                        Some(node),
                        format!(
                            "its daemon {} was replaced by {} without the harness deleting it",
                            before.id, instance.id
                        ),
                    ));
                }
            }
            self.daemons_seen.insert(node.clone(), instance.clone());
        }
        if let Ok(running) = &obs.controllers {
            let running: BTreeSet<String> = running.iter().cloned().collect();
            if !self.controller_restarting {
                for gone in self.controllers_seen.difference(&running) {
                    crashes.push(Violation::new(
                        Invariant::Crash,
                        None,
                        format!("controller {gone} went away without the harness restarting it"),
                    ));
                }
            }
            self.controllers_seen = running;
        }
        for crash in crashes {
            self.record(crash);
        }
    }

    /// Observes until `done` holds (its observation's time) or `limit` passes. An
    /// interruption ends the wait at the next look, within a tick.
    pub(super) async fn wait_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&Self, &ClusterObservation) -> bool,
    ) -> Option<Instant> {
        poll_every(TICK, limit, async || {
            if self.interrupted() {
                return Ok(None);
            }
            let obs = self.tick().await;
            if done(self, &obs) {
                Ok(Some(obs.at))
            } else {
                Err(())
            }
        })
        .await
        .ok()
        .flatten()
    }

    /// The time between observations, cut short by an interruption.
    pub(super) async fn pause(&self) {
        let stop = self.stop.clone();
        tokio::select! {
            _ = tokio::time::sleep(TICK) => {}
            _ = stop.cancelled(), if !self.cleaning => {}
        }
    }

    /// The namespace, the daemons and the controller, the domain and its template,
    /// then the workload; the time from the workload's creation to the domain whole.
    async fn form(&mut self) -> anyhow::Result<Option<u64>> {
        let namespace: Namespace = serde_json::from_value(self.workload.namespace_object())?;
        Api::<Namespace>::all(self.client.clone())
            .create(&PostParams::default(), &namespace)
            .await
            .context("cannot create the run's namespace")?;
        let nodes = self.workload.nodes.clone();
        self.access.start(&nodes).await?;
        Api::<ComputeDomain>::namespaced(self.client.clone(), &self.workload.namespace)
            .create(&PostParams::default(), &self.workload.compute_domain())
            .await
            .context("cannot create the ComputeDomain")?;
        let form_limit = self.config.form_limit;
        if self
            .wait_until(form_limit, |_, o| o.template_exists)
            .await
            .is_none()
        {
            self.liveness(format!(
                "the controller made no ResourceClaimTemplate for the domain within {form_limit:?}"
            ));
            return Ok(None);
        }
        self.create_workload().await?;
        let created = Instant::now();
        self.say(&format!(
            "{} {WORKLOAD_NAME}: {} pods, one per node, image {}",
            match self.workload.kind {
                WorkloadKind::Deployment => "Deployment",
                WorkloadKind::Job => "Job",
            },
            nodes.len(),
            self.workload.image
        ));
        match self
            .wait_until(form_limit, |run, o| run.unwhole(o).is_empty())
            .await
        {
            Some(at) => {
                let ms = at.saturating_duration_since(created).as_millis() as u64;
                self.say(&format!("formed: Ready {0}/{0} in {ms} ms", nodes.len()));
                Ok(Some(ms))
            }
            None => {
                self.not_whole("not whole within the formation limit");
                Ok(None)
            }
        }
    }

    async fn create_workload(&self) -> anyhow::Result<()> {
        let namespace = &self.workload.namespace;
        let object = self.workload.workload_object();
        let params = PostParams::default();
        match self.workload.kind {
            WorkloadKind::Deployment => {
                let deployment: Deployment = serde_json::from_value(object)?;
                Api::<Deployment>::namespaced(self.client.clone(), namespace)
                    .create(&params, &deployment)
                    .await
                    .context("cannot create the Deployment")?;
            }
            WorkloadKind::Job => {
                let job: Job = serde_json::from_value(object)?;
                Api::<Job>::namespaced(self.client.clone(), namespace)
                    .create(&params, &job)
                    .await
                    .context("cannot create the Job")?;
            }
        }
        Ok(())
    }

    /// Records why the domain is not whole, as violations.
    pub(super) fn not_whole(&mut self, when: &str) {
        let Some(obs) = self.last.clone() else { return };
        for mut reason in self.unwhole(&obs) {
            reason.detail = format!("{when}: {}", reason.detail);
            self.record(reason);
        }
    }

    /// Waits for `step`'s time, then injects it.
    async fn run_step(&mut self, step: &Step) -> FaultRecord {
        let cutoff = self.phase_start + self.config.duration * 2 + Duration::from_secs(120);
        if Instant::now() > cutoff {
            return self.record_for(
                step,
                Outcome::NotRun("the run fell too far behind its schedule".into()),
            );
        }
        let due = self.phase_start + step.at;
        if due > Instant::now() {
            self.quiet(due).await;
        }
        self.current = Some((step.kind, step.index));
        if matches!(step.kind, FaultKind::Drain | FaultKind::PodDelete) {
            // The fault ends the target's job: its imports, and the others' of its
            // memory, go with it.
            for target in &step.targets {
                self.end_imports(*target);
            }
        }
        let events_before = self.events();
        let mut record = self.inject(step).await;
        let events_after = self.events();
        if let Some(line) = events_delta(&events_before, &events_after) {
            record.notes.push(format!("events: {line}"));
        }
        if record.injected_at_ms.is_some() {
            self.imports_hit(step);
        }
        self.check_imports().await;
        self.take_imports().await;
        self.current = None;
        self.say(&record.progress_line("(the controller)"));
        record
    }

    fn events(&self) -> BTreeMap<String, u32> {
        self.events_seen.clone()
    }

    /// Watches until `until` with no fault under way: the domain healed before, and
    /// coming apart for longer than the grace is a violation.
    async fn quiet(&mut self, until: Instant) {
        loop {
            let obs = self.tick().await;
            let apart = self.unwhole(&obs);
            let grace = self.config.grace;
            for mut reason in self.apart.confirm(apart, obs.at, grace) {
                reason.detail = format!("came apart with no fault under way: {}", reason.detail);
                self.record(reason);
            }
            if Instant::now() + TICK >= until || self.interrupted() {
                break;
            }
            self.pause().await;
        }
        self.apart = Persistent::default();
    }

    /// After the last fault: whole again.
    async fn finish(&mut self) {
        let limit = self.config.heal_limit;
        if self
            .wait_until(limit, |run, o| run.unwhole(o).is_empty())
            .await
            .is_some()
        {
            self.say("faults over: the domain is whole and its status true");
        } else {
            self.not_whole("not whole after the last fault");
        }
        self.check_imports().await;
    }

    /// A record of `step` with `outcome` and nothing measured.
    pub(super) fn record_for(&self, step: &Step, outcome: Outcome) -> FaultRecord {
        FaultRecord {
            step: step.index,
            kind: step.kind,
            targets: step
                .targets
                .iter()
                .map(|t| self.workload.nodes[*t].clone())
                .collect(),
            planned_at_ms: step.at.as_millis() as u64,
            injected_at_ms: None,
            detect_ms: None,
            heal_ms: None,
            outcome,
            notes: Vec::new(),
        }
    }

    pub(super) fn since_phase_ms(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.phase_start).as_millis() as u64
    }

    /// Deletes what the run made, checking on the way that every claim is released
    /// and the domain's finalizer lets go; says what was left.
    async fn clean_up(&mut self) -> String {
        let namespace = self.workload.namespace.clone();
        let mut left = Vec::new();
        match uncordon_ours(&self.client, &namespace).await {
            Ok(nodes) if !nodes.is_empty() => left.push(format!("uncordoned {}", nodes.join(", "))),
            Ok(_) => {}
            Err(error) => left.push(format!("cannot uncordon: {error:#}")),
        }
        if self.config.keep {
            self.access.stop().await;
            return format!("kept namespace {namespace} and what is in it (--keep-namespace)");
        }
        if let Err(error) = self.delete_workload().await {
            left.push(format!("{error:#}"));
        }
        let released = self
            .wait_until(TEARDOWN_LIMIT, |run, o| {
                o.pods.is_empty()
                    && run.workload.nodes.iter().all(|n| {
                        o.view(n)
                            .is_some_and(|v| !v.claims.iter().any(|c| run.known_claims.contains(c)))
                    })
            })
            .await;
        if released.is_none() {
            let obs = self.last.clone();
            let holders: Vec<String> = self
                .workload
                .nodes
                .iter()
                .filter(|n| {
                    obs.as_ref()
                        .and_then(|o| o.view(n))
                        .is_none_or(|v| v.claims.iter().any(|c| self.known_claims.contains(c)))
                })
                .cloned()
                .collect();
            self.record(Violation::new(
                Invariant::Checkpoint,
                None,
                format!(
                    "the workload deleted, claims of the run still held (or not readable) on {holders:?} after {TEARDOWN_LIMIT:?}"
                ),
            ));
        }
        let domains = Api::<ComputeDomain>::namespaced(self.client.clone(), &namespace);
        if let Err(error) = domains.delete(DOMAIN_NAME, &DeleteParams::default()).await {
            left.push(format!("cannot delete the ComputeDomain: {error}"));
        }
        if self
            .wait_until(TEARDOWN_LIMIT, |_, o| {
                o.domain.is_none() && o.errors.is_empty()
            })
            .await
            .is_none()
        {
            self.liveness(format!(
                "the ComputeDomain was not released (its finalizer) within {TEARDOWN_LIMIT:?} of its deletion"
            ));
        }
        self.access.stop().await;
        if let Err(error) = delete_namespace(&self.client, &namespace).await {
            left.push(format!("{error:#}"));
        }
        if left.is_empty() {
            format!("deleted the workload, the ComputeDomain and namespace {namespace}")
        } else {
            left.join("; ")
        }
    }

    async fn delete_workload(&self) -> anyhow::Result<()> {
        let namespace = &self.workload.namespace;
        let params = DeleteParams {
            propagation_policy: Some(PropagationPolicy::Foreground),
            ..DeleteParams::default()
        };
        let deleted = match self.workload.kind {
            WorkloadKind::Deployment => {
                Api::<Deployment>::namespaced(self.client.clone(), namespace)
                    .delete(WORKLOAD_NAME, &params)
                    .await
                    .map(|_| ())
            }
            WorkloadKind::Job => Api::<Job>::namespaced(self.client.clone(), namespace)
                .delete(WORKLOAD_NAME, &params)
                .await
                .map(|_| ()),
        };
        deleted.context("cannot delete the workload")?;
        // Foreground deletion leaves the pods to the garbage collector; delete them
        // too so that the claims' release is what is waited for.
        Api::<Pod>::namespaced(self.client.clone(), namespace)
            .delete_collection(
                &DeleteParams::default(),
                &ListParams::default().labels(&self.workload.pod_selector()),
            )
            .await
            .context("cannot delete the workload's pods")?;
        Ok(())
    }

    fn report(
        &mut self,
        schedule: Schedule,
        formation_ms: Option<u64>,
        faults: Vec<FaultRecord>,
        cleanup: String,
    ) -> ClusterReport {
        let kinds = Report::summarise(
            &self.config.scenario,
            &faults,
            self.findings.violations(),
            self.findings.crashes(),
            self.imports.report.as_ref().map(|r| r.broken.as_slice()),
        );
        ClusterReport {
            seed: self.config.seed,
            namespace: self.workload.namespace.clone(),
            nodes: self.workload.nodes.clone(),
            access: self.access.describe(),
            workload: format!(
                "a {} of {} pods, image {}, {} GPUs each",
                match self.workload.kind {
                    WorkloadKind::Deployment => "Deployment",
                    WorkloadKind::Job => "Job",
                },
                self.workload.nodes.len(),
                self.workload.image,
                self.workload.gpus_per_pod
            ),
            scenario: self.config.scenario.clone(),
            duration_s: self.config.duration.as_secs(),
            formation_ms,
            elapsed_ms: self.started.elapsed().as_millis() as u64,
            grace_ms: self.config.grace.as_millis() as u64,
            observations: self.observations,
            kinds,
            faults,
            violations: self.findings.violations().to_vec(),
            crashes: self.findings.crashes().to_vec(),
            events: self.events(),
            imports: self.imports.report.clone(),
            cleanup,
            schedule,
            interrupted: self.stop.is_cancelled(),
            ok: self.findings.ok() && !self.stop.is_cancelled(),
        }
    }
}

/// What changed in the domain's events, as `NodeLost+1, DomainReady+1`.
fn events_delta(before: &BTreeMap<String, u32>, after: &BTreeMap<String, u32>) -> Option<String> {
    let changes: Vec<String> = after
        .iter()
        .filter_map(|(reason, count)| {
            let was = before.get(reason).copied().unwrap_or(0);
            (*count > was).then(|| format!("{reason}+{}", count - was))
        })
        .collect();
    (!changes.is_empty()).then(|| changes.join(", "))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn event_deltas_name_what_grew() {
        let before = BTreeMap::from([("NodeLost".to_owned(), 1), ("DomainReady".to_owned(), 2)]);
        let after = BTreeMap::from([
            ("NodeLost".to_owned(), 2),
            ("DomainReady".to_owned(), 2),
            ("NodeJoined".to_owned(), 1),
        ]);
        assert_eq!(
            events_delta(&before, &after).as_deref(),
            Some("NodeJoined+1, NodeLost+1")
        );
        assert_eq!(events_delta(&after, &after), None);
    }
}
