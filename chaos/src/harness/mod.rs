//! `domaind-chaos run`: a rack of real `domaind run` processes on loopback, one
//! ComputeDomain across all of them, faults from a seeded schedule, and invariants
//! checked from outside on every observation.
//!
//! Faults come one at a time: each is injected, held, ended, and the domain must be
//! whole again (every member Ready, agreeing, status true) before the next one, so
//! that each detection and heal time belongs to one fault. Every wait is bounded; a
//! bound that passes is a violation (liveness), never a hang.
//!
//! One module a concern, all around the one [`Harness`] value that holds the rack and
//! what was done to it:
//! - `run_loop`: the run from start to report (formation, each step at its time,
//!   quiet between steps, the final checks, the graceful stop);
//! - `observer`: one tick (reap crashes, advance lives, collect prepares, observe,
//!   check) and the waits made of ticks;
//! - `faults`: the injectors, a module per family (processes, network, claims,
//!   certificates, the IMEX port, the state directory), each ending in the one heal tail;
//! - `heal`: whether the domain is whole, the wait for it, detection and heal times;
//! - `claims`: the kubelet's part: claim files, prepares in the background, unprepares;
//! - `findings`: violations (each once, later sightings counted) and crashes;
//! - `others`: with `--cliques K`, the cliques past the first: their domains, their
//!   crashes, and the cliques invariant over every node.
//! - `domains`: with `--domains N`, the sharing domains beside the first: their claims
//!   at formation, and the channels invariant on every observation.
//! - `imports`: the jobs' memory imports on the claims' nodes, taken once a domain is
//!   Ready and checked after every fault (the imports invariant).

mod claims;
mod domains;
mod faults;
pub(crate) mod findings;
mod heal;
mod imports;
mod observer;
mod others;
mod run_loop;
mod sampler;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use domaind_actors::model::Isolation;
use domaind_backends::local::ComputeDomainRef;
use domaind_testbed::rack::{LocalRack, RackSpec, short_temp_dir};

use crate::cliques::CliqueMap;
use crate::invariants::{Invariant, Life, Violation, World};
use crate::netfault::NetFaults;
use crate::observe::Observation;
use crate::schedule::{FaultKind, Schedule};
use crate::statedir::StateDirs;

use claims::Prepares;
use findings::Findings;
use imports::Imports;
use others::Others;

pub use run_loop::run;
pub use sampler::Sampling;

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
    /// Nodes of the clique under faults, and of every other clique.
    pub nodes: usize,
    /// NVLink cliques in the rack: the first takes the faults, the others each form a
    /// domain of their own beside it.
    pub cliques: usize,
    /// Domains on the first clique's nodes: 1, IMEX its own; more, each with
    /// `isolation: Channel` and a claim on every node.
    pub domains: usize,
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
    /// The least quiet between one fault's heal and the next fault.
    pub fault_gap: Duration,
    /// The rack's last nodes that no fault targets directly (a soak's witnesses: one
    /// process for the whole run, living through every other node's faults).
    pub spare: usize,
    /// A soak: sample every daemon's vitals this often and judge their trends.
    pub sampling: Option<Sampling>,
}

/// The rack under test and everything the run did to it and saw of it.
struct Harness {
    config: RunConfig,
    // Declared before the mounts and the temporary directory: dropped (daemons killed)
    // before the state directories are unmounted, and those before the directory is
    // removed.
    rack: LocalRack,
    /// A tmpfs over each state directory of the first clique (`disk-full`), or why not.
    disks: Result<StateDirs, String>,
    tmp: Option<tempfile::TempDir>,
    net: Result<NetFaults, String>,
    world: World,
    /// The run's first domain: faults are healed against it (agreement, status).
    domain: ComputeDomainRef,
    /// With `--domains`: every other domain the run made, deleted or not, by uid.
    sharing: BTreeMap<String, ComputeDomainRef>,
    /// Domains made so far, the first included: the next one's number.
    domains_made: usize,
    started: Instant,
    phase_start: Instant,
    /// The fault being injected or healed, for attributing violations.
    current: Option<(FaultKind, usize)>,
    findings: Findings,
    observations: u64,
    /// The node whose `/metrics` each observation reads (during cert-rotate).
    metrics_for: Option<usize>,
    prepares: Prepares,
    /// The newest observation and the world it was checked against.
    last: Option<(World, Observation)>,
    /// Every rack node's clique, for the cliques invariant.
    cliques: CliqueMap,
    others: Others,
    imports: Imports,
    sampler: Option<sampler::Sampler>,
}

