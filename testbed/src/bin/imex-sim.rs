//! `imex-sim`: a test double of `nvidia-imex` (the daemon) and `nvidia-imex-ctl` (the
//! query tool), for machines without NVLink. See `domaind_testbed::imex_sim` and
//! `domaind_testbed::imex_sim::cli`.
//!
//! It also runs the guard the IMEX adapter starts the daemon through
//! (`imex-sim imex-guard ...`, as `domaind imex-guard ...`), so that the adapter's
//! tests, which have this binary and not `domaind`, start daemons as `domaind run`
//! does; and the IMEX runner (`imex-sim imex-runner --socket PATH`, as `domaind
//! imex-runner`), so that those tests can keep a daemon past its adapter.

use std::process::ExitCode;

use domaind_imex::{guard, runner};

fn main() -> ExitCode {
    let args: Vec<std::ffi::OsString> = std::env::args_os().skip(1).collect();
    if args.first().is_some_and(|a| a == guard::SUBCOMMAND) {
        return guard::main(&args[1..]);
    }
    if args.first().is_some_and(|a| a == runner::RUNNER_SUBCOMMAND) {
        return runner::main(&args[1..]);
    }
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.to_string_lossy().into_owned())
        .collect();
    domaind_testbed::imex_sim::cli::main(&args)
}
