//! `domaind`: ComputeDomains for NVIDIA multi-node NVLink racks, formed peer to peer.

mod cli;
mod commands;
mod logging;

use std::process::ExitCode;

use clap::Parser;

fn main() -> ExitCode {
    let cli = cli::Cli::parse();
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
