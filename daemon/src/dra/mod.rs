//! The kubelet's side of DRA: the gRPC servers the kubelet calls (both DRA versions and
//! plugin registration) and what they call, [`NodePlugin`].

mod plugin;

pub use plugin::{ClaimFailure, NodePlugin, PreparedDevice};
