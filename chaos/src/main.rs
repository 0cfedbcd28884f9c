//! `domaind-chaos run`: see `domaind-chaos run --help` and the book's docs/src/chaos.md.

use std::process::ExitCode;

use clap::Parser as _;
use domaind_chaos::cli::{Cli, Command, RunArgs};
use domaind_chaos::cluster::AccessChoice;
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Run(args) if args.cluster => return cluster(*args),
        Command::Run(args) => *args,
        Command::Forge(args) => return forge(args),
        Command::Judge(args) => return judge(&args),
    };
    let config = match args.config() {
        Ok(config) => config,
        Err(error) => return failed(&error),
    };
    let Some(runtime) = runtime(tokio::runtime::Builder::new_multi_thread().worker_threads(2))
    else {
        return ExitCode::from(2);
    };
    // On a signal the run is dropped where it stands: dropping it removes the network
    // faults, kills every daemon and removes the rack's files.
    let outcome = runtime.block_on(until_interrupted(domaind_chaos::harness::run(config)));
    runtime.shutdown_background();
    match outcome {
        Ok(Some(report)) => conclude(&report.table(), &report, report.ok, args.json.as_deref()),
        Ok(None) => {
            eprintln!("domaind-chaos: interrupted; the rack and its network faults are gone");
            ExitCode::from(130)
        }
        Err(error) => failed(&error),
    }
}

/// `run --cluster`: the same exit codes as a loopback run. The first SIGINT or SIGTERM
/// stops the faults and lets the run clean up as at its end (the workload deleted, its
/// claims released, the domain and the namespace deleted, the cordon lifted); a second
/// one drops the run where it stands and only uncordons and deletes the namespace.
fn cluster(args: RunArgs) -> ExitCode {
    let config = match args.cluster_config() {
        Ok(config) => config,
        Err(error) => return failed(&error),
    };
    let Some(runtime) = runtime(tokio::runtime::Builder::new_multi_thread().worker_threads(2))
    else {
        return ExitCode::from(2);
    };
    let namespace = config.namespace.clone();
    let controller_dies_with_us = matches!(config.access, AccessChoice::Local { .. });
    let outcome = runtime.block_on(async {
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            anyhow::bail!("cannot handle SIGINT and SIGTERM");
        };
        let stop = CancellationToken::new();
        let run = domaind_chaos::cluster::run(config, stop.clone());
        tokio::pin!(run);
        tokio::select! {
            outcome = &mut run => return outcome,
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        eprintln!(
            "domaind-chaos: interrupted; no more faults, cleaning up what the run made \
             (interrupt again to stop at once)"
        );
        stop.cancel();
        tokio::select! {
            outcome = &mut run => return outcome,
            _ = interrupt.recv() => {}
            _ = terminate.recv() => {}
        }
        eprintln!("domaind-chaos: stopped; uncordoning and deleting namespace {namespace}");
        if let Err(error) =
            domaind_chaos::cluster::cleanup_after_interrupt(&namespace, controller_dies_with_us)
                .await
        {
            eprintln!("domaind-chaos: clean-up failed: {error:#}");
        }
        Ok(None)
    });
    runtime.shutdown_background();
    match outcome {
        Ok(Some(report)) if report.interrupted => {
            print!("{}", report.table());
            ExitCode::from(130)
        }
        Ok(Some(report)) => conclude(&report.table(), &report, report.ok, args.json.as_deref()),
        // A dry run (the plan is printed), or a run stopped at once.
        Ok(None) if args.dry_run => ExitCode::SUCCESS,
        Ok(None) => ExitCode::from(130),
        Err(error) => failed(&error),
    }
}

