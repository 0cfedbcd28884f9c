//! `domaind run`: the node daemon. Kubelet DRA plugin, gossip member and IMEX
//! supervisor in one process.
//!
//! Start-up order matters: the checkpoint and the clique are read before gossip starts
//! (a node joins its clique's gossip ring, and rejoins its domains from the
//! checkpoint), and the kubelet's sockets open last, once prepare calls can be served.
//! A graceful stop runs the other way: refuse new calls, retract this node from its
//! domains so peers drop it at once, stop IMEX, flush the checkpoint, stop gossip, and
//! (Kubernetes backend) stop publishing slices, deleting them if told to.

mod args;
mod http;
mod info;
mod ports;
mod readiness;
pub mod seeds;
mod state;
mod tls;
mod vitals;

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use actix::Actor;
use anyhow::Context as _;
use domaind_actors::model::CliqueId;
use domaind_actors::{Depart, NodeActor, NodeConfig, Ports};
use domaind_gossip::identity::IMEX_SHARED_NAME;
use domaind_gossip::pulse::PulseTiming;
use domaind_gossip::tls::NodeTls;
use domaind_gossip::transport::TransportLimits;
use domaind_gossip::{EagerGossip, GossipConfig, GossipNode, cluster_id_for_clique};
use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use tokio::signal::unix::{SignalKind, signal};
use tokio_util::sync::CancellationToken;
use tracing::{error, info, warn};

pub use args::{
    Addressing, Backend, ChannelNodes, DEFAULT_STATE_ADDR, DialledNames, ImexTls, Readiness,
    RunArgs, SeedDiscovery, SlicesOnExit, TlsMode,
};
pub use info::RunInfo;
pub use ports::{GossipPort, SystemClock};
pub use seeds::{SeedPlan, StaticSeeds};
pub use state::{
    CheckpointView, DomainView, GossipView, HandedChannel, ImexView, NodeView, SharedImexView,
};
pub use vitals::Vitals;

use domaind_backends::kube::{KubeBackend, KubeSettings};
use domaind_backends::local::{
    LocalClaimExistence, LocalClaimSource, LocalDir, LocalEventSink, LocalStaleClaimNotices,
    LocalStatusSink,
};
use domaind_backends::stale::{NodeClaims, StaleClaimChecker};
use domaind_checkpoint::{CheckpointConfig, FileCheckpointStore};
use domaind_gpu::GpuInventory;
use domaind_imex::{AddressingMode, Command, ImexDaemon, ImexSettings};
use domaind_kubelet_plugin::{DriverName, KubeletPluginServer, PluginServerConfig};
use domaind_prepare::cdi::CdiWriter;
use domaind_prepare::devices::{ChannelDevices, DeviceRoots};
use domaind_prepare::{ChannelInjection, PrepareService};

/// How often the TLS files are checked for rotation.
const TLS_RELOAD_INTERVAL: Duration = Duration::from_secs(10);
/// How long to wait for a clique while the GPUs' fabric registration is under way.
const CLIQUE_WAIT: Duration = Duration::from_secs(120);
/// Pulse rounds to keep gossiping after retracting: the retraction is pushed at once,
/// and this leaves time for relays and for repeating a push that was lost.
const RETRACT_ROUNDS: u32 = 10;

/// Runs the daemon until SIGTERM or SIGINT.
pub fn run(args: RunArgs) -> anyhow::Result<()> {
    // Before anything records a metric.
    let metrics = PrometheusBuilder::new()
        .install_recorder()
        .context("cannot install the metrics recorder")?;
    // actix actors stay on this thread; tokio::spawn work (gossip, gRPC, HTTP) runs on
    // the workers.
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_multi_thread()
            .enable_all()
            .build()
            .expect("cannot build the tokio runtime")
    });
    // A panic on any thread or task ends the process (see `vitals`).
    let vitals = Arc::new(Vitals::default());
    vitals::install_panic_hook(vitals.clone());
    system.block_on(serve(args, metrics, vitals))
}

