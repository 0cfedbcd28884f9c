//! The node daemon's parts, started in the order they depend on each other and stopped
//! in the reverse: each step below is one boundary (TLS, gossip, a backend, the node
//! actor, the servers), so that `start` reads as the order of start-up. The parts
//! bound to the node's clique (gossip, the slices and seeds, the node actor's domains)
//! move with it when it changes ([`moving`]).

mod moving;

use std::net::SocketAddr;
use std::sync::Arc;

use actix::{Actor, Addr};
use anyhow::Context as _;
use domaind_actors::model::CliqueId;
use domaind_actors::ports::Imex;
use domaind_actors::{Depart, NodeActor, NodeConfig, Ports};
use domaind_backends::kube::{KubeBackend, KubeSettings, TaintTiming};
use domaind_backends::local::{
    LocalClaimExistence, LocalClaimSource, LocalDir, LocalEventSink, LocalStaleClaimNotices,
    LocalStatusSink,
};
use domaind_backends::stale::{NodeClaims, StaleClaimChecker};
use domaind_checkpoint::{CheckpointConfig, FileCheckpointStore};
use domaind_gossip::pulse::PulseTiming;
use domaind_gossip::tls::NodeTls;
use domaind_gossip::{GossipConfig, GossipNode, cluster_id_for_clique};
use domaind_imex::ImexDaemon;
use domaind_kubelet_plugin::{
    DriverName, KubeletPluginServer, PluginServerConfig, RunningPluginServer,
};
use domaind_prepare::PrepareService;
use domaind_prepare::cdi::CdiWriter;
use metrics_exporter_prometheus::PrometheusHandle;
use tokio::sync::{Notify, mpsc, watch};
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

use super::clique::{CliqueMove, CliqueTiming, CliqueWatch, InventoryReader, ObservedImex};
use super::device_health;
use super::seeds::{self, SeedPlan, StaticSeeds};
use super::vitals::{self, Vitals};
use super::{
    Backend, GossipPort, RETRACT_ROUNDS, RunArgs, RunInfo, SlicesOnExit, SystemClock,
    TLS_RELOAD_INTERVAL, channel_injection, discover_clique, eager_gossip, gossip_limits, http,
    imex_settings, open_inventory, outcome, readiness, tls, until_stop, wait_for_signal,
};

