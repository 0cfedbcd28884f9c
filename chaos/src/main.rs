//! `domaind-chaos run`: see `domaind-chaos run --help` and the README's "Chaos harness".

use std::process::ExitCode;

use clap::Parser as _;
use domaind_chaos::cli::{Cli, Command, RunArgs};
use tokio::signal::unix::{SignalKind, signal};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let args = match cli.command {
        Command::Run(args) if args.cluster => return cluster(*args),
        Command::Run(args) => *args,
        Command::Forge(args) => return forge(args),
    };
    let config = match args.config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("domaind-chaos: {error:#}");
            return ExitCode::from(2);
        }
    };
    let Some(runtime) = runtime(tokio::runtime::Builder::new_multi_thread().worker_threads(2))
    else {
        return ExitCode::from(2);
    };
    let outcome = runtime.block_on(async {
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return Err(anyhow::anyhow!("cannot handle SIGINT and SIGTERM"));
        };
        // On a signal the run is dropped where it stands: dropping it removes the
        // network faults, kills every daemon and removes the rack's files.
        tokio::select! {
            report = domaind_chaos::harness::run(config) => report.map(Some),
            _ = interrupt.recv() => Ok(None),
            _ = terminate.recv() => Ok(None),
        }
    });
    runtime.shutdown_background();
    let report = match outcome {
        Ok(Some(report)) => report,
        Ok(None) => {
            eprintln!("domaind-chaos: interrupted; the rack and its network faults are gone");
            return ExitCode::from(130);
        }
        Err(error) => {
            eprintln!("domaind-chaos: {error:#}");
            return ExitCode::from(2);
        }
    };
    conclude(&report.table(), &report, report.ok, args.json.as_deref())
}

/// `run --cluster`: the same exit codes as a loopback run.
fn cluster(args: RunArgs) -> ExitCode {
    let config = match args.cluster_config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("domaind-chaos: {error:#}");
            return ExitCode::from(2);
        }
    };
    let Some(runtime) = runtime(tokio::runtime::Builder::new_multi_thread().worker_threads(2))
    else {
        return ExitCode::from(2);
    };
    let namespace = config.namespace.clone();
    let dry_run = config.dry_run;
    let outcome = runtime.block_on(async {
        let (Ok(mut interrupt), Ok(mut terminate)) = (
            signal(SignalKind::interrupt()),
            signal(SignalKind::terminate()),
        ) else {
            return Err(anyhow::anyhow!("cannot handle SIGINT and SIGTERM"));
        };
        let interrupted = tokio::select! {
            report = domaind_chaos::cluster::run(config) => return report.map(Some),
            _ = interrupt.recv() => true,
            _ = terminate.recv() => true,
        };
        // The run is dropped where it stands (a local run's daemons die with it); what
        // it made on the cluster must not stay: a cordoned node above all.
        if interrupted && !dry_run {
            eprintln!("domaind-chaos: interrupted; uncordoning and deleting namespace {namespace}");
            if let Err(error) = domaind_chaos::cluster::cleanup_after_interrupt(&namespace).await {
                eprintln!("domaind-chaos: clean-up failed: {error:#}");
            }
        }
        Ok(None)
    });
    runtime.shutdown_background();
    let report = match outcome {
        Ok(Some(Some(report))) => report,
        Ok(Some(None)) => return ExitCode::SUCCESS,
        Ok(None) => return ExitCode::from(130),
        Err(error) => {
            eprintln!("domaind-chaos: {error:#}");
            return ExitCode::from(2);
        }
    };
    conclude(&report.table(), &report, report.ok, args.json.as_deref())
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
            .unwrap_or_else(|| domaind_node::gpu::Topology::simulated_clique(1).0);
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
