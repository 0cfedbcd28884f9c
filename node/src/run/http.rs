//! `/metrics`, `/healthz`, `/readyz` on `--http-addr`, for Prometheus and the kubelet's
//! probes, and `/state` on its own listener (`--state-addr`, loopback by default), for
//! the demo, the chaos harness and operators: `/state` tells the node's claims, domains
//! and IMEX peers, and `--http-addr` is reachable from the network. The first three are
//! shared with the controller (`domaind_kube_api::health`); `/state` and the liveness
//! check are the node's own.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use axum::Router;
use axum::extract::State;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Json, Response};
use axum::routing::get;
use domaind_actors::ports::PrepareState;
use domaind_actors::{GetClaims, GetSnapshot, NodeActor};
use futures::FutureExt as _;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio_util::sync::CancellationToken;

pub use domaind_kube_api::health::Readiness;

use domaind_gossip::GossipNode;
use domaind_kube_api::health::NotAlive;

use super::state::{CheckpointView, GossipView, HandedChannel, NodeView};
use super::vitals::Vitals;
use domaind_checkpoint::Persistence;
use tokio::sync::watch;

/// How long the node actor may take to answer before the node is reported unhealthy.
const LIVENESS_TIMEOUT: Duration = Duration::from_secs(3);

/// Binds `addr` and serves `/metrics`, `/healthz` and `/readyz` until `stop` is
/// cancelled. Returns the bound address (the port may have been 0) and the server's task.
pub async fn serve(
    addr: SocketAddr,
    metrics: PrometheusHandle,
    node: Addr<NodeActor>,
    readiness: Arc<Readiness>,
    vitals: Arc<Vitals>,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let probed = node.clone();
    // Alive when nothing fatal happened (a dead gossip task, a panic) and the node
    // actor answers: a wedged actor system is what a restart cures.
    let liveness: domaind_kube_api::health::Liveness = Arc::new(move || {
        let node = probed.clone();
        let fault = vitals.failure();
        async move {
            if let Some(fault) = fault {
                return Err(NotAlive::new(fault));
            }
            match tokio::time::timeout(LIVENESS_TIMEOUT, node.send(GetSnapshot)).await {
                Ok(Ok(_)) => Ok(()),
                Ok(Err(_)) => Err(NotAlive::new("the node actor has stopped")),
                Err(_) => Err(NotAlive::new(format!(
                    "the node actor did not answer within {LIVENESS_TIMEOUT:?}"
                ))),
            }
        }
        .boxed()
    });
    let app =
        domaind_kube_api::health::router(metrics, liveness, readiness, "starting or shutting down");
    domaind_kube_api::health::serve(addr, app, stop).await
}

/// The gossip plane of the moment: it is replaced when the node moves to another
/// clique.
#[derive(Clone)]
pub struct StateGossip {
    pub node: Arc<GossipNode>,
    pub cluster_id: String,
}

/// Binds `addr` and serves `/state` until `stop` is cancelled, under the same limits as
/// the other endpoints. Returns the bound address and the server's task.
pub async fn serve_state(
    addr: SocketAddr,
    node: Addr<NodeActor>,
    gossip: watch::Receiver<StateGossip>,
    persistence: watch::Receiver<Persistence>,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let sources = StateSources {
        node,
        gossip,
        persistence,
    };
    let app = Router::new()
        .route("/state", get(state))
        .with_state(Arc::new(sources));
    domaind_kube_api::health::serve(addr, app, stop).await
}

/// What `/state` is made of.
struct StateSources {
    node: Addr<NodeActor>,
    gossip: watch::Receiver<StateGossip>,
    persistence: watch::Receiver<Persistence>,
}

async fn state(State(sources): State<Arc<StateSources>>) -> Response {
    let asked = async {
        let snapshot = sources.node.send(GetSnapshot).await?;
        let records = sources.node.send(GetClaims).await?;
        Ok::<_, actix::MailboxError>((snapshot, records))
    };
    match tokio::time::timeout(LIVENESS_TIMEOUT, asked).await {
        Ok(Ok((snapshot, records))) => {
            let mut view = NodeView::from(snapshot);
            // Asked right after the snapshot: a claim answered in between may be here
            // and not in `claims`.
            view.prepared = records
                .iter()
                .filter(|r| r.state == PrepareState::PrepareCompleted)
                .map(|r| r.claim.uid.clone())
                .collect();
            view.prepared.sort();
            view.channels = records
                .iter()
                .filter(|r| r.state == PrepareState::PrepareCompleted)
                .filter_map(|r| {
                    Some(HandedChannel {
                        claim: r.claim.uid.clone(),
                        domain: r.info.domain.uid.0.clone(),
                        channel: r.channel?,
                    })
                })
                .collect();
            view.channels.sort();
            let gossip = sources.gossip.borrow().clone();
            view.gossip = GossipView {
                cluster_id: gossip.cluster_id,
                members: gossip.node.live_nodes().into_keys().collect(),
                state: gossip.node.state_size().await.into(),
            };
            view.checkpoint = CheckpointView::from(&*sources.persistence.borrow());
            Json(view).into_response()
        }
        _ => (
            StatusCode::SERVICE_UNAVAILABLE,
            "the node actor did not answer\n",
        )
            .into_response(),
    }
}
