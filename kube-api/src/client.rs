//! The one way node daemons and the controller build their Kubernetes client: the
//! cluster's configuration, ring as the TLS provider, and every request counted and
//! timed by [`ApiMetricsLayer`](crate::metrics::ApiMetricsLayer). Each call is then
//! bounded in time by [`bounded`](crate::api::bounded) with `--kube-api-timeout`: kube's
//! client has no read timeout of its own that would not also cut its watches.

use anyhow::Context as _;
use kube::Client;
use kube::client::ClientBuilder;
use tracing::info;

use crate::metrics::ApiMetricsLayer;

/// A client for the cluster we run in (in-cluster service account) or the one
/// `KUBECONFIG` (or `~/.kube/config`) names. Nothing is sent yet: an unreachable API
/// server is found out, and retried, later.
pub async fn client() -> anyhow::Result<Client> {
    // aws-lc-rs is never compiled in; installing ring before kube builds its TLS config
    // keeps rustls from having to choose. Someone may have installed it first: fine.
    let _ = rustls::crypto::ring::default_provider().install_default();
    let config = kube::Config::infer().await.context(
        "cannot find the Kubernetes API server: not in a cluster (no service account) and no \
         usable KUBECONFIG or ~/.kube/config",
    )?;
    info!(server = %config.cluster_url, "Kubernetes API server");
    let client = ClientBuilder::try_from(config)
        .context("cannot build the Kubernetes client")?
        .with_layer(&ApiMetricsLayer)
        .build();
    Ok(client)
}
