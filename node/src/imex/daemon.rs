//! The IMEX adapter: runs `nvidia-imex` (or `imex-sim`) as a child process and
//! implements the actors' [`Imex`] port.
//!
//! - `start` writes the config files and spawns the daemon in the foreground, its
//!   stdout and stderr forwarded into our logs (target `nvidia-imex`).
//!   Before spawning it checks that the daemon's two ports can be listened on
//!   ([`super::listen_check`]): a daemon that cannot bind exits at once, and started
//!   anyway would only look like a crash.
//! - `apply` in DNS-names mode rewrites only our block of the hosts file and sends
//!   SIGUSR1 (never a restart); in IPs mode a changed nodes config restarts IMEX.
//! - No SIGUSR1 before the daemon has answered a status query: until its handler is
//!   installed the signal's default action kills it, and the only sign we get that the
//!   handlers are in place is that it answers. A reload asked for before then waits
//!   for the first answer (the daemon read the hosts file at start, but perhaps before
//!   the last rewrite).
//! - SIGUSR1s closer together than `reload_min_interval` coalesce into one, sent when
//!   the interval has passed: IMEX acts on at most one per ~5 s.
//! - Each child is owned by a task that waits on it ([`watch_child`]): an exit is
//!   known the moment it happens, and `exited` tells the ImexProcess actor, whose
//!   polls are seconds apart while all is well. Signals go through that task too, so
//!   none can reach a reaped child's reused pid.
//! - `status` reports an exited child and says why it ended (exit status and last
//!   lines of output; the ImexProcess actor restarts it with backoff), then asks
//!   `nvidia-imex-ctl -c <config> -q` for READY, and when not ready `-N -j` for
//!   per-peer links.
//! - `stop` sends SIGTERM, waits `stop_timeout`, then SIGKILL.
//! - With TLS on ([`ImexSettings::tls`]) `start` writes the node's key, certificate
//!   and CA bundle where the config says (mode 0600, atomically), from the credentials
//!   the adapter follows ([`ImexDaemon::with_credentials`]: gossip's accepted set).
//!   When they rotate the files are rewritten and IMEX is told with SIGUSR1, the
//!   signal it reloads its SSL credentials on (through the usual coalescing): no
//!   restart, so its peers' imports survive a rotation.
//! - Without a keeper the daemon dies with this process, even on SIGKILL: it is
//!   started through the guard ([`super::guard`]), which sets a parent-death signal and
//!   execs it, forked from a thread of the adapter's own ([`super::spawner`]), in a
//!   process group of its own. `start` first stops any daemon on our config that is
//!   not our child, and a daemon of ours holding IMEX's port ([`super::leftover`]).
//! - With a keeper ([`super::keeper`]): the IMEX runner ([`ImexSettings::runner`],
//!   [`super::runner`]) or the host's systemd unit ([`ImexSettings::host_service`],
//!   [`super::host_service`]), the keeper starts, signals and stops the daemon, which
//!   outlives this process. `start` first looks for an instance on our config: one
//!   that serves the config files we would write (their contents, recorded at its
//!   start) is adopted, the same process and the same instance, with a reload if the
//!   hosts block changed meanwhile; one that serves others (or of which nothing was
//!   recorded) is kept while prepared claims use it, else stopped and replaced.
//!   Dropping the adapter leaves the daemon running.

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use domaind_actors::model::Slot;
use domaind_actors::ports::{Imex, ImexStatus, PortError};
use domaind_actors::rules::peers::{
    PeerSet, render_nodes_config_dns, render_nodes_config_ips, slot_hostname,
};
use domaind_gossip::tls::TlsFiles;
use nix::sys::signal::Signal;
use serde::Deserialize;
use tokio::process::Command;
use tokio::sync::{Mutex, Notify, watch};
use tokio::time::{Instant, timeout};
use tracing::{error, info, warn};

use super::child::{Ask, Running, watch_child};
use super::config::{
    AddressingMode, ImexSettings, TLS_CA_FILE, TLS_CERT_FILE, TLS_FILE_MODE, TLS_KEY_FILE,
    render_config,
};
use super::host_service::HostService;
use super::keeper::ImexKeeper;
use super::output::OutputTail;
use super::relink::Relinking;
use super::runner::{Instance, RunnerClient, RunnerSignal, StartRequest};
use super::spawner::Spawner;
use super::{guard, holders, hosts, leftover, listen_check};

pub const IMEX_STARTS: &str = "domaind_imex_starts_total";
pub const IMEX_RELOADS: &str = "domaind_imex_reloads_total";
pub const IMEX_EXITS: &str = "domaind_imex_exits_total";
pub const IMEX_RELOADS_DEFERRED: &str = "domaind_imex_reloads_deferred_total";
/// `domaind_imex_tls_rotations_total{outcome}`: rotated credentials written for IMEX
/// (`written`, then a reload) or not (`failed`, retried every [`CREDENTIALS_RETRY`]).
pub const IMEX_TLS_ROTATIONS: &str = "domaind_imex_tls_rotations_total";
/// `domaind_imex_adoptions_total{outcome}`: an instance outside this process (the
/// runner's, the host unit's) found on our config at start, `adopted` (it serves the
/// config we would write), `kept` (it serves another, or nothing says what, but
/// prepared claims use it: [`Imex::claims_in_use`]) or `replaced` (and no claim uses
/// it).
pub const IMEX_ADOPTIONS: &str = "domaind_imex_adoptions_total";

