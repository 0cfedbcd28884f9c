//! The `DRAPlugin` service, v1 and v1beta1: translation between each version's messages
//! and [`ClaimHandler`]. The two versions have the same messages today, in different
//! packages, so one macro writes both translations.

use domaind_actors::model::ClaimRef;
use domaind_kubelet_api::dra::{v1, v1beta1};
use tonic::{Request, Response, Status};

use super::claims::ClaimHandler;
use super::version::DraVersion;

/// Serves both versions; the tonic services hold it behind an `Arc`.
#[derive(Debug, Clone)]
pub(crate) struct DraService {
    handler: ClaimHandler,
}

impl DraService {
    pub(crate) fn new(handler: ClaimHandler) -> Self {
        Self { handler }
    }
}

macro_rules! dra_version {
    ($api:ident, $version:expr) => {
        #[tonic::async_trait]
        impl $api::dra_plugin_server::DraPlugin for DraService {
            async fn node_prepare_resources(
                &self,
                request: Request<$api::NodePrepareResourcesRequest>,
            ) -> Result<Response<$api::NodePrepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|claim| ClaimRef {
                        uid: claim.uid,
                        namespace: claim.namespace,
                        name: claim.name,
                    });
                let answers = self.handler.prepare($version, claims.collect()).await?;
                let claims = answers
                    .into_iter()
                    .map(|(uid, answer)| {
                        let entry = match answer {
                            Ok(devices) => $api::NodePrepareResourceResponse {
                                devices: devices
                                    .into_iter()
                                    .map(|device| $api::Device {
                                        request_names: device.request_names,
                                        pool_name: device.pool_name,
                                        device_name: device.device_name,
                                        cdi_device_ids: device.cdi_device_ids,
                                    })
                                    .collect(),
                                error: String::new(),
                            },
                            Err(error) => $api::NodePrepareResourceResponse {
                                devices: Vec::new(),
                                error,
                            },
                        };
                        (uid, entry)
                    })
                    .collect();
                Ok(Response::new($api::NodePrepareResourcesResponse { claims }))
            }

            async fn node_unprepare_resources(
                &self,
                request: Request<$api::NodeUnprepareResourcesRequest>,
            ) -> Result<Response<$api::NodeUnprepareResourcesResponse>, Status> {
                let claims = request
                    .into_inner()
                    .claims
                    .into_iter()
                    .map(|claim| ClaimRef {
                        uid: claim.uid,
                        namespace: claim.namespace,
                        name: claim.name,
                    });
                let answers = self.handler.unprepare($version, claims.collect()).await?;
                let claims = answers
                    .into_iter()
                    .map(|(uid, answer)| {
                        let error = answer.err().unwrap_or_default();
                        (uid, $api::NodeUnprepareResourceResponse { error })
                    })
                    .collect();
                Ok(Response::new($api::NodeUnprepareResourcesResponse {
                    claims,
                }))
            }
        }
    };
}

dra_version!(v1, DraVersion::V1);
dra_version!(v1beta1, DraVersion::V1beta1);
