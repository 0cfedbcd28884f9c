//! `/metrics`, `/healthz`, `/readyz` and `/state`, for Prometheus, the kubelet's probes,
//! and the demo and chaos harness.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use actix::Addr;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use domaind_actors::{GetSnapshot, NodeActor};
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::state::NodeView;

/// How long the node actor may take to answer before the node is reported unhealthy.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(3);

/// What the probes report: set by the daemon as it starts and stops.
#[derive(Debug, Default)]
pub struct Readiness {
    ready: AtomicBool,
}

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    pub fn get(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

#[derive(Clone)]
struct Shared {
    metrics: PrometheusHandle,
    node: Addr<NodeActor>,
    readiness: Arc<Readiness>,
}

/// Binds `addr` and serves until `stop` is cancelled. Returns the bound address (the
/// port may have been 0) and the server's task.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    node: Addr<NodeActor>,
    readiness: Arc<Readiness>,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let app = Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .route("/state", get(state))
        .with_state(Shared {
            metrics,
            node,
            readiness,
        });
    let task = tokio::spawn(async move {
        let served = axum::serve(listener, app)
            .with_graceful_shutdown(stop.cancelled_owned())
            .await;
        if let Err(error) = served {
            tracing::error!(%error, "the HTTP server stopped");
        }
    });
    Ok((bound, task))
}

async fn render_metrics(State(shared): State<Shared>) -> String {
    shared.metrics.render()
}

/// Alive when the node actor answers: a wedged actor system is what a restart cures.
async fn healthz(State(shared): State<Shared>) -> Response {
    match tokio::time::timeout(LIVENESS_TIMEOUT, shared.node.send(GetSnapshot)).await {
        Ok(Ok(_)) => (StatusCode::OK, "ok\n").into_response(),
        Ok(Err(_)) => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the node actor has stopped\n",
        )
            .into_response(),
        Err(_) => (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("the node actor did not answer within {LIVENESS_TIMEOUT:?}\n"),
        )
            .into_response(),
    }
}

async fn readyz(State(shared): State<Shared>) -> Response {
    if shared.readiness.get() {
        (StatusCode::OK, "ready\n").into_response()
    } else {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: starting or shutting down\n",
        )
            .into_response()
    }
}

async fn state(State(shared): State<Shared>) -> Response {
    match tokio::time::timeout(LIVENESS_TIMEOUT, shared.node.send(GetSnapshot)).await {
        Ok(Ok(snapshot)) => Json(NodeView::from(snapshot)).into_response(),
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the node actor did not answer\n",
        )
            .into_response(),
    }
}