/// How long one wait on the keeper for a daemon's end lasts before it is asked again.
const RUNNER_WAIT: Duration = Duration::from_secs(30);
/// How soon a keeper that gave no answer is asked again.
const RUNNER_RETRY: Duration = Duration::from_secs(1);

/// How soon rotated credentials that could not be written are tried again.
pub const CREDENTIALS_RETRY: Duration = Duration::from_secs(5);

/// The credentials IMEX's links use, following every rotation (gossip's accepted set:
/// `NodeTls::files`).
pub type Credentials = watch::Receiver<Arc<TlsFiles>>;

/// How long an exited daemon's last output may take to arrive through the pipes.
const LAST_WORDS_WAIT: Duration = Duration::from_millis(200);

/// The IMEX daemon of this node.
#[derive(Debug, Clone)]
pub struct ImexDaemon {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    settings: ImexSettings,
    state: Mutex<State>,
    /// Woken whenever a child exits, on its own or stopped.
    exits: Arc<Notify>,
    /// Forks the daemon from a thread that lives as long as this adapter.
    spawner: Spawner,
    /// What IMEX's TLS files are written from, when `settings.tls`.
    credentials: Option<Credentials>,
    /// Who keeps the daemon when it must outlive us.
    keeper: Option<Arc<dyn ImexKeeper>>,
    /// As the domain last said before a start ([`Imex::claims_in_use`]).
    claims_in_use: std::sync::atomic::AtomicBool,
    /// An adopted daemon still serves peers this node has not asked for (yet): its
    /// domains are catching up ([`ImexDaemon::catching_up`]).
    catching_up: watch::Sender<bool>,
}

#[derive(Debug, Default)]
struct State {
    child: Option<Running>,
    /// The running child's output.
    output: Option<OutputTail>,
    /// The running child answered a status query: its signal handlers are in place.
    answered: bool,
    /// A reload was asked for before the child answered.
    reload_deferred: bool,
    /// Counts spawns, so that an answer is credited to the child that gave it.
    generation: u64,
    /// How the last child ended on its own, until a status query reports it.
    exited: Option<Exit>,
    peers: PeerSet,
    nodes_config: String,
    last_reload: Option<Instant>,
    reload_pending: bool,
    /// Until when an adopted daemon keeps the peers it served besides those asked for
    /// ([`ImexSettings::adoption_hold`]).
    hold_until: Option<Instant>,
    /// The running daemon serves another config and was kept for the claims using it:
    /// why (reported in every status until it stops).
    kept: Option<String>,
    /// The running daemon was adopted from its keeper, not started by this adapter.
    adopted: bool,
    /// Links the daemon is making again because we restarted them.
    relinking: Relinking,
}

impl State {
    fn holding(&self) -> bool {
        self.hold_until.is_some_and(|until| Instant::now() < until)
    }
}

#[derive(Debug)]
struct Exit {
    status: String,
    output: Option<OutputTail>,
}

impl Exit {
    async fn describe(self) -> String {
        let lines = match self.output {
            Some(output) => output.last_lines(LAST_WORDS_WAIT).await,
            // A kept daemon: its last words are in its status already.
            None => return format!("exited ({})", self.status),
        };
        if lines.is_empty() {
            format!("exited ({}) with no output", self.status)
        } else {
            format!(
                "exited ({}); last output: {}",
                self.status,
                lines.join(" | ")
            )
        }
    }
}

fn port_error(what: &str, error: impl std::fmt::Display) -> PortError {
    PortError(format!("{what}: {error}"))
}

/// Writes through a temporary file and a rename, so IMEX never reads half a file. A
/// file that already holds `contents` is left alone: a restart on a full state
/// directory (where the config dir lives by default) then starts IMEX with the files
/// it has, rather than failing to rewrite them unchanged.
fn write_atomic(path: &Path, contents: &str) -> std::io::Result<()> {
    if std::fs::read(path).is_ok_and(|existing| existing == contents.as_bytes()) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| std::io::Error::other(format!("{} names no file", path.display())))?;
    domaind_atomic_file::replace(dir, name, contents.as_bytes(), 0o644)
}

/// Writes a file only root may read, atomically; whether it changed. A file that already
/// holds `contents` with that mode is left alone (a full state directory must not keep
/// IMEX from starting on the files it has).
fn write_secret(dir: &Path, name: &str, contents: &[u8]) -> std::io::Result<bool> {
    use std::os::unix::fs::PermissionsExt as _;
    let path = dir.join(name);
    let same = std::fs::read(&path).is_ok_and(|existing| existing == contents);
    let private = std::fs::metadata(&path)
        .is_ok_and(|meta| meta.permissions().mode() & 0o777 == TLS_FILE_MODE);
    if same && private {
        return Ok(false);
    }
    domaind_atomic_file::replace(dir, name, contents, TLS_FILE_MODE)?;
    Ok(true)
}

/// Who keeps the daemon outside this process, if anyone: the runner, else the host's
/// unit (`domaind run` lets only one be asked for).
fn keeper(settings: &ImexSettings) -> Option<Arc<dyn ImexKeeper>> {
    if let Some(socket) = &settings.runner {
        if settings.host_service.is_some() {
            warn!(runner = %socket.display(), "both an IMEX runner and a host unit are configured: the runner keeps IMEX");
        }
        return Some(Arc::new(RunnerClient::new(socket.clone())));
    }
    let unit = settings.host_service.clone()?;
    Some(Arc::new(HostService::new(unit, settings.config_path())))
}