/// A task that runs until its token is cancelled.
struct Background {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

impl Background {
    async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Gossip and what follows its seeds.
struct GossipPlane {
    node: Arc<GossipNode>,
    seed_plan: SeedPlan,
    cluster_id: String,
    /// Re-resolves static seed names while the daemon runs.
    static_resolving: Option<Background>,
    /// Records the gossip task's end as a fatal fault ([`vitals::watch_gossip`]).
    watch: JoinHandle<()>,
}

impl GossipPlane {
    /// What `/state` shows of it.
    fn view(&self) -> http::StateGossip {
        http::StateGossip {
            node: self.node.clone(),
            cluster_id: self.cluster_id.clone(),
        }
    }
}

/// The clique watch, and the moves it decides.
struct CliqueWatching {
    watch: Background,
    moves: mpsc::Receiver<CliqueMove>,
}

/// Where claims and status go: the backend's ports, and what the stop and the stale
/// claim check need of it.
struct BackendPorts {
    ports: Ports,
    kube: Option<KubeBackend>,
    local_dir: Option<LocalDir>,
}

/// The HTTP servers: health and metrics, and the optional state endpoint.
struct HttpServers {
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    http_addr: SocketAddr,
    state_addr: Option<SocketAddr>,
}

/// What `domaind run` started, in the order it stops them.
pub(super) struct Daemon {
    args: RunArgs,
    vitals: Arc<Vitals>,
    readiness: Arc<http::Readiness>,
    node_actor: Addr<NodeActor>,
    /// For gossip started anew in another clique.
    tls: Arc<NodeTls>,
    gossip: GossipPlane,
    /// The gossip plane `/state` reports: the one of the moment.
    state_gossip: watch::Sender<http::StateGossip>,
    clique_watch: Option<CliqueWatching>,
    plugin_server: RunningPluginServer,
    kube: Option<KubeBackend>,
    stale_check: Option<Background>,
    http: HttpServers,
    stop_certs: CancellationToken,
    certificate_renewal: Option<JoinHandle<()>>,
}

impl Daemon {
    pub(super) async fn start(
        args: RunArgs,
        metrics: PrometheusHandle,
        vitals: Arc<Vitals>,
    ) -> anyhow::Result<Self> {
        let node = args.node_name.clone();
        info!(node = %node, ip = %args.pod_ip, backend = ?args.backend, "domaind starting");

        let stop_certs = CancellationToken::new();
        let gossip_tls = tls::prepare(&args, &metrics, &stop_certs).await?;
        let paths = gossip_tls.paths.clone();
        let tls = NodeTls::load(paths.clone(), node.clone()).with_context(|| {
            format!(
                "cannot load gossip TLS files for node {node}: {}, {}, {}",
                paths.ca_cert.display(),
                paths.cert.display(),
                paths.key.display()
            )
        })?;
        let _reloader = tls.spawn_reloader(TLS_RELOAD_INTERVAL);
        // IMEX's links follow the certificate gossip accepted, through every rotation.
        let imex_credentials = tls.files();
        let inventory = open_inventory(&args)?;
        let clique = discover_clique(&inventory).await?;
        info!(clique = %clique, "clique discovered");

        // Opens whatever the state directory's state: a full or read-only one is served
        // from memory and reported (readiness, /state, metrics, events), not fatal.
        let checkpoint = FileCheckpointStore::open(CheckpointConfig::new(&args.state_dir))
            .with_context(|| {
                format!("cannot open the checkpoint in {}", args.state_dir.display())
            })?;
        let persistence = checkpoint.persistence();
        let checkpoint_events = checkpoint.clone();

        let injection = channel_injection(&args)?;
        let cdi = CdiWriter::new(&args.cdi_dir, &args.kube.driver_name)
            .with_context(|| format!("invalid driver name {:?}", args.kube.driver_name))?;
        for stale in cdi.remove_stale_temp_files().unwrap_or_default() {
            info!(file = %stale, "removed a CDI file an interrupted write left");
        }

        let gossip = start_gossip(&args, &clique, tls.clone(), &vitals).await?;
        let state_gossip = watch::Sender::new(gossip.view());

        let imex = Arc::new(ImexDaemon::with_credentials(
            imex_settings(&args, &paths.cert)?,
            imex_credentials,
        ));
        let imex_catching_up = imex.catching_up();
        let imex_failing = Arc::new(Notify::new());
        let imex: Arc<dyn Imex> = Arc::new(ObservedImex::new(imex, imex_failing.clone()));
        let backend = start_backend(&args, &clique, &gossip, imex, checkpoint, &cdi).await?;
        // Before the node actor loads the checkpoint: damage found there is told.
        checkpoint_events.report_events_to(node.as_str(), backend.ports.events.clone());
        let readiness = Arc::new(http::Readiness::default());
        let _persistence_readiness = tokio::spawn(readiness::hold_while(
            persistence.clone(),
            readiness.clone(),
            "checkpoint",
            readiness::persistence_hold,
        ));
        let _imex_readiness = tokio::spawn(readiness::hold_while(
            imex_catching_up,
            readiness.clone(),
            "imex",
            readiness::catch_up_hold,
        ));
        let (device_health, _follows_health) = device_health::follow(&backend.ports.health);
        let node_actor = NodeActor::new(node_config(&args, clique.clone()), backend.ports).start();

        let stop_http = CancellationToken::new();
        let (http_addr, http_task) = http::serve(
            args.http.http_addr,
            metrics,
            node_actor.clone(),
            readiness.clone(),
            vitals.clone(),
            stop_http.clone(),
        )
        .await
        .with_context(|| format!("cannot listen on {} (--http-addr)", args.http.http_addr))?;
        let mut http = HttpServers {
            stop: stop_http,
            tasks: vec![http_task],
            http_addr,
            state_addr: None,
        };
        if let Some(addr) = args.state_addr.0 {
            let (bound, task) = http::serve_state(
                addr,
                node_actor.clone(),
                state_gossip.subscribe(),
                persistence,
                http.stop.clone(),
            )
            .await
            .with_context(|| format!("cannot listen on {addr} (--state-addr)"))?;
            http.state_addr = Some(bound);
            http.tasks.push(task);
        }

        let plugin = Arc::new(PrepareService::new(
            node_actor.clone(),
            node.as_str(),
            cdi,
            injection,
        ));
        let stale_check = start_stale_check(
            &args,
            &node_actor,
            &plugin,
            backend.kube.as_ref(),
            backend.local_dir.as_ref(),
        );
        let plugin_server = KubeletPluginServer::start(
            PluginServerConfig {
                driver_name: DriverName::new(args.kube.driver_name.clone())?,
                plugins_dir: args.kubelet_plugins_dir.clone(),
                registry_dir: args.kubelet_registry_dir.clone(),
                health_addr: args.health_grpc_addr,
                device_health,
                ..PluginServerConfig::default()
            },
            plugin,
        )
        .await
        .context("cannot start the kubelet plugin")?;

        let clique_watch = watch_clique(&args, inventory, &clique, imex_failing);
        let daemon = Daemon {
            args,
            vitals,
            readiness,
            node_actor,
            tls,
            gossip,
            state_gossip,
            clique_watch,
            plugin_server,
            kube: backend.kube,
            stale_check,
            http,
            stop_certs,
            certificate_renewal: gossip_tls.renewal,
        };
        daemon.announce_ready();
        Ok(daemon)
    }

