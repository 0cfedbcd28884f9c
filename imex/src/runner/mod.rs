//! The IMEX runner: a small process that keeps the node's IMEX daemons running while
//! `domaind run` comes and goes.
//!
//! IMEX must outlive the node daemon: a new IMEX instance makes its peers clean up
//! every import of the node's memory, and that fails the jobs that span it. So in
//! runner mode (`domaind run --imex-runner SOCKET`) the daemon does not start IMEX
//! itself: it asks the runner (`domaind imex-runner --socket SOCKET`), a process
//! that is rarely updated and, in a cluster, runs in a DaemonSet of its own
//! (`updateStrategy: OnDelete`), reached over a unix socket in a host directory. A
//! restarted `domaind run` finds the instance on its config and adopts it: the same
//! process, the same instance ([`super::daemon`]).
//!
//! The runner owns the daemons it starts: it reaps them, signals them, stops them and
//! keeps their last lines of output, and they die with it (through the guard,
//! [`super::guard`]): a runner that is restarted restarts IMEX, which is why it does
//! as little as it can and changes rarely.
//!
//! The protocol is HTTP/1.1 with JSON bodies over the socket, one request a
//! connection:
//! - `GET /v1/instances`: every instance, running or the last ended on its config;
//! - `POST /v1/start` ([`StartRequest`]): starts one on a config none runs on (409
//!   otherwise);
//! - `POST /v1/signal` ([`SignalRequest`]): SIGUSR1 (reload), SIGTERM or SIGKILL;
//! - `POST /v1/stop` ([`StopRequest`]): SIGTERM, then SIGKILL after the timeout;
//! - `POST /v1/wait` ([`WaitRequest`]): answers when the instance has ended, or when
//!   the timeout has passed.
//!
//! The socket's directory is root's alone (0700): whoever can connect can start a
//! program as root, which only root could do anyway.

mod client;
mod server;

pub use client::{RunnerClient, RunnerError};
pub use server::{RUNNER_SUBCOMMAND, serve};

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// One IMEX daemon the runner started.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Instance {
    /// The config it runs on (`-c`): the key, one daemon per config.
    pub config: PathBuf,
    /// Which start of the runner's this was: a new instance, a new number.
    pub instance: u64,
    pub pid: Option<u32>,
    pub program: PathBuf,
    /// What its starter said it was started with (the config files' contents): how a
    /// restarted node daemon tells whether the instance serves the config it would
    /// write now.
    pub served: String,
    /// How it ended, once it has.
    pub ended: Option<String>,
    /// Its last lines of output.
    pub last_output: Vec<String>,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StartRequest {
    pub config: PathBuf,
    pub program: PathBuf,
    /// Arguments before `-c CONFIG`, which the runner appends.
    pub args: Vec<String>,
    pub env: Vec<(String, String)>,
    pub served: String,
}

/// The signals a starter may send: a reload, a stop, a kill.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum RunnerSignal {
    Usr1,
    Term,
    Kill,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct SignalRequest {
    pub config: PathBuf,
    pub instance: u64,
    pub signal: RunnerSignal,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StopRequest {
    pub config: PathBuf,
    pub instance: u64,
    pub timeout_ms: u64,
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct WaitRequest {
    pub config: PathBuf,
    pub instance: u64,
    pub timeout_ms: u64,
}

const USAGE: &str = "usage: imex-runner --socket PATH";

/// The runner's command line (`args` after the subcommand), for binaries without
/// clap's: runs until SIGTERM or SIGINT.
pub fn main(args: &[std::ffi::OsString]) -> std::process::ExitCode {
    let socket = match args {
        [flag, path] if flag == "--socket" => PathBuf::from(path),
        _ => {
            eprintln!("imex-runner: {USAGE}");
            return std::process::ExitCode::from(2);
        }
    };
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("imex-runner: cannot start: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&socket)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("imex-runner: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Serves `socket` until SIGTERM or SIGINT; the daemons it starts die with it (through
/// this binary's `imex-guard`).
pub async fn run(socket: &std::path::Path) -> anyhow::Result<()> {
    use anyhow::Context as _;
    use tokio::signal::unix::{SignalKind, signal};
    let exe = std::env::current_exe().context("cannot find this binary")?;
    let guard = super::Command::new(exe).arg(super::guard::SUBCOMMAND);
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    let shutdown = async move {
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
    };
    serve(socket, Some(guard), shutdown).await
}
