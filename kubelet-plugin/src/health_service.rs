//! The `DRAResourceHealth` service, v1alpha1, v1beta1 and v1: each kubelet stream is
//! [`updates`] of the feed, translated into that version's messages. The versions have
//! the same messages in different packages, so one macro writes the three.

use std::borrow::Cow;
use std::pin::Pin;
use std::sync::Arc;

use domaind_kubelet_api::dra_health::{v1, v1alpha1, v1beta1};
use futures::{Stream, StreamExt};
use tokio::sync::watch;
use tonic::{Request, Response, Status};

use super::device_health::{
    DeviceHealthEntry, DeviceHealthFeed, DeviceHealthState, HEALTH_CHECK_TIMEOUT, HEALTH_REFRESH,
    bounded_message, updates,
};
use super::gate::CallGate;
use super::version::HealthVersion;

/// Streams the kubelet opened, by `version` and `outcome`: `opened`, `unavailable`
/// (shutting down).
pub const HEALTH_STREAMS_TOTAL: &str = "domaind_dra_health_streams_total";
/// Lists sent, by `version` and `reason`: `connect`, `change` (the node's view changed),
/// `refresh` (the same list again, before the kubelet's timeout).
pub const HEALTH_SENDS_TOTAL: &str = "domaind_dra_health_sends_total";

/// How many streams are open now: each holds an [`OpenStream`] until it is dropped.
#[derive(Debug, Clone)]
pub(crate) struct HealthStreams(watch::Sender<usize>);

impl HealthStreams {
    pub(crate) fn new() -> Self {
        Self(watch::Sender::new(0))
    }

    pub(crate) fn open(&self) -> usize {
        *self.0.borrow()
    }

    fn opened(&self, version: HealthVersion) -> OpenStream {
        self.0.send_modify(|n| *n += 1);
        OpenStream {
            streams: self.0.clone(),
            version,
        }
    }
}

struct OpenStream {
    streams: watch::Sender<usize>,
    version: HealthVersion,
}

impl Drop for OpenStream {
    fn drop(&mut self) {
        self.streams.send_modify(|n| *n -= 1);
        tracing::debug!(version = %self.version, "a device health stream ended");
    }
}

/// A stream's responses, in one version's messages.
type Responses<T> = Pin<Box<dyn Stream<Item = Result<T, Status>> + Send>>;

/// Serves every version; the tonic services each hold a clone.
#[derive(Debug, Clone)]
pub(crate) struct HealthService {
    feed: DeviceHealthFeed,
    gate: CallGate,
    streams: HealthStreams,
}

/// One entry as every version's message has it.
struct WireDevice<'a> {
    entry: &'a DeviceHealthEntry,
    message: Cow<'a, str>,
}

impl HealthService {
    pub(crate) fn new(feed: DeviceHealthFeed, gate: CallGate, streams: HealthStreams) -> Self {
        Self {
            feed,
            gate,
            streams,
        }
    }

    /// Admits a stream (or refuses it once shutdown began) and returns what it sends,
    /// each list built by `translate` into the version's response.
    fn watch<T: Send + 'static>(
        &self,
        version: HealthVersion,
        translate: fn(&[WireDevice<'_>]) -> T,
    ) -> Result<Responses<T>, Status> {
        let label = version.as_str();
        if let Err(refused) = self.gate.check_open() {
            metrics::counter!(HEALTH_STREAMS_TOTAL, "version" => label, "outcome" => "unavailable")
                .increment(1);
            return Err(refused);
        }
        metrics::counter!(HEALTH_STREAMS_TOTAL, "version" => label, "outcome" => "opened")
            .increment(1);
        tracing::info!(%version, "the kubelet watches device health");
        let open = self.streams.opened(version);
        let lists = updates(self.feed.clone(), self.gate.closed(), HEALTH_REFRESH);
        Ok(Box::pin(lists.map(move |(reason, list)| {
            // Moved in: the stream counts as open until tonic drops it.
            let _open = &open;
            metrics::counter!(HEALTH_SENDS_TOTAL, "version" => label, "reason" => reason.as_str())
                .increment(1);
            Ok(translate(&wire(&list)))
        })))
    }
}

fn wire(list: &Arc<Vec<DeviceHealthEntry>>) -> Vec<WireDevice<'_>> {
    list.iter()
        .map(|entry| WireDevice {
            entry,
            message: bounded_message(&entry.message),
        })
        .collect()
}

fn timeout_seconds() -> i64 {
    HEALTH_CHECK_TIMEOUT.as_secs() as i64
}

macro_rules! health_version {
    ($api:ident, $version:expr) => {
        impl From<DeviceHealthState> for $api::HealthStatus {
            fn from(state: DeviceHealthState) -> Self {
                match state {
                    DeviceHealthState::Unknown => $api::HealthStatus::Unknown,
                    DeviceHealthState::Healthy => $api::HealthStatus::Healthy,
                    DeviceHealthState::Unhealthy => $api::HealthStatus::Unhealthy,
                }
            }
        }

        #[tonic::async_trait]
        impl $api::dra_resource_health_server::DraResourceHealth for HealthService {
            type NodeWatchResourcesStream = Responses<$api::NodeWatchResourcesResponse>;

            async fn node_watch_resources(
                &self,
                _request: Request<$api::NodeWatchResourcesRequest>,
            ) -> Result<Response<Self::NodeWatchResourcesStream>, Status> {
                let stream = self.watch($version, |devices| $api::NodeWatchResourcesResponse {
                    devices: devices
                        .iter()
                        .map(|device| $api::DeviceHealth {
                            device: Some($api::DeviceIdentifier {
                                pool_name: device.entry.pool.clone(),
                                device_name: device.entry.device.clone(),
                            }),
                            health: $api::HealthStatus::from(device.entry.health) as i32,
                            last_updated_time: device.entry.last_updated_unix_s,
                            health_check_timeout_seconds: timeout_seconds(),
                            message: device.message.to_string(),
                        })
                        .collect(),
                })?;
                Ok(Response::new(stream))
            }
        }
    };
}

health_version!(v1alpha1, HealthVersion::V1alpha1);
health_version!(v1beta1, HealthVersion::V1beta1);
health_version!(v1, HealthVersion::V1);
