//! `domaind demo`: the product doing its job on one machine. A rack of `domaind run`
//! processes on loopback forms a ComputeDomain through the kubelet's socket, loses a
//! node to SIGKILL, heals, and takes the node back. With `--cliques K` the rack is K
//! NVLink cliques, each doing all of that with a domain of its own at the same time,
//! and the demo checks on every look that no node has a gossip member or IMEX peer
//! of another clique.

pub(crate) mod busy;
mod idle;
mod restart;
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

use domaind_node::dra::DraVersion;
use domaind_node::local::{ClaimFile, ComputeDomainRef};
use domaind_node::rack::{LocalRack, RackSpec, prepare_until_ready, short_temp_dir};
use restart::{DaemonKill, daemon_kill};
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
    #[arg(long, default_value_t = 77)]
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

/// The line `--keep --json` prints first.
#[derive(Debug, Clone, Serialize)]
struct RackLine {
    compute_domain: DemoDomain,
    /// Every clique's domain, the first being `compute_domain`; absent with one.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    compute_domains: Vec<DemoDomain>,
    local_dir: PathBuf,
    nodes: Vec<NodeLine>,
}

#[derive(Debug, Clone, Serialize)]
struct NodeLine {
    name: String,
    ip: String,
    gossip_addr: String,
    http_addr: String,
    /// Empty when the node serves no /state.
    state_addr: String,
    dra_socket: PathBuf,
    registration_socket: PathBuf,
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

/// `demo-domain` for a rack of one clique, as always; `demo-domain-<n>` from 1 with
/// several.
fn domain_name(clique: usize, cliques: usize) -> String {
    if cliques == 1 {
        "demo-domain".into()
    } else {
        format!("demo-domain-{}", clique + 1)
    }
}

/// The domain of each clique is formed, loses its clique's last node to SIGKILL, heals
/// and takes the node back; with several cliques all at once, timed per clique.
async fn scenario(
    rack: &mut LocalRack,
    domains: &[DemoDomain],
    args: &DemoArgs,
) -> anyhow::Result<FleetSummary> {
    let total = rack.nodes().len();
    let cliques: Vec<Vec<usize>> = (0..domains.len()).map(|c| rack.clique_members(c)).collect();
    let fleet = cliques.len() > 1;
    let size = |c: usize| cliques[c].len();
    let live = !args.json && std::io::stdout().is_terminal();
    let clique_of = (0..total).map(|i| rack.clique_of(i)).collect();
    let mut observer = Observer::new(live, args.json, domains.to_vec(), clique_of);
    let layout = if fleet {
        format!(
            "in {} NVLink cliques of {} (each node seeds gossip with its clique-mates only)",
            cliques.len(),
            args.nodes
        )
    } else {
        "in one NVLink clique".to_owned()
    };
    observer.say(&format!(
        "Starting a rack of {total} domaind nodes on 127.0.{}.1-{total}: TLS gossip, imex-sim linked over mTLS, \
         fake GB200 GPUs {layout}, the local backend in {}",
        args.subnet,
        rack.local().root().display()
    ));
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        rack.start_all()?;
        rack.wait_all_ready(STEP_LIMIT)?;
        Ok(())
    })?;
    if args.keep && args.json {
        print_rack_line(rack, domains)?;
    }

    for (i, node) in rack.nodes().iter().enumerate() {
        let clique = rack.clique_of(i);
        rack.local()
            .write_claim(&claim_file(node.name(), &domains[clique], size(clique)))?;
    }
    let which = if fleet {
        format!(
            "ComputeDomains {}/{}..{} (one per clique)",
            domains[0].namespace,
            domains[0].name,
            domains.len()
        )
    } else {
        format!("ComputeDomain {}/{}", domains[0].namespace, domains[0].name)
    };
    observer.say(&format!(
        "Preparing one claim per node for {which}, as each node's kubelet would"
    ));
    let started = Instant::now();
    let formed_cpu = busy::CpuMark::now();
    let prepares = futures::future::join_all(rack.nodes().iter().enumerate().map(|(i, node)| {
        let domain = &domains[rack.clique_of(i)];
        let (socket, claim) = (node.dra_socket(), claim_ref(node.name(), domain));
        async move { prepare_until_ready(&socket, &claim, DraVersion::V1, STEP_LIMIT).await }
    }));
    let (answers, formed_at, _) = observer
        .watch_each(rack, prepares, cliques.len(), |snapshot, c| {
            snapshot.ready(c, &cliques[c])
        })
        .await?;
    for (node, answer) in rack.nodes().iter().zip(answers) {
        if let Err(error) = answer? {
            bail!("{} refused its claim: {error}", node.name());
        }
    }
    let formed_ms = since(started, &formed_at);
    let formed_busy = formed_cpu
        .as_ref()
        .and_then(busy::CpuMark::busy_percent_since);
    let formed_work = formed_cpu.and_then(|mark| mark.work_since(&daemon_pids(rack)));
    for (c, ms) in formed_ms.iter().enumerate() {
        observer.say(&format!(
            "{}Domain formed: Ready {n}/{n} in {ms} ms",
            prefix(fleet, c),
            n = size(c)
        ));
    }

    let victims: Vec<usize> = cliques
        .iter()
        .map(|members| *members.last().expect("a clique has a node"))
        .collect();
    let killed: Vec<String> = victims
        .iter()
        .map(|v| rack.node(*v).name().to_owned())
        .collect();

    // The jobs: on every node, an import of memory from every peer.
    let mut imports = Vec::new();
    for node in 0..total {
        imports.push(rack.import(node).await?);
    }
    let daemon_kills =
        daemon_kill(rack, &mut observer, domains, &cliques, &victims, &imports).await?;
    for (c, kill) in daemon_kills.iter().enumerate() {
        observer.say(&format!(
            "{}{}'s daemon killed (IMEX keeps running): {} {n}/{n} throughout, {} of {} \
             imports broken, {} IMEX, daemon back in {} ms",
            prefix(fleet, c),
            killed[c],
            if kill.ready_throughout {
                "Ready"
            } else {
                "NOT Ready"
            },
            kill.imports_broken,
            kill.imports,
            if kill.same_imex { "the same" } else { "a NEW" },
            kill.back_ms,
            n = size(c)
        ));
    }

    observer.say(&format!(
        "Killing {} (daemon and IMEX) with SIGKILL: the node itself dies",
        killed.join(", ")
    ));
    let started = Instant::now();
    let heal_cpu = busy::CpuMark::now();
    tokio::task::block_in_place(|| victims.iter().try_for_each(|v| rack.kill_node(*v)))?;
    let (_, healed_at, _) = observer
        .watch_each(
            rack,
            std::future::ready(()),
            cliques.len(),
            |snapshot, c| snapshot.survivors_dropped(&cliques[c], &killed[c]),
        )
        .await?;
    let heal_ms = since(started, &healed_at);
    let heal_busy = heal_cpu
        .as_ref()
        .and_then(busy::CpuMark::busy_percent_since);
    let heal_work = heal_cpu.and_then(|mark| mark.work_since(&daemon_pids(rack)));
    for c in 0..cliques.len() {
        observer.say(&format!(
            "{}Survivors dropped {} from their IMEX peers in {} ms",
            prefix(fleet, c),
            killed[c],
            heal_ms[c]
        ));
    }

    let (_, listed_at, _) = observer
        .watch_each(
            rack,
            std::future::ready(()),
            cliques.len(),
            |snapshot, c| snapshot.status_lists_lost(c, &killed[c]),
        )
        .await?;
    let status_ms = since(started, &listed_at);
    // Every import of the victims' cliques breaks: the victim's with its IMEX, the
    // survivors' once their IMEX no longer lists it. How long the last one takes is
    // how long a survivor's IMEX kept a dead node configured.
    let expected = imports
        .iter()
        .filter(|i| {
            victims
                .iter()
                .any(|v| rack.clique_of(*v) == rack.clique_of(i.node))
        })
        .count();
    let mut imports_broken_by_node_kill = rack.broken_imports(&imports).await.len();
    let deadline = Instant::now() + IMPORTS_BREAK_LIMIT;
    while imports_broken_by_node_kill < expected && Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(100)).await;
        imports_broken_by_node_kill = rack.broken_imports(&imports).await.len();
    }
    let imports_broken_ms = started.elapsed().as_millis() as u64;
    for c in 0..cliques.len() {
        observer.say(&format!(
            "{}Status NotReady with {} lost after {} ms (one write for the whole loss)",
            prefix(fleet, c),
            killed[c],
            status_ms[c]
        ));
    }
    observer.say(&format!(
        "{imports_broken_by_node_kill} of {expected} imports broken by the node's death \
         (the last seen {imports_broken_ms} ms after it): a job spanning a dead node fails"
    ));

    observer.say(&format!(
        "Restarting {}: {} restores its checkpoint and rejoins",
        killed.join(", "),
        if fleet { "each" } else { "it" }
    ));
    let started = Instant::now();
    let rejoin_cpu = busy::CpuMark::now();
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        for victim in &victims {
            rack.start(*victim)?;
        }
        for victim in &victims {
            rack.wait_ready(*victim, STEP_LIMIT)?;
        }
        Ok(())
    })?;
    let (_, rejoined_at, _) = observer
        .watch_each(
            rack,
            std::future::ready(()),
            cliques.len(),
            |snapshot, c| snapshot.ready(c, &cliques[c]),
        )
        .await?;
    let rejoin_ms = since(started, &rejoined_at);
    let rejoin_busy = rejoin_cpu
        .as_ref()
        .and_then(busy::CpuMark::busy_percent_since);
    let rejoin_work = rejoin_cpu.and_then(|mark| mark.work_since(&daemon_pids(rack)));
    let work_ms = match (formed_work, heal_work, rejoin_work) {
        (Some(formed), Some(heal), Some(rejoin)) => Some(StepWork {
            formed,
            heal,
            rejoin,
        }),
        _ => None,
    };
    let busy_percent = match (formed_busy, heal_busy, rejoin_busy) {
        (Some(formed), Some(heal), Some(rejoin)) => Some(BusyPercent {
            formed,
            heal,
            rejoin,
        }),
        _ => None,
    };
    for c in 0..cliques.len() {
        observer.say(&format!(
            "{}{} rejoined: Ready {n}/{n} in {} ms",
            prefix(fleet, c),
            killed[c],
            rejoin_ms[c],
            n = size(c)
        ));
    }

    let idle = match args.idle {
        Some(window) => {
            observer.say(&format!(
                "Leaving the rack alone for {} s, then measuring {} s of idle",
                idle::SETTLE.as_secs(),
                window.as_secs_f64()
            ));
            tokio::time::sleep(idle::SETTLE).await;
            let cost = idle::measure(rack, window).await?;
            if !args.json {
                print!("{}", idle::render(&cost));
            }
            Some(cost)
        }
        None => None,
    };

    let mut summaries = Vec::new();
    for (c, domain) in domains.iter().enumerate() {
        summaries.push(Summary {
            nodes: size(c),
            compute_domain: domain.clone(),
            formed_ms: formed_ms[c],
            killed: killed[c].clone(),
            daemon_kill: daemon_kills[c].clone(),
            imports_broken_by_node_kill,
            imports_broken_ms,
            heal_ms: heal_ms[c],
            status_ms: status_ms[c],
            rejoin_ms: rejoin_ms[c],
            busy_percent,
            work_ms,
            events: rack.local().read_events(&domain.uid)?.len(),
            rack_dir: rack.spec().root.clone(),
            // The whole rack's, measured once: on the first clique's summary.
            idle: if c == 0 { idle.clone() } else { None },
            ok: true,
        });
    }
    let crossings: Vec<String> = observer.crossings().iter().cloned().collect();
    if fleet {
        observer.fleet_summary(&summaries);
    } else {
        observer.summary(&summaries[0]);
    }
    if !crossings.is_empty() {
        bail!("nodes had gossip members or IMEX peers of another clique: {crossings:?}");
    }
    Ok(FleetSummary {
        cliques: summaries,
        crossings,
        ok: true,
    })
}

