//! The HTTP endpoints every long-running domaind process serves — `/metrics` for
//! Prometheus, `/healthz` and `/readyz` for the kubelet's probes — shared by the node
//! daemon and the controller, each adding its own routes and liveness check. Served
//! through [`http_guard`], whose limits a network peer cannot get around.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::get;
use futures::future::BoxFuture;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

use crate::http_guard::{self, HttpLimits};

/// What `/readyz` reports: set by the process as it starts and stops, and held down
/// for a while by any part of it that cannot do all its work (`hold`).
#[derive(Debug, Default)]
pub struct Readiness {
    ready: AtomicBool,
    /// Why the process will never be ready again, once it knows.
    fault: Mutex<Option<String>>,
    /// Why the process is not fully ready now, by who says so.
    held: Mutex<std::collections::BTreeMap<&'static str, String>>,
}

impl Readiness {
    pub fn set(&self, ready: bool) {
        self.ready.store(ready, Ordering::Release);
    }

    /// Not ready for good, for `reason` (which `/readyz` then reports).
    pub fn fail(&self, reason: impl Into<String>) {
        *self.fault.lock().unwrap_or_else(|p| p.into_inner()) = Some(reason.into());
        self.set(false);
    }

    fn fault(&self) -> Option<String> {
        self.fault.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// Not ready while `by` says `reason`; ready again (as far as `by` goes) with `None`.
    /// Unlike a fault this passes: a part of the process that is degraded but working
    /// (serving from memory while its disk is full, say) says so here rather than by
    /// failing liveness, which would restart the process and lose what it holds.
    pub fn hold(&self, by: &'static str, reason: Option<String>) {
        let mut held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        match reason {
            Some(reason) => held.insert(by, reason),
            None => held.remove(by),
        };
    }

    fn held(&self) -> Vec<String> {
        let held = self.held.lock().unwrap_or_else(|p| p.into_inner());
        held.iter()
            .map(|(by, why)| format!("{by}: {why}"))
            .collect()
    }

    pub fn get(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }
}

/// `/healthz`'s question: is the process still doing its work? `Err` says why not, and
/// the kubelet restarts the container.
pub type Liveness = Arc<dyn Fn() -> BoxFuture<'static, Result<(), NotAlive>> + Send + Sync>;

/// Why a process is not alive. Its only reader is a person (the probe's body, the
/// container's last state), and the only thing done about it is a restart, so it is
/// words, not kinds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{why}")]
pub struct NotAlive {
    why: String,
}

impl NotAlive {
    pub fn new(why: impl Into<String>) -> Self {
        Self { why: why.into() }
    }
}

#[derive(Clone)]
struct Shared {
    metrics: PrometheusHandle,
    liveness: Liveness,
    readiness: Arc<Readiness>,
    not_ready: &'static str,
}

/// `/metrics`, `/healthz` and `/readyz`. `not_ready` is what `/readyz` answers while the
/// process is not ready. Merge the process's own routes into the result.
pub fn router(
    metrics: PrometheusHandle,
    liveness: Liveness,
    readiness: Arc<Readiness>,
    not_ready: &'static str,
) -> Router {
    Router::new()
        .route("/metrics", get(render_metrics))
        .route("/healthz", get(healthz))
        .route("/readyz", get(readyz))
        .with_state(Shared {
            metrics,
            liveness,
            readiness,
            not_ready,
        })
}

/// Binds `addr` and serves `app` until `stop` is cancelled, under the default
/// [`HttpLimits`]. Returns the bound address (the port may have been 0) and the server's
/// task.
pub async fn serve(
    addr: SocketAddr,
    app: Router,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    http_guard::serve(addr, app, HttpLimits::default(), stop).await
}

async fn render_metrics(State(shared): State<Shared>) -> String {
    shared.metrics.render()
}

async fn healthz(State(shared): State<Shared>) -> Response {
    match (shared.liveness)().await {
        Ok(()) => (StatusCode::OK, "ok\n").into_response(),
        Err(why) => (StatusCode::SERVICE_UNAVAILABLE, format!("{why}\n")).into_response(),
    }
}

async fn readyz(State(shared): State<Shared>) -> Response {
    let not_ready = |why: &str| {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            format!("not ready: {why}\n"),
        )
            .into_response()
    };
    if let Some(fault) = shared.readiness.fault() {
        return not_ready(&fault);
    }
    if !shared.readiness.get() {
        return not_ready(shared.not_ready);
    }
    let held = shared.readiness.held();
    if !held.is_empty() {
        return not_ready(&held.join("; "));
    }
    (StatusCode::OK, "ready\n").into_response()
}

#[cfg(test)]
mod tests {
    use super::*;
    use futures::FutureExt as _;
    use metrics_exporter_prometheus::PrometheusBuilder;
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    async fn get(addr: SocketAddr, path: &str) -> String {
        let mut stream = tokio::net::TcpStream::connect(addr).await.unwrap();
        let request = format!("GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        stream.write_all(request.as_bytes()).await.unwrap();
        let mut answer = String::new();
        stream.read_to_string(&mut answer).await.unwrap();
        answer
    }

    #[tokio::test]
    async fn probes_report_liveness_and_readiness() {
        let alive = Arc::new(AtomicBool::new(true));
        let probe = alive.clone();
        let liveness: Liveness = Arc::new(move || {
            let alive = probe.load(Ordering::Acquire);
            async move {
                if alive {
                    Ok(())
                } else {
                    Err(NotAlive::new("the loop is stuck"))
                }
            }
            .boxed()
        });
        let readiness = Arc::new(Readiness::default());
        let metrics = PrometheusBuilder::new().build_recorder().handle();
        let app = router(metrics, liveness, readiness.clone(), "starting");
        let stop = CancellationToken::new();
        let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), app, stop.clone())
            .await
            .unwrap();

        assert!(get(addr, "/readyz").await.contains("503"));
        assert!(get(addr, "/readyz").await.contains("not ready: starting"));
        readiness.set(true);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        assert!(get(addr, "/healthz").await.starts_with("HTTP/1.1 200"));
        alive.store(false, Ordering::Release);
        let unhealthy = get(addr, "/healthz").await;
        assert!(unhealthy.starts_with("HTTP/1.1 503"), "{unhealthy}");
        assert!(unhealthy.contains("the loop is stuck"));
        assert!(get(addr, "/metrics").await.starts_with("HTTP/1.1 200"));
        // A hold passes; the process stays alive meanwhile.
        readiness.hold("checkpoint", Some("the state directory is full".into()));
        let held = get(addr, "/readyz").await;
        assert!(held.starts_with("HTTP/1.1 503"), "{held}");
        assert!(
            held.contains("not ready: checkpoint: the state directory is full"),
            "{held}"
        );
        readiness.hold("checkpoint", None);
        assert!(get(addr, "/readyz").await.starts_with("HTTP/1.1 200"));
        // A fault outranks a later `set(true)`: the process is on its way out.
        readiness.fail("gossip stopped: boom");
        readiness.set(true);
        let failed = get(addr, "/readyz").await;
        assert!(failed.starts_with("HTTP/1.1 503"), "{failed}");
        assert!(
            failed.contains("not ready: gossip stopped: boom"),
            "{failed}"
        );

        stop.cancel();
        task.await.unwrap();
    }
}