impl ImexDaemon {
    pub fn new(settings: ImexSettings) -> Self {
        Self::build(settings, None)
    }

    /// An adapter whose IMEX links use `credentials` when `settings.tls`: written at
    /// each start, and rewritten (then a reload) whenever they change. Spawns the task
    /// that follows them, which ends with the adapter.
    pub fn with_credentials(settings: ImexSettings, credentials: Credentials) -> Self {
        let tls = settings.tls;
        let daemon = Self::build(settings, Some(credentials.clone()));
        if tls {
            tokio::spawn(follow_credentials(
                Arc::downgrade(&daemon.inner),
                credentials,
            ));
        }
        daemon
    }

    fn build(settings: ImexSettings, credentials: Option<Credentials>) -> Self {
        let keeper = keeper(&settings);
        // With a keeper, a daemon of ours may be running, for this node to adopt once
        // its domains resume: caught up only once that is known.
        let catching_up = watch::Sender::new(keeper.is_some());
        let daemon = Self {
            inner: Arc::new(Inner {
                state: Mutex::new(State::default()),
                exits: Arc::default(),
                spawner: Spawner::new(),
                credentials,
                keeper,
                claims_in_use: Default::default(),
                catching_up,
                settings,
            }),
        };
        if daemon.inner.keeper.is_some()
            && let Ok(runtime) = tokio::runtime::Handle::try_current()
        {
            runtime.spawn(settle_catching_up(Arc::downgrade(&daemon.inner)));
        }
        daemon
    }

    pub fn settings(&self) -> &ImexSettings {
        &self.inner.settings
    }

    /// Whether an adopted daemon still serves peers this node has not asked for yet,
    /// as of the last status query: the node is catching up with its domains after a
    /// restart, at most for the adoption hold. `/readyz` waits on it, so that a rolling
    /// update restarts the next node only once this one has caught up: two nodes
    /// catching up together each wait for the other's advertisement, and the first
    /// hold to end would drop the other from its IMEX.
    pub fn catching_up(&self) -> watch::Receiver<bool> {
        self.inner.catching_up.subscribe()
    }

    /// The daemon's process id, while it runs.
    pub async fn pid(&self) -> Option<u32> {
        self.inner
            .state
            .lock()
            .await
            .child
            .as_ref()
            .filter(|c| c.ended().is_none())
            .and_then(|c| c.pid)
    }
}

impl Inner {
    /// Writes IMEX's key, certificate and CA bundle; whether any changed. CA first and
    /// key before certificate: a daemon that reloads meanwhile (a peer's reload makes
    /// it) finds a pair that does not match and keeps what it had, as IMEX does with
    /// credentials it cannot load; our own SIGUSR1 follows the last write.
    fn write_credentials(&self, files: &TlsFiles) -> std::io::Result<bool> {
        let dir = &self.settings.config_dir;
        let mut changed = false;
        for (name, contents) in [
            (TLS_CA_FILE, files.ca_cert()),
            (TLS_KEY_FILE, files.key()),
            (TLS_CERT_FILE, files.cert()),
        ] {
            changed |= write_secret(dir, name, contents).map_err(|e| {
                std::io::Error::new(e.kind(), format!("{}: {e}", dir.join(name).display()))
            })?;
        }
        Ok(changed)
    }

    /// At start: the credentials with TLS on (an error without them), and no key left
    /// behind with TLS off.
    fn prepare_credentials(&self) -> Result<(), PortError> {
        let s = &self.settings;
        if !s.tls {
            for path in [s.tls_key_path(), s.tls_cert_path(), s.tls_ca_path()] {
                match std::fs::remove_file(&path) {
                    Ok(()) => info!(file = %path.display(), "IMEX TLS is off: removed its file"),
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
                    Err(e) => {
                        warn!(file = %path.display(), error = %e, "cannot remove a file of IMEX TLS, which is off")
                    }
                }
            }
            return Ok(());
        }
        let Some(credentials) = &self.credentials else {
            return Err(PortError(
                "IMEX TLS is on but the adapter was given no credentials".into(),
            ));
        };
        let files = credentials.borrow().clone();
        self.write_credentials(&files)
            .map(|_| ())
            .map_err(|e| port_error("cannot write IMEX's TLS credentials", e))
    }

    fn nodes_config(&self, peers: &PeerSet) -> String {
        match self.settings.mode {
            AddressingMode::DnsNames => render_nodes_config_dns(self.settings.max_slots),
            AddressingMode::Ips => render_nodes_config_ips(peers),
        }
    }

    /// Writes our block of the hosts file for `peers` (DNS-names mode); `held`: with the
    /// slots the file maps now kept besides them ([`hosts::held_block`]).
    fn write_hosts(&self, peers: &PeerSet, held: bool) -> Result<bool, PortError> {
        if self.settings.mode != AddressingMode::DnsNames {
            return Ok(false);
        }
        let s = &self.settings;
        let block = if held {
            let served = std::fs::read_to_string(&s.hosts_file).unwrap_or_default();
            hosts::held_block(&served, peers, s.max_slots, s.unused_slot_ip)
        } else {
            hosts::render_block(peers, s.max_slots, s.unused_slot_ip)
        };
        hosts::write(&self.settings.hosts_file, &block).map_err(|e| {
            port_error(
                &format!("cannot write {}", self.settings.hosts_file.display()),
                e,
            )
        })
    }