async fn serve(
    args: RunArgs,
    metrics: PrometheusHandle,
    vitals: Arc<Vitals>,
) -> anyhow::Result<()> {
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
    let clique = discover_clique(&args).await?;
    info!(clique = %clique, "clique discovered");

    // Opens whatever the state directory's state: a full or read-only one is served
    // from memory and reported (readiness, /state, metrics, events), not fatal.
    let checkpoint = FileCheckpointStore::open(CheckpointConfig::new(&args.state_dir))
        .with_context(|| format!("cannot open the checkpoint in {}", args.state_dir.display()))?;
    let persistence = checkpoint.persistence();
    let checkpoint_events = checkpoint.clone();

    let injection = channel_injection(&args)?;
    let cdi = CdiWriter::new(&args.cdi_dir, &args.kube.driver_name)
        .with_context(|| format!("invalid driver name {:?}", args.kube.driver_name))?;
    for stale in cdi.remove_stale_temp_files().unwrap_or_default() {
        info!(file = %stale, "removed a CDI file an interrupted write left");
    }

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
    let mut gossip_config = GossipConfig::new(
        node.clone(),
        SocketAddr::new(args.pod_ip, args.gossip_port),
        cluster_id.clone(),
    );
    if let Some((addresses, names)) = &static_names {
        let resolved = names.resolve().await;
        gossip_config.seeds = addresses
            .iter()
            .chain(&resolved)
            .map(ToString::to_string)
            .collect();
    }
    gossip_config.timing.gossip_interval = args.gossip_interval;
    gossip_config.timing.pulse = PulseTiming {
        interval: args.pulse_interval,
        dead_after: args.gossip_dead_after,
    };
    gossip_config.timing.eager = eager_gossip(args.gossip_push_fanout);
    let gossip = Arc::new(
        GossipNode::start_tls(gossip_config, tls, gossip_limits(&args))
            .await
            .context("cannot start gossip")?,
    );
    let _gossip_watch = vitals::watch_gossip(vitals.clone(), &gossip);
    let stop_seeds = CancellationToken::new();
    let static_resolving = static_names
        .filter(|(_, names)| !names.is_empty())
        .map(|(_, names)| {
            tokio::spawn(names.follow(gossip.clone(), seeds::RESOLVE_INTERVAL, stop_seeds.clone()))
        });

    let imex = Arc::new(ImexDaemon::with_credentials(
        imex_settings(&args, &paths.cert)?,
        imex_credentials,
    ));
    let imex_catching_up = imex.catching_up();
    let mut kube = None;
    let mut local_dir = None;
    let ports = match args.backend {
        Backend::Kube => {
            let client = domaind_kube_api::client().await?;
            let mut backend = KubeBackend::start(
                client,
                KubeSettings {
                    node: node.to_string(),
                    driver: args.kube.driver_name.clone(),
                    clique: clique.0.clone(),
                    channel_devices: args.channel_devices,
                    gossip_addr: Some(gossip.gossip_addr()),
                    default_readiness: args.default_readiness.into(),
                    api_timeout: args.kube.kube_api_timeout,
                    reconcile_timeout: args.reconcile_timeout,
                },
                checkpoint,
                cdi.clone(),
            );
            if seed_plan == SeedPlan::ApiServer {
                backend.discover_seeds(gossip.clone());
            }
            let ports = Ports {
                gossip: Arc::new(GossipPort(gossip.clone())),
                imex,
                status: backend.status.clone(),
                events: backend.events.clone(),
                claims: backend.claims.clone(),
                checkpoint: backend.checkpoint.clone(),
                clock: Arc::new(SystemClock),
            };
            kube = Some(backend);
            ports
        }
        Backend::Local => {
            let dir = LocalDir::new(
                args.local_dir
                    .clone()
                    .context("--local-dir is required with --backend local")?,
            );
            local_dir = Some(dir.clone());
            Ports {
                gossip: Arc::new(GossipPort(gossip.clone())),
                imex,
                status: Arc::new(LocalStatusSink::new(dir.clone())),
                events: Arc::new(LocalEventSink::new(dir.clone(), node.as_str())),
                claims: Arc::new(LocalClaimSource::new(
                    dir,
                    node.as_str(),
                    &args.kube.driver_name,
                )),
                checkpoint: Arc::new(checkpoint),
                clock: Arc::new(SystemClock),
            }
        }
    };
    // Before the node actor loads the checkpoint: damage found there is told.
    checkpoint_events.report_events_to(node.as_str(), ports.events.clone());
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
    let mut config = NodeConfig::new(node.as_str(), args.pod_ip, clique);
    config.max_slots = args.max_slots;
    config.channels = args.channel_devices;
    config.channel_settle = args.channel_settle;
    config.default_readiness = args.default_readiness.into();
    config.prepare_deadline = args.prepare_deadline;
    config.imex_poll.steady = args.imex_poll_steady;
    // Never slower while unready than when ready: a short steady interval (a
    // measurement of the old schedule) shortens both.
    config.imex_poll.unready = config.imex_poll.unready.min(args.imex_poll_steady);
    let node_actor = NodeActor::new(config, ports).start();

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
    let (state_addr, state_task) = match args.state_addr.0 {
        Some(addr) => {
            let (bound, task) = http::serve_state(
                addr,
                node_actor.clone(),
                gossip.clone(),
                cluster_id,
                persistence,
                stop_http.clone(),
            )
            .await
            .with_context(|| format!("cannot listen on {addr} (--state-addr)"))?;
            (Some(bound), Some(task))
        }
        None => (None, None),
    };

    let plugin = Arc::new(PrepareService::new(
        node_actor.clone(),
        node.as_str(),
        cdi,
        injection,
    ));
    let stop_stale = CancellationToken::new();
    let stale_task = if args.stale_claim_check_interval.is_zero() {
        None
    } else {
        let claims = Arc::new(NodeClaims::new(node_actor.clone(), plugin.clone()));
        let checker = match (&kube, &local_dir) {
            (Some(kube), _) => Some(kube.stale_claims(claims)),
            (None, Some(dir)) => Some(StaleClaimChecker::new(
                Arc::new(LocalClaimExistence::new(dir.clone())),
                claims,
                Arc::new(LocalStaleClaimNotices::new(dir.clone(), node.as_str())),
            )),
            (None, None) => None,
        };
        checker.map(|checker| {
            tokio::spawn(checker.run(args.stale_claim_check_interval, stop_stale.clone()))
        })
    };
    let plugin_server = KubeletPluginServer::start(
        PluginServerConfig {
            driver_name: DriverName::new(args.kube.driver_name.clone())?,
            plugins_dir: args.kubelet_plugins_dir.clone(),
            registry_dir: args.kubelet_registry_dir.clone(),
            health_addr: args.health_grpc_addr,
            ..PluginServerConfig::default()
        },
        plugin,
    )
    .await
    .context("cannot start the kubelet plugin")?;

    let info = RunInfo {
        pid: std::process::id(),
        node: node.to_string(),
        gossip_addr: gossip.gossip_addr(),
        http_addr,
        state_addr,
        dra_socket: plugin_server.dra_socket().to_owned(),
        registration_socket: plugin_server.registration_socket().to_owned(),
    };
    // Best effort: it tells tools where this daemon listens, and a full state directory
    // must not stop a daemon that can serve.
    if let Err(error) = info.write(&args.state_dir) {
        warn!(%error, dir = %args.state_dir.display(), "cannot write run.json; going on without it");
    }
    if args.ready_needs_kubelet {
        let registration = plugin_server.registration();
        let socket = plugin_server.registration_socket().to_owned();
        // Held before the process says it is ready, so that /readyz is never 200 first.
        readiness.hold(
            readiness::KUBELET,
            readiness::registration_hold(&registration.borrow(), &socket),
        );
        tokio::spawn(readiness::hold_while(
            registration,
            readiness.clone(),
            readiness::KUBELET,
            move |state| readiness::registration_hold(state, &socket),
        ));
    }
    readiness.set(true);
    info!(
        gossip = %info.gossip_addr,
        http = %info.http_addr,
        state = ?info.state_addr,
        dra_socket = %info.dra_socket.display(),
        registration_socket = %info.registration_socket.display(),
        "domaind ready"
    );

    let fault = until_stop(wait_for_signal(), &vitals).await?;
    if let Some(fault) = &fault {
        readiness.fail(fault.clone());
    }
    readiness.set(false);
    // No release races the departure (it would leave a domain the node is leaving).
    stop_stale.cancel();
    if let Some(task) = stale_task {
        let _ = task.await;
    }
    let graceful = async {
        plugin_server.begin_shutdown().await;
        if node_actor.send(Depart).await.is_err() {
            warn!("the node actor was already gone");
        }
        // Peers learn of the retraction by gossip: keep gossiping a few rounds. After a
        // fault gossip may be what died, and the restart matters more.
        if fault.is_none() {
            tokio::time::sleep(args.pulse_interval * RETRACT_ROUNDS).await;
        }
        stop_seeds.cancel();
        if let Some(task) = static_resolving {
            let _ = task.await;
        }
        if let Err(error) = gossip.stop().await {
            warn!(%error, "gossip did not stop cleanly");
        }
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
    if let Some(renewal) = gossip_tls.renewal {
        let _ = renewal.await;
    }
    stop_http.cancel();
    let _ = http_task.await;
    if let Some(task) = state_task {
        let _ = task.await;
    }
    // A panic during the stop is still a fault.
    outcome(fault.or_else(|| vitals.failure()))
}

/// Waits for a stop signal or a fatal fault, whichever comes first; the fault, if it
/// was one.
async fn until_stop(
    signal: impl std::future::Future<Output = anyhow::Result<&'static str>>,
    vitals: &Vitals,
) -> anyhow::Result<Option<String>> {
    tokio::select! {
        signal = signal => {
            info!(signal = signal?, "stopping gracefully");
            Ok(None)
        }
        fault = vitals.failed() => {
            error!(%fault, "a fatal fault; exiting so that the node is restarted");
            Ok(Some(fault))
        }
    }
}

/// What `run` returns: an error after a fault, so that the process exits non-zero.
fn outcome(fault: Option<String>) -> anyhow::Result<()> {
    match fault {
        None => {
            info!("domaind stopped");
            Ok(())
        }
        Some(fault) => Err(anyhow::anyhow!(
            "domaind stopped after a fatal fault: {fault}"
        )),
    }
}

async fn wait_for_signal() -> anyhow::Result<&'static str> {
    let mut term = signal(SignalKind::terminate()).context("cannot handle SIGTERM")?;
    let mut int = signal(SignalKind::interrupt()).context("cannot handle SIGINT")?;
    Ok(tokio::select! {
        _ = term.recv() => "SIGTERM",
        _ = int.recv() => "SIGINT",
    })
}

