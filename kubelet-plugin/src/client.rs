//! A client that speaks to a DRA kubelet plugin as the kubelet does: registration on the
//! plugin's `-reg.sock`, then prepare and unprepare in either DRA version on the endpoint
//! registration names. For tests, the demo, the chaos harness and `domaind kubelet-sim`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use domaind_actors::model::ClaimRef;
use domaind_kubelet_api::dra::{v1, v1beta1};
use domaind_kubelet_api::pluginregistration as reg;
use hyper_util::rt::TokioIo;
use tokio::net::UnixStream;
use tonic::transport::{Channel, Endpoint, Uri};

use super::plugin::PreparedDevice;
use super::registration::DRA_PLUGIN_TYPE;
use super::version::DraVersion;

#[derive(Debug, thiserror::Error)]
pub enum ClientError {
    #[error("cannot connect to {}", path.display())]
    Connect {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{method} on {} failed: {} ({:?})", path.display(), status.message(), status.code())]
    Call {
        method: &'static str,
        path: PathBuf,
        status: tonic::Status,
    },
    #[error("the plugin on {} cannot be registered: {reason}", path.display())]
    Refused { path: PathBuf, reason: String },
}

/// What a plugin said of itself at registration, once accepted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Registration {
    pub driver_name: String,
    /// The DRA socket to call.
    pub endpoint: PathBuf,
    /// As offered, e.g. `v1.DRAPlugin`, including any we do not know.
    pub supported_versions: Vec<String>,
    /// The offered versions we speak.
    pub versions: Vec<DraVersion>,
}

impl Registration {
    /// The version the kubelet calls: v1 when offered.
    pub fn preferred_version(&self) -> DraVersion {
        // `DraVersion` is ordered newest first.
        self.versions
            .iter()
            .copied()
            .min()
            .unwrap_or(DraVersion::V1)
    }
}

/// One claim's answer, in the order of the request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClaimAnswer<T> {
    pub claim: ClaimRef,
    /// The result, or the claim's `error` text.
    pub result: Result<T, String>,
}

/// What the kubelet does with a plugin's registration socket: asks who is there, checks
/// that it is a DRA plugin offering a version we speak, and says whether it accepted it.
pub async fn register(registration_socket: &Path) -> Result<Registration, ClientError> {
    let channel = connect_unix(registration_socket).await?;
    let mut client = reg::registration_client::RegistrationClient::new(channel);
    let call_failed = |method| {
        move |status| ClientError::Call {
            method,
            path: registration_socket.to_path_buf(),
            status,
        }
    };
    let info = client
        .get_info(reg::InfoRequest {})
        .await
        .map_err(call_failed("GetInfo"))?
        .into_inner();
    let versions: Vec<DraVersion> = info
        .supported_versions
        .iter()
        .filter_map(|name| DraVersion::from_registration_name(name))
        .collect();
    let problem = if info.r#type != DRA_PLUGIN_TYPE {
        Some(format!(
            "plugin type is {:?}, expected {DRA_PLUGIN_TYPE:?}",
            info.r#type
        ))
    } else if info.name.is_empty() {
        Some("the plugin gives no driver name".to_string())
    } else if info.endpoint.is_empty() {
        Some("the plugin gives no endpoint".to_string())
    } else if versions.is_empty() {
        Some(format!(
            "none of the offered versions {:?} is one we speak (v1.DRAPlugin, v1beta1.DRAPlugin)",
            info.supported_versions
        ))
    } else {
        None
    };
    client
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: problem.is_none(),
            error: problem.clone().unwrap_or_default(),
        })
        .await
        .map_err(call_failed("NotifyRegistrationStatus"))?;
    if let Some(reason) = problem {
        return Err(ClientError::Refused {
            path: registration_socket.to_path_buf(),
            reason,
        });
    }
    Ok(Registration {
        driver_name: info.name,
        endpoint: PathBuf::from(info.endpoint),
        supported_versions: info.supported_versions,
        versions,
    })
}

/// One claim in either version's message (the same fields, in different packages).
macro_rules! claim {
    ($api:ident, $claim:expr) => {
        $api::Claim {
            namespace: $claim.namespace.clone(),
            uid: $claim.uid.clone(),
            name: $claim.name.clone(),
        }
    };
}

/// A connection to a plugin's DRA socket.
#[derive(Debug, Clone)]
pub struct KubeletClient {
    channel: Channel,
    socket: PathBuf,
}

impl KubeletClient {
    pub async fn connect(dra_socket: impl Into<PathBuf>) -> Result<Self, ClientError> {
        let socket = dra_socket.into();
        Ok(Self {
            channel: connect_unix(&socket).await?,
            socket,
        })
    }

