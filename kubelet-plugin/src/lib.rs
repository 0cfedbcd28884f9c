//! The kubelet's side of DRA: the gRPC servers the kubelet calls (both DRA versions,
//! device health and plugin registration) and what they call, [`NodePlugin`], and
//! report, [`DeviceHealthFeed`]; and [`client`], a client that talks to them as the
//! kubelet does.

mod authority;
mod claims;
pub mod client;
mod config;
mod device_health;
mod error;
mod gate;
mod health;
mod health_service;
mod malformed;
mod plugin;
mod registration;
mod server;
mod service;
mod severable;
mod socket;
#[cfg(any(test, feature = "testing"))]
pub mod testing;
mod version;

pub use authority::{
    AUTHORITY_REWRITES_TOTAL, AuthorityError, AuthorityRewriter, BAD_FRAMES_TOTAL,
};
pub use claims::{CLAIMS_TOTAL, REQUESTS_TOTAL};
pub use config::{
    DEFAULT_DRAIN_TIMEOUT, DEFAULT_PLUGINS_DIR, DEFAULT_REGISTRY_DIR, DriverName, DriverNameError,
    PluginServerConfig,
};
pub use device_health::{
    DeviceHealthEntry, DeviceHealthFeed, DeviceHealthState, HEALTH_CHECK_TIMEOUT, HEALTH_REFRESH,
    MAX_MESSAGE_BYTES, bounded_message, no_device_health,
};
pub use error::PluginServerError;
pub use health_service::{HEALTH_SENDS_TOTAL, HEALTH_STREAMS_TOTAL};
pub use plugin::{ClaimFailure, NodePlugin, PreparedDevice};
pub use registration::{DRA_PLUGIN_TYPE, REGISTRATIONS_TOTAL, RegistrationState};
pub use server::{KubeletPluginServer, RunningPluginServer, ShutdownReport};
pub use version::{DraVersion, HealthVersion, UnknownDraVersion};

/// Gives the kubelet plugin's metrics their help text (`# HELP` on `/metrics`, and the
/// book's metrics reference); the daemon calls it once, after installing its recorder.
pub fn describe_metrics() {
    use metrics::{describe_counter, describe_histogram};
    describe_counter!(
        REQUESTS_TOTAL,
        "DRA calls from the kubelet, by `method`, `version` and `outcome`: `ok` (every claim \
         answered without error), `claim_errors` (at least one claim has an error), \
         `invalid_argument`, `unavailable` (shutting down), `malformed` (the protobuf did not \
         decode)."
    );
    describe_counter!(
        CLAIMS_TOTAL,
        "Claims in DRA calls, by `method`, `version` and `outcome`: `ok`, `retryable_error`, \
         `permanent_error`, `invalid` (refused before reaching the node)."
    );
    describe_histogram!(
        claims::REQUEST_SECONDS,
        "Seconds a kubelet call took to be answered for all its claims, by `method`: \
         `NodePrepareResources`, `NodeUnprepareResources`. A prepare waits for its domain \
         (up to `--prepare-deadline`), so this is the latency a pod start sees from the \
         plugin; calls refused whole are not timed."
    );
    describe_counter!(
        HEALTH_STREAMS_TOTAL,
        "Device health streams the kubelet opened, by `version` and `outcome`: `opened`, \
         `unavailable` (shutting down)."
    );
    describe_counter!(
        HEALTH_SENDS_TOTAL,
        "Device health lists sent to the kubelet, by `version` and `reason`: `connect`, \
         `change` (the node's view changed), `refresh` (the same list again, before the \
         kubelet's timeout)."
    );
    describe_counter!(
        REGISTRATIONS_TOTAL,
        "Registration notices from the kubelet, by `outcome`: `registered`, `refused`."
    );
    describe_counter!(
        AUTHORITY_REWRITES_TOTAL,
        "HTTP/2 `:authority` headers of the plugin's sockets replaced, by `socket`: `dra`, \
         `registration`; a client that is not the kubelet's DRA manager shows up here."
    );
    describe_counter!(
        BAD_FRAMES_TOTAL,
        "Connections to the plugin's sockets closed because the client did not send HTTP/2 \
         that could be parsed, by `socket`."
    );
}