    /// Fails, naming the port and who holds it, when IMEX could not listen on `port`. A
    /// holder that is an IMEX daemon of ours no domaind owns is stopped first.
    async fn ensure_listenable(&self, port: u16, what: &str) -> Result<(), PortError> {
        let s = &self.settings;
        let Err(mut error) = listen_check::probe(s.bind_ip, port) else {
            return Ok(());
        };
        let mut held_by = holders::holders(s.bind_ip, port);
        let config = s.config_path();
        let ours: Vec<i32> = held_by
            .iter()
            .map(|h| h.pid)
            .filter(|pid| leftover::is_ours(*pid, &config))
            .collect();
        if !ours.is_empty() {
            leftover::stop_pids(&ours, s.stop_timeout, "it holds the IMEX port").await;
            match listen_check::probe(s.bind_ip, port) {
                Ok(()) => return Ok(()),
                Err(again) => error = again,
            }
            held_by = holders::holders(s.bind_ip, port);
        }
        Err(PortError(listen_check::refusal(
            s.bind_ip,
            port,
            what,
            &error,
            &holders::describe(&held_by),
        )))
    }

    /// The daemon's command: through the guard when there is one, so that it dies
    /// with this process ([`guard::daemon_command`]).
    fn daemon_command(&self) -> Command {
        let s = &self.settings;
        let args: Vec<String> = s.daemon.args.clone();
        guard::daemon_command(
            s.guard.as_ref(),
            &s.daemon.program,
            &args,
            &s.config_path(),
            &s.daemon_env,
        )
    }

    /// What a daemon started now serves, for the keeper to record and a later adapter to
    /// compare: config.cfg as we write it. The peers (the nodes config and, in DNS-names
    /// mode, the hosts block) are not part of it: a restarted node knows few of them at
    /// first, and an adopted daemon keeps those it serves for a while
    /// ([`ImexSettings::adoption_hold`]).
    /// An adopted daemon under its hold serves peers beyond those asked for: the
    /// node's view of its domain is still filling in.
    fn serves_beyond(&self, state: &State) -> bool {
        let s = &self.settings;
        match s.mode {
            AddressingMode::DnsNames => {
                let served = std::fs::read_to_string(&s.hosts_file).unwrap_or_default();
                hosts::serves_beyond(&served, &state.peers, s.max_slots)
            }
            AddressingMode::Ips => state.nodes_config.lines().any(|line| {
                line.trim()
                    .parse::<std::net::IpAddr>()
                    .is_ok_and(|ip| !state.peers.peers.values().any(|p| p.ip == ip))
            }),
        }
    }

    fn served(&self) -> String {
        render_config(&self.settings)
    }

    async fn spawn(&self, state: &mut State) -> Result<(), PortError> {
        let s = &self.settings;
        self.ensure_listenable(s.server_port, "SERVER_PORT").await?;
        self.ensure_listenable(s.cmd_port, "IMEX_CMD_PORT").await?;
        if let Some(keeper) = &self.keeper {
            let request = StartRequest {
                config: s.config_path(),
                program: s.daemon.program.clone(),
                args: s.daemon.args.clone(),
                env: s.daemon_env.clone(),
                served: self.served(),
            };
            let instance = keeper.start(&request).await.map_err(|e| {
                PortError(format!(
                    "cannot start the IMEX daemon {} through {}: {e}",
                    s.daemon.program.display(),
                    keeper.describe()
                ))
            })?;
            metrics::counter!(IMEX_STARTS).increment(1);
            info!(pid = instance.pid, instance = instance.instance, program = %instance.program.display(), keeper = %keeper.describe(), "IMEX daemon started outside this process");
            self.took(
                state,
                follow_keeper(keeper.clone(), &instance, self.exits.clone()),
                None,
            );
            state.relinking.started(self.remote_slots(&state.peers));
            return Ok(());
        }
        let mut child = self
            .spawner
            .spawn(self.daemon_command())
            .await
            .map_err(|e| {
                PortError(format!(
                    "cannot start the IMEX daemon {}: {e} (is the NVIDIA IMEX package installed? \
                     the binary path is configurable; imex-sim stands in for it without GPUs)",
                    s.daemon.program.display()
                ))
            })?;
        let output = OutputTail::of(&mut child);
        metrics::counter!(IMEX_STARTS).increment(1);
        info!(pid = child.id(), program = %s.daemon.program.display(), guarded = s.guard.is_some(), "IMEX daemon started");
        self.took(state, watch_child(child, self.exits.clone()), Some(output));
        state.relinking.started(self.remote_slots(&state.peers));
        Ok(())
    }

    /// A daemon is ours from now on: started, or adopted from its keeper.
    fn took(&self, state: &mut State, child: Running, output: Option<OutputTail>) {
        state.child = Some(child);
        state.output = output;
        state.answered = false;
        state.reload_deferred = false;
        state.generation += 1;
        state.exited = None;
        state.last_reload = None;
        state.hold_until = None;
        state.kept = None;
        state.adopted = false;
        state.relinking = Relinking::default();
    }