/// How long the demo waits for the node kill to break every import of its clique.
const IMPORTS_BREAK_LIMIT: Duration = Duration::from_secs(15);

/// Milliseconds from `started` to each of `at`.
fn since(started: Instant, at: &[Instant]) -> Vec<u64> {
    at.iter()
        .map(|at| at.saturating_duration_since(started).as_millis() as u64)
        .collect()
}

/// "clique 2: " before a clique's line, with several cliques.
fn prefix(fleet: bool, clique: usize) -> String {
    if fleet {
        format!("clique {}: ", clique + 1)
    } else {
        String::new()
    }
}

fn claim_file(node: &str, domain: &DemoDomain, nodes: usize) -> ClaimFile {
    ClaimFile {
        namespace: domain.namespace.clone(),
        name: format!("{}-{node}", domain.name),
        uid: claim_uid(node),
        compute_domain: ComputeDomainRef {
            namespace: domain.namespace.clone(),
            name: domain.name.clone(),
            uid: domain.uid.clone(),
            num_nodes: nodes as u32,
            isolation: Default::default(),
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
    }
}

fn claim_uid(node: &str) -> String {
    format!("claim-{node}")
}

fn claim_ref(node: &str, domain: &DemoDomain) -> ClaimRef {
    ClaimRef {
        uid: claim_uid(node),
        namespace: domain.namespace.clone(),
        name: format!("{}-{node}", domain.name),
    }
}

/// A random version-4 UUID: a restarted demo is a new domain.
fn demo_uid() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

fn node_lines(rack: &LocalRack) -> Vec<NodeLine> {
    rack.nodes()
        .iter()
        .map(|n| NodeLine {
            name: n.name().to_owned(),
            ip: n.ip().to_string(),
            gossip_addr: n
                .info()
                .map(|i| i.gossip_addr.to_string())
                .unwrap_or_default(),
            http_addr: n
                .info()
                .map(|i| i.http_addr.to_string())
                .unwrap_or_default(),
            state_addr: n
                .info()
                .and_then(|i| i.state_addr)
                .map(|addr| addr.to_string())
                .unwrap_or_default(),
            dra_socket: n.dra_socket(),
            registration_socket: n.registration_socket(),
        })
        .collect()
}

fn print_rack_line(rack: &LocalRack, domains: &[DemoDomain]) -> anyhow::Result<()> {
    let line = RackLine {
        compute_domain: domains[0].clone(),
        compute_domains: if domains.len() > 1 {
            domains.to_vec()
        } else {
            Vec::new()
        },
        local_dir: rack.local().root().to_owned(),
        nodes: node_lines(rack),
    };
    let mut stdout = std::io::stdout().lock();
    writeln!(stdout, "{}", serde_json::to_string(&line)?)?;
    stdout.flush()?;
    Ok(())
}

fn print_how_to_poke(rack: &LocalRack, domain: &DemoDomain, json: bool) {
    if json {
        return;
    }
    let local = rack.local();
    let first = &node_lines(rack)[0];
    println!(
        "\nThe rack keeps running. Poke it:\n\
         \x20 cat {status}\n\
         \x20 curl -s http://{state}/state\n\
         \x20 domaind kubelet-sim prepare --socket {socket} --claim {claim}:{ns}:{name}\n\
         \x20 kill -KILL <pid of a node> (see {root}/node-*/state/run.json)\n\
         Claims are files in {claims}; logs are {root}/node-*/domaind.log.\n\
         Ctrl-C stops the rack and removes its files.",
        status = local
            .status_path(&domain.uid)
            .map(|p| p.display().to_string())
            .unwrap_or_default(),
        state = first.state_addr,
        socket = first.dra_socket.display(),
        claim = claim_uid(&first.name),
        ns = domain.namespace,
        name = format_args!("{}-{}", domain.name, first.name),
        root = rack.spec().root.display(),
        claims = local.claims_dir().display(),
    );
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
