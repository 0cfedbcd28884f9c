//! `domaind controller`: the thin central part. It does only what needs one place in
//! the cluster — a finalizer and a ResourceClaimTemplate per ComputeDomain, the
//! release of a deleted domain once no claim of it is allocated, and in rack mode a
//! domain per NVLink clique. Membership, readiness and per-node status are the node
//! daemons' (`domaind run`); the controller never writes them.
//!
//! | module | job |
//! |---|---|
//! | `template` | the template a CD must have; whether a found one is ours |
//! | `membership` | whether any claim of a domain is still allocated |
//! | `condition` | the `TemplateReady` condition and its apply body |
//! | `finalizer` | the JSON patches that add and remove the finalizer |
//! | `reconcile` | one pass over one CD: the API calls |
//! | `backoff` | retries after errors |
//! | `leader` | Lease-based leader election |
//! | `rack` | rack mode |
//! | `signer` | gossip node certificates: the CSR signer and the CA bundle |
//! | `args` | flags |

mod args;
mod backoff;
mod census;
mod condition;
mod finalizer;
pub mod leader;
mod membership;
mod metrics;
pub mod rack;
mod reconcile;
pub mod signer;
mod template;

#[cfg(test)]
pub(crate) mod tests;

use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use futures::{FutureExt as _, StreamExt as _};
use k8s_openapi::api::resource::v1::ResourceClaimTemplate;
use kube::runtime::{Controller, watcher};
use kube::{Api, Client};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use args::ControllerArgs;
pub use condition::TemplateOutcome;
pub use leader::{Elector, Heartbeat, Leadership, LeaseSettings};
pub use membership::allocated_claims;
pub use rack::RackSettings;
pub use reconcile::{Context, Error, Timing, error_policy, reconcile};
pub use template::{Ownership, TemplateSettings};

use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::health::{Liveness, NotAlive, Readiness};
use domaind_kube_api::names;

/// Gives every metric the controller records its help text (`# HELP` on `/metrics`, and
/// the book's metrics reference): its own and its Kubernetes client's.
pub fn describe_metrics() {
    metrics::describe();
    domaind_kube_api::metrics::describe();
}

/// Runs the controller until SIGTERM or SIGINT.
pub fn run(args: ControllerArgs) -> anyhow::Result<()> {
    if args.leader_elect {
        args.election_timing()
            .validate()
            .map_err(anyhow::Error::msg)
            .context("invalid leader election timing")?;
    }
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    describe_metrics();
    let runtime = domaind_kube_api::runtime::multi_thread()
        .build()
        .context("cannot build the tokio runtime")?;
    runtime.block_on(serve(args, metrics))
}

async fn serve(args: ControllerArgs, metrics: PrometheusHandle) -> anyhow::Result<()> {
    let client = domaind_kube_api::client().await?;
    let identity = args
        .leader_identity
        .clone()
        .unwrap_or_else(args::default_identity);
    let stop = CancellationToken::new();
    spawn_signal_handler(stop.clone())?;

    let heartbeat = Arc::new(Heartbeat::default());
    let readiness = Arc::new(Readiness::default());
    let stop_http = CancellationToken::new();
    let (http_addr, http_task) = domaind_kube_api::health::serve(
        args.http.http_addr,
        domaind_kube_api::health::router(
            metrics,
            liveness(&args, heartbeat.clone()),
            readiness.clone(),
            "the API server has not answered yet",
        ),
        stop_http.clone(),
    )
    .await
    .with_context(|| format!("cannot listen on {} (--http-addr)", args.http.http_addr))?;

    let stop_elector = CancellationToken::new();
    let (mut leadership, elector) = if args.leader_elect {
        let namespace = args
            .lease_namespace
            .clone()
            .unwrap_or_else(|| client.default_namespace().to_string());
        let settings = LeaseSettings {
            name: args.lease_name.clone(),
            namespace: namespace.clone(),
            identity: identity.clone(),
            timing: args.election_timing(),
        };
        info!(lease = %args.lease_name, %namespace, %identity, "electing a leader");
        let (elector, leadership) = Elector::new(
            Api::namespaced(client.clone(), &namespace),
            settings,
            heartbeat.clone(),
        );
        (
            leadership,
            Some(tokio::spawn(elector.run(stop_elector.clone()))),
        )
    } else {
        heartbeat.answered();
        (Leadership::unconditional(), None)
    };
    spawn_readiness(heartbeat.clone(), readiness.clone(), stop.clone());
    info!(http = %http_addr, driver = %args.kube.driver_name, rack_mode = args.rack_mode, "domaind controller started");

    loop {
        tokio::select! {
            _ = leadership.acquired() => {}
            _ = stop.cancelled() => break,
        }
        ::metrics::gauge!(metrics::LEADER).set(1.0);
        info!("leading: reconciling ComputeDomains");
        let term = CancellationToken::new();
        let ending = {
            let mut lost = leadership.clone();
            let (stop, term) = (stop.clone(), term.clone());
            tokio::spawn(async move {
                tokio::select! {
                    _ = lost.lost() => {}
                    _ = stop.cancelled() => {}
                }
                term.cancel();
            })
        };
        lead(client.clone(), &args, &identity, term).await;
        ending.abort();
        ::metrics::gauge!(metrics::LEADER).set(0.0);
        census::set_gauges(census::Totals::default());
        if stop.is_cancelled() {
            break;
        }
        warn!("no longer leading: stopped reconciling; standing by");
    }

    info!("stopping");
    readiness.set(false);
    stop_elector.cancel();
    if let Some(elector) = elector {
        let release = async {
            if let Ok(elector) = elector.await {
                elector.release().await;
            }
        };
        if tokio::time::timeout(args.shutdown_timeout, release)
            .await
            .is_err()
        {
            warn!("releasing the lease timed out; it expires by itself");
        }
    }
    stop_http.cancel();
    let _ = http_task.await;
    info!("domaind controller stopped");
    Ok(())
}