    /// The slots of `peers` other than this node: the links IMEX makes.
    fn remote_slots(&self, peers: &PeerSet) -> Vec<Slot> {
        let me = self.settings.bind_ip;
        peers
            .peers
            .iter()
            .filter(|(_, p)| p.ip != me)
            .map(|(slot, _)| *slot)
            .collect()
    }

    /// At start with a keeper: adopts its instance on our config when that serves
    /// `served`, keeps it while claims use it when it serves something else (or nothing
    /// recorded), stops it otherwise. Whether one was adopted or kept.
    async fn adopt(&self, state: &mut State) -> Result<bool, PortError> {
        let Some(keeper) = &self.keeper else {
            return Ok(false);
        };
        let config = self.settings.config_path();
        let instances = keeper
            .instances()
            .await
            .map_err(|e| port_error(&format!("cannot ask {} what runs", keeper.describe()), e))?;
        let Some(found) = instances
            .into_iter()
            .find(|i| i.config == config && i.ended.is_none())
        else {
            return Ok(false);
        };
        let in_use = self
            .claims_in_use
            .load(std::sync::atomic::Ordering::Relaxed);
        if found.served != self.served() && in_use {
            let reason = if found.served.is_empty() {
                // The host's unit, started by someone else (at boot, by hand, by
                // systemd's own restart): what it serves is unknown.
                format!(
                    "instance {} (pid {:?}) of {} was not started by domaind: what config it serves is unknown",
                    found.instance,
                    found.pid,
                    keeper.describe()
                )
            } else {
                format!(
                    "instance {} (pid {:?}) was started with another config.cfg than this release writes",
                    found.instance, found.pid
                )
            };
            metrics::counter!(IMEX_ADOPTIONS, "outcome" => "kept").increment(1);
            warn!(
                pid = found.pid,
                instance = found.instance,
                keeper = %keeper.describe(),
                %reason,
                "the running IMEX daemon does not serve this node's config, but prepared claims use it: kept, not replaced"
            );
            self.took(
                state,
                follow_keeper(keeper.clone(), &found, self.exits.clone()),
                None,
            );
            state.kept = Some(reason);
            state.adopted = true;
            state.hold_until = Some(Instant::now() + self.settings.adoption_hold);
            // Caught up once a status query finds the node asks for all it serves.
            self.catching_up.send_replace(true);
            state.nodes_config =
                std::fs::read_to_string(self.settings.nodes_config_path()).unwrap_or_default();
            return Ok(true);
        }
        if found.served == self.served() {
            metrics::counter!(IMEX_ADOPTIONS, "outcome" => "adopted").increment(1);
            info!(
                pid = found.pid,
                instance = found.instance,
                keeper = %keeper.describe(),
                "IMEX daemon adopted: it serves the config this node has"
            );
            self.took(
                state,
                follow_keeper(keeper.clone(), &found, self.exits.clone()),
                None,
            );
            state.hold_until = Some(Instant::now() + self.settings.adoption_hold);
            // Caught up once a status query finds the node asks for all it serves.
            self.catching_up.send_replace(true);
            state.adopted = true;
            // What it was started with, not what this node knows of its peers yet.
            state.nodes_config =
                std::fs::read_to_string(self.settings.nodes_config_path()).unwrap_or_default();
            return Ok(true);
        }
        metrics::counter!(IMEX_ADOPTIONS, "outcome" => "replaced").increment(1);
        warn!(
            pid = found.pid,
            instance = found.instance,
            keeper = %keeper.describe(),
            "the running IMEX daemon does not serve this node's config (or nothing says what it serves): replacing it"
        );
        keeper
            .stop(&config, found.instance, self.settings.stop_timeout)
            .await
            .map_err(|e| {
                port_error(
                    &format!("cannot stop the IMEX daemon of {}", keeper.describe()),
                    e,
                )
            })?;
        Ok(false)
    }

    /// Whether the child still runs; if it ended, keeps how for the next status.
    fn alive(&self, state: &mut State) -> bool {
        let Some(child) = state.child.as_ref() else {
            return false;
        };
        let Some(status) = child.ended() else {
            return true;
        };
        metrics::counter!(IMEX_EXITS).increment(1);
        warn!(%status, "IMEX daemon exited");
        state.child = None;
        state.exited = Some(Exit {
            status,
            output: state.output.take(),
        });
        false
    }

    /// An exit that no status has reported yet.
    fn unreported_exit(state: &State) -> bool {
        state.exited.is_some() || state.child.as_ref().is_some_and(|c| c.ended().is_some())
    }

    async fn stop_child(&self, state: &mut State) {
        state.output = None;
        let Some(mut child) = state.child.take() else {
            return;
        };
        child.signal(Signal::SIGTERM);
        match child.wait(self.settings.stop_timeout).await {
            Some(status) => info!(%status, "IMEX daemon stopped"),
            None => {
                warn!(timeout = ?self.settings.stop_timeout, "IMEX daemon ignored SIGTERM; killing it");
                let _ = child.asks.send(Ask::Kill);
                // SIGKILL cannot be ignored; the bound only guards against a task gone.
                child.wait(self.settings.stop_timeout).await;
            }
        }
    }

