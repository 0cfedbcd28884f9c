//! `domaind demo`: the product doing its job on one machine. A rack of `domaind run`
//! processes on loopback forms a ComputeDomain through the kubelet's socket, loses a
//! node to SIGKILL, heals, and takes the node back.

mod idle;
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
use table::{Observer, Snapshot};

/// How long any one step may take before the demo gives up.
const STEP_LIMIT: Duration = Duration::from_secs(90);
/// How long daemons get to stop gracefully at the end.
const STOP_LIMIT: Duration = Duration::from_secs(20);

#[derive(Debug, Clone, Args)]
pub struct DemoArgs {
    /// Nodes in the rack, 1 to 18 (an NVL72 rack has 18). The default runs well on
    /// 2 cores.
    #[arg(long, default_value_t = 4, value_parser = clap::value_parser!(u16).range(1..=18))]
    pub nodes: u16,

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

    /// The daemons' gossip interval.
    #[arg(long, default_value = "150ms", value_parser = humantime::parse_duration)]
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
    /// SIGKILL → every survivor dropped the node from its IMEX peers.
    pub heal_ms: u64,
    /// SIGKILL → the status lists the node NotReady. Later than `heal_ms`: a Ready
    /// domain's degradation is held ~3 s so that the whole loss is one write.
    pub status_ms: u64,
    /// Restart → the status Ready with every node again.
    pub rejoin_ms: u64,
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

/// The line `--keep --json` prints first.
#[derive(Debug, Clone, Serialize)]
struct RackLine {
    compute_domain: DemoDomain,
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
    let domaind = std::env::current_exe().context("cannot find the domaind binary")?;
    let tmp = short_temp_dir("domaind-demo").context("cannot make a temporary directory")?;
    let mut spec = RackSpec::self_contained(args.nodes.into(), domaind, tmp.path().into());
    spec.subnet = args.subnet;
    spec.gossip_interval = args.gossip_interval;
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    if let Some(steady) = args.imex_poll_steady {
        spec.extra_args.push("--imex-poll-steady".into());
        spec.extra_args
            .push(humantime::format_duration(steady).to_string());
    }
    let mut rack = LocalRack::create(spec)?;
    let domain = DemoDomain {
        namespace: "default".into(),
        name: "demo-domain".into(),
        uid: demo_uid(),
    };
    let mut interrupts = Interrupts::new()?;
    let outcome = tokio::select! {
        outcome = scenario(&mut rack, &domain, &args) => outcome,
        signal = interrupts.next() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    let outcome = match outcome {
        Ok(summary) if args.keep => {
            print_how_to_poke(&rack, &domain, args.json);
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

async fn scenario(
    rack: &mut LocalRack,
    domain: &DemoDomain,
    args: &DemoArgs,
) -> anyhow::Result<Summary> {
    let nodes = rack.nodes().len();
    let live = !args.json && std::io::stdout().is_terminal();
    let mut observer = Observer::new(live, args.json, domain.clone());
    observer.say(&format!(
        "Starting a rack of {nodes} domaind nodes on 127.0.{}.1-{nodes}: TLS gossip, imex-sim, \
         fake GB200 GPUs in one NVLink clique, the local backend in {}",
        args.subnet,
        rack.local().root().display()
    ));
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        rack.start_all()?;
        rack.wait_all_ready(STEP_LIMIT)?;
        Ok(())
    })?;
    if args.keep && args.json {
        print_rack_line(rack, domain)?;
    }

    for node in rack.nodes() {
        rack.local()
            .write_claim(&claim_file(node.name(), domain, nodes))?;
    }
    observer.say(&format!(
        "Preparing one claim per node for ComputeDomain {}/{}, as each node's kubelet would",
        domain.namespace, domain.name
    ));
    let started = Instant::now();
    let prepares = futures::future::join_all(rack.nodes().iter().map(|node| {
        let (socket, claim) = (node.dra_socket(), claim_ref(node.name()));
        async move { prepare_until_ready(&socket, &claim, DraVersion::V1, STEP_LIMIT).await }
    }));
    let formed = observer
        .watch_while(rack, prepares, |snapshot, _| snapshot.ready(nodes))
        .await?;
    for (node, answer) in rack.nodes().iter().zip(formed.0) {
        if let Err(error) = answer? {
            bail!("{} refused its claim: {error}", node.name());
        }
    }
    let formed_ms = started.elapsed().as_millis() as u64;
    observer.say(&format!(
        "Domain formed: Ready {nodes}/{nodes} in {formed_ms} ms"
    ));

    let victim = nodes - 1;
    let killed = rack.node(victim).name().to_owned();
    observer.say(&format!("Killing {killed} with SIGKILL (no goodbye)"));
    let started = Instant::now();
    tokio::task::block_in_place(|| rack.kill(victim))?;
    let dead = killed.clone();
    observer
        .watch_while(rack, std::future::ready(()), move |snapshot, _| {
            snapshot.survivors_dropped(&dead)
        })
        .await?;
    let heal_ms = started.elapsed().as_millis() as u64;
    observer.say(&format!(
        "Survivors dropped {killed} from their IMEX peers in {heal_ms} ms"
    ));
    let dead = killed.clone();
    observer
        .watch_while(rack, std::future::ready(()), move |snapshot, _| {
            snapshot.status_lists_lost(&dead)
        })
        .await?;
    let status_ms = started.elapsed().as_millis() as u64;
    observer.say(&format!(
        "Status NotReady with {killed} lost after {status_ms} ms (one write for the whole loss)"
    ));

    observer.say(&format!(
        "Restarting {killed}: it restores its checkpoint and rejoins"
    ));
    let started = Instant::now();
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        rack.start(victim)?;
        rack.wait_ready(victim, STEP_LIMIT)?;
        Ok(())
    })?;
    observer
        .watch_while(rack, std::future::ready(()), |snapshot, _| {
            snapshot.ready(nodes)
        })
        .await?;
    let rejoin_ms = started.elapsed().as_millis() as u64;
    observer.say(&format!(
        "{killed} rejoined: Ready {nodes}/{nodes} in {rejoin_ms} ms"
    ));

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

