//! `domaind bench prepare`: how long the kubelet waits for NodePrepareResources on a
//! node whose domain is ready, with N claims already held there, one call at a time
//! and many at once. Driven over the node's real DRA socket with the project's tonic
//! kubelet client, on one channel kept open as the kubelet keeps it.

use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use clap::Args;
use domaind_actors::model::{AllocationMode, ClaimRef, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_kubelet_plugin::DraVersion;
use domaind_kubelet_plugin::client::KubeletClient;
use domaind_testbed::rack::{LocalRack, RackSpec, prepare_until_ready, short_temp_dir};
use serde::Serialize;
use tokio::task::JoinSet;

use super::latency::{Latency, table};
use crate::demo::Interrupts;
use crate::demo::busy::{CpuMark, Work};

/// The daemons write run.json within this.
const START_LIMIT: Duration = Duration::from_secs(60);
/// The domain forms within this.
const FORM_LIMIT: Duration = Duration::from_secs(90);
/// One measured call; a slower one fails the bench rather than hang it.
const CALL_LIMIT: Duration = Duration::from_secs(60);
/// How long daemons get to stop gracefully at the end.
const STOP_LIMIT: Duration = Duration::from_secs(20);
/// Held claims are prepared this many at a time (not timed).
const SETUP_BATCH: usize = 50;
const NAMESPACE: &str = "bench";
const DOMAIN: &str = "bench-domain";
/// The node measured: the rack's first.
const MEASURED: usize = 0;

#[derive(Debug, Clone, Args)]
pub struct PrepareBenchArgs {
    /// Claims held prepared on the measured node (node-01) while it is measured, its
    /// share of the domain's formation included; prepared first, not timed.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u32).range(1..=5000))]
    pub held: u32,

    /// Sequential samples: a new claim of the ready domain prepared (timed), then
    /// unprepared (timed), so that the held count stays constant.
    #[arg(long, default_value_t = 200, value_parser = clap::value_parser!(u32).range(1..=10000))]
    pub samples: u32,

    /// New claims prepared at once in each concurrent round, each in a call of its own
    /// on the one channel, then unprepared at once.
    #[arg(long, default_value_t = 100, value_parser = clap::value_parser!(u32).range(1..=1000))]
    pub concurrent: u32,

    /// Concurrent rounds.
    #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u32).range(1..=100))]
    pub rounds: u32,

    /// Nodes in the rack, 1 to 18; the domain spans all of them.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u16).range(1..=18))]
    pub nodes: u16,

    /// The rack's loopback subnet: nodes get 127.0.<subnet>.1, .2, ...
    #[arg(long, default_value_t = domaind_loopback::BENCH_PREPARE)]
    pub subnet: u8,

    /// Print one JSON object instead of the table.
    #[arg(long)]
    pub json: bool,
}

/// What the bench measured; `--json` prints it.
#[derive(Debug, Clone, Serialize)]
pub struct PrepareBench {
    pub nodes: usize,
    pub held: u32,
    pub samples: u32,
    pub concurrent: u32,
    pub rounds: u32,
    /// CPUs this process may use: the daemons share them with the bench.
    pub cpus: usize,
    /// Preparing the held claims, untimed in the cases.
    pub setup_ms: u64,
    pub cases: Vec<Latency>,
    /// The CPU each concurrent call cost, by whom: where the time of a storm goes.
    pub work: Vec<CallWork>,
    /// Where the rack's files were; removed when the bench ends.
    pub rack_dir: std::path::PathBuf,
}

pub fn run(args: PrepareBenchArgs) -> anyhow::Result<()> {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .context("cannot start the runtime")?;
    runtime.block_on(bench(args))
}

async fn bench(args: PrepareBenchArgs) -> anyhow::Result<()> {
    let domaind = std::env::current_exe().context("cannot find the domaind binary")?;
    let tmp = short_temp_dir("domaind-bench").context("cannot make a temporary directory")?;
    let mut spec = RackSpec::self_contained(usize::from(args.nodes), domaind, tmp.path().into());
    spec.subnet = args.subnet;
    spec.extra_args = vec!["--prepare-deadline".into(), "2s".into()];
    let mut rack = LocalRack::create(spec)?;
    let mut interrupts = Interrupts::new()?;
    let outcome = tokio::select! {
        outcome = measure(&mut rack, &args) => outcome,
        signal = interrupts.next() => Err(anyhow::anyhow!("interrupted by {signal}")),
    };
    tokio::task::block_in_place(|| rack.stop_all(STOP_LIMIT));
    let crashed = rack.unexpected_exits();
    drop(rack);
    drop(tmp);
    let report = outcome?;
    if !crashed.is_empty() {
        bail!("daemons died during the bench: {crashed:?}");
    }
    if args.json {
        println!("{}", serde_json::to_string(&report)?);
    } else {
        print!("{}", table(&report.cases));
        for work in &report.work {
            println!("{}", work.line());
        }
    }
    Ok(())
}

fn say(line: &str) {
    eprintln!("==> {line}");
}

async fn measure(rack: &mut LocalRack, args: &PrepareBenchArgs) -> anyhow::Result<PrepareBench> {
    let nodes = rack.nodes().len();
    let domain = ComputeDomainRef {
        namespace: NAMESPACE.into(),
        name: DOMAIN.into(),
        uid: format!("bench-{}", std::process::id()),
        num_nodes: nodes as u32,
        isolation: Default::default(),
    };
    say(&format!(
        "Starting a rack of {nodes} domaind nodes on 127.0.{}.1-{nodes} (imex-sim, fake GB200 GPUs, the local backend in {})",
        args.subnet,
        rack.local().root().display()
    ));
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        rack.start_all()?;
        rack.wait_all_ready(START_LIMIT)?;
        Ok(())
    })?;

    // Every claim of the run is allocated up front: writing files is not the node's
    // time.
    let formation: Vec<ClaimRef> = rack
        .nodes()
        .iter()
        .map(|n| claim(&format!("domain-{}", n.name())))
        .collect();
    let held: Vec<ClaimRef> = (1..args.held)
        .map(|i| claim(&format!("held-{i:05}")))
        .collect();
    let sequential: Vec<ClaimRef> = (0..args.samples)
        .map(|i| claim(&format!("seq-{i:05}")))
        .collect();
    let rounds: Vec<Vec<ClaimRef>> = (0..args.rounds)
        .map(|r| {
            (0..args.concurrent)
                .map(|i| claim(&format!("round-{r}-{i:04}")))
                .collect()
        })
        .collect();
    for claim in formation
        .iter()
        .chain(&held)
        .chain(&sequential)
        .chain(rounds.iter().flatten())
    {
        rack.local().write_claim(&claim_file(claim, &domain))?;
    }

    say(&format!(
        "Forming ComputeDomain {NAMESPACE}/{DOMAIN}: one claim per node"
    ));
    let started = Instant::now();
    let formed =
        futures::future::join_all(rack.nodes().iter().zip(&formation).map(|(node, claim)| {
            let socket = node.dra_socket();
            async move { prepare_until_ready(&socket, claim, DraVersion::V1, FORM_LIMIT).await }
        }))
        .await;
    for (claim, answer) in formation.iter().zip(formed) {
        if let Err(error) = answer? {
            bail!("{} was not prepared: {error}", claim.uid);
        }
    }
    say(&format!(
        "Domain ready in {} ms",
        started.elapsed().as_millis()
    ));

    let measured = rack.node(MEASURED);
    let client = KubeletClient::connect(measured.dra_socket()).await?;
    let started = Instant::now();
    for batch in held.chunks(SETUP_BATCH) {
        at_once(&client, batch, Call::Prepare).await?;
    }
    let setup_ms = started.elapsed().as_millis() as u64;
    say(&format!(
        "{} holds {} claims (prepared in {setup_ms} ms); measuring {} sequential prepares and {} rounds of {} at once",
        measured.name(),
        args.held,
        args.samples,
        args.rounds,
        args.concurrent
    ));

    let (mut prepares, mut unprepares) = (Vec::new(), Vec::new());
    for claim in &sequential {
        prepares.push(timed(&client, claim, Call::Prepare).await?);
        unprepares.push(timed(&client, claim, Call::Unprepare).await?);
    }
    let (mut concurrent_prepares, mut concurrent_unprepares) = (Vec::new(), Vec::new());
    let daemons: Vec<u32> = rack.nodes().iter().filter_map(|n| n.pid()).collect();
    let (mut prepare_work, mut unprepare_work) = (Vec::new(), Vec::new());
    for round in &rounds {
        let mark = CpuMark::now();
        concurrent_prepares.extend(at_once(&client, round, Call::Prepare).await?);
        prepare_work.extend(mark.and_then(|m| m.work_since(&daemons)));
        let mark = CpuMark::now();
        concurrent_unprepares.extend(at_once(&client, round, Call::Unprepare).await?);
        unprepare_work.extend(mark.and_then(|m| m.work_since(&daemons)));
    }
    let calls = rounds.iter().map(Vec::len).sum::<usize>();
    let work = [
        CallWork::of("concurrent prepare", &prepare_work, calls),
        CallWork::of("concurrent unprepare", &unprepare_work, calls),
    ]
    .into_iter()
    .flatten()
    .collect();

    let cases = [
        Latency::of("sequential prepare", &prepares),
        Latency::of("sequential unprepare", &unprepares),
        Latency::of("concurrent prepare", &concurrent_prepares),
        Latency::of("concurrent unprepare", &concurrent_unprepares),
    ]
    .into_iter()
    .flatten()
    .collect();
    Ok(PrepareBench {
        nodes,
        held: args.held,
        samples: args.samples,
        concurrent: args.concurrent,
        rounds: args.rounds,
        cpus: std::thread::available_parallelism().map_or(1, |n| n.get()),
        setup_ms,
        cases,
        work,
        rack_dir: rack.spec().root.clone(),
    })
}