    fn signal_reload(&self, state: &mut State) {
        let Some(child) = state.child.as_ref().filter(|c| c.ended().is_none()) else {
            return;
        };
        let pid = child.pid.unwrap_or_default();
        if !state.answered {
            if !std::mem::replace(&mut state.reload_deferred, true) {
                metrics::counter!(IMEX_RELOADS_DEFERRED).increment(1);
                info!(
                    pid,
                    "IMEX reload waits for the daemon's first answer: signalled earlier, it could die of SIGUSR1"
                );
            }
            return;
        }
        child.signal(Signal::SIGUSR1);
        metrics::counter!(IMEX_RELOADS).increment(1);
        info!(pid, "IMEX daemon asked to reload (SIGUSR1)");
        let now = Instant::now();
        state.last_reload = Some(now);
        let slots = self.remote_slots(&state.peers);
        state
            .relinking
            .reloaded(slots, now, self.settings.relink_hold);
    }

    async fn query(&self, extra: &[&str]) -> Result<String, PortError> {
        let s = &self.settings;
        let output = Command::new(&s.ctl.program)
            .args(&s.ctl.args)
            .arg("-c")
            .arg(s.config_path())
            .args(extra)
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output();
        let output = timeout(s.query_timeout, output)
            .await
            .map_err(|_| {
                PortError(format!(
                    "IMEX status query timed out after {:?}",
                    s.query_timeout
                ))
            })?
            .map_err(|e| port_error(&format!("cannot run {}", s.ctl.program.display()), e))?;
        // A tool that failed without answering (its own wait ran out, the daemon did not
        // answer) is no answer at all, not an empty one: "not ready" would be a guess.
        if !output.status.success() && output.stdout.is_empty() {
            return Err(PortError(format!(
                "IMEX status query failed ({}): {}",
                output.status,
                String::from_utf8_lossy(&output.stderr).trim()
            )));
        }
        Ok(String::from_utf8_lossy(&output.stdout).into_owned())
    }

    /// Maps the per-peer listing to slots, through the peer set IMEX was given.
    fn links(&self, listing: &str, peers: &PeerSet) -> BTreeMap<Slot, bool> {
        let Ok(listing) = serde_json::from_str::<Listing>(listing) else {
            return BTreeMap::new();
        };
        let mut links = BTreeMap::new();
        for (slot, peer) in &peers.peers {
            let host = match self.settings.mode {
                AddressingMode::DnsNames => slot_hostname(*slot),
                AddressingMode::Ips => peer.ip.to_string(),
            };
            if let Some(entry) = listing.nodes.iter().find(|n| n.host == host)
                && entry.status != "SELF"
            {
                links.insert(*slot, entry.status == "CONNECTED");
            }
        }
        links
    }
}

/// The handle of a daemon a keeper keeps: a task waits on the keeper for its end and
/// carries asks over as signals. Dropping the handle leaves the daemon running: it
/// outlives us by design.
fn follow_keeper(keeper: Arc<dyn ImexKeeper>, instance: &Instance, exits: Arc<Notify>) -> Running {
    let (running, ended_tx, mut asks) = Running::owned_elsewhere(instance.pid);
    let (config, id) = (instance.config.clone(), instance.instance);
    tokio::spawn(async move {
        let ended = loop {
            tokio::select! {
                seen = keeper.wait(&config, id, RUNNER_WAIT) => match seen {
                    Ok(seen) => if let Some(ended) = seen.ended {
                        break if seen.last_output.is_empty() {
                            ended
                        } else {
                            format!("{ended}; last output: {}", seen.last_output.join(" | "))
                        };
                    },
                    // A runner's daemons die with it: one that is gone, or that no
                    // longer knows the instance, has none of ours; a unit whose main
                    // process is another has none either.
                    Err(error) if error.is_gone() => {
                        break format!("gone with its keeper: {error}");
                    }
                    Err(error) => {
                        warn!(%error, keeper = %keeper.describe(), retry_in = ?RUNNER_RETRY, "cannot follow the IMEX daemon through its keeper");
                        tokio::time::sleep(RUNNER_RETRY).await;
                    }
                },
                ask = asks.recv() => {
                    let signal = match ask {
                        Some(Ask::Signal(Signal::SIGUSR1)) => RunnerSignal::Usr1,
                        Some(Ask::Signal(Signal::SIGTERM)) => RunnerSignal::Term,
                        Some(Ask::Signal(other)) => {
                            warn!(signal = %other, "not a signal a keeper sends; ignored");
                            continue;
                        }
                        Some(Ask::Kill) => RunnerSignal::Kill,
                        None => return,
                    };
                    if let Err(error) = keeper.signal(&config, id, signal).await {
                        warn!(%error, ?signal, keeper = %keeper.describe(), "the IMEX daemon's keeper could not signal it");
                    }
                }
            }
        };
        let _ = ended_tx.send(Some(ended));
        exits.notify_waiters();
    });
    running
}

/// At start with a keeper: nothing to catch up with unless it runs a daemon on our
/// config; one that no domain of this node adopts within twice the adoption hold (no
/// domain resumed IMEX) is not this node's to catch up with either.
async fn settle_catching_up(inner: std::sync::Weak<Inner>) {
    let Some((keeper, config, hold)) = inner.upgrade().and_then(|i| {
        let keeper = i.keeper.clone()?;
        Some((keeper, i.settings.config_path(), i.settings.adoption_hold))
    }) else {
        return;
    };
    let running = keeper.instances().await.is_ok_and(|found| {
        found
            .iter()
            .any(|i| i.config == config && i.ended.is_none())
    });
    if running {
        tokio::time::sleep(hold * 2).await;
    }
    let Some(inner) = inner.upgrade() else { return };
    if !inner.state.lock().await.adopted {
        inner.catching_up.send_replace(false);
    }
}