    /// Writes `run.json`: where this daemon listens.
    fn write_run_info(&self) -> RunInfo {
        let info = RunInfo {
            pid: std::process::id(),
            node: self.args.node_name.to_string(),
            gossip_addr: self.gossip.node.gossip_addr(),
            http_addr: self.http.http_addr,
            state_addr: self.http.state_addr,
            dra_socket: self.plugin_server.dra_socket().to_owned(),
            registration_socket: self.plugin_server.registration_socket().to_owned(),
        };
        // Best effort: it tells tools where this daemon listens, and a full state
        // directory must not stop a daemon that can serve.
        if let Err(error) = info.write(&self.args.state_dir) {
            warn!(%error, dir = %self.args.state_dir.display(), "cannot write run.json; going on without it");
        }
        info
    }

    /// Turns `/readyz` on (held while the kubelet has not registered the plugin, where
    /// asked), then writes `run.json`.
    fn announce_ready(&self) {
        if self.args.ready_needs_kubelet {
            let registration = self.plugin_server.registration();
            let socket = self.plugin_server.registration_socket().to_owned();
            // Held before the process says it is ready, so that /readyz is never 200 first.
            self.readiness.hold(
                readiness::KUBELET,
                readiness::registration_hold(&registration.borrow(), &socket),
            );
            tokio::spawn(readiness::hold_while(
                registration,
                self.readiness.clone(),
                readiness::KUBELET,
                move |state| readiness::registration_hold(state, &socket),
            ));
        }
        self.readiness.set(true);
        // Only now: whoever finds run.json (the chaos harness, tests, an operator's
        // script) may ask /readyz at once, and the file is visible from its rename,
        // before the directory's fsync returns.
        let info = self.write_run_info();
        info!(
            gossip = %info.gossip_addr,
            http = %info.http_addr,
            state = ?info.state_addr,
            dra_socket = %info.dra_socket.display(),
            registration_socket = %info.registration_socket.display(),
            "domaind ready"
        );
    }

    /// Serves until SIGTERM, SIGINT or a fatal fault, moving the node whenever its
    /// clique changes, then stops; an error after a fault, so that the process exits
    /// non-zero. A signal during a move is taken once the move is done.
    pub(super) async fn serve_until_stopped(mut self) -> anyhow::Result<()> {
        enum Next {
            Stop(anyhow::Result<Option<String>>),
            Move(CliqueMove),
        }
        let vitals = self.vitals.clone();
        let stopping = until_stop(wait_for_signal(), &vitals);
        tokio::pin!(stopping);
        let fault = loop {
            let moves = async {
                match self.clique_watch.as_mut() {
                    Some(watching) => watching.moves.recv().await,
                    None => std::future::pending().await,
                }
            };
            let next = tokio::select! {
                stopped = &mut stopping => Next::Stop(stopped),
                Some(moved) = moves => Next::Move(moved),
            };
            match next {
                Next::Stop(stopped) => break stopped?,
                Next::Move(moved) => self.move_clique(moved).await,
            }
        };
        if let Some(fault) = &fault {
            self.readiness.fail(fault.clone());
        }
        self.readiness.set(false);
        let vitals = self.vitals.clone();
        self.stop(fault.is_some()).await;
        // A panic during the stop is still a fault.
        outcome(fault.or_else(|| vitals.failure()))
    }