/// The node's clique, from the fake topology or NVML. While the GPUs' fabric
/// registration is under way the answer is transient: ask again, for a while.
async fn discover_clique(args: &RunArgs) -> anyhow::Result<CliqueId> {
    let inventory: Arc<dyn GpuInventory> = Arc::from(domaind_gpu::open_inventory(
        args.gpu_topology.as_deref(),
        args.node_name.as_str(),
        &args.nvml_library,
        &args.driver_root,
    )?);
    let deadline = tokio::time::Instant::now() + CLIQUE_WAIT;
    let mut delay = Duration::from_millis(500);
    loop {
        let asking = inventory.clone();
        let answer = tokio::task::spawn_blocking(move || asking.clique())
            .await
            .context("the GPU query panicked")?;
        match answer {
            Ok(clique) => return Ok(clique),
            Err(error) if error.is_transient() && tokio::time::Instant::now() < deadline => {
                info!(%error, retry_in = ?delay, "clique not known yet");
                tokio::time::sleep(delay).await;
                delay = (delay * 2).min(Duration::from_secs(10));
            }
            Err(error) => return Err(error).context("cannot learn this node's NVLink clique"),
        }
    }
}

fn channel_injection(args: &RunArgs) -> anyhow::Result<ChannelInjection> {
    let roots = DeviceRoots {
        proc_devices: args.proc_devices.clone(),
        dev: args.dev_root.clone(),
    };
    let explain = || {
        format!(
            "cannot find the IMEX channel device's major in {}: is the NVIDIA driver loaded? \
             (machines without it can pass --proc-devices with a file that lists \
             nvidia-caps-imex-channels)",
            args.proc_devices.display()
        )
    };
    let (major, nodes) = match args.channel_nodes {
        ChannelNodes::Create => {
            let devices = ChannelDevices::open(roots).with_context(explain)?;
            (devices.major(), Some(devices))
        }
        ChannelNodes::Skip => (roots.imex_channels_major().with_context(explain)?, None),
    };
    Ok(ChannelInjection {
        major,
        nodes,
        all_channels: args.all_channels,
    })
}

