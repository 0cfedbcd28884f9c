//! The node daemon's side of the runner's socket.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use http_body_util::{BodyExt as _, Full};
use hyper_util::rt::TokioIo;
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::net::UnixStream;

use super::{Instance, RunnerSignal, SignalRequest, StartRequest, StopRequest, WaitRequest};
use crate::keeper::{ImexKeeper, KeeperError};

/// How long a request other than a wait or a stop may take.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(10);
/// Added to a wait's or a stop's own bound for the exchange around it.
const EXCHANGE_MARGIN: Duration = Duration::from_secs(5);

/// Why a request to the runner gave no answer.
#[derive(Debug, thiserror::Error)]
pub enum RunnerError {
    #[error("the IMEX runner at {socket} cannot be reached: {source}")]
    Unreachable {
        socket: PathBuf,
        source: std::io::Error,
    },
    #[error("the IMEX runner at {socket} did not answer within {limit:?}")]
    Timeout { socket: PathBuf, limit: Duration },
    /// The runner answered with an error status; `conflict` when an instance already
    /// runs on the config.
    #[error("the IMEX runner refused: {message} ({status})")]
    Refused { status: u16, message: String },
    #[error("the IMEX runner's answer makes no sense: {0}")]
    Protocol(String),
}

impl RunnerError {
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Refused { status: 409, .. })
    }

    pub fn is_unreachable(&self) -> bool {
        matches!(self, Self::Unreachable { .. })
    }

    pub fn is_unknown_instance(&self) -> bool {
        matches!(self, Self::Refused { status: 404, .. })
    }
}

#[derive(Debug, Clone)]
pub struct RunnerClient {
    socket: PathBuf,
}

impl RunnerClient {
    pub fn new(socket: impl Into<PathBuf>) -> Self {
        Self {
            socket: socket.into(),
        }
    }

    pub fn socket(&self) -> &Path {
        &self.socket
    }

    pub async fn instances(&self) -> Result<Vec<Instance>, RunnerError> {
        self.call("GET", "/v1/instances", None::<&()>, REQUEST_TIMEOUT)
            .await
    }

    pub async fn start(&self, request: &StartRequest) -> Result<Instance, RunnerError> {
        self.call("POST", "/v1/start", Some(request), REQUEST_TIMEOUT)
            .await
    }

    pub async fn signal(
        &self,
        config: &Path,
        instance: u64,
        signal: RunnerSignal,
    ) -> Result<(), RunnerError> {
        let request = SignalRequest {
            config: config.to_path_buf(),
            instance,
            signal,
        };
        self.call("POST", "/v1/signal", Some(&request), REQUEST_TIMEOUT)
            .await
    }

    /// SIGTERM, `limit`, then SIGKILL: the instance as it ended.
    pub async fn stop(
        &self,
        config: &Path,
        instance: u64,
        limit: Duration,
    ) -> Result<Instance, RunnerError> {
        let request = StopRequest {
            config: config.to_path_buf(),
            instance,
            timeout_ms: millis(limit),
        };
        // The runner waits up to `limit` twice (after SIGTERM, after SIGKILL).
        let bound = limit * 2 + EXCHANGE_MARGIN;
        self.call("POST", "/v1/stop", Some(&request), bound).await
    }

    /// The instance once it has ended, or as it is after `limit`.
    pub async fn wait(
        &self,
        config: &Path,
        instance: u64,
        limit: Duration,
    ) -> Result<Instance, RunnerError> {
        let request = WaitRequest {
            config: config.to_path_buf(),
            instance,
            timeout_ms: millis(limit),
        };
        self.call("POST", "/v1/wait", Some(&request), limit + EXCHANGE_MARGIN)
            .await
    }

