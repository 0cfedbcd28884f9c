//! `domaind`: ComputeDomains for NVIDIA multi-node NVLink racks, formed peer to peer.

mod bench;
mod cli;
mod commands;
mod demo;
mod logging;
#[cfg(test)]
mod reference;

use std::process::ExitCode;

use clap::Parser;

// Every command of the binary, the node daemon's included (see domaind_heap).
#[global_allocator]
static ALLOCATOR: domaind_heap::Allocator = domaind_heap::Allocator {};

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
    // The simulator has its own command line and logs, as the imex-sim binary does.
    if let cli::Command::ImexSim { args } = &cli.command {
        return domaind_testbed::imex_sim::cli::main(args);
    }
    // Nothing but the guard itself: it becomes the IMEX daemon.
    if let cli::Command::ImexGuard { args } = &cli.command {
        return domaind_imex::guard::main(args);
    }
    logging::init(&cli.logging);
    // Once, before any TLS is configured: ring is the only provider compiled in.
    domaind_gossip::tls::crypto_provider();
    match commands::run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("domaind: error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
