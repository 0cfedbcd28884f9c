//! Starting and stopping the kubelet plugin: the DRA API (both versions), device health
//! (`DRAResourceHealth`, three versions) and gRPC health on `dra.sock`, registration on
//! `-reg.sock`, gRPC health on an optional TCP port.

use std::future::Future;
use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use domaind_kubelet_api::dra::{v1, v1beta1};
use domaind_kubelet_api::dra_health;
use domaind_kubelet_api::pluginregistration::registration_server::RegistrationServer;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::StreamExt;
use tokio_stream::wrappers::{TcpListenerStream, UnixListenerStream};
use tokio_util::sync::CancellationToken;
use tonic::transport::Server;
use tonic_health::ServingStatus;

use super::authority::AuthorityFilter;
use super::claims::ClaimHandler;
use super::config::PluginServerConfig;
use super::error::PluginServerError;
use super::gate::CallGate;
use super::health::PluginHealth;
use super::health_service::{HealthService, HealthStreams};
use super::malformed::CountMalformed;
use super::plugin::NodePlugin;
use super::registration::{RegistrationService, RegistrationState};
use super::service::DraService;
use super::severable::Severable;
use super::socket::{self, SocketFile};

/// Once calls have drained, connections close at once after GOAWAY; this bounds one that
/// does not (a health watch stream) before it is cut.
const STOP_GRACE: Duration = Duration::from_secs(1);

/// The kubelet plugin's gRPC servers.
#[derive(Debug)]
pub struct KubeletPluginServer;

impl KubeletPluginServer {
    /// Listens on the sockets (clearing stale ones, refusing live ones) and serves until
    /// [`RunningPluginServer::shutdown`]. Must run inside a tokio runtime: the servers
    /// are `tokio::spawn`ed, so they run on its workers, beside actix if need be.
    pub async fn start(
        config: PluginServerConfig,
        plugin: Arc<dyn NodePlugin>,
    ) -> Result<RunningPluginServer, PluginServerError> {
        // The kubelet resolves the endpoint we register from its own working directory.
        let absolute = |path: std::path::PathBuf| std::path::absolute(&path).unwrap_or(path);
        let dra_path = absolute(config.dra_socket());
        let registration_path = absolute(config.registration_socket());

        let health_listener = match config.health_addr {
            Some(addr) => Some(bind_health(addr).await?),
            None => None,
        };
        let health_addr = health_listener.as_ref().map(|(_, bound)| *bound);
        // The registration socket last: its appearance is what makes the kubelet call
        // us, so the DRA socket it points to must already listen.
        let (dra_listener, dra_socket) = socket::bind(&dra_path).await?;
        let (registration_listener, registration_socket) =
            match socket::bind(&registration_path).await {
                Ok(bound) => bound,
                Err(error) => {
                    drop(dra_listener);
                    dra_socket.remove();
                    return Err(error);
                }
            };

        let gate = CallGate::new();
        let health = PluginHealth::new().await;
        let stop = CancellationToken::new();
        let sever = CancellationToken::new();
        let dra = Arc::new(DraService::new(ClaimHandler::new(plugin, gate.clone())));
        let health_streams = HealthStreams::new();
        let device_health =
            HealthService::new(config.device_health, gate.clone(), health_streams.clone());
        let registration = RegistrationService::new(&config.driver_name, &dra_path, gate.clone());
        let registration_state = registration.state();

        // SERVING before the tasks run, so a server that dies at once leaves NOT_SERVING.
        health.set(ServingStatus::Serving).await;
        let mut tasks = vec![
            spawn_server(
                "dra",
                Server::builder()
                    .layer(CountMalformed::layer())
                    .add_service(health.service())
                    .add_service(v1::dra_plugin_server::DraPluginServer::from_arc(
                        dra.clone(),
                    ))
                    .add_service(v1beta1::dra_plugin_server::DraPluginServer::from_arc(dra))
                    .add_service(
                        dra_health::v1alpha1::dra_resource_health_server::DraResourceHealthServer::new(
                            device_health.clone(),
                        ),
                    )
                    .add_service(
                        dra_health::v1beta1::dra_resource_health_server::DraResourceHealthServer::new(
                            device_health.clone(),
                        ),
                    )
                    .add_service(
                        dra_health::v1::dra_resource_health_server::DraResourceHealthServer::new(
                            device_health,
                        ),
                    )
                    .serve_with_incoming_shutdown(
                        UnixListenerStream::new(dra_listener)
                            .map(authority_filtered("dra"))
                            .map(severable(&sever)),
                        stop.clone().cancelled_owned(),
                    ),
                &stop,
                &health,
            ),
            spawn_server(
                "registration",
                Server::builder()
                    .add_service(RegistrationServer::new(registration))
                    .serve_with_incoming_shutdown(
                        UnixListenerStream::new(registration_listener)
                            .map(authority_filtered("registration"))
                            .map(severable(&sever)),
                        stop.clone().cancelled_owned(),
                    ),
                &stop,
                &health,
            ),
        ];
        if let Some((listener, _)) = health_listener {
            tasks.push(spawn_server(
                "health",
                Server::builder()
                    .add_service(health.service())
                    .serve_with_incoming_shutdown(
                        TcpListenerStream::new(listener).map(severable(&sever)),
                        stop.clone().cancelled_owned(),
                    ),
                &stop,
                &health,
            ));
        }
        tracing::info!(
            driver = %config.driver_name,
            dra_socket = %dra_path.display(),
            registration_socket = %registration_path.display(),
            health_addr = ?health_addr,
            "kubelet plugin serving DRA v1 and v1beta1, device health v1, v1beta1 and v1alpha1"
        );
        Ok(RunningPluginServer {
            dra_socket,
            registration_socket,
            health_addr,
            gate,
            health,
            health_streams,
            registration: registration_state,
            stop,
            sever,
            tasks,
            drain_timeout: config.drain_timeout,
            finished: false,
        })
    }
}