/// Ends an adopted daemon's hold once it is over: from then on it serves the peers asked
/// for last, and those it kept that nobody asked for go. `generation`: the adoption's;
/// a daemon started since has no hold.
async fn end_hold(inner: std::sync::Weak<Inner>, generation: u64) {
    let Some(hold) = inner.upgrade().map(|i| i.settings.adoption_hold) else {
        return;
    };
    tokio::time::sleep(hold).await;
    let Some(inner) = inner.upgrade() else { return };
    let mut state = inner.state.lock().await;
    if state.generation != generation || state.hold_until.take().is_none() {
        return;
    }
    inner.catching_up.send_replace(false);
    if !inner.alive(&mut state) {
        return;
    }
    let peers = state.peers.clone();
    match inner.settings.mode {
        AddressingMode::DnsNames => match inner.write_hosts(&peers, false) {
            Ok(true) => {
                info!("the adopted IMEX daemon's hold is over: serving the peers this node knows");
                request_reload(&inner, &mut state);
            }
            Ok(false) => {}
            Err(error) => {
                warn!(%error, "cannot write the peers after the adopted IMEX daemon's hold")
            }
        },
        AddressingMode::Ips => {
            let nodes_config = inner.nodes_config(&peers);
            if nodes_config == state.nodes_config {
                return;
            }
            let path = inner.settings.nodes_config_path();
            if let Err(error) = write_atomic(&path, &nodes_config) {
                warn!(%error, "cannot write {} after the adopted IMEX daemon's hold", path.display());
                return;
            }
            info!(
                "the adopted IMEX daemon's hold is over and its peers changed (IPs mode): restarting it"
            );
            inner.stop_child(&mut state).await;
            match inner.spawn(&mut state).await {
                Ok(()) => state.nodes_config = nodes_config,
                Err(error) => warn!(%error, "cannot restart the IMEX daemon after its hold"),
            }
        }
    }
}

/// Sends SIGUSR1 now, or when `reload_min_interval` has passed since the last one;
/// requests in between become one.
fn request_reload(inner: &Arc<Inner>, state: &mut State) {
    let due = state
        .last_reload
        .map(|last| last + inner.settings.reload_min_interval)
        .filter(|due| *due > Instant::now());
    match due {
        None => inner.signal_reload(state),
        Some(_) if state.reload_pending => {}
        Some(due) => {
            state.reload_pending = true;
            let later = inner.clone();
            tokio::spawn(async move {
                tokio::time::sleep_until(due).await;
                let mut state = later.state.lock().await;
                state.reload_pending = false;
                later.signal_reload(&mut state);
            });
        }
    }
}

/// Rewrites IMEX's credentials whenever they rotate and asks the daemon to reload them;
/// a write that fails is tried again every [`CREDENTIALS_RETRY`] (IMEX keeps the old
/// credentials meanwhile). Ends when the adapter or the credentials' source is gone.
async fn follow_credentials(inner: std::sync::Weak<Inner>, mut credentials: Credentials) {
    let mut failing = false;
    loop {
        if failing {
            tokio::select! {
                changed = credentials.changed() => if changed.is_err() { return },
                () = tokio::time::sleep(CREDENTIALS_RETRY) => {}
            }
        } else if credentials.changed().await.is_err() {
            return;
        }
        let files = credentials.borrow_and_update().clone();
        let Some(inner) = inner.upgrade() else { return };
        let mut state = inner.state.lock().await;
        match inner.write_credentials(&files) {
            Ok(changed) => {
                if failing || changed {
                    metrics::counter!(IMEX_TLS_ROTATIONS, "outcome" => "written").increment(1);
                    info!(
                        "IMEX's TLS credentials rotated: files rewritten, asking IMEX to reload them"
                    );
                    request_reload(&inner, &mut state);
                }
                failing = false;
            }
            Err(e) => {
                metrics::counter!(IMEX_TLS_ROTATIONS, "outcome" => "failed").increment(1);
                error!(error = %e, retry_in = ?CREDENTIALS_RETRY, "cannot write IMEX's rotated TLS credentials; IMEX keeps the old ones");
                failing = true;
            }
        }
    }
}

/// The per-node listing of `-N -j`, as imex-sim prints it.
#[derive(Debug, Deserialize)]
pub(crate) struct Listing {
    pub nodes: Vec<ListingEntry>,
}

#[derive(Debug, Deserialize)]
pub(crate) struct ListingEntry {
    pub host: String,
    pub status: String,
}

