//! `domaind-chaos run`: see `domaind-chaos run --help` and the README's "Chaos harness".

use std::process::ExitCode;

use clap::Parser as _;
use domaind_chaos::cli::{Cli, Command};
use tokio::signal::unix::{SignalKind, signal};

fn main() -> ExitCode {
    let cli = Cli::parse();
    let Command::Run(args) = cli.command;
    let config = match args.config() {
        Ok(config) => config,
        Err(error) => {
            eprintln!("domaind-chaos: {error:#}");
            return ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("domaind-chaos: cannot start the runtime: {error}");
            return ExitCode::from(2);
        }
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
    print!("{}", report.table());
    if let Some(path) = &args.json {
        let written = serde_json::to_vec_pretty(&report)
            .map_err(anyhow::Error::from)
            .and_then(|json| std::fs::write(path, json).map_err(anyhow::Error::from));
        if let Err(error) = written {
            eprintln!("domaind-chaos: cannot write {}: {error:#}", path.display());
            return ExitCode::from(2);
        }
    }
    if report.ok {
        ExitCode::SUCCESS
    } else {
        ExitCode::from(1)
    }
}