/// Binds the health port, and says which port that is when the config asked for 0.
async fn bind_health(addr: SocketAddr) -> Result<(TcpListener, SocketAddr), PluginServerError> {
    let failed = |source| PluginServerError::BindHealth { addr, source };
    let listener = TcpListener::bind(addr).await.map_err(failed)?;
    let bound = listener.local_addr().map_err(failed)?;
    Ok((listener, bound))
}

/// Wraps each accepted connection so that `sever` can cut it.
/// Both kubelet sockets: their clients send authorities h2 refuses (see `authority`).
fn authority_filtered<S>(
    socket: &'static str,
) -> impl FnMut(std::io::Result<S>) -> std::io::Result<AuthorityFilter<S>> {
    move |accepted| accepted.map(|io| AuthorityFilter::new(io, socket))
}

fn severable<S>(
    sever: &CancellationToken,
) -> impl FnMut(std::io::Result<S>) -> std::io::Result<Severable<S>> + use<S> {
    let sever = sever.clone();
    move |accepted| accepted.map(|io| Severable::new(io, &sever))
}

fn spawn_server(
    name: &'static str,
    serve: impl Future<Output = Result<(), tonic::transport::Error>> + Send + 'static,
    stop: &CancellationToken,
    health: &PluginHealth,
) -> (&'static str, JoinHandle<()>) {
    let stop = stop.clone();
    let health = health.clone();
    let task = tokio::spawn(async move {
        let result = serve.await;
        if stop.is_cancelled() {
            if let Err(error) = result {
                tracing::warn!(server = name, %error, "server stopped with an error");
            }
            return;
        }
        match result {
            Ok(()) => tracing::error!(server = name, "server stopped unexpectedly"),
            Err(error) => tracing::error!(server = name, %error, "server failed"),
        }
        health.set(ServingStatus::NotServing).await;
    });
    (name, task)
}

/// What shutdown found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ShutdownReport {
    /// Every call admitted before shutdown finished within the drain timeout.
    pub drained: bool,
    /// Calls still running when the drain timeout expired (cut off with the servers).
    pub abandoned_calls: usize,
}