/// `work`'s outcome, or `None` once SIGINT or SIGTERM came first (`work` is dropped).
async fn until_interrupted<T>(
    work: impl std::future::Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<Option<T>> {
    let (Ok(mut interrupt), Ok(mut terminate)) = (
        signal(SignalKind::interrupt()),
        signal(SignalKind::terminate()),
    ) else {
        anyhow::bail!("cannot handle SIGINT and SIGTERM");
    };
    tokio::select! {
        outcome = work => outcome.map(Some),
        _ = interrupt.recv() => Ok(None),
        _ = terminate.recv() => Ok(None),
    }
}

/// The harness could not run: exit code 2.
fn failed(error: &anyhow::Error) -> ExitCode {
    eprintln!("domaind-chaos: {error:#}");
    ExitCode::from(2)
}

/// Prints the table, writes the JSON where asked, and says how the run ended.
fn conclude(
    table: &str,
    report: &impl serde::Serialize,
    ok: bool,
    json: Option<&std::path::Path>,
) -> ExitCode {
    print!("{table}");
    if let Some(path) = json {
        let written = serde_json::to_vec_pretty(report)
            .map_err(anyhow::Error::from)
            .and_then(|json| std::fs::write(path, json).map_err(anyhow::Error::from));
        if let Err(error) = written {
            eprintln!("domaind-chaos: cannot write {}: {error:#}", path.display());
            return ExitCode::from(2);
        }
    }
    if ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}

fn forge(args: domaind_chaos::cli::ForgeArgs) -> ExitCode {
    let Some(runtime) = runtime(&mut tokio::runtime::Builder::new_current_thread()) else {
        return ExitCode::from(2);
    };
    let outcome = runtime.block_on(async {
        let nodes = domaind_chaos::forge::rack_nodes(&args.rack)?;
        let clique = args
            .clique
            .clone()
            .unwrap_or_else(|| domaind_gpu::Topology::simulated_clique(1).0);
        let ip = match args.ip {
            Some(ip) => ip,
            None => match nodes[0].gossip_addr.ip() {
                std::net::IpAddr::V4(v4) => {
                    let [a, b, c, _] = v4.octets();
                    std::net::IpAddr::from([a, b, c, 250])
                }
                other => other,
            },
        };
        let cluster = domaind_gossip::cluster_id_for_clique(&clique);
        domaind_chaos::forge::forge_rack(&args.rack, &cluster, ip).await
    });
    match outcome {
        Ok(report) => {
            print!("{}", report.table());
            for problem in &report.problems {
                println!("PROBLEM: {problem}");
            }
            if report.ok() {
                println!(
                    "the rack held: every forgery refused and counted, no view changed, every node healthy"
                );
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            }
        }
        Err(error) => {
            eprintln!("domaind-chaos: {error:#}");
            ExitCode::from(2)
        }
    }
}

fn runtime(builder: &mut tokio::runtime::Builder) -> Option<tokio::runtime::Runtime> {
    builder
        .enable_all()
        .build()
        .inspect_err(|error| eprintln!("domaind-chaos: cannot start the runtime: {error}"))
        .ok()
}

/// `domaind-chaos judge`: a soak's samples judged again.
fn judge(args: &domaind_chaos::cli::JudgeArgs) -> ExitCode {
    use domaind_chaos::soak::{Samples, SoakReport};
    let samples = match std::fs::read_to_string(&args.samples)
        .map_err(|e| e.to_string())
        .and_then(|text| Samples::from_csv(&text))
    {
        Ok(samples) => samples,
        Err(error) => {
            eprintln!("domaind-chaos: {}: {error}", args.samples.display());
            return ExitCode::from(2);
        }
    };
    let report = SoakReport::new(&samples, args.every, args.warmup, args.min_span);
    print!("{}", report.table());
    if let Some(path) = &args.json {
        let written = serde_json::to_vec_pretty(&report)
            .map_err(|e| e.to_string())
            .and_then(|json| std::fs::write(path, json).map_err(|e| e.to_string()));
        if let Err(error) = written {
            eprintln!("domaind-chaos: cannot write {}: {error}", path.display());
            return ExitCode::from(2);
        }
    }
    if report.ok() {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
