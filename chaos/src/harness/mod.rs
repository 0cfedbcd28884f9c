//! `domaind-chaos run`: a rack of real `domaind run` processes on loopback, one
//! ComputeDomain across all of them, faults from a seeded schedule, and invariants
//! checked from outside on every observation.
//!
//! Faults come one at a time: each is injected, held, ended, and the domain must be
//! whole again (every member Ready, agreeing, status true) before the next one, so
//! that each detection and heal time belongs to one fault. Every wait is bounded; a
//! bound that passes is a violation (liveness), never a hang.

use std::collections::HashMap;
use std::net::IpAddr;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use domaind::dra::DraVersion;
use domaind::dra::client::KubeletClient;
use domaind::local::{ClaimFile, ComputeDomainRef};
use domaind::rack::{LocalRack, PrepareAnswer, RackSpec, prepare_until_ready, short_temp_dir};
use domaind::run::RunInfo;
use domaind_actors::model::{AllocationMode, ClaimRef, ReadinessPolicy};
use nix::sys::signal::Signal;
use tokio::task::JoinHandle;

use crate::invariants::{
    ClaimPhase, Invariant, Life, Violation, World, check, dropped_by_all, missing_members,
    unsettled,
};
use crate::netfault::NetFaults;
use crate::observe::{self, FileRead, NodeObservation, Observation};
use crate::report::{CrashRecord, FaultRecord, Outcome, Report, ViolationRecord};
use crate::schedule::{Churn, FaultKind, Schedule, Step};

/// How often the rack is observed (and every invariant checked).
const TICK: Duration = Duration::from_millis(200);
/// A daemon writes run.json within this.
const START_LIMIT: Duration = Duration::from_secs(60);
/// Prepares issued → the domain Ready with every node.
const FORM_LIMIT: Duration = Duration::from_secs(120);
/// Fault → survivors drop the node (the design holds itself to 5 s).
const DETECT_LIMIT: Duration = Duration::from_secs(20);
/// Certificate written → reloaded (the daemon looks every 10 s, and a rotation read
/// half-written is refused once and taken at the next look).
const ROTATE_LIMIT: Duration = Duration::from_secs(25);
/// Fault ended → the domain whole again.
const HEAL_LIMIT: Duration = Duration::from_secs(60);
/// SIGTERM → exit (the daemon's own shutdown timeout is 20 s).
const STOP_LIMIT: Duration = Duration::from_secs(30);
/// One unprepare call.
const UNPREPARE_LIMIT: Duration = Duration::from_secs(15);
/// A claim's prepare, retried as the kubelet does while the domain is not ready.
const PREPARE_LIMIT: Duration = Duration::from_secs(60);
/// Lines of a crashed daemon's log in the report.
const LOG_TAIL: usize = 20;

const NAMESPACE: &str = "chaos";
const DOMAIN_NAME: &str = "chaos-domain";

/// What to run.
#[derive(Debug, Clone)]
pub struct RunConfig {
    pub nodes: usize,
    pub scenario: Vec<FaultKind>,
    pub seed: u64,
    /// How long faults are scheduled for (formation and the final checks come on top).
    pub duration: Duration,
    pub domaind: PathBuf,
    pub imex_sim: PathBuf,
    /// Nodes get 127.0.<subnet>.1...
    pub subnet: u8,
    pub isolation_grace: Duration,
    pub gossip_interval: Duration,
    /// The daemons' `--log` filter.
    pub log_filter: String,
    /// Leave the rack's directory (logs, state, files) behind, and say where.
    pub keep_files: bool,
    /// No progress lines on stderr.
    pub quiet: bool,
}

