//! gRPC health (`grpc.health.v1.Health`) for the kubelet plugin: SERVING while both
//! servers run, NOT_SERVING from the moment shutdown begins, for the whole server ("")
//! and for each service we offer by name (DRA, device health, registration).

use domaind_kubelet_api::pluginregistration::registration_server;
use tonic_health::ServingStatus;
use tonic_health::pb::health_server::HealthServer;
use tonic_health::server::{HealthReporter, HealthService};

use super::version::{DraVersion, HealthVersion};

#[derive(Debug, Clone)]
pub(crate) struct PluginHealth {
    reporter: HealthReporter,
}

impl PluginHealth {
    /// Starts NOT_SERVING: nothing is up yet.
    pub(crate) async fn new() -> Self {
        let health = Self {
            reporter: HealthReporter::new(),
        };
        health.set(ServingStatus::NotServing).await;
        health
    }

    /// A health service answering from this reporter; one per server.
    pub(crate) fn service(&self) -> HealthServer<HealthService> {
        HealthServer::new(HealthService::from_health_reporter(self.reporter.clone()))
    }

    pub(crate) async fn set(&self, status: ServingStatus) {
        let names = DraVersion::ALL
            .iter()
            .map(|version| version.service_name())
            .chain(
                HealthVersion::ALL
                    .iter()
                    .map(|version| version.service_name()),
            )
            .chain([registration_server::SERVICE_NAME, ""]);
        for name in names {
            self.reporter.set_service_status(name, status).await;
        }
    }
}
