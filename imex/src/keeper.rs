//! Whoever keeps IMEX alive outside this process, so that it outlives `domaind run`:
//! the IMEX runner ([`super::runner::RunnerClient`]) or the host's systemd unit
//! ([`super::host_service::HostService`]). The adapter ([`super::daemon`]) starts,
//! signals, stops and follows the daemon through this trait alone, and a restarted
//! adapter finds the running instance through it to adopt it.

use std::path::Path;
use std::time::Duration;

use async_trait::async_trait;

use super::runner::{Instance, RunnerSignal, StartRequest};

/// Why a keeper gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum KeeperError {
    /// The instance is gone, and with it any daemon of ours: the runner cannot be
    /// reached (its daemons die with it) or no longer knows the instance, or the unit's
    /// main process is another one now. Asking again will not bring it back.
    #[error("{0}")]
    Gone(String),
    /// No answer this time (a refusal, a timeout, a tool that failed): ask again.
    #[error("{0}")]
    Failed(String),
    /// The keeper cannot run IMEX as domaind configures it (a unit not installed, of
    /// the wrong type, on another config): asking again gets the same answer until a
    /// person changes it.
    #[error("{0}")]
    Misconfigured(String),
}

impl KeeperError {
    pub fn is_gone(&self) -> bool {
        matches!(self, Self::Gone(_))
    }

    pub fn is_misconfigured(&self) -> bool {
        matches!(self, Self::Misconfigured(_))
    }
}

/// What the adapter needs from whoever keeps IMEX alive outside this process. One
/// daemon per config (`-c` path): `config` names it, `instance` tells one start from
/// the next.
#[async_trait]
pub trait ImexKeeper: std::fmt::Debug + Send + Sync {
    /// Who this is, for logs and errors: "the IMEX runner at PATH", "systemd unit U".
    fn describe(&self) -> String;

    /// The instances it knows: running, or the last ended on a config.
    async fn instances(&self) -> Result<Vec<Instance>, KeeperError>;

    /// Starts a daemon on `request.config`, which none runs on.
    async fn start(&self, request: &StartRequest) -> Result<Instance, KeeperError>;

    /// Sends `signal` to the instance's daemon.
    async fn signal(
        &self,
        config: &Path,
        instance: u64,
        signal: RunnerSignal,
    ) -> Result<(), KeeperError>;

    /// SIGTERM, `limit`, then SIGKILL: the instance as it ended.
    async fn stop(
        &self,
        config: &Path,
        instance: u64,
        limit: Duration,
    ) -> Result<Instance, KeeperError>;

    /// The instance once it has ended, or as it is after `limit`.
    async fn wait(
        &self,
        config: &Path,
        instance: u64,
        limit: Duration,
    ) -> Result<Instance, KeeperError>;
}