/// Runs the harness; the report says whether the invariants held. An error means the
/// harness itself could not run (no binaries, no rack).
pub async fn run(config: RunConfig) -> anyhow::Result<Report> {
    let schedule = Schedule::generate(config.seed, config.nodes, &config.scenario, config.duration);
    let mut harness = Harness::start(config, schedule.clone())?;
    harness.say(&format!(
        "rack of {} nodes on 127.0.{}.1-{} in {} (logs: <dir>/node-*/domaind.log); network faults: {}",
        harness.config.nodes,
        harness.config.subnet,
        harness.config.nodes,
        harness.rack.spec().root.display(),
        harness.network_line()
    ));
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

struct Harness {
    config: RunConfig,
    // Declared before the temporary directory: dropped (daemons killed) before it is
    // removed.
    rack: LocalRack,
    tmp: Option<tempfile::TempDir>,
    net: Result<NetFaults, String>,
    world: World,
    domain: ComputeDomainRef,
    started: Instant,
    phase_start: Instant,
    /// The fault being injected or healed, for attributing violations.
    current: Option<(FaultKind, usize)>,
    violations: Vec<ViolationRecord>,
    seen: HashMap<Violation, usize>,
    crashes: Vec<CrashRecord>,
    observations: u64,
    /// The node whose `/metrics` each observation reads (during cert-rotate).
    metrics_for: Option<usize>,
    /// Prepare calls under way: node, claim, the call.
    prepares: Vec<(usize, String, JoinHandle<anyhow::Result<PrepareAnswer>>)>,
    /// The newest observation and the world it was checked against.
    last: Option<(World, Observation)>,
}

impl Harness {
    fn start(config: RunConfig, schedule: Schedule) -> anyhow::Result<Self> {
        for (what, path) in [("domaind", &config.domaind), ("imex-sim", &config.imex_sim)] {
            if !path.is_file() {
                anyhow::bail!(
                    "{what} not found at {}: build them first: cargo build --release --bin domaind --bin imex-sim",
                    path.display()
                );
            }
        }
        let net = if schedule.kinds.iter().any(|k| k.needs_network_control()) {
            NetFaults::probe(config.subnet)
        } else {
            Err("not needed by this scenario".into())
        };
        let tmp = short_temp_dir("dch").context("cannot make a temporary directory")?;
        let mut spec = RackSpec::new(
            config.nodes,
            config.domaind.clone(),
            config.imex_sim.clone(),
            tmp.path().into(),
        );
        spec.subnet = config.subnet;
        spec.gossip_interval = config.gossip_interval;
        spec.log_filter = config.log_filter.clone();
        // The kubelet calls again after a retryable answer; a short deadline keeps each
        // call, and so each wait of the harness, short.
        spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
        let mut rack = LocalRack::create(spec)?;
        let now = Instant::now();
        let domain = ComputeDomainRef {
            namespace: NAMESPACE.into(),
            name: DOMAIN_NAME.into(),
            uid: format!("chaos-{:016x}", config.seed),
            num_nodes: 0,
        };
        let world = World::new(
            domain.uid.clone(),
            config.isolation_grace,
            rack.nodes().iter().map(|n| (n.name().to_owned(), n.ip())),
            now,
        );
        tokio::task::block_in_place(|| rack.start_all())?;
        let mut harness = Self {
            config,
            rack,
            tmp: Some(tmp),
            net,
            world,
            domain,
            started: now,
            phase_start: now,
            current: None,
            violations: Vec::new(),
            seen: HashMap::new(),
            crashes: Vec::new(),
            observations: 0,
            metrics_for: None,
            prepares: Vec::new(),
            last: None,
        };
        for i in 0..harness.config.nodes {
            harness.world.set_life(i, Life::Starting, now);
        }
        Ok(harness)
    }

    fn say(&self, line: &str) {
        if !self.config.quiet {
            eprintln!("[{:>6.1}s] {line}", self.started.elapsed().as_secs_f64());
        }
    }

    fn network_line(&self) -> String {
        match &self.net {
            Ok(net) => format!(
                "iptables chain {} on 127.0.{}.0/24 only",
                net.chain(),
                self.config.subnet
            ),
            Err(reason) => format!("unavailable ({reason})"),
        }
    }

    fn name(&self, node: usize) -> String {
        self.world.nodes[node].name.clone()
    }

    fn ms_since_start(&self, at: Instant) -> u64 {
        at.saturating_duration_since(self.started).as_millis() as u64
    }

    /// Records a violation once; later sightings count.
    fn record(&mut self, violation: Violation) {
        if let Some(&index) = self.seen.get(&violation) {
            self.violations[index].times_seen += 1;
            return;
        }
        self.say(&format!(
            "VIOLATION {}{}: {}",
            violation.invariant,
            violation
                .node
                .as_ref()
                .map(|n| format!(" on {n}"))
                .unwrap_or_default(),
            violation.detail
        ));
        self.seen.insert(violation.clone(), self.violations.len());
        self.violations.push(ViolationRecord {
            violation,
            first_seen_ms: self.ms_since_start(Instant::now()),
            during: self.current.map(|(kind, _)| kind),
            step: self.current.map(|(_, step)| step),
            times_seen: 1,
        });
    }

    fn liveness(&mut self, node: Option<usize>, detail: String) {
        let name = node.map(|n| self.name(n));
        self.record(Violation::new(Invariant::Liveness, name.as_deref(), detail));
    }

    fn log_tail(&self, node: usize) -> Vec<String> {
        let text = std::fs::read_to_string(self.rack.node(node).log_path()).unwrap_or_default();
        let lines: Vec<&str> = text.lines().collect();
        lines[lines.len().saturating_sub(LOG_TAIL)..]
            .iter()
            .map(|l| (*l).to_owned())
            .collect()
    }

    /// Daemons that exited without being told: each is a violation, and is started
    /// again so that the run goes on (its checkpoint brings its claims back).
    fn reap_crashes(&mut self) {
        for name in self.rack.unexpected_exits() {
            let Some(node) = self.world.nodes.iter().position(|n| n.name == name) else {
                continue;
            };
            let code = tokio::task::block_in_place(|| self.rack.stop(node, Duration::ZERO));
            let log_tail = self.log_tail(node);
            self.crashes.push(CrashRecord {
                node: name.clone(),
                at_ms: self.ms_since_start(Instant::now()),
                during: self.current.map(|(kind, _)| kind),
                log_tail,
            });
            self.record(Violation::new(
                Invariant::Crash,
                Some(&name),
                format!("domaind exited on its own ({code:?}); started again"),
            ));
            let now = Instant::now();
            match self.rack.start(node) {
                Ok(()) => self.world.set_life(node, Life::Starting, now),
                Err(error) => {
                    self.world.set_life(node, Life::Down, now);
                    self.liveness(Some(node), format!("cannot start it again: {error:#}"));
                }
            }
        }
    }

    /// Starting daemons that wrote run.json are up; stopping daemons that exited are
    /// down (a graceful stop must exit 0).
    fn advance_lives(&mut self) {
        for node in 0..self.world.nodes.len() {
            match self.world.nodes[node].life {
                Life::Starting => {
                    let pid = self.rack.node(node).pid();
                    let written = RunInfo::read(&self.rack.node(node).state_dir())
                        .ok()
                        .flatten()
                        .is_some_and(|info| Some(info.pid) == pid);
                    if written
                        && tokio::task::block_in_place(|| self.rack.wait_ready(node, TICK)).is_ok()
                    {
                        self.world.set_life(node, Life::Up, Instant::now());
                    }
                }
                Life::Stopping if !self.rack.running(node) => {
                    let code = tokio::task::block_in_place(|| self.rack.stop(node, Duration::ZERO));
                    self.world.set_life(node, Life::Down, Instant::now());
                    if !matches!(code, Ok(Some(0))) {
                        let name = self.name(node);
                        self.record(Violation::new(
                            Invariant::Crash,
                            Some(&name),
                            format!(
                                "a graceful stop (SIGTERM) ended with {code:?}, not exit code 0"
                            ),
                        ));
                    }
                }
                _ => {}
            }
        }
    }

    /// Prepare calls that finished: their claims are prepared, or the failure is a
    /// violation (the kubelet would retry forever; we had a minute).
    async fn collect_prepares(&mut self) {
        let mut pending = Vec::new();
        for (node, claim, call) in std::mem::take(&mut self.prepares) {
            if !call.is_finished() {
                pending.push((node, claim, call));
                continue;
            }
            let answer = match call.await {
                Ok(Ok(answer)) => answer,
                Ok(Err(error)) => Err(format!("{error:#}")),
                Err(error) => Err(format!("the call panicked or was cancelled: {error}")),
            };
            match answer {
                Ok(_) => {
                    self.world
                        .set_claim(node, &claim, ClaimPhase::Prepared, Instant::now());
                }
                Err(error) => self.liveness(
                    Some(node),
                    format!("prepare of {claim} did not succeed within {PREPARE_LIMIT:?}: {error}"),
                ),
            }
        }
        self.prepares = pending;
    }

    /// One observation of the rack, checked against every invariant.
    async fn tick(&mut self) {
        self.reap_crashes();
        self.advance_lives();
        self.collect_prepares().await;
        let world = self.world.clone();
        let observation = self.observe(&world).await;
        let now = Instant::now();
        for violation in check(&world, &observation, now) {
            self.record(violation);
        }
        self.observations += 1;
        self.last = Some((world, observation));
    }

    async fn observe(&mut self, world: &World) -> Observation {
        let count = world.nodes.len();
        // Processes first: a running IMEX daemon means its hosts file was written
        // before it started, so the file read next is at least that new.
        let pids = self
            .rack
            .imex_daemons()
            .unwrap_or_else(|_| vec![Vec::new(); count]);
        let mut nodes: Vec<NodeObservation> = Vec::with_capacity(count);
        for (i, pids) in pids.into_iter().enumerate() {
            let node = self.rack.node(i);
            let mut seen = NodeObservation::empty();
            seen.imex_pids = pids;
            seen.hosts = read_hosts_settled(&node.imex_dir().join("hosts")).await;
            seen.nodes_config =
                observe::read_nodes_config(&node.imex_dir().join("nodes_config.cfg"));
            seen.checkpoint = observe::read_checkpoint(&node.state_dir());
            nodes.push(seen);
        }
        let asks: Vec<_> = (0..count)
            .map(|i| {
                let addr = (world.nodes[i].life == Life::Up)
                    .then(|| self.rack.node(i).info().map(|info| info.http_addr))
                    .flatten();
                let metrics = self.metrics_for == Some(i);
                async move {
                    let Some(addr) = addr else {
                        return (None, None);
                    };
                    let view = observe::view(addr).await;
                    let reloads = if metrics {
                        observe::reloads(addr).await.ok()
                    } else {
                        None
                    };
                    (Some(view), reloads)
                }
            })
            .collect();
        for (seen, (view, reloads)) in nodes.iter_mut().zip(futures::future::join_all(asks).await) {
            match view {
                Some(Ok(view)) => seen.view = Some(view),
                Some(Err(error)) => seen.view_error = Some(error),
                None => {}
            }
            seen.tls_reloads = reloads;
        }
        let status = match self.rack.local().read_status(&self.domain.uid) {
            Ok(Some(status)) => FileRead::Read(status),
            Ok(None) => FileRead::Missing,
            Err(error) => FileRead::Bad(error.to_string()),
        };
        Observation {
            at: Instant::now(),
            nodes,
            status,
        }
    }

    /// Observes until `done` holds, at most `limit`; when it first held.
    async fn wait_until(
        &mut self,
        limit: Duration,
        mut done: impl FnMut(&Self, &World, &Observation) -> bool,
    ) -> Option<Instant> {
        let deadline = Instant::now() + limit;
        loop {
            self.tick().await;
            let (world, observation) = self.last.as_ref().expect("observed");
            if done(self, world, observation) {
                return Some(observation.at);
            }
            if Instant::now() >= deadline {
                return None;
            }
            tokio::time::sleep(TICK).await;
        }
    }

    /// Observes for `duration`; when `seen` first held, if it did.
    async fn hold(
        &mut self,
        duration: Duration,
        mut seen: impl FnMut(&Self, &World, &Observation) -> bool,
    ) -> Option<Instant> {
        let deadline = Instant::now() + duration;
        let mut first = None;
        loop {
            self.tick().await;
            let (world, observation) = self.last.as_ref().expect("observed");
            if first.is_none() && seen(self, world, observation) {
                first = Some(observation.at);
            }
            let now = Instant::now();
            if now >= deadline {
                return first;
            }
            tokio::time::sleep(TICK.min(deadline - now)).await;
        }
    }

    /// Waits with no fault under way. The domain healed before, and nothing should
    /// take it apart now: if it stays apart for longer than the isolation grace (a
    /// blip of a loaded machine is not a verdict), what is wrong becomes violations.
    async fn quiet(&mut self, duration: Duration) {
        let grace = self.config.isolation_grace;
        let mut apart_since: Option<Instant> = None;
        let mut broken = Vec::new();
        self.hold(duration, |h, w, o| {
            if h.settled(w, o) {
                apart_since = None;
            } else {
                let since = *apart_since.get_or_insert(o.at);
                if broken.is_empty() && o.at.saturating_duration_since(since) >= grace {
                    broken = unsettled(w, o);
                }
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

    fn settled(&self, world: &World, observation: &Observation) -> bool {
        self.prepares.is_empty() && unsettled(world, observation).is_empty()
    }

    /// Waits until the domain is whole again; how long it took from `since`. If it is
    /// not within the limit, what is still wrong becomes violations.
    async fn heal(&mut self, since: Instant, after: &str) -> Option<u64> {
        match self.wait_until(HEAL_LIMIT, |h, w, o| h.settled(w, o)).await {
            Some(at) => Some(at.saturating_duration_since(since).as_millis() as u64),
            None => {
                let reasons = self
                    .last
                    .as_ref()
                    .map(|(w, o)| unsettled(w, o))
                    .unwrap_or_default();
                for mut reason in reasons {
                    reason.detail = format!(
                        "not whole {}s after {after}: {}",
                        HEAL_LIMIT.as_secs(),
                        reason.detail
                    );
                    self.record(reason);
                }
                if !self.prepares.is_empty() {
                    let pending: Vec<String> =
                        self.prepares.iter().map(|(_, c, _)| c.clone()).collect();
                    self.liveness(
                        None,
                        format!("prepares still unanswered after {after}: {pending:?}"),
                    );
                }
                None
            }
        }
    }

    fn claim_file(&self, uid: &str) -> ClaimFile {
        ClaimFile {
            namespace: NAMESPACE.into(),
            name: uid.into(),
            uid: uid.into(),
            compute_domain: self.domain.clone(),
            allocation_mode: AllocationMode::Single,
            // The barrier: a prepare answers once every member is ready.
            readiness: Some(ReadinessPolicy::Domain),
            driver: None,
            device: None,
        }
    }

    fn claim_ref(uid: &str) -> ClaimRef {
        ClaimRef {
            uid: uid.into(),
            namespace: NAMESPACE.into(),
            name: uid.into(),
        }
    }

    fn own_claim(&self, node: usize) -> String {
        format!("claim-{}", self.world.nodes[node].name)
    }

    /// Allocates `uid` to `node` (the claim file) and calls prepare in the background,
    /// as the kubelet does, until it succeeds.
    fn begin_prepare(&mut self, node: usize, uid: &str) {
        if let Err(error) = self.rack.local().write_claim(&self.claim_file(uid)) {
            self.liveness(Some(node), format!("cannot write claim {uid}: {error}"));
            return;
        }
        self.world
            .set_claim(node, uid, ClaimPhase::Preparing, Instant::now());
        let socket = self.rack.node(node).dra_socket();
        let claim = Self::claim_ref(uid);
        let call = tokio::spawn(async move {
            prepare_until_ready(&socket, &claim, DraVersion::V1, PREPARE_LIMIT).await
        });
        self.prepares.push((node, uid.to_owned(), call));
    }

    /// Unprepares `uid` on `node` and removes its claim file; whether it succeeded.
    async fn unprepare(&mut self, node: usize, uid: &str) -> bool {
        self.world
            .set_claim(node, uid, ClaimPhase::Unpreparing, Instant::now());
        let socket = self.rack.node(node).dra_socket();
        let claim = Self::claim_ref(uid);
        let call = async {
            let client = KubeletClient::connect(socket).await?;
            let mut answers = client.unprepare(&[claim], DraVersion::V1).await?;
            anyhow::Ok(answers.pop().context("no answer for the claim")?.result)
        };
        let error = match tokio::time::timeout(UNPREPARE_LIMIT, call).await {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(error))) => Some(error),
            Ok(Err(error)) => Some(format!("{error:#}")),
            Err(_) => Some(format!("no answer within {UNPREPARE_LIMIT:?}")),
        };
        match error {
            None => {
                self.world
                    .set_claim(node, uid, ClaimPhase::Released, Instant::now());
                let _ = self.rack.local().remove_claim(uid);
                true
            }
            Some(error) => {
                self.liveness(Some(node), format!("unprepare of {uid} failed: {error}"));
                false
            }
        }
    }

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
        self.say(&format!(
            "preparing one claim per node for ComputeDomain {NAMESPACE}/{DOMAIN_NAME} ({})",
            self.domain.uid
        ));
        let issued = Instant::now();
        for node in 0..self.world.nodes.len() {
            let claim = self.own_claim(node);
            self.begin_prepare(node, &claim);
        }
        match self.wait_until(FORM_LIMIT, |h, w, o| h.settled(w, o)).await {
            Some(at) => {
                let ms = at.saturating_duration_since(issued).as_millis() as u64;
                let nodes = self.world.nodes.len();
                let since_start = at.saturating_duration_since(started).as_secs_f64();
                self.say(&format!(
                    "formed: Ready {nodes}/{nodes} in {ms} ms ({since_start:.1} s after the daemons started)"
                ));
                Some(ms)
            }
            None => {
                self.heal_failed("the prepares of formation");
                None
            }
        }
    }

    fn heal_failed(&mut self, after: &str) {
        let reasons = self
            .last
            .as_ref()
            .map(|(w, o)| unsettled(w, o))
            .unwrap_or_default();
        for mut reason in reasons {
            reason.detail = format!("not whole after {after}: {}", reason.detail);
            self.record(reason);
        }
    }

    fn not_run(&self, step: &Step, reason: &str) -> FaultRecord {
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

    /// Runs one step of the schedule: waits for its time, injects, holds, ends, heals.
    async fn run_step(&mut self, step: &Step) -> Vec<FaultRecord> {
        if step.kind.needs_network_control()
            && let Err(reason) = &self.net
        {
            let mut record = self.not_run(step, reason);
            record.outcome = Outcome::Skipped(reason.clone());
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
        let records = match step.kind {
            FaultKind::Kill => vec![self.kill(step).await],
            FaultKind::Pause => vec![self.pause(step).await],
            FaultKind::ImexCrash => vec![self.imex_crash(step).await],
            FaultKind::Restart => self.rolling_restart(step).await,
            FaultKind::Partition => vec![self.partition(step).await],
            FaultKind::Loss => vec![self.loss(step).await],
            FaultKind::Churn => vec![self.churn(step).await],
            FaultKind::CertRotate => vec![self.cert_rotate(step).await],
        };
        self.current = None;
        for record in &records {
            self.say(&format!(
                "{} {}: detect {}, heal {}{}",
                record.kind,
                if record.targets.is_empty() {
                    "(every link of the rack)".to_owned()
                } else {
                    record.targets.join(",")
                },
                record
                    .detect_ms
                    .map_or_else(|| "-".into(), |ms| format!("{ms} ms")),
                record
                    .heal_ms
                    .map_or_else(|| "-".into(), |ms| format!("{ms} ms")),
                if record.notes.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", record.notes.join("; "))
                }
            ));
        }
        records
    }

    /// Waits until the survivors dropped `target`; the detection time, or a
    /// violation naming who still holds it.
    async fn detect_drop(&mut self, target: usize, injected: Instant, what: &str) -> Option<u64> {
        match self
            .wait_until(DETECT_LIMIT, |_, w, o| dropped_by_all(w, o, target))
            .await
        {
            Some(at) => Some(at.saturating_duration_since(injected).as_millis() as u64),
            None => {
                let holders = self.holders_of(target);
                self.liveness(
                    Some(target),
                    format!(
                        "{what}, but {holders:?} still had it in their peer sets after {}s",
                        DETECT_LIMIT.as_secs()
                    ),
                );
                None
            }
        }
    }

    /// The members whose peer set lists `target`, in the newest observation.
    fn holders_of(&self, target: usize) -> Vec<String> {
        let Some((world, observation)) = &self.last else {
            return Vec::new();
        };
        let ip = world.nodes[target].ip;
        world
            .nodes
            .iter()
            .zip(&observation.nodes)
            .enumerate()
            .filter(|(i, (node, seen))| {
                *i != target
                    && node.life == Life::Up
                    && seen
                        .hosts
                        .read()
                        .is_some_and(|b| b.slots.values().any(|a| *a == ip))
            })
            .map(|(_, (node, _))| node.name.clone())
            .collect()
    }

    async fn kill(&mut self, step: &Step) -> FaultRecord {
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
        record.heal_ms = self.heal(ended, "a restart after SIGKILL").await;
        if record.heal_ms.is_none() {
            record.outcome = Outcome::NotHealed;
        }
        record
    }

    fn restart_node(&mut self, node: usize) {
        match self.rack.start(node) {
            Ok(()) => self.world.set_life(node, Life::Starting, Instant::now()),
            Err(error) => self.liveness(Some(node), format!("cannot start it: {error:#}")),
        }
    }

    async fn pause(&mut self, step: &Step) -> FaultRecord {
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
            Some(at) => {
                record.detect_ms = Some(at.saturating_duration_since(injected).as_millis() as u64);
            }
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
        record.heal_ms = self.heal(ended, "SIGCONT").await;
        if record.heal_ms.is_none() {
            record.outcome = Outcome::NotHealed;
        }
        record
    }

    async fn imex_crash(&mut self, step: &Step) -> FaultRecord {
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
        match restarted {
            Some(at) => {
                record.detect_ms = Some(at.saturating_duration_since(injected).as_millis() as u64);
            }
            None => self.liveness(
                Some(target),
                format!(
                    "its IMEX daemon (pid {pids:?}) was killed and no new one ran within {}s",
                    DETECT_LIMIT.as_secs()
                ),
            ),
        }
        record.heal_ms = self.heal(injected, "an IMEX daemon crash").await;
        if record.heal_ms.is_none() {
            record.outcome = Outcome::NotHealed;
        }
        record
    }

    async fn rolling_restart(&mut self, step: &Step) -> Vec<FaultRecord> {
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
            record.heal_ms = self.heal(ended, "a graceful restart").await;
            if record.heal_ms.is_none() {
                record.outcome = Outcome::NotHealed;
            }
            records.push(record);
        }
        records
    }

    async fn partition(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let IpAddr::V4(ip) = self.world.nodes[target].ip else {
            record.outcome = Outcome::Skipped("not an IPv4 address".into());
            return record;
        };
        let injected = Instant::now();
        let cut = match &mut self.net {
            Ok(net) => net.partition(ip),
            Err(reason) => Err(anyhow::anyhow!("{reason}")),
        };
        if let Err(error) = cut {
            record.injected_at_ms = None;
            record.outcome = Outcome::Skipped(format!("{error:#}"));
            return record;
        }
        record.detect_ms = self.detect_drop(target, injected, "cut off").await;
        self.hold(step.hold, |_, _, _| false).await;
        let ended = Instant::now();
        self.heal_network(Some(target));
        record.heal_ms = self.heal(ended, "the partition healed").await;
        if record.heal_ms.is_none() {
            record.outcome = Outcome::NotHealed;
        }
        record
    }

    fn heal_network(&mut self, node: Option<usize>) {
        let healed = match &mut self.net {
            Ok(net) => net.heal(),
            Err(_) => Ok(()),
        };
        if let Err(error) = healed {
            self.liveness(node, format!("cannot remove the network fault: {error:#}"));
        }
    }

    async fn loss(&mut self, step: &Step) -> FaultRecord {
        let percent = step.loss_percent.unwrap_or(10);
        let mut record = self.record_for(step, &[]);
        let lossy = match &mut self.net {
            Ok(net) => net.loss(percent),
            Err(reason) => Err(anyhow::anyhow!("{reason}")),
        };
        if let Err(error) = lossy {
            record.injected_at_ms = None;
            record.outcome = Outcome::Skipped(format!("{error:#}"));
            return record;
        }
        let mut dropped: Vec<(String, String)> = Vec::new();
        self.hold(step.hold, |_, w, o| {
            for pair in missing_members(w, o) {
                if !dropped.contains(&pair) {
                    dropped.push(pair);
                }
            }
            false
        })
        .await;
        let ended = Instant::now();
        self.heal_network(None);
        record
            .notes
            .push(format!("{percent}% loss for {} ms", step.hold.as_millis()));
        if !dropped.is_empty() {
            // Not an invariant (no node is wrongly admitted), but the design promises
            // no false removal under 10% loss: worth seeing.
            record.notes.push(format!(
                "members dropped under loss (observer, dropped): {dropped:?}"
            ));
        }
        record.heal_ms = self.heal(ended, "the loss stopped").await;
        if record.heal_ms.is_none() {
            record.outcome = Outcome::NotHealed;
        }
        record
    }

    async fn churn(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let own = self.own_claim(target);
        match step.churn.unwrap_or(Churn::LeaveAndRejoin) {
            Churn::LeaveAndRejoin => {
                let injected = Instant::now();
                let held: Vec<String> = self.world.nodes[target]
                    .claims
                    .iter()
                    .filter(|(_, p)| **p != ClaimPhase::Released)
                    .map(|(uid, _)| uid.clone())
                    .collect();
                for claim in held {
                    self.unprepare(target, &claim).await;
                }
                let left = self
                    .wait_until(DETECT_LIMIT, |_, w, o| {
                        dropped_by_all(w, o, target) && !o.nodes[target].imex_running()
                    })
                    .await;
                match left {
                    Some(at) => {
                        record.detect_ms =
                            Some(at.saturating_duration_since(injected).as_millis() as u64);
                    }
                    None => {
                        let holders = self.holders_of(target);
                        self.liveness(
                            Some(target),
                            format!(
                                "unprepared its last claim, but after {}s {holders:?} still had it in their peer sets or it still ran IMEX",
                                DETECT_LIMIT.as_secs()
                            ),
                        );
                    }
                }
                self.hold(step.hold, |_, _, _| false).await;
                let ended = Instant::now();
                self.begin_prepare(target, &own);
                record.notes.push("left and rejoined".into());
                record.heal_ms = self.heal(ended, "its claim was prepared again").await;
            }
            Churn::ExtraClaim => {
                let extra = format!("extra-{}-{}", step.index, self.name(target));
                self.begin_prepare(target, &extra);
                self.wait_until(PREPARE_LIMIT, |h, _, _| h.prepares.is_empty())
                    .await;
                self.unprepare(target, &own).await;
                let mut dropped = false;
                self.hold(step.hold, |_, w, o| {
                    dropped |= missing_members(w, o)
                        .iter()
                        .any(|(_, gone)| *gone == w.nodes[target].name);
                    false
                })
                .await;
                if dropped {
                    record.notes.push(format!(
                        "dropped from a peer set while it still held {extra}"
                    ));
                }
                let ended = Instant::now();
                self.begin_prepare(target, &own);
                self.wait_until(PREPARE_LIMIT, |h, _, _| h.prepares.is_empty())
                    .await;
                self.unprepare(target, &extra).await;
                record
                    .notes
                    .push(format!("extra claim {extra}; own claim out and back"));
                record.heal_ms = self.heal(ended, "its claim was prepared again").await;
            }
        }
        if record.heal_ms.is_none() {
            record.outcome = Outcome::NotHealed;
        }
        record
    }

    async fn cert_rotate(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        self.metrics_for = Some(target);
        self.tick().await;
        let (rotated, refused) = self
            .last
            .as_ref()
            .and_then(|(_, o)| o.nodes[target].tls_reloads)
            .unwrap_or_default();
        let injected = Instant::now();
        if let Err(error) = self
            .rack
            .reissue_certificate(target, time::Duration::days(1))
        {
            self.metrics_for = None;
            self.liveness(
                Some(target),
                format!("cannot reissue its certificate: {error:#}"),
            );
            record.outcome = Outcome::NotHealed;
            return record;
        }
        // A rotation should not take the domain apart at all: its heal is when it was
        // first seen whole after the write, if it stayed whole while the daemon got
        // round to reloading.
        let mut whole_at = None;
        let mut broke = false;
        let reloaded = self
            .wait_until(ROTATE_LIMIT, |h, w, o| {
                if h.settled(w, o) {
                    whole_at.get_or_insert(o.at);
                } else if whole_at.is_some() {
                    broke = true;
                }
                o.nodes[target]
                    .tls_reloads
                    .is_some_and(|(r, _)| r > rotated)
            })
            .await;
        let refused_now = self
            .last
            .as_ref()
            .and_then(|(_, o)| o.nodes[target].tls_reloads)
            .map_or(refused, |(_, r)| r);
        self.metrics_for = None;
        if refused_now > refused {
            // The files are replaced one by one; a reload between two of them sees a
            // key that does not match the certificate, refuses it and keeps the old
            // one until its next look.
            record.notes.push(format!(
                "{} reload(s) refused a half-written rotation first",
                refused_now - refused
            ));
        }
        match reloaded {
            Some(at) => {
                record.detect_ms = Some(at.saturating_duration_since(injected).as_millis() as u64);
            }
            None => self.liveness(
                Some(target),
                format!(
                    "did not reload its reissued certificate within {}s",
                    ROTATE_LIMIT.as_secs()
                ),
            ),
        }
        record.heal_ms = self
            .heal(injected, "a certificate rotation")
            .await
            .map(|after| match whole_at {
                Some(at) if !broke => at.saturating_duration_since(injected).as_millis() as u64,
                _ => after,
            });
        if record.heal_ms.is_none() {
            record.outcome = Outcome::NotHealed;
        }
        record
    }

    /// After the last fault: the domain must be whole (agreement, status true).
    async fn finish(&mut self) {
        let since = Instant::now();
        if self.heal(since, "the faults stopped").await.is_some() {
            self.say("faults over: every member agrees and the status is true");
        }
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
            &self.violations,
            &self.crashes,
        );
        let mut kept_files = None;
        if self.config.keep_files
            && let Some(tmp) = self.tmp.take()
        {
            let kept = tmp.keep();
            self.say(&format!("the rack's files are kept in {}", kept.display()));
            kept_files = Some(kept);
        }
        let ok = self.violations.is_empty() && self.crashes.is_empty();
        Report {
            seed: self.config.seed,
            nodes: self.config.nodes,
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
            violations: self.violations.clone(),
            crashes: self.crashes.clone(),
            schedule,
            kept_files,
            ok,
        }
    }
}

/// A hosts file is rewritten in place (it may be a bind mount), so a read can catch
/// it half-written; such a read is taken again, a few times, before it counts.
async fn read_hosts_settled(path: &std::path::Path) -> FileRead<observe::HostsBlock> {
    let mut read = observe::read_hosts(path);
    for _ in 0..3 {
        if !matches!(read, FileRead::Bad(_)) {
            break;
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
        read = observe::read_hosts(path);
    }
    read
}