/// Reconciles ComputeDomains (and in rack mode keeps a domain per clique) until `term`.
async fn lead(client: Client, args: &ControllerArgs, identity: &str, term: CancellationToken) {
    let ctx = Arc::new(Context::new(
        client.clone(),
        TemplateSettings {
            driver: args.kube.driver_name.clone(),
            device_class: args.device_class.clone(),
        },
        args.reconcile_timing(),
        identity,
    ));
    let domains: Api<ComputeDomain> = Api::all(client.clone());
    let templates: Api<ResourceClaimTemplate> = Api::all(client.clone());
    let controller = Controller::new(domains, watcher::Config::default())
        // Only our templates: their deletion wakes their CD, which recreates them.
        .owns(
            templates,
            watcher::Config::default().labels(names::DOMAIN_LABEL),
        )
        .graceful_shutdown_on(term.clone().cancelled_owned());
    let rack = args.rack_mode.then(|| {
        let settings = RackSettings {
            namespace: args.rack_namespace.clone().unwrap_or_default(),
            label: args.rack_label.clone(),
        };
        tokio::spawn(rack::run(
            client.clone(),
            settings,
            controller.store(),
            term.clone(),
        ))
    });
    let signer = signer_settings(args, client.default_namespace()).map(|settings| {
        let (client, identity, term) = (client.clone(), identity.to_string(), term.clone());
        tokio::spawn(async move { signer::run(client, settings, &identity, term).await })
    });
    let shutdown_timeout = args.shutdown_timeout;
    let run = controller
        .run(reconcile, error_policy, ctx)
        .for_each(|result| {
            match result {
                Ok((cd, action)) => debug!(cd = %cd, ?action, "reconciled"),
                // The reconciler's own errors are logged by the error policy.
                Err(kube::runtime::controller::Error::ReconcilerFailed(..)) => {}
                Err(error) => warn!(%error, "controller"),
            }
            futures::future::ready(())
        });
    tokio::pin!(run);
    tokio::select! {
        _ = &mut run => {}
        // In-flight reconciles finish after the term ends, within the shutdown timeout.
        _ = term.cancelled().then(|()| tokio::time::sleep(shutdown_timeout)) => {
            warn!("reconciles did not finish within the shutdown timeout");
        }
    }
    term.cancel();
    if let Some(rack) = rack {
        let _ = rack.await;
    }
    if let Some(signer) = signer {
        let _ = signer.await;
    }
}

/// The signer's settings, when `--node-service-account` asks for one.
fn signer_settings(
    args: &ControllerArgs,
    default_namespace: &str,
) -> Option<signer::SignerSettings> {
    let service_account = args.node_service_account.as_deref()?;
    let namespace = args
        .gossip_ca_namespace
        .clone()
        .unwrap_or_else(|| default_namespace.to_string());
    let sa_namespace = args
        .node_service_account_namespace
        .clone()
        .unwrap_or_else(|| namespace.clone());
    Some(signer::SignerSettings {
        policy: signer::Policy::new(&sa_namespace, service_account, args.node_cert_lifetime),
        bundle: signer::BundleSettings {
            namespace,
            secret: args.gossip_ca_secret.clone(),
            config_map: args.gossip_ca_bundle.clone(),
            resync: Duration::from_secs(60),
        },
        api_timeout: args.kube.kube_api_timeout,
    })
}

/// Alive while the elector's loop turns (a slow API server is not a reason to restart;
/// a stuck loop is). Without election there is nothing to ask.
fn liveness(args: &ControllerArgs, heartbeat: Arc<Heartbeat>) -> Liveness {
    let elected = args.leader_elect;
    let limit = (args.retry_period * 10).max(Duration::from_secs(30));
    Arc::new(move || {
        let since = heartbeat.since_last_round();
        async move {
            if !elected || since < limit {
                Ok(())
            } else {
                Err(NotAlive::new(format!(
                    "the leader election loop has not finished a round for {since:?}"
                )))
            }
        }
        .boxed()
    })
}

fn spawn_readiness(heartbeat: Arc<Heartbeat>, readiness: Arc<Readiness>, stop: CancellationToken) {
    tokio::spawn(async move {
        while !heartbeat.ever_answered() {
            tokio::select! {
                _ = tokio::time::sleep(Duration::from_millis(200)) => {}
                _ = stop.cancelled() => return,
            }
        }
        readiness.set(true);
    });
}

fn spawn_signal_handler(stop: CancellationToken) -> anyhow::Result<()> {
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    tokio::spawn(async move {
        let name = tokio::select! {
            _ = term.recv() => "SIGTERM",
            _ = int.recv() => "SIGINT",
        };
        info!(signal = name, "stopping gracefully");
        stop.cancel();
    });
    Ok(())
}