impl Harness {
    fn start(config: RunConfig, schedule: &Schedule) -> anyhow::Result<Self> {
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
            config.nodes * config.cliques,
            config.domaind.clone(),
            config.imex_sim.clone(),
            tmp.path().into(),
        );
        spec.cliques = config.cliques;
        spec.subnet = config.subnet;
        spec.gossip_interval = config.gossip_interval;
        spec.log_filter = config.log_filter.clone();
        // The kubelet calls again after a retryable answer; a short deadline keeps each
        // call, and so each wait of the harness, short.
        spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
        // As the chart installs it: IMEX outlives a daemon's restart.
        spec.imex_runner = true;
        let rack = LocalRack::create(spec)?;
        // Before any daemon starts: a mount over a directory in use would hide its files.
        let disks = if schedule.kinds.iter().any(|k| k.needs_state_dir_mounts()) {
            let dirs: Vec<PathBuf> = rack
                .nodes()
                .iter()
                .take(config.nodes)
                .map(|n| n.state_dir())
                .collect();
            StateDirs::mount(&dirs)
        } else {
            Err("not needed by this scenario".into())
        };
        let mut rack = rack;
        let now = Instant::now();
        let domain = ComputeDomainRef {
            namespace: NAMESPACE.into(),
            name: DOMAIN_NAME.into(),
            uid: format!("chaos-{:016x}", config.seed),
            num_nodes: 0,
            isolation: if config.domains > 1 {
                Isolation::Channel
            } else {
                Isolation::default()
            },
        };
        let mut world = World::new(
            domain.uid.clone(),
            config.isolation_grace,
            // The rack's first nodes are its first clique (contiguous blocks).
            rack.nodes()
                .iter()
                .take(config.nodes)
                .map(|n| (n.name().to_owned(), n.ip())),
            now,
        );
        world.sharing = config.domains > 1;
        let cliques = CliqueMap::new(
            rack.nodes()
                .iter()
                .enumerate()
                .map(|(i, n)| (n.name().to_owned(), n.ip(), rack.clique_of(i))),
        );
        let others = Others::new(config.nodes, rack.nodes().len());
        let sampler = config
            .sampling
            .as_ref()
            .map(sampler::Sampler::new)
            .transpose()?;
        tokio::task::block_in_place(|| rack.start_all())?;
        let mut harness = Self {
            config,
            rack,
            disks,
            tmp: Some(tmp),
            net,
            world,
            domain,
            sharing: BTreeMap::new(),
            domains_made: 1,
            started: now,
            phase_start: now,
            current: None,
            findings: Findings::default(),
            observations: 0,
            metrics_for: None,
            prepares: Prepares::default(),
            last: None,
            cliques,
            others,
            imports: Imports::default(),
            sampler,
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

    fn state_dirs_line(&self) -> String {
        match &self.disks {
            Ok(disks) => format!(
                "a {} MiB tmpfs over each of the {} state directories",
                crate::statedir::STATE_DIR_SIZE >> 20,
                disks.dirs().len()
            ),
            Err(reason) => format!("unavailable ({reason})"),
        }
    }

    /// Why a fault of `kind` cannot be injected here, if it cannot.
    fn missing_control(&self, kind: FaultKind) -> Option<String> {
        if kind.needs_network_control()
            && let Err(reason) = &self.net
        {
            return Some(reason.clone());
        }
        if kind.needs_state_dir_mounts()
            && let Err(reason) = &self.disks
        {
            return Some(reason.clone());
        }
        None
    }

    fn name(&self, node: usize) -> String {
        self.world.nodes[node].name.clone()
    }

    fn ms_since_start(&self, at: Instant) -> u64 {
        millis(self.started, at)
    }

    /// Records a violation, attributed to the fault under way; said once, when new.
    fn record(&mut self, violation: Violation) {
        let at_ms = self.ms_since_start(Instant::now());
        if let Some(line) = self.findings.record(violation, at_ms, self.current) {
            self.say(&line);
        }
    }

    fn liveness(&mut self, node: Option<usize>, detail: String) {
        let name = node.map(|n| self.name(n));
        self.record(Violation::new(Invariant::Liveness, name.as_deref(), detail));
    }
}

/// Milliseconds from `from` to `to` (none when `to` is earlier): how every detection
/// and heal time is counted.
fn millis(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_millis() as u64
}