    /// The channel, for other services on the same socket (gRPC health).
    pub fn channel(&self) -> Channel {
        self.channel.clone()
    }

    /// NodePrepareResources. A failed call is an error; a failed claim is its answer.
    pub async fn prepare(
        &self,
        claims: &[ClaimRef],
        version: DraVersion,
    ) -> Result<Vec<ClaimAnswer<Vec<PreparedDevice>>>, ClientError> {
        const METHOD: &str = "NodePrepareResources";
        macro_rules! call {
            ($api:ident) => {{
                let request = $api::NodePrepareResourcesRequest {
                    claims: claims.iter().map(|c| claim!($api, c)).collect(),
                };
                let mut client = $api::dra_plugin_client::DraPluginClient::new(self.channel());
                let response = client
                    .node_prepare_resources(request)
                    .await
                    .map_err(|status| self.failed(METHOD, status))?;
                response
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|(uid, entry)| {
                        let result = if entry.error.is_empty() {
                            Ok(entry
                                .devices
                                .into_iter()
                                .map(|d| PreparedDevice {
                                    request_names: d.request_names,
                                    pool_name: d.pool_name,
                                    device_name: d.device_name,
                                    cdi_device_ids: d.cdi_device_ids,
                                })
                                .collect())
                        } else {
                            Err(entry.error)
                        };
                        (uid, result)
                    })
                    .collect::<HashMap<_, _>>()
            }};
        }
        let mut answers = match version {
            DraVersion::V1 => call!(v1),
            DraVersion::V1beta1 => call!(v1beta1),
        };
        Ok(in_request_order(claims, &mut answers))
    }

    /// NodeUnprepareResources. A failed call is an error; a failed claim is its answer.
    pub async fn unprepare(
        &self,
        claims: &[ClaimRef],
        version: DraVersion,
    ) -> Result<Vec<ClaimAnswer<()>>, ClientError> {
        const METHOD: &str = "NodeUnprepareResources";
        macro_rules! call {
            ($api:ident) => {{
                let request = $api::NodeUnprepareResourcesRequest {
                    claims: claims.iter().map(|c| claim!($api, c)).collect(),
                };
                let mut client = $api::dra_plugin_client::DraPluginClient::new(self.channel());
                let response = client
                    .node_unprepare_resources(request)
                    .await
                    .map_err(|status| self.failed(METHOD, status))?;
                response
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|(uid, entry)| {
                        let result = if entry.error.is_empty() {
                            Ok(())
                        } else {
                            Err(entry.error)
                        };
                        (uid, result)
                    })
                    .collect::<HashMap<_, _>>()
            }};
        }
        let mut answers = match version {
            DraVersion::V1 => call!(v1),
            DraVersion::V1beta1 => call!(v1beta1),
        };
        Ok(in_request_order(claims, &mut answers))
    }

    fn failed(&self, method: &'static str, status: tonic::Status) -> ClientError {
        ClientError::Call {
            method,
            path: self.socket.clone(),
            status,
        }
    }
}

/// The kubelet counts a claim without an entry as failed; so do we.
fn in_request_order<T: Clone>(
    claims: &[ClaimRef],
    answers: &mut HashMap<String, Result<T, String>>,
) -> Vec<ClaimAnswer<T>> {
    claims
        .iter()
        .map(|claim| {
            let result = answers.get(&claim.uid).cloned().unwrap_or_else(|| {
                Err("the plugin's response has no entry for this claim".to_string())
            });
            ClaimAnswer {
                claim: claim.clone(),
                result,
            }
        })
        .collect()
}

/// A gRPC channel over a unix socket. The URI is a placeholder tonic requires: the
/// connector ignores it and dials the path.
async fn connect_unix(path: &Path) -> Result<Channel, ClientError> {
    let dial = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let dial = dial.clone();
            async move { UnixStream::connect(dial).await.map(TokioIo::new) }
        }))
        .await
        .map_err(|error| ClientError::Connect {
            path: path.to_path_buf(),
            source: io_cause(&error),
        })
}

/// tonic wraps the dialer's error in layers that each repeat it; the io error at the
/// bottom (no such file, connection refused) is what a person needs.
fn io_cause(error: &tonic::transport::Error) -> std::io::Error {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(current) = cause {
        if let Some(io) = current.downcast_ref::<std::io::Error>() {
            return std::io::Error::new(io.kind(), io.to_string());
        }
        cause = current.source();
    }
    std::io::Error::other(error.to_string())
}