    async fn call<B: Serialize, T: DeserializeOwned>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
        limit: Duration,
    ) -> Result<T, RunnerError> {
        let exchange = self.exchange(method, path, body);
        let (status, body) =
            tokio::time::timeout(limit, exchange)
                .await
                .map_err(|_| RunnerError::Timeout {
                    socket: self.socket.clone(),
                    limit,
                })??;
        if !(200..300).contains(&status) {
            return Err(RunnerError::Refused {
                status,
                message: String::from_utf8_lossy(&body).into_owned(),
            });
        }
        serde_json::from_slice(&body).map_err(|e| RunnerError::Protocol(e.to_string()))
    }

    async fn exchange<B: Serialize>(
        &self,
        method: &str,
        path: &str,
        body: Option<&B>,
    ) -> Result<(u16, Bytes), RunnerError> {
        let unreachable = |source| RunnerError::Unreachable {
            socket: self.socket.clone(),
            source,
        };
        let stream = UnixStream::connect(&self.socket)
            .await
            .map_err(unreachable)?;
        let (mut sender, connection) = hyper::client::conn::http1::handshake(TokioIo::new(stream))
            .await
            .map_err(|e| unreachable(std::io::Error::other(e)))?;
        tokio::spawn(connection);
        let payload = match body {
            Some(body) => {
                serde_json::to_vec(body).map_err(|e| RunnerError::Protocol(e.to_string()))?
            }
            None => Vec::new(),
        };
        let request = hyper::Request::builder()
            .method(method)
            .uri(path)
            .header(hyper::header::HOST, "imex-runner")
            .header(hyper::header::CONTENT_TYPE, "application/json")
            .body(Full::new(Bytes::from(payload)))
            .map_err(|e| RunnerError::Protocol(e.to_string()))?;
        let response = sender
            .send_request(request)
            .await
            .map_err(|e| unreachable(std::io::Error::other(e)))?;
        let status = response.status().as_u16();
        let body = response
            .into_body()
            .collect()
            .await
            .map_err(|e| unreachable(std::io::Error::other(e)))?
            .to_bytes();
        Ok((status, body))
    }
}

fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis()).unwrap_or(u64::MAX)
}

impl From<RunnerError> for KeeperError {
    /// A runner that cannot be reached has no daemon of ours left (they die with it),
    /// and one that no longer knows the instance has not got it either.
    fn from(error: RunnerError) -> Self {
        if error.is_unreachable() || error.is_unknown_instance() {
            Self::Gone(error.to_string())
        } else {
            Self::Failed(error.to_string())
        }
    }
}

#[async_trait]
impl ImexKeeper for RunnerClient {
    fn describe(&self) -> String {
        format!("the IMEX runner at {}", self.socket.display())
    }

    async fn instances(&self) -> Result<Vec<Instance>, KeeperError> {
        Ok(RunnerClient::instances(self).await?)
    }

    async fn start(&self, request: &StartRequest) -> Result<Instance, KeeperError> {
        Ok(RunnerClient::start(self, request).await?)
    }

    async fn signal(
        &self,
        config: &Path,
        instance: u64,
        signal: RunnerSignal,
    ) -> Result<(), KeeperError> {
        Ok(RunnerClient::signal(self, config, instance, signal).await?)
    }

    async fn stop(
        &self,
        config: &Path,
        instance: u64,
        limit: Duration,
    ) -> Result<Instance, KeeperError> {
        Ok(RunnerClient::stop(self, config, instance, limit).await?)
    }

    async fn wait(
        &self,
        config: &Path,
        instance: u64,
        limit: Duration,
    ) -> Result<Instance, KeeperError> {
        Ok(RunnerClient::wait(self, config, instance, limit).await?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The adapter reports a runner's daemon ended when the runner is gone or has
    /// forgotten the instance, and asks again after any other failure.
    #[test]
    fn a_runner_gone_or_without_the_instance_has_none_of_ours_any_other_error_is_retried() {
        let unreachable = RunnerError::Unreachable {
            socket: "/run/r.sock".into(),
            source: std::io::ErrorKind::ConnectionRefused.into(),
        };
        let unknown = RunnerError::Refused {
            status: 404,
            message: "no instance 3".into(),
        };
        for gone in [unreachable, unknown] {
            let text = gone.to_string();
            let error = KeeperError::from(gone);
            assert!(error.is_gone(), "{error}");
            assert_eq!(error.to_string(), text);
        }
        let retried = [
            RunnerError::Refused {
                status: 409,
                message: "runs".into(),
            },
            RunnerError::Timeout {
                socket: "/run/r.sock".into(),
                limit: Duration::from_secs(1),
            },
            RunnerError::Protocol("bad JSON".into()),
        ];
        for error in retried {
            assert!(!KeeperError::from(error).is_gone());
        }
    }
}
