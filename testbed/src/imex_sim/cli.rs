//! The command line of `imex-sim`, shared by the `imex-sim` binary and the
//! `domaind imex-sim` subcommand (so that the demo needs one binary).
//!
//! ```text
//! imex-sim -c CONFIG                  run the daemon (foreground)
//! imex-sim ctl -c CONFIG -q           print READY or NOT_READY
//! imex-sim ctl -c CONFIG -N [-j]      print the per-node listing (JSON)
//! imex-sim ctl -c CONFIG --crash      make the daemon exit uncleanly
//! imex-sim ctl -c CONFIG --hang       make the daemon stop answering
//! ```

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use super as sim;

const USAGE: &str = "usage: imex-sim [-c CONFIG] | imex-sim ctl [-c CONFIG] (-q | -N [-j] | --crash | --hang) [-t MILLIS]";

/// Runs the simulator's command line: `args` without the program name.
pub fn main(args: &[String]) -> ExitCode {
    let (ctl, args) = match args.first().map(String::as_str) {
        Some("ctl") => (true, &args[1..]),
        _ => (false, args),
    };
    let mut config = PathBuf::from("/etc/nvidia-imex/config.cfg");
    let mut command = None;
    let mut wait = Duration::from_secs(3);
    let mut i = 0;
    while i < args.len() {
        match args[i].as_str() {
            "-c" if i + 1 < args.len() => {
                config = PathBuf::from(&args[i + 1]);
                i += 1;
            }
            "-t" if i + 1 < args.len() => {
                let Ok(ms) = args[i + 1].parse() else {
                    eprintln!("imex-sim: -t takes milliseconds\n{USAGE}");
                    return ExitCode::from(2);
                };
                wait = Duration::from_millis(ms);
                i += 1;
            }
            "-q" if ctl => command = Some("q"),
            "-N" if ctl => command = Some("N"),
            "-j" if ctl => {}
            "--crash" if ctl => command = Some("crash"),
            "--hang" if ctl => command = Some("hang"),
            "-h" | "--help" => {
                println!("{USAGE}");
                return ExitCode::SUCCESS;
            }
            other => {
                eprintln!("imex-sim: unexpected argument {other:?}\n{USAGE}");
                return ExitCode::from(2);
            }
        }
        i += 1;
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("imex-sim: cannot start: {error}");
            return ExitCode::FAILURE;
        }
    };
    let result = if ctl {
        let Some(command) = command else {
            eprintln!("imex-sim: ctl needs -q, -N, --crash or --hang\n{USAGE}");
            return ExitCode::from(2);
        };
        runtime
            .block_on(sim::run_ctl(&config, command, wait))
            .map(|reply| print!("{reply}"))
    } else {
        runtime.block_on(sim::run_daemon(&config))
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("imex-sim: {error}");
            ExitCode::FAILURE
        }
    }
}