/// The gossip transport's limits: its outbound connections leave IMEX's ports alone
/// (see [`TransportLimits::avoid_source_ports`]).
fn gossip_limits(args: &RunArgs) -> TransportLimits {
    TransportLimits {
        avoid_source_ports: vec![args.imex_port, args.imex_cmd_port],
        ..TransportLimits::default()
    }
}

fn imex_settings(args: &RunArgs, gossip_cert: &Path) -> anyhow::Result<ImexSettings> {
    let config_dir = args
        .imex_config_dir
        .clone()
        .unwrap_or_else(|| args.state_dir.join("imex"));
    let mut settings = ImexSettings::new(&config_dir, args.pod_ip);
    // The daemon dies with this process, even on SIGKILL (docs/ARCHITECTURE.md, "IMEX
    // daemon").
    settings.guard = Some(
        Command::new(std::env::current_exe().context("cannot find this binary")?)
            .arg(domaind_imex::guard::SUBCOMMAND),
    );
    settings.runner = args.imex_runner.clone();
    settings.host_service = args.imex_host_unit()?;
    settings.server_port = args.imex_port;
    settings.cmd_port = args.imex_cmd_port;
    settings.max_slots = args.max_slots;
    settings.mode = match args.imex_addressing {
        Addressing::DnsNames => AddressingMode::DnsNames,
        Addressing::Ips => AddressingMode::Ips,
    };
    let simulator = match (&args.imex_sim, args.imex_sim_builtin) {
        (Some(sim), _) => Some(Command::new(sim)),
        (None, true) => Some(
            Command::new(std::env::current_exe().context("cannot find this binary")?)
                .arg("imex-sim"),
        ),
        (None, false) => None,
    };
    let dialled = args.imex_dialled(gossip_cert);
    settings.tls = args.imex_tls.enabled(dialled);
    settings.shared_name = dialled
        == DialledNames::SharedName {
            in_certificate: true,
        };
    match (args.imex_tls, settings.tls, dialled) {
        (ImexTls::Off, _, _) => info!("IMEX's links run in the clear (--imex-tls off)"),
        (
            _,
            true,
            DialledNames::SharedName {
                in_certificate: false,
            },
        ) => warn!(
            cert = %gossip_cert.display(),
            name = IMEX_SHARED_NAME,
            "IMEX's links run over mutual TLS (--imex-tls on), but this node's certificate \
             does not carry IMEX's shared name, so nvidia-imex checks each peer's \
             certificate against the slot name it dialled, which no certificate carries: \
             its peers will refuse it (--imex-shared-name asks for the name)"
        ),
        (
            _,
            true,
            DialledNames::Ips {
                in_certificate: false,
            },
        ) => warn!(
            cert = %gossip_cert.display(),
            ip = %args.pod_ip,
            "IMEX's links run over mutual TLS (--imex-tls on), but IMEX checks each peer's \
             certificate against the IP it dialled, which this node's certificate does not \
             carry: its peers will refuse it"
        ),
        (_, true, _) => {
            info!("IMEX's links run over mutual TLS with this node's gossip certificate")
        }
        // The default for one release: not a fault, but what keeps IMEX in the clear.
        (_, false, DialledNames::SharedName { .. }) if !args.imex_shared_name => info!(
            name = IMEX_SHARED_NAME,
            "IMEX's links run in the clear: in DNS-names mode IMEX checks each peer's \
             certificate against IMEX's shared name, which a node's certificate carries only \
             when issued with --imex-shared-name (`domaind run` with --tls-mode csr, \
             `domaind certs issue`; chart value node.imex.sharedName). It is off by default \
             because daemons of the previous release refuse gossip from a certificate with a \
             second DNS name: turn it on once every node runs this release"
        ),
        (_, false, DialledNames::SharedName { .. }) => warn!(
            cert = %gossip_cert.display(),
            name = IMEX_SHARED_NAME,
            "IMEX's links run in the clear: in DNS-names mode IMEX checks each peer's \
             certificate against IMEX's shared name, which this node's certificate does not \
             carry (--tls-mode csr asks for it with --imex-shared-name; `domaind certs issue \
             --imex-shared-name` in files mode)"
        ),
        (_, false, DialledNames::Ips { .. }) => warn!(
            cert = %gossip_cert.display(),
            ip = %args.pod_ip,
            "IMEX's links run in the clear: IMEX checks each peer's certificate against the \
             IP it dialled, and this node's certificate does not carry --pod-ip as an IP SAN \
             (--tls-mode csr asks for it; `domaind certs issue --ip` in files mode)"
        ),
    }
    match simulator {
        Some(sim) => {
            settings.daemon = sim.clone();
            settings.ctl = sim.arg("ctl");
            // The simulator resolves slot names through its own hosts file, never the
            // machine's.
            settings.hosts_file = args
                .imex_hosts_file
                .clone()
                .unwrap_or_else(|| config_dir.join("hosts"));
            settings.daemon_env = vec![(
                domaind_imex::hosts::SIM_HOSTS_ENV.into(),
                settings.hosts_file.display().to_string(),
            )];
        }
        None => {
            settings.daemon = Command::new(&args.imex_bin);
            settings.ctl = Command::new(&args.imex_ctl);
            settings.hosts_file = args
                .imex_hosts_file
                .clone()
                .unwrap_or_else(|| PathBuf::from("/etc/hosts"));
        }
    }
    Ok(settings)
}

