//! The Kubernetes contract domaind's node daemons and controller share, and nothing
//! either side keeps to itself: the ComputeDomain CRD and its channel config as users
//! and NVIDIA's tools see them, the names and labels other components match on, the one
//! way to build an API client (timeout, metrics, failures sorted), the health and
//! metrics endpoints the kubelet's probes and Prometheus read, and the flags both
//! commands take and the runtime both run on.
//!
//! It knows no actix, tonic, gossip or NVML: the controller depends on it alone, and
//! the node daemon maps its own model onto these types at its edge.

pub mod api;
pub mod args;
pub mod channel_config;
pub mod client;
pub mod crd;
pub mod health;
pub mod http_guard;
pub mod metrics;
pub mod names;
pub mod reasons;
pub mod runtime;
#[cfg(feature = "testing")]
pub mod testing;

pub use api::{ApiError, bounded};
pub use channel_config::ChannelConfig;
pub use client::client;
