//! The kubelet's side of DRA: the gRPC servers the kubelet calls (both DRA versions and
//! plugin registration) and what they call, [`NodePlugin`]; and [`client`], a client
//! that talks to them as the kubelet does.

mod authority;
mod claims;
pub mod client;
mod config;
mod error;
mod gate;
mod health;
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
pub use error::PluginServerError;
pub use plugin::{ClaimFailure, NodePlugin, PreparedDevice};
pub use registration::{DRA_PLUGIN_TYPE, REGISTRATIONS_TOTAL, RegistrationState};
pub use server::{KubeletPluginServer, RunningPluginServer, ShutdownReport};
pub use version::{DraVersion, UnknownDraVersion};