/// CPU per call over the concurrent rounds, in milliseconds of one core.
#[derive(Debug, Clone, Serialize)]
pub struct CallWork {
    pub case: &'static str,
    /// The rack's daemons (the measured node does the work).
    pub daemons_ms: f64,
    /// This process: the kubelet's side of the calls.
    pub client_ms: f64,
    /// Status tools and IMEX daemons.
    pub imex_ms: f64,
    /// Everything else on the machine.
    pub rest_ms: f64,
}

impl CallWork {
    fn of(case: &'static str, rounds: &[Work], calls: usize) -> Option<Self> {
        if rounds.is_empty() || calls == 0 {
            return None;
        }
        let per_call =
            |part: fn(&Work) -> u64| rounds.iter().map(part).sum::<u64>() as f64 / calls as f64;
        Some(Self {
            case,
            daemons_ms: per_call(|w| w.daemons),
            client_ms: per_call(|w| w.demo),
            imex_ms: per_call(|w| w.status_tools + w.imex + w.runners),
            rest_ms: per_call(|w| w.rest),
        })
    }

    fn line(&self) -> String {
        format!(
            "{}: CPU per call {:.2} ms in the daemons, {:.2} ms in the client, {:.2} ms in IMEX and its tools, {:.2} ms elsewhere",
            self.case, self.daemons_ms, self.client_ms, self.imex_ms, self.rest_ms
        )
    }
}