/// The running servers. Dropping this without [`shutdown`](Self::shutdown) stops them
/// at once, without waiting for calls, and removes the sockets.
#[derive(Debug)]
pub struct RunningPluginServer {
    dra_socket: SocketFile,
    registration_socket: SocketFile,
    health_addr: Option<SocketAddr>,
    gate: CallGate,
    health: PluginHealth,
    health_streams: HealthStreams,
    registration: watch::Receiver<RegistrationState>,
    /// Stops accepting and closes connections once their calls are done.
    stop: CancellationToken,
    /// Cuts every connection, calls and all.
    sever: CancellationToken,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
    drain_timeout: Duration,
    finished: bool,
}

impl RunningPluginServer {
    /// The DRA socket: the endpoint registration gives the kubelet.
    pub fn dra_socket(&self) -> &Path {
        self.dra_socket.path()
    }

    pub fn registration_socket(&self) -> &Path {
        self.registration_socket.path()
    }

    /// The TCP address health is served on, with the port the system picked for port 0.
    pub fn health_addr(&self) -> Option<SocketAddr> {
        self.health_addr
    }

    /// What the kubelet last said about our registration, and its changes (for `/readyz`).
    pub fn registration(&self) -> watch::Receiver<RegistrationState> {
        self.registration.clone()
    }

    /// Calls admitted and not yet answered.
    pub fn calls_in_flight(&self) -> usize {
        self.gate.in_flight()
    }

    /// Device health streams open now (each kubelet keeps one).
    pub fn health_streams(&self) -> usize {
        self.health_streams.open()
    }

    /// Refuses new calls with UNAVAILABLE and reports NOT_SERVING; calls in flight go on;
    /// device health streams end (cleanly: the kubelet sees the stream's end, no error).
    /// [`shutdown`](Self::shutdown) does this first; calling it earlier (on SIGTERM,
    /// say) is harmless.
    pub async fn begin_shutdown(&self) {
        self.gate.close();
        self.health.set(ServingStatus::NotServing).await;
        tracing::info!(
            in_flight = self.gate.in_flight(),
            "kubelet plugin shutting down: refusing new calls"
        );
    }

    /// Begins shutdown, waits for calls in flight (at most the drain timeout), stops the
    /// servers and removes the socket files.
    pub async fn shutdown(mut self) -> ShutdownReport {
        self.begin_shutdown().await;
        let drained = self.gate.drained(self.drain_timeout).await;
        let abandoned_calls = if drained { 0 } else { self.gate.in_flight() };
        if !drained {
            tracing::warn!(
                abandoned_calls,
                timeout = ?self.drain_timeout,
                "calls still in flight after the drain timeout; stopping anyway"
            );
        }
        self.stop.cancel();
        if !drained {
            // Those calls would hold their connections open: cut them now.
            self.sever.cancel();
        }
        self.stop_servers().await;
        self.remove_sockets();
        self.finished = true;
        tracing::info!(drained, "kubelet plugin stopped");
        ShutdownReport {
            drained,
            abandoned_calls,
        }
    }

    /// Waits for the servers to end: gracefully, then by cutting connections, then by
    /// aborting the tasks, each step bounded by [`STOP_GRACE`].
    async fn stop_servers(&mut self) {
        let tasks = std::mem::take(&mut self.tasks);
        let aborts: Vec<_> = tasks
            .iter()
            .map(|(name, task)| (*name, task.abort_handle()))
            .collect();
        let mut all = futures::future::join_all(tasks.into_iter().map(|(_, task)| task));
        if tokio::time::timeout(STOP_GRACE, &mut all).await.is_ok() {
            return;
        }
        self.sever.cancel();
        if tokio::time::timeout(STOP_GRACE, &mut all).await.is_ok() {
            return;
        }
        for (name, abort) in aborts {
            if !abort.is_finished() {
                abort.abort();
                tracing::warn!(server = name, "server did not stop; aborted");
            }
        }
    }

    fn remove_sockets(&self) {
        self.registration_socket.remove();
        self.dra_socket.remove();
    }
}

impl Drop for RunningPluginServer {
    fn drop(&mut self) {
        if !self.finished {
            self.gate.close();
            self.stop.cancel();
            self.sever.cancel();
            self.remove_sockets();
        }
    }
}
