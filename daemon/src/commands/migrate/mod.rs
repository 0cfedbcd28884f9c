//! `domaind migrate --check`: what a cluster running NVIDIA's ComputeDomain stack holds
//! that matters to a switch to domaind, and what to do about each (`findings`, pure),
//! from the objects the API server lists (`cluster`, the adapter). It changes nothing.

mod cluster;
mod findings;

use clap::{Args, ValueEnum};

#[derive(Debug, Args)]
pub struct MigrateArgs {
    /// Inspect the cluster and report; the only mode (the switch itself is done by hand,
    /// docs/OPERATIONS.md, "Moving over from NVIDIA's driver").
    #[arg(long, required = true)]
    pub check: bool,
    /// `text` for people, `json` for scripts (one object: driver, compute_domains,
    /// blocked, findings[] with kind, object, found, action, blocks).
    #[arg(long, value_enum, default_value_t = Output::Text)]
    pub output: Output,
    /// The DRA driver name both drivers register.
    #[arg(long, default_value = domaind_kube_api::names::DEFAULT_DRIVER_NAME)]
    pub driver_name: String,
    /// How long each list may take.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub timeout: std::time::Duration,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Output {
    Text,
    Json,
}

/// Exit codes: 0 nothing blocks the switch, 1 something does, 2 the cluster could not be
/// inspected.
pub fn run(args: MigrateArgs) -> ! {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("cannot build the tokio runtime");
    let inventory = match runtime.block_on(cluster::inventory(&args.driver_name, args.timeout)) {
        Ok(inventory) => inventory,
        Err(error) => {
            eprintln!("domaind migrate: cannot inspect the cluster: {error:#}");
            std::process::exit(2);
        }
    };
    let report = findings::inspect(&inventory, &args.driver_name);
    match args.output {
        Output::Text => print!("{}", findings::render_text(&report)),
        Output::Json => println!(
            "{}",
            serde_json::to_string_pretty(&report).expect("a report serialises")
        ),
    }
    std::process::exit(if report.blocked { 1 } else { 0 })
}
