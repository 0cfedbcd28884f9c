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
