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
pub mod clique;
mod daemon;
mod device_health;
mod http;
mod info;
mod ports;
mod readiness;
pub mod seeds;
mod state;
mod tls;
mod vitals;

use daemon::Daemon;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context as _;
use domaind_actors::model::CliqueId;
use domaind_gossip::EagerGossip;
use domaind_gossip::identity::IMEX_SHARED_NAME;
use domaind_gossip::transport::TransportLimits;
use metrics_exporter_prometheus::PrometheusBuilder;
use tokio::signal::unix::{SignalKind, signal};
use tracing::{error, info, warn};

pub use args::{
    Addressing, Backend, ChannelNodes, DEFAULT_STATE_ADDR, DialledNames, ImexTls, Readiness,
    RunArgs, SeedDiscovery, SlicesOnExit, TlsMode,
};
pub use info::RunInfo;
pub use ports::{GossipPort, SystemClock};
pub use seeds::{SeedPlan, StaticSeeds};
pub use state::{
    CheckpointView, DomainView, GossipStateView, GossipView, HandedChannel, ImexView, NodeView,
    SharedImexView,
};
pub use vitals::Vitals;

use domaind_gpu::GpuInventory;
use domaind_imex::{AddressingMode, Command, ImexSettings};
use domaind_prepare::ChannelInjection;
use domaind_prepare::devices::{ChannelDevices, DeviceRoots};

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
    crate::describe_metrics();
    // actix actors stay on this thread; tokio::spawn work (gossip, gRPC, HTTP) runs on
    // the workers.
    let system = actix::System::with_tokio_rt(|| {
        domaind_kube_api::runtime::multi_thread()
            .build()
            .expect("cannot build the tokio runtime")
    });
    // A panic on any thread or task ends the process (see `vitals`).
    let vitals = Arc::new(Vitals::default());
    vitals::install_panic_hook(vitals.clone());
    if let Err(error) = domaind_heap::purge_in_background() {
        tracing::warn!(%error, "cannot start the allocator's background purging: freed memory is given back only while the daemon allocates");
    }
    system.block_on(async {
        tokio::spawn(record_heap_every(HEAP_GAUGES_INTERVAL));
        let daemon = Daemon::start(args, metrics, vitals).await?;
        daemon.serve_until_stopped().await
    })
}

/// How often the heap gauges are refreshed: about a scrape's interval.
const HEAP_GAUGES_INTERVAL: Duration = Duration::from_secs(10);

/// Keeps the heap gauges (`domaind_heap`) current for as long as the runtime runs.
async fn record_heap_every(interval: Duration) {
    let mut ticks = tokio::time::interval(interval);
    ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        ticks.tick().await;
        domaind_heap::record();
    }
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

/// The node's GPUs: the fake topology or NVML, as the flags say.
fn open_inventory(args: &RunArgs) -> anyhow::Result<Arc<dyn GpuInventory>> {
    Ok(Arc::from(domaind_gpu::open_inventory(
        args.gpu_topology.as_deref(),
        args.node_name.as_str(),
        &args.nvml_library,
        &args.driver_root,
    )?))
}

/// The node's clique at start. While the GPUs' fabric registration is under way the
/// answer is transient: ask again, for a while.
async fn discover_clique(inventory: &Arc<dyn GpuInventory>) -> anyhow::Result<CliqueId> {
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