/// `--gossip-push-fanout`: 0 is eager gossip off, relays included.
fn eager_gossip(push_fanout: usize) -> EagerGossip {
    if push_fanout == 0 {
        EagerGossip::OFF
    } else {
        EagerGossip {
            origin_fanout: push_fanout,
            ..EagerGossip::default()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_fault_stops_the_daemon_with_an_error_and_a_signal_without() {
        let vitals = Vitals::default();
        let waiting = until_stop(std::future::pending(), &vitals);
        vitals.fail("gossip stopped: Chitchat server panicked");
        let fault = waiting.await.unwrap();
        let error = outcome(fault).unwrap_err().to_string();
        assert!(
            error.contains("gossip stopped: Chitchat server panicked"),
            "{error}"
        );

        let signalled = until_stop(async { Ok("SIGTERM") }, &Vitals::default()).await;
        assert_eq!(signalled.unwrap(), None);
        assert!(outcome(None).is_ok());
    }

    #[test]
    fn a_push_fanout_of_zero_turns_eager_gossip_off() {
        assert_eq!(eager_gossip(0), EagerGossip::OFF);
        let rack = eager_gossip(17);
        assert_eq!(rack, EagerGossip::default());
        let small = eager_gossip(4);
        assert_eq!(small.origin_fanout, 4);
        assert_eq!(small.relay_fanout, EagerGossip::default().relay_fanout);
    }
}