#[derive(Debug, Clone, Copy)]
enum Call {
    Prepare,
    Unprepare,
}

/// One call for one claim, as the kubelet makes it for a pod: how long its answer
/// took. A claim answered with an error fails the bench: a failure's latency is not a
/// prepare's.
async fn timed(client: &KubeletClient, claim: &ClaimRef, call: Call) -> anyhow::Result<Duration> {
    let claims = std::slice::from_ref(claim);
    let started = Instant::now();
    let answered = tokio::time::timeout(CALL_LIMIT, async {
        anyhow::Ok(match call {
            Call::Prepare => client
                .prepare(claims, DraVersion::V1)
                .await?
                .pop()
                .map(|a| a.result.map(drop)),
            Call::Unprepare => client
                .unprepare(claims, DraVersion::V1)
                .await?
                .pop()
                .map(|a| a.result),
        })
    })
    .await
    .with_context(|| format!("{call:?} of {} took over {CALL_LIMIT:?}", claim.uid))??;
    let took = started.elapsed();
    match answered {
        Some(Ok(())) => Ok(took),
        Some(Err(error)) => bail!("{call:?} of {} failed: {error}", claim.uid),
        None => bail!("{call:?} of {}: the plugin answered no claim", claim.uid),
    }
}

/// A call for each of `claims`, all issued at once on clones of the one channel (the
/// kubelet calls for several pods at once the same way): each call's own latency.
async fn at_once(
    client: &KubeletClient,
    claims: &[ClaimRef],
    call: Call,
) -> anyhow::Result<Vec<Duration>> {
    let mut calls = JoinSet::new();
    for claim in claims {
        let (client, claim) = (client.clone(), claim.clone());
        calls.spawn(async move { timed(&client, &claim, call).await });
    }
    let mut took = Vec::with_capacity(claims.len());
    while let Some(answer) = calls.join_next().await {
        took.push(answer.context("a call's task failed")??);
    }
    Ok(took)
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: NAMESPACE.into(),
        name: format!("claim-{uid}"),
    }
}

fn claim_file(claim: &ClaimRef, domain: &ComputeDomainRef) -> ClaimFile {
    ClaimFile {
        namespace: claim.namespace.clone(),
        name: claim.name.clone(),
        uid: claim.uid.clone(),
        compute_domain: domain.clone(),
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
        admin_access: false,
    }
}
