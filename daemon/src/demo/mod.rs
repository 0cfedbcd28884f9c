//! `domaind demo`: the product doing its job on one machine. A rack of `domaind run`
//! processes on loopback forms a ComputeDomain through the kubelet's socket, loses a
//! node to SIGKILL, heals, and takes the node back. With `--cliques K` the rack is K
//! NVLink cliques, each doing all of that with a domain of its own at the same time,
//! and the demo checks on every look that no node has a gossip member or IMEX peer
//! of another clique.

pub(crate) mod busy;
mod claims;
mod idle;
mod output;
mod restart;
mod scenario;
mod sharing;
mod table;

use std::io::{IsTerminal as _, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use domaind_actors::model::{AllocationMode, ClaimRef, Phase, ReadinessPolicy};
use domaind_kube_api::crd;
use serde::Serialize;
use tokio::signal::unix::{SignalKind, signal};

use claims::{claim_file, claim_ref, claim_uid, demo_uid, domain_name};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_kubelet_plugin::DraVersion;
use domaind_testbed::rack::{LocalRack, RackSpec, prepare_until_ready, short_temp_dir};
use output::{print_how_to_poke, print_rack_line};
use restart::{DaemonKill, daemon_kill};
use scenario::{scenario, since};
use table::{Observer, Snapshot};

/// How long any one step may take before the demo gives up.
const STEP_LIMIT: Duration = Duration::from_secs(90);
/// How long daemons get to stop gracefully at the end.
const STOP_LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Nodes in the rack (in each clique, with --cliques), 1 to 18 (an NVL72 rack has
    /// 18). The default runs well on 2 cores.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=18))]
    pub nodes: u16,

    /// NVLink cliques, 1 to 8, of --nodes nodes each: one domain per clique, formed,
    /// healed and rejoined side by side; every node seeds gossip with its clique-mates
    /// only. A clique's node kill needs 2 or more nodes.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    pub cliques: u16,

    /// ComputeDomains, 1 to 4. Above 1 they all have `isolation: Channel` and every
    /// node holds a claim of each: they form at once, each on its own channel, each
    /// pod's CDI spec is checked to hold its own domain's channel only, and the first
    /// is deleted while the others stay Ready. Not with --cliques, --keep or --idle.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=4))]
    pub domains: u16,

    /// Leave the rack running after the demo, and print how to poke it; stop with
    /// SIGTERM or SIGINT (Ctrl-C), which cleans up.
    #[arg(long)]
    pub keep: bool,

    /// Machine-readable output instead of the live table: a JSON summary at the end,
    /// and with --keep, first one JSON line describing the rack.
    #[arg(long)]
    pub json: bool,

    /// The rack's loopback subnet: nodes get 127.0.<subnet>.1, .2, ...
    #[arg(long, default_value_t = domaind_loopback::DEMO)]
    pub subnet: u8,

    /// The daemons' anti-entropy interval (chitchat's rounds; liveness is pulsed every
    /// 150 ms whatever this is).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub gossip_interval: Duration,

    /// After the scenario, leave the rack alone (20 s to settle) and then measure, over
    /// this long, the CPU each daemon uses (itself, the status tools it runs, its IMEX
    /// daemon; from /proc) and the IMEX status questions it asks; printed as a table
    /// (or as `idle` in the --json summary).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub idle: Option<Duration>,

    /// The daemons' --imex-poll-steady (theirs by default).
    #[arg(long, value_parser = humantime::parse_duration)]
    pub imex_poll_steady: Option<Duration>,

    /// Copy every node's logs (the daemon's, its IMEX runner's and IMEX's) here before
    /// the rack is deleted, as <DIR>/node-NN/...; for a run to be looked at afterwards.
    #[arg(long)]
    pub logs: Option<PathBuf>,
}

/// The ComputeDomain the demo forms.
#[derive(Debug, Clone, Serialize)]
pub struct DemoDomain {
    pub namespace: String,
    pub name: String,
    pub uid: String,
}

/// What `--json` prints at the end.
#[derive(Debug, Clone, Serialize)]
pub struct Summary {
    pub nodes: usize,
    pub compute_domain: DemoDomain,
    /// Prepare calls issued on every node → every call answered and the status Ready
    /// with every node.
    pub formed_ms: u64,
    pub killed: String,
    /// The node's daemon alone killed and restarted, its IMEX left running.
    pub daemon_kill: DaemonKill,
    /// After the node kill (daemon and IMEX): imports broken, of all the nodes' jobs
    /// (every one of the clique's, once every survivor's IMEX dropped the node)...
    pub imports_broken_by_node_kill: usize,
    /// ...and when the last of them was seen broken (SIGKILL → then).
    pub imports_broken_ms: u64,
    /// SIGKILL → every survivor dropped the node from its IMEX peers.
    pub heal_ms: u64,
    /// SIGKILL → the status lists the node NotReady. Later than `heal_ms`: a Ready
    /// domain's degradation is held 1.5 s so that the whole loss is one write.
    pub status_ms: u64,
    /// Restart → the status Ready with every node again.
    pub rejoin_ms: u64,
    /// How busy the machine's cores were (percent, from /proc/stat) during the
    /// formation, the heal and the rejoin: near 100, a step waited for CPU that the
    /// rack's nodes share here and would not on a real rack.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub busy_percent: Option<BusyPercent>,
    /// The CPU each part of the rack used in those steps: where the time went.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub work_ms: Option<StepWork>,
    /// Status documents the rack's reporters wrote, as the status file's history shows
    /// through the events.
    pub events: usize,
    /// Where the rack's files were; removed when the demo ends.
    pub rack_dir: PathBuf,
    /// With `--idle`: what each daemon cost while the rack idled.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub idle: Option<idle::IdleCost>,
    pub ok: bool,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct BusyPercent {
    pub formed: u32,
    pub heal: u32,
    pub rejoin: u32,
}

#[derive(Debug, Clone, Copy, Serialize)]
pub struct StepWork {
    pub formed: busy::Work,
    pub heal: busy::Work,
    pub rejoin: busy::Work,
}

/// The pids of the rack's daemons that run now.
fn daemon_pids(rack: &LocalRack) -> Vec<u32> {
    rack.nodes().iter().filter_map(|n| n.pid()).collect()
}

/// What `--json` prints at the end with `--cliques` above 1.
#[derive(Debug, Clone, Serialize)]
pub struct FleetSummary {
    pub cliques: Vec<Summary>,
    /// Every gossip member or IMEX peer of another clique any node showed in any look
    /// of the run: none when cliques are isolated.
    pub crossings: Vec<String>,
    pub ok: bool,
}

pub fn run(args: DemoArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(demo(args))
}

async fn demo(args: DemoArgs) -> anyhow::Result<()> {
    if args.domains > 1 {
        if args.cliques > 1 || args.keep || args.idle.is_some() {
            bail!(
                "--domains {} runs its own scenario on one clique: it cannot be combined with \
                 --cliques, --keep or --idle",
                args.domains
            );
        }
        return shared_demo(args).await;
    }
    let domaind = std::env::current_exe().context("cannot find the domaind binary")?;
    let tmp = short_temp_dir("domaind-demo").context("cannot make a temporary directory")?;
    let cliques = usize::from(args.cliques);
    let mut spec = RackSpec::self_contained(
        usize::from(args.nodes) * cliques,
        domaind,
        tmp.path().into(),
    );
    spec.cliques = cliques;
    spec.subnet = args.subnet;
    spec.gossip_interval = args.gossip_interval;
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    // As the chart installs it: IMEX under a runner, so that a daemon restart leaves
    // it, and the jobs' imports, running.
    spec.imex_runner = true;
    if let Some(steady) = args.imex_poll_steady {
        spec.extra_args.push("--imex-poll-steady".into());
        spec.extra_args
            .push(humantime::format_duration(steady).to_string());
    }
    let mut rack = LocalRack::create(spec)?;
    let domains: Vec<DemoDomain> = (0..cliques)
        .map(|clique| DemoDomain {
            namespace: "default".into(),
            name: domain_name(clique, cliques),
            uid: demo_uid(),
        })
        .collect();
    let mut interrupts = Interrupts::new()?;
    let outcome = tokio::select! {
        outcome = scenario(&mut rack, &domains, &args) => outcome,
        signal = interrupts.next() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    let outcome = match outcome {
        Ok(summary) if args.keep => {
            print_how_to_poke(&rack, &domains[0], args.json);
            let signal = interrupts.next().await;
            if !args.json {
                println!("\n{signal}: stopping the rack");
            }
            Ok(summary)
        }
        other => other,
    };
    tokio::task::block_in_place(|| rack.stop_all(STOP_LIMIT));
    let crashed = rack.unexpected_exits();
    drop(rack);
    if let Some(logs) = &args.logs {
        copy_logs(tmp.path(), logs)?;
    }
    drop(tmp);
    let mut fleet = outcome?;
    if !crashed.is_empty() {
        bail!("daemons died that the demo did not kill: {crashed:?}");
    }
    if args.json {
        if cliques == 1 {
            println!("{}", serde_json::to_string(&fleet.cliques.remove(0))?);
        } else {
            println!("{}", serde_json::to_string(&fleet)?);
        }
    }
    Ok(())
}

/// Every `*.log` under `root`, copied to the same relative path under `to`.
fn copy_logs(root: &std::path::Path, to: &std::path::Path) -> anyhow::Result<()> {
    for entry in
        std::fs::read_dir(root).with_context(|| format!("cannot read {}", root.display()))?
    {
        let entry = entry?;
        let path = entry.path();
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_logs(&path, &target)?;
        } else if path.extension().is_some_and(|e| e == "log") {
            std::fs::create_dir_all(to).with_context(|| format!("cannot make {}", to.display()))?;
            std::fs::copy(&path, &target).with_context(|| {
                format!("cannot copy {} to {}", path.display(), target.display())
            })?;
        }
    }
    Ok(())
}

/// `--domains N`: N domains with `isolation: Channel` share one rack.
async fn shared_demo(args: DemoArgs) -> anyhow::Result<()> {
    let domaind = std::env::current_exe().context("cannot find the domaind binary")?;
    let tmp = short_temp_dir("domaind-demo").context("cannot make a temporary directory")?;
    let mut spec = RackSpec::self_contained(usize::from(args.nodes), domaind, tmp.path().into());
    spec.subnet = args.subnet;
    spec.gossip_interval = args.gossip_interval;
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    let mut rack = LocalRack::create(spec)?;
    let mut interrupts = Interrupts::new()?;
    let outcome = tokio::select! {
        outcome = sharing::scenario(&mut rack, &args) => outcome,
        signal = interrupts.next() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    tokio::task::block_in_place(|| rack.stop_all(STOP_LIMIT));
    let crashed = rack.unexpected_exits();
    drop(rack);
    drop(tmp);
    let summary = outcome?;
    if !crashed.is_empty() {
        bail!("daemons died that the demo did not kill: {crashed:?}");
    }
    if args.json {
        println!("{}", serde_json::to_string(&summary)?);
    }
    Ok(())
}

/// SIGINT and SIGTERM, as one stream.
pub(crate) struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupts {
    pub(crate) fn new() -> anyhow::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        })
    }

    pub(crate) async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

impl Snapshot {
    /// Clique `clique`'s status Ready with all of `members`, and each of them sees all
    /// of them.
    fn ready(&self, clique: usize, members: &[usize]) -> bool {
        let nodes = members.len();
        let status_ready = self
            .statuses
            .get(clique)
            .and_then(Option::as_ref)
            .is_some_and(|s| s.status == crd::Phase::Ready && s.ready_nodes as usize == nodes);
        let views_agree = members.iter().all(|i| {
            self.views[*i].1.as_ref().is_some_and(|v| {
                v.domains
                    .first()
                    .is_some_and(|d| d.phase == Phase::Ready && d.members.len() == nodes)
            })
        });
        status_ready && views_agree
    }

    /// Every survivor among `members` dropped `node` from its IMEX peers.
    fn survivors_dropped(&self, members: &[usize], node: &str) -> bool {
        members
            .iter()
            .map(|i| &self.views[*i])
            .filter(|(name, _)| name != node)
            .all(|(_, view)| {
                view.as_ref().is_some_and(|v| {
                    v.domains
                        .first()
                        .is_some_and(|d| !d.peers.values().any(|p| p == node))
                })
            })
    }

    /// Clique `clique`'s status is NotReady and lists `node` NotReady.
    fn status_lists_lost(&self, clique: usize, node: &str) -> bool {
        self.statuses
            .get(clique)
            .and_then(Option::as_ref)
            .is_some_and(|s| {
                s.status == crd::Phase::NotReady
                    && s.nodes
                        .iter()
                        .any(|n| n.name == node && n.status == crd::Phase::NotReady)
            })
    }
}
