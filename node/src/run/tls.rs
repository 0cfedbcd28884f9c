//! Where the gossip certificate comes from (`--tls-mode`): files someone else puts in
//! `--tls-dir`, or (`csr`) the cluster's signer, asked by this daemon (`crate::certs`).
//!
//! In csr mode gossip cannot start without a certificate, so the first one is awaited
//! before anything else starts; meanwhile `/healthz` answers and `/readyz` says why
//! there is no certificate yet (a denial's reason, an unreachable API server).

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use domaind_gossip::tls::TlsPaths;
use domaind_kube_api::health::{self, Liveness, Readiness};
use futures::FutureExt as _;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::info;

use super::args::{RunArgs, TlsMode};
use crate::certs::kube::KubeSigner;
use crate::certs::{self, CertClient, CertState};

/// How often the CA bundle file is looked for while it is not there yet (the
/// ConfigMap appears once the controller has published it).
const CA_FILE_POLL: Duration = Duration::from_secs(1);

/// The gossip TLS files, ready to load, and in csr mode the renewal running.
#[derive(Debug)]
pub struct GossipTls {
    pub paths: TlsPaths,
    pub renewal: Option<JoinHandle<()>>,
}

/// The files for `--tls-mode`: in csr mode only once the first certificate is issued
/// and the CA bundle is there.
pub async fn prepare(
    args: &RunArgs,
    metrics: &PrometheusHandle,
    stop: &CancellationToken,
) -> anyhow::Result<GossipTls> {
    let mut paths = TlsPaths::in_dir(&args.tls_dir);
    if let Some(ca) = &args.tls_ca_file {
        paths.ca_cert = ca.clone();
    }
    if args.tls_mode == TlsMode::Files {
        return Ok(GossipTls {
            paths,
            renewal: None,
        });
    }
    let client = domaind_kube_api::client()
        .await
        .context("--tls-mode csr asks the Kubernetes API for the node's certificate")?;
    let signer = KubeSigner::new(client, args.kube.kube_api_timeout, args.csr_timeout);
    let (certs, state) = CertClient::new(
        args.node_name.as_str(),
        &args.tls_dir,
        args.csr_lifetime,
        Arc::new(signer),
        certs::system_clock(),
        certs::retry_backoff(),
    );
    let mut certs = certs.with_imex_names(args.imex_names());
    paths.cert = certs.cert_path();
    paths.key = certs.key_path();

    let readiness = Arc::new(Readiness::default());
    let stop_http = CancellationToken::new();
    let alive: Liveness = Arc::new(|| async { Ok(()) }.boxed());
    let (addr, http) = health::serve(
        args.http.http_addr,
        health::router(
            metrics.clone(),
            alive,
            readiness.clone(),
            "no gossip certificate yet",
        ),
        stop_http.clone(),
    )
    .await
    .with_context(|| format!("cannot listen on {} (--http-addr)", args.http.http_addr))?;
    info!(http = %addr, "waiting for this node's gossip certificate");
    let reporter = tokio::spawn({
        let (mut state, readiness) = (state.clone(), readiness.clone());
        async move {
            loop {
                if let CertState::Waiting(why) = &*state.borrow_and_update() {
                    readiness.fail(why.clone());
                }
                if state.changed().await.is_err() {
                    return;
                }
            }
        }
    });

    let first = certs.first(stop).await;
    if let Some(first) = first {
        wait_for_file(&paths.ca_cert, &readiness, stop).await;
        reporter.abort();
        stop_http.cancel();
        let _ = http.await;
        let renewal = tokio::spawn(certs.renew(first, stop.clone()));
        return Ok(GossipTls {
            paths,
            renewal: Some(renewal),
        });
    }
    reporter.abort();
    stop_http.cancel();
    let _ = http.await;
    anyhow::bail!("stopped before a gossip certificate was issued")
}

async fn wait_for_file(path: &Path, readiness: &Readiness, stop: &CancellationToken) {
    while !path.exists() {
        readiness.fail(format!(
            "waiting for the gossip CA bundle {} (the controller publishes it)",
            path.display()
        ));
        tokio::select! {
            _ = tokio::time::sleep(CA_FILE_POLL) => {}
            _ = stop.cancelled() => return,
        }
    }
}
