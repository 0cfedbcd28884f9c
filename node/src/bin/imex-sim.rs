//! `imex-sim`: a test double of `nvidia-imex` (the daemon) and `nvidia-imex-ctl` (the
//! query tool), for machines without NVLink. See `domaind_node::imex::sim` and
//! `domaind_node::imex::sim_cli`.

use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    domaind_node::imex::sim_cli::main(&args)
}