    let events = rack.local().read_events(&domain.uid)?.len();
    let summary = Summary {
        nodes,
        compute_domain: domain.clone(),
        formed_ms,
        killed,
        heal_ms,
        status_ms,
        rejoin_ms,
        events,
        rack_dir: rack.spec().root.clone(),
        idle,
        ok: true,
    };
    observer.summary(&summary);
    Ok(summary)
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

fn claim_ref(node: &str) -> ClaimRef {
    ClaimRef {
        uid: claim_uid(node),
        namespace: "default".into(),
        name: format!("demo-domain-{node}"),
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

fn print_rack_line(rack: &LocalRack, domain: &DemoDomain) -> anyhow::Result<()> {
    let line = RackLine {
        compute_domain: domain.clone(),
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
struct Interrupts {
    int: tokio::signal::unix::Signal,
    term: tokio::signal::unix::Signal,
}

impl Interrupts {
    fn new() -> anyhow::Result<Self> {
        Ok(Self {
            int: signal(SignalKind::interrupt()).context("cannot handle SIGINT")?,
            term: signal(SignalKind::terminate()).context("cannot handle SIGTERM")?,
        })
    }

    async fn next(&mut self) -> &'static str {
        tokio::select! {
            _ = self.int.recv() => "SIGINT",
            _ = self.term.recv() => "SIGTERM",
        }
    }
}

impl Snapshot {
    /// Status Ready with `nodes` ready nodes, and every node sees all of them.
    fn ready(&self, nodes: usize) -> bool {
        let status_ready = self
            .status
            .as_ref()
            .is_some_and(|s| s.status == crd::Phase::Ready && s.ready_nodes as usize == nodes);
        let views_agree = self.views.iter().all(|(_, view)| {
            view.as_ref().is_some_and(|v| {
                v.domains
                    .first()
                    .is_some_and(|d| d.phase == Phase::Ready && d.members.len() == nodes)
            })
        });
        status_ready && views_agree
    }

    /// Every survivor dropped `node` from its IMEX peers.
    fn survivors_dropped(&self, node: &str) -> bool {
        self.views
            .iter()
            .filter(|(name, _)| name != node)
            .all(|(_, view)| {
                view.as_ref().is_some_and(|v| {
                    v.domains
                        .first()
                        .is_some_and(|d| !d.peers.values().any(|p| p == node))
                })
            })
    }

    /// The status is NotReady and lists `node` NotReady.
    fn status_lists_lost(&self, node: &str) -> bool {
        self.status.as_ref().is_some_and(|s| {
            s.status == crd::Phase::NotReady
                && s.nodes
                    .iter()
                    .any(|n| n.name == node && n.status == crd::Phase::NotReady)
        })
    }
}
