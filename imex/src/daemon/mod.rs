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

mod files;
mod process;
mod reload;

use files::{follow_credentials, write_atomic};
use reload::{end_hold, request_reload, settle_catching_up};

use std::collections::BTreeMap;
use std::path::Path;
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use domaind_actors::model::Slot;
use domaind_actors::ports::{ErrorKind, Imex, ImexStatus, PortError};
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
use super::keeper::{ImexKeeper, KeeperError};
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

/// A keeper's failure. One that did not answer, or lost its daemon, is asked again
/// after the supervisor's backoff (a lost daemon is started afresh); one that cannot run
/// IMEX as configured stays so until a person changes the unit.
fn port_error(what: &str, error: KeeperError) -> PortError {
    let kind = if error.is_misconfigured() {
        ErrorKind::Permanent
    } else {
        ErrorKind::Transient
    };
    PortError::new(kind, what).with_source(error)
}

/// A missing program or directory, or one this process may not use, stays so until
/// someone installs or fixes it; other I/O failures (a full disk) may pass.
fn io_error(what: &str, error: std::io::Error) -> PortError {
    let kind = match error.kind() {
        std::io::ErrorKind::NotFound
        | std::io::ErrorKind::PermissionDenied
        | std::io::ErrorKind::ReadOnlyFilesystem => ErrorKind::Permanent,
        _ => ErrorKind::Transient,
    };
    PortError::new(kind, what).with_source(error)
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
                PortError::transient(format!(
                    "IMEX status query timed out after {:?}",
                    s.query_timeout
                ))
            })?
            .map_err(|e| io_error(&format!("cannot run {}", s.ctl.program.display()), e))?;
        // A tool that failed without answering (its own wait ran out, the daemon did not
        // answer) is no answer at all, not an empty one: "not ready" would be a guess.
        if !output.status.success() && output.stdout.is_empty() {
            return Err(PortError::transient(format!(
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

/// The per-node listing of `-N -j`, as imex-sim prints it (and reads it back in tests).
#[derive(Debug, Deserialize)]
pub struct Listing {
    pub nodes: Vec<ListingEntry>,
}

#[derive(Debug, Deserialize)]
pub struct ListingEntry {
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
                    .map_err(|e| io_error("cannot write IMEX's TLS credentials", e))?;
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
            io_error(
                &format!("cannot write {}", settings.config_path().display()),
                e,
            )
        })?;
        write_atomic(&settings.nodes_config_path(), &nodes_config).map_err(|e| {
            io_error(
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
            return Err(PortError::transient("the IMEX daemon is not running"));
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
                        .map_err(|e| io_error(&format!("cannot write {}", path.display()), e))?;
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
        // The answer says how IMEX was when asked: a slow tool (a loaded node) must not
        // move it past the relink hold.
        let asked = Instant::now();
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
                state.relinking.judge(ready, links, asked)
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

#[cfg(test)]
mod tests {
    use std::error::Error as _;

    use super::*;

    #[test]
    fn a_keeper_that_cannot_run_imex_as_configured_is_a_permanent_failure() {
        let unit = KeeperError::Misconfigured("systemd unit imex has Type=forking".into());
        let error = port_error("cannot start the IMEX daemon", unit);
        assert_eq!(error.kind(), ErrorKind::Permanent);
        assert_eq!(
            error.to_string(),
            "cannot start the IMEX daemon: systemd unit imex has Type=forking"
        );
        let silent = KeeperError::Failed("systemctl: no answer".into());
        assert_eq!(port_error("x", silent).kind(), ErrorKind::Transient);
        let lost = KeeperError::Gone("the runner is gone".into());
        assert_eq!(port_error("x", lost).kind(), ErrorKind::Transient);
    }

    #[test]
    fn a_missing_program_is_permanent_a_full_disk_is_not_and_the_io_error_is_kept() {
        let missing = std::io::Error::from(std::io::ErrorKind::NotFound);
        let error = io_error("cannot start the IMEX daemon /usr/bin/nvidia-imex", missing);
        assert_eq!(error.kind(), ErrorKind::Permanent);
        let source = error
            .source()
            .and_then(|s| s.downcast_ref::<std::io::Error>());
        assert_eq!(
            source.map(std::io::Error::kind),
            Some(std::io::ErrorKind::NotFound)
        );
        let full = std::io::Error::from(std::io::ErrorKind::StorageFull);
        assert_eq!(
            io_error("cannot write x", full).kind(),
            ErrorKind::Transient
        );
    }
}
