//! The `Registration` service the kubelet's plugin watcher calls on our `-reg.sock`: who
//! we are and where the DRA API is, then whether the kubelet accepted us.

use std::path::Path;

use domaind_kubelet_api::pluginregistration as api;
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::config::DriverName;
use super::gate::CallGate;
use super::version::{DraVersion, HealthVersion};

/// The kubelet's plugin type for DRA drivers.
pub const DRA_PLUGIN_TYPE: &str = "DRAPlugin";
/// Registration notices from the kubelet, by `outcome`: `registered`, `refused`.
pub const REGISTRATIONS_TOTAL: &str = "domaind_kubelet_registrations_total";

/// What the kubelet last told us about our registration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RegistrationState {
    /// The kubelet has not told us yet (it may not have found the socket).
    Pending,
    /// The kubelet accepted the plugin and will call the DRA API.
    Registered,
    /// The kubelet refused the plugin, saying why; it will not call us.
    Refused { error: String },
}

#[derive(Debug)]
pub(crate) struct RegistrationService {
    info: api::PluginInfo,
    state: watch::Sender<RegistrationState>,
    gate: CallGate,
}

impl RegistrationService {
    pub(crate) fn new(driver: &DriverName, dra_socket: &Path, gate: CallGate) -> Self {
        Self {
            info: api::PluginInfo {
                r#type: DRA_PLUGIN_TYPE.to_string(),
                name: driver.to_string(),
                endpoint: dra_socket.to_string_lossy().into_owned(),
                // The DRA versions first: kubelet 1.36 takes the first entry it knows as
                // the DRA service, and skips the health services, which later kubelets
                // call only when offered here.
                supported_versions: DraVersion::ALL
                    .iter()
                    .map(|version| version.registration_name())
                    .chain(HealthVersion::ALL.iter().map(|v| v.service_name()))
                    .map(str::to_string)
                    .collect(),
            },
            state: watch::Sender::new(RegistrationState::Pending),
            gate,
        }
    }

    pub(crate) fn state(&self) -> watch::Receiver<RegistrationState> {
        self.state.subscribe()
    }
}

#[tonic::async_trait]
impl api::registration_server::Registration for RegistrationService {
    async fn get_info(
        &self,
        _request: Request<api::InfoRequest>,
    ) -> Result<Response<api::PluginInfo>, Status> {
        let _admitted = self.gate.enter()?;
        tracing::debug!(endpoint = %self.info.endpoint, "kubelet asked who we are");
        Ok(Response::new(self.info.clone()))
    }

    async fn notify_registration_status(
        &self,
        request: Request<api::RegistrationStatus>,
    ) -> Result<Response<api::RegistrationStatusResponse>, Status> {
        let _admitted = self.gate.enter()?;
        let status = request.into_inner();
        let state = if status.plugin_registered {
            tracing::info!(driver = %self.info.name, "the kubelet registered the DRA plugin");
            RegistrationState::Registered
        } else {
            let error = if status.error.is_empty() {
                "the kubelet gave no reason".to_string()
            } else {
                status.error
            };
            tracing::error!(driver = %self.info.name, %error, "the kubelet refused the DRA plugin");
            RegistrationState::Refused { error }
        };
        let outcome = match state {
            RegistrationState::Registered => "registered",
            _ => "refused",
        };
        metrics::counter!(REGISTRATIONS_TOTAL, "outcome" => outcome).increment(1);
        self.state.send_replace(state);
        Ok(Response::new(api::RegistrationStatusResponse {}))
    }
}