    async fn stop(self, after_fault: bool) {
        let Daemon {
            args,
            node_actor,
            gossip,
            clique_watch,
            plugin_server,
            kube,
            stale_check,
            http,
            stop_certs,
            certificate_renewal,
            ..
        } = self;
        if let Some(watching) = clique_watch {
            watching.watch.stop().await;
        }
        // No release races the departure (it would leave a domain the node is leaving).
        if let Some(check) = stale_check {
            check.stop().await;
        }
        let graceful = async {
            plugin_server.begin_shutdown().await;
            if node_actor.send(Depart).await.is_err() {
                warn!("the node actor was already gone");
            }
            // Peers learn of the retraction by gossip: keep gossiping a few rounds.
            // After a fault gossip may be what died, and the restart matters more.
            if !after_fault {
                tokio::time::sleep(args.pulse_interval * RETRACT_ROUNDS).await;
            }
            if let Some(resolving) = gossip.static_resolving {
                resolving.stop().await;
            }
            if let Err(error) = gossip.node.stop().await {
                warn!(%error, "gossip did not stop cleanly");
            }
            gossip.watch.abort();
            plugin_server.shutdown().await;
            if let Some(kube) = kube {
                kube.stop(args.slices_on_exit == SlicesOnExit::Delete).await;
            }
        };
        if tokio::time::timeout(args.shutdown_timeout, graceful)
            .await
            .is_err()
        {
            error!(timeout = ?args.shutdown_timeout, "graceful stop timed out; exiting anyway");
        }
        RunInfo::remove(&args.state_dir);
        stop_certs.cancel();
        if let Some(renewal) = certificate_renewal {
            let _ = renewal.await;
        }
        http.stop.cancel();
        for task in http.tasks {
            let _ = task.await;
        }
    }
}

/// Joins the clique's gossip ring over TLS, seeded as the seed plan says; its end,
/// unless asked for, is a fatal fault.
async fn start_gossip(
    args: &RunArgs,
    clique: &CliqueId,
    tls: Arc<NodeTls>,
    vitals: &Arc<Vitals>,
) -> anyhow::Result<GossipPlane> {
    let node = args.node_name.clone();
    let cluster_id = cluster_id_for_clique(&clique.0);
    let seed_plan = seeds::plan(args.seed_discovery, args.backend, &clique.0, &args.seeds)?;
    seeds::announce(&seed_plan);
    let static_names = match &seed_plan {
        SeedPlan::Static(listed) => {
            let (addresses, names) = seeds::split(listed);
            Some((
                addresses,
                StaticSeeds::new(names, node.as_str(), seeds::system_resolver()),
            ))
        }
        SeedPlan::Nobody | SeedPlan::ApiServer => None,
    };
    let mut config = GossipConfig::new(
        node.clone(),
        SocketAddr::new(args.pod_ip, args.gossip_port),
        cluster_id.clone(),
    );
    if let Some((addresses, names)) = &static_names {
        let resolved = names.resolve().await;
        config.seeds = addresses
            .iter()
            .chain(&resolved)
            .map(ToString::to_string)
            .collect();
    }
    config.timing.gossip_interval = args.gossip_interval;
    config.timing.pulse = PulseTiming {
        interval: args.pulse_interval,
        dead_after: args.gossip_dead_after,
    };
    config.timing.eager = eager_gossip(args.gossip_push_fanout);
    let gossip = Arc::new(
        GossipNode::start_tls(config, tls, gossip_limits(args))
            .await
            .context("cannot start gossip")?,
    );
    let static_resolving = static_names
        .filter(|(_, names)| !names.is_empty())
        .map(|(_, names)| {
            let stop = CancellationToken::new();
            let task =
                tokio::spawn(names.follow(gossip.clone(), seeds::RESOLVE_INTERVAL, stop.clone()));
            Background { stop, task }
        });
    let watch = vitals::watch_gossip(vitals.clone(), &gossip);
    Ok(GossipPlane {
        node: gossip,
        seed_plan,
        cluster_id,
        static_resolving,
        watch,
    })
}

/// The clique watch (`clique/`), unless `--clique-check-interval` is zero.
fn watch_clique(
    args: &RunArgs,
    inventory: Arc<dyn domaind_gpu::GpuInventory>,
    clique: &CliqueId,
    imex_failing: Arc<Notify>,
) -> Option<CliqueWatching> {
    if args.clique_check_interval.is_zero() {
        info!("the NVLink clique is read once, at start (--clique-check-interval 0s)");
        return None;
    }
    let watch = CliqueWatch::new(
        InventoryReader(inventory),
        clique.clone(),
        CliqueTiming::every(args.clique_check_interval),
        imex_failing,
    );
    let (moves, taken) = mpsc::channel(1);
    let stop = CancellationToken::new();
    let task = tokio::spawn(watch.run(moves, stop.clone()));
    Some(CliqueWatching {
        watch: Background { stop, task },
        moves: taken,
    })
}

/// The ports the node actor works through, over the Kubernetes API or local files.
async fn start_backend(
    args: &RunArgs,
    clique: &CliqueId,
    gossip: &GossipPlane,
    imex: Arc<dyn Imex>,
    checkpoint: FileCheckpointStore,
    cdi: &CdiWriter,
) -> anyhow::Result<BackendPorts> {
    let node = args.node_name.as_str();
    let gossip_port = Arc::new(GossipPort(gossip.node.clone()));
    match args.backend {
        Backend::Kube => {
            let client = domaind_kube_api::client().await?;
            // One board: the node actor publishes on it; the slices' taint, the claims'
            // status and the kubelet's health stream read it.
            let health = domaind_actors::HealthBoard::default();
            let mut backend = KubeBackend::start(
                client,
                KubeSettings {
                    node: node.to_string(),
                    driver: args.kube.driver_name.clone(),
                    clique: clique.0.clone(),
                    channel_devices: args.channel_devices,
                    gossip_addr: Some(gossip.node.gossip_addr()),
                    default_readiness: args.default_readiness.into(),
                    api_timeout: args.kube.kube_api_timeout,
                    reconcile_timeout: args.reconcile_timeout,
                    imex_taint: TaintTiming {
                        after: args.imex_taint_after,
                        clear_after: args.imex_untaint_after,
                    },
                },
                checkpoint,
                cdi.clone(),
                health.subscribe(),
            );
            if gossip.seed_plan == SeedPlan::ApiServer {
                backend.discover_seeds(gossip.node.clone());
            }
            backend.write_claim_status(health.subscribe());
            let ports = Ports {
                gossip: gossip_port,
                imex,
                status: backend.status.clone(),
                events: backend.events.clone(),
                claims: backend.claims.clone(),
                checkpoint: backend.checkpoint.clone(),
                clock: Arc::new(SystemClock),
                health,
            };
            Ok(BackendPorts {
                ports,
                kube: Some(backend),
                local_dir: None,
            })
        }
        Backend::Local => {
            let dir = LocalDir::new(
                args.local_dir
                    .clone()
                    .context("--local-dir is required with --backend local")?,
            );
            let ports = Ports {
                gossip: gossip_port,
                imex,
                status: Arc::new(LocalStatusSink::new(dir.clone())),
                events: Arc::new(LocalEventSink::new(dir.clone(), node)),
                claims: Arc::new(LocalClaimSource::new(
                    dir.clone(),
                    node,
                    &args.kube.driver_name,
                )),
                checkpoint: Arc::new(checkpoint),
                clock: Arc::new(SystemClock),
                health: domaind_actors::HealthBoard::default(),
            };
            Ok(BackendPorts {
                ports,
                kube: None,
                local_dir: Some(dir),
            })
        }
    }
}

fn node_config(args: &RunArgs, clique: CliqueId) -> NodeConfig {
    let mut config = NodeConfig::new(args.node_name.as_str(), args.pod_ip, clique);
    config.max_slots = args.max_slots;
    config.channels = args.channel_devices;
    config.channel_settle = args.channel_settle;
    config.default_readiness = args.default_readiness.into();
    config.prepare_deadline = args.prepare_deadline;
    config.imex_poll.steady = args.imex_poll_steady;
    // Never slower while unready than when ready: a short steady interval (a
    // measurement of the old schedule) shortens both.
    config.imex_poll.unready = config.imex_poll.unready.min(args.imex_poll_steady);
    config
}

/// The periodic check for claims whose ResourceClaim (or local file) is gone; none
/// when its interval is zero.
fn start_stale_check(
    args: &RunArgs,
    node_actor: &Addr<NodeActor>,
    plugin: &Arc<PrepareService>,
    kube: Option<&KubeBackend>,
    local_dir: Option<&LocalDir>,
) -> Option<Background> {
    if args.stale_claim_check_interval.is_zero() {
        return None;
    }
    let claims = Arc::new(NodeClaims::new(node_actor.clone(), plugin.clone()));
    let checker = match (kube, local_dir) {
        (Some(kube), _) => kube.stale_claims(claims),
        (None, Some(dir)) => StaleClaimChecker::new(
            Arc::new(LocalClaimExistence::new(dir.clone())),
            claims,
            Arc::new(LocalStaleClaimNotices::new(
                dir.clone(),
                args.node_name.as_str(),
            )),
        ),
        (None, None) => return None,
    };
    let stop = CancellationToken::new();
    let task = tokio::spawn(checker.run(args.stale_claim_check_interval, stop.clone()));
    Some(Background { stop, task })
}
