//! `domaind bench`: figures measured on real daemons, printed for docs/BENCHMARKS.md
//! with the command that produced them. Never asserted by a test: a test only runs a
//! bench tiny, so that it keeps working.

mod demo;
mod latency;
mod prepare;

use clap::Subcommand;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// Prepare latency on a ready domain, through a node's real DRA socket.
    ///
    /// Starts a rack of `domaind run` processes on loopback (the demo's: certificates,
    /// the IMEX simulator, fake GB200 GPUs, the local backend), forms a ComputeDomain,
    /// and prepares --held claims on node-01 (not timed). Then, as the kubelet does,
    /// over one gRPC channel kept open: --samples new claims prepared one after the
    /// other, each unprepared again so the held count stays constant; and --rounds
    /// rounds of --concurrent new claims prepared at once, each a call of its own,
    /// then unprepared at once. Prints p50, p90, p99 and max per case. Everything it
    /// started and wrote is removed at the end, on Ctrl-C too.
    Prepare(prepare::PrepareBenchArgs),
    /// The demo's scenario (`domaind demo`: form, daemon kill, node kill, rejoin) run
    /// --runs times, each a fresh rack; prints p50, p90, p99 and max of each figure
    /// over the runs, with the load average before them. Stops at the first failed run.
    Demo(demo::DemoBenchArgs),
}

pub fn run(command: BenchCommand) -> anyhow::Result<()> {
    match command {
        BenchCommand::Prepare(args) => prepare::run(args),
        BenchCommand::Demo(args) => demo::run(args),
    }
}