#[async_trait]
impl Imex for ImexDaemon {
    async fn start(&self, peers: &PeerSet) -> Result<(), PortError> {
        let inner = &self.inner;
        let mut state = inner.state.lock().await;
        let nodes_config = inner.nodes_config(peers);
        if inner.alive(&mut state) {
            // Asked to start while running: a stale daemon (hung, or from before a
            // restart of ours). Replace it.
            inner.stop_child(&mut state).await;
        } else if inner.keeper.is_none() {
            let settings = &inner.settings;
            leftover::stop(&settings.config_path(), settings.stop_timeout).await;
        } else if inner.adopt(&mut state).await? {
            state.peers = peers.clone();
            let mut changed = inner.write_hosts(peers, true)?;
            // Credentials that rotated while no domaind followed them.
            if let Some(credentials) = inner.credentials.as_ref().filter(|_| inner.settings.tls) {
                let files = credentials.borrow().clone();
                changed |= inner
                    .write_credentials(&files)
                    .map_err(|e| port_error("cannot write IMEX's TLS credentials", e))?;
            }
            if changed {
                request_reload(inner, &mut state);
            }
            tokio::spawn(end_hold(Arc::downgrade(inner), state.generation));
            return Ok(());
        }
        let settings = &inner.settings;
        inner.prepare_credentials()?;
        write_atomic(&settings.config_path(), &render_config(settings)).map_err(|e| {
            port_error(
                &format!("cannot write {}", settings.config_path().display()),
                e,
            )
        })?;
        write_atomic(&settings.nodes_config_path(), &nodes_config).map_err(|e| {
            port_error(
                &format!("cannot write {}", settings.nodes_config_path().display()),
                e,
            )
        })?;
        inner.write_hosts(peers, false)?;
        inner.spawn(&mut state).await?;
        state.peers = peers.clone();
        state.nodes_config = nodes_config;
        Ok(())
    }

    async fn apply(&self, peers: &PeerSet) -> Result<(), PortError> {
        let inner = &self.inner;
        let mut state = inner.state.lock().await;
        if !inner.alive(&mut state) {
            return Err(PortError("the IMEX daemon is not running".into()));
        }
        match inner.settings.mode {
            AddressingMode::DnsNames => {
                let changed = inner.write_hosts(peers, state.holding())?;
                state.peers = peers.clone();
                if changed {
                    drop(state);
                    self.reload().await?;
                }
            }
            AddressingMode::Ips => {
                let nodes_config = inner.nodes_config(peers);
                state.peers = peers.clone();
                // An adopted daemon is restarted for new peers only once its hold is
                // over ([`end_hold`] applies the set asked for last).
                if nodes_config != state.nodes_config && !state.holding() {
                    let path = inner.settings.nodes_config_path();
                    write_atomic(&path, &nodes_config)
                        .map_err(|e| port_error(&format!("cannot write {}", path.display()), e))?;
                    info!("IMEX peers changed (IPs mode): restarting the daemon");
                    inner.stop_child(&mut state).await;
                    inner.spawn(&mut state).await?;
                    state.nodes_config = nodes_config;
                }
            }
        }
        Ok(())
    }

    async fn reload(&self) -> Result<(), PortError> {
        let mut state = self.inner.state.lock().await;
        request_reload(&self.inner, &mut state);
        Ok(())
    }

    async fn status(&self) -> Result<ImexStatus, PortError> {
        let (peers, generation) = {
            let mut state = self.inner.state.lock().await;
            if !self.inner.alive(&mut state) {
                let exited = state.exited.take();
                drop(state);
                let exited = match exited {
                    Some(exit) => Some(exit.describe().await),
                    None => None,
                };
                return Ok(ImexStatus {
                    exited,
                    ..ImexStatus::default()
                });
            }
            (state.peers.clone(), state.generation)
        };
        let ready = self.inner.query(&["-q"]).await?.trim() == "READY";
        {
            let mut state = self.inner.state.lock().await;
            if state.generation == generation && !state.answered {
                state.answered = true;
                if std::mem::take(&mut state.reload_deferred) {
                    info!("IMEX daemon answered: sending the reload that waited for it");
                    request_reload(&self.inner, &mut state);
                }
            }
        }
        let me = self.inner.settings.bind_ip;
        let links = if ready {
            peers
                .peers
                .iter()
                .filter(|(_, p)| p.ip != me)
                .map(|(slot, _)| (*slot, true))
                .collect()
        } else {
            let listing = self.inner.query(&["-N", "-j"]).await.unwrap_or_default();
            self.inner.links(&listing, &peers)
        };
        let (ready, links, kept, adopted, catching_up) = {
            let mut state = self.inner.state.lock().await;
            // An answer about a daemon since replaced says nothing of the new one's links.
            let (ready, links) = if state.generation == generation {
                state.relinking.judge(ready, links, Instant::now())
            } else {
                (ready, links)
            };
            let catching_up = state.adopted && state.holding() && self.inner.serves_beyond(&state);
            (ready, links, state.kept.clone(), state.adopted, catching_up)
        };
        self.inner
            .catching_up
            .send_if_modified(|was| std::mem::replace(was, catching_up) != catching_up);
        Ok(ImexStatus {
            running: true,
            ready,
            links,
            exited: None,
            kept,
            adopted,
            catching_up,
        })
    }

    async fn stop(&self) -> Result<(), PortError> {
        let mut state = self.inner.state.lock().await;
        self.inner.stop_child(&mut state).await;
        Ok(())
    }

    fn outlives_node_daemon(&self) -> bool {
        self.inner.keeper.is_some()
    }

    fn claims_in_use(&self, in_use: bool) {
        self.inner
            .claims_in_use
            .store(in_use, std::sync::atomic::Ordering::Relaxed);
    }

    async fn exited(&self) {
        loop {
            // Armed before the check, so that an exit in between still wakes us.
            let notified = self.inner.exits.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if Inner::unreported_exit(&*self.inner.state.lock().await) {
                return;
            }
            notified.await;
        }
    }
}
