//! Flags the node daemon (`domaind run`) and the controller (`domaind controller`)
//! share, flattened into each: one spelling, one environment variable, one default.

use std::marker::PhantomData;
use std::net::SocketAddr;
use std::time::Duration;

use clap::Args;

use crate::names::DEFAULT_DRIVER_NAME;

/// How we talk to the API server.
#[derive(Debug, Clone, Args)]
pub struct KubeArgs {
    /// The DRA driver name: the node daemons' ResourceSlices, claims and CDI vendor, and
    /// the opaque config of the controller's claim templates use it.
    #[arg(long, env = "DOMAIND_DRIVER_NAME", default_value = DEFAULT_DRIVER_NAME)]
    pub driver_name: String,

    /// How long one Kubernetes API call may take before it counts as failed (and is
    /// retried with backoff, or answered with a retryable error).
    #[arg(long, env = "DOMAIND_KUBE_API_TIMEOUT", default_value = "10s", value_parser = humantime::parse_duration)]
    pub kube_api_timeout: Duration,
}

/// Where /metrics (Prometheus), /healthz and /readyz are served, with the default
/// address `D` gives, so that a node daemon and a controller on one host do not
/// collide.
#[derive(Debug, Clone, Args)]
pub struct HttpArgs<D: DefaultHttpAddr> {
    /// Where /metrics (Prometheus), /healthz and /readyz are served.
    #[arg(long, env = "DOMAIND_HTTP_ADDR", default_value = D::ADDR)]
    pub http_addr: SocketAddr,

    #[arg(skip)]
    default: PhantomData<D>,
}

/// The default of `--http-addr` of one command.
pub trait DefaultHttpAddr: Clone + std::fmt::Debug + Send + Sync + 'static {
    const ADDR: &'static str;
}

/// The node daemons' default HTTP address.
#[derive(Debug, Clone, Copy, Default)]
pub struct NodeHttp;

impl DefaultHttpAddr for NodeHttp {
    const ADDR: &'static str = "0.0.0.0:9464";
}

/// The controller's default HTTP address.
#[derive(Debug, Clone, Copy, Default)]
pub struct ControllerHttp;

impl DefaultHttpAddr for ControllerHttp {
    const ADDR: &'static str = "0.0.0.0:9465";
}
