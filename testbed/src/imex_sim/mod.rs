//! `imex-sim`: a test double of `nvidia-imex` and `nvidia-imex-ctl`.
//!
//! It reads the same config file and nodes config, resolves names through a hosts
//! file (`IMEX_SIM_HOSTS` in its environment; `/etc/hosts` otherwise), listens on
//! `BIND_INTERFACE_IP:SERVER_PORT`, and really connects to every resolvable peer's
//! `SERVER_PORT`, keeping the connections and re-dialling lost ones. Both ends of a
//! link beat every 250 ms, and a link silent for 1 s is lost, as IMEX notices a peer
//! it no longer hears from (a partition or a dead host closes nothing). SIGUSR1 makes it
//! re-read the nodes config and hosts file and reconnect; SIGTERM, SIGINT and SIGQUIT
//! stop it; SIGHUP prints its peer listing. Its signal handlers are in place before it
//! listens, so that a supervisor that reaches it can also signal it.
//!
//! Its command service on `IMEX_CMD_BIND_INTERFACE_IP:IMEX_CMD_PORT` answers the
//! status query (`READY` when connected to every resolvable peer, `NOT_READY`
//! otherwise), a per-node listing, and two faults for chaos tests: `crash` (exit at
//! once, uncleanly) and `hang` (stop answering and ignore SIGTERM). Names the hosts
//! file marks as unused slots count as unresolvable.
//!
//! Like IMEX, each daemon is an *instance* (an id made at start, exchanged on every
//! link), and it models the memory imports of the jobs on its node
//! ([`imports`]): the command `import ADDRESS,...` makes one from those
//! peers, `imports` lists them and says which broke and why.
//!
//! A config that turns IMEX's SSL/TLS on makes its links mutual TLS with the files it
//! names, refusing peers whose certificates chain to another CA ([`tls`]);
//! SIGUSR1 then reloads those files first.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use rustls_pki_types::ServerName;
use serde::Serialize;
use tokio::io::{AsyncBufReadExt, AsyncRead, AsyncReadExt, AsyncWrite, AsyncWriteExt, BufReader};
use tokio::net::{TcpListener, TcpStream};
use tokio::signal::unix::{Signal, SignalKind, signal};
use tokio::task::JoinSet;
use tokio::time::timeout;

use domaind_imex::config::{parse_config, read};
use domaind_imex::hosts::{self, Resolution};
pub mod cli;
pub mod imports;
pub mod tls;

use self::imports::Imports;
use self::tls::{ACCEPTED, HANDSHAKE_TIMEOUT, LinkTls, TlsOptions, TlsStats};

pub use domaind_imex::hosts::SIM_HOSTS_ENV as HOSTS_ENV;

/// How soon a lost or unreachable peer is dialled again.
const REDIAL: Duration = Duration::from_millis(100);
/// How soon a peer whose handshake was refused is dialled again: a refusal is not
/// fixed by retrying, and each try is a handshake on both ends.
const REDIAL_REFUSED: Duration = Duration::from_secs(1);

/// What the simulator needs from the config file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SimConfig {
    pub bind_ip: IpAddr,
    pub server_port: u16,
    pub cmd_ip: IpAddr,
    pub cmd_port: u16,
    pub nodes_config: PathBuf,
    /// Its links' TLS, when the config turns it on.
    pub tls: Option<TlsOptions>,
}

impl SimConfig {
    pub fn load(path: &Path) -> Result<Self, String> {
        let keys = parse_config(&read(path).map_err(|e| e.to_string())?);
        let get = |key: &str| {
            keys.get(key)
                .ok_or_else(|| format!("{}: {key} is missing", path.display()))
        };
        let parse_ip = |key: &str| -> Result<IpAddr, String> {
            get(key)?
                .parse()
                .map_err(|e| format!("{}: {key}: {e}", path.display()))
        };
        let parse_port = |key: &str, default: u16| -> Result<u16, String> {
            keys.get(key).map_or(Ok(default), |v| {
                v.parse()
                    .map_err(|e| format!("{}: {key}: {e}", path.display()))
            })
        };
        let bind_ip = parse_ip("BIND_INTERFACE_IP")?;
        Ok(Self {
            bind_ip,
            server_port: parse_port("SERVER_PORT", 50000)?,
            cmd_ip: keys
                .get("IMEX_CMD_BIND_INTERFACE_IP")
                .map_or(Ok(bind_ip), |v| {
                    v.parse()
                        .map_err(|e| format!("IMEX_CMD_BIND_INTERFACE_IP: {e}"))
                })?,
            cmd_port: parse_port("IMEX_CMD_PORT", 50005)?,
            nodes_config: PathBuf::from(get("IMEX_NODE_CONFIG_FILE")?),
            tls: TlsOptions::from_config(&keys, path)?,
        })
    }
}

/// One line of the nodes config, as the simulator sees it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PeerEntry {
    pub index: usize,
    pub host: String,
    pub address: Option<IpAddr>,
    pub status: PeerStatus,
    /// Why the link is down, when a handshake was refused.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
    /// The peer's IMEX instance, as its side of the link last said.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub instance: Option<u64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum PeerStatus {
    /// This node itself.
    #[serde(rename = "SELF")]
    Myself,
    Connected,
    Disconnected,
    Unresolved,
}

/// Resolves the nodes config through the hosts file.
pub fn resolve(nodes_config: &str, hosts_file: &str, me: IpAddr) -> Vec<PeerEntry> {
    let names = hosts::parse(hosts_file);
    nodes_config
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty() && !l.starts_with('#'))
        .enumerate()
        .map(|(index, host)| {
            let address = host
                .parse::<IpAddr>()
                .ok()
                .or_else(|| match names.get(host) {
                    Some(Resolution::Ip(ip)) => Some(*ip),
                    Some(Resolution::Parked) | None => None,
                });
            let status = match address {
                None => PeerStatus::Unresolved,
                Some(ip) if ip == me => PeerStatus::Myself,
                Some(_) => PeerStatus::Disconnected,
            };
            PeerEntry {
                index,
                host: host.to_owned(),
                address,
                status,
                error: None,
                instance: None,
            }
        })
        .collect()
}

pub fn ready(peers: &[PeerEntry]) -> bool {
    peers.iter().all(|p| {
        matches!(
            p.status,
            PeerStatus::Myself | PeerStatus::Connected | PeerStatus::Unresolved
        )
    })
}

struct Shared {
    /// This daemon's instance: a new one at every start.
    instance: u64,
    imports: Mutex<Imports>,
    config: SimConfig,
    hosts_path: PathBuf,
    peers: Mutex<Vec<PeerEntry>>,
    hung: std::sync::atomic::AtomicBool,
    tls: Option<Arc<LinkTls>>,
}

impl Shared {
    fn peers(&self) -> std::sync::MutexGuard<'_, Vec<PeerEntry>> {
        self.peers.lock().unwrap_or_else(|p| p.into_inner())
    }

    fn set_status(&self, index: usize, status: PeerStatus, error: Option<String>) {
        if let Some(peer) = self.peers().get_mut(index) {
            peer.status = status;
            peer.error = error;
        }
    }

    fn imports(&self) -> std::sync::MutexGuard<'_, Imports> {
        self.imports.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The link to peer `index` came up, to the daemon instance `instance`.
    fn linked(&self, index: usize, instance: u64) {
        let address = {
            let mut peers = self.peers();
            let Some(peer) = peers.get_mut(index) else {
                return;
            };
            peer.status = PeerStatus::Connected;
            peer.error = None;
            peer.instance = Some(instance);
            peer.address
        };
        if let Some(address) = address {
            self.imports().linked(&address.to_string(), instance);
        }
    }

    /// `import ADDRESS,...`: a job imports from each of these peers, all of which
    /// must be linked. Named, not "every peer": a daemon whose config resolves none of
    /// its peers yet is READY too, and imports from nobody.
    fn import(&self, wanted: &str) -> Result<u64, String> {
        let peers = self.peers().clone();
        let mut from = BTreeMap::new();
        for address in wanted.split(',').map(str::trim).filter(|a| !a.is_empty()) {
            let linked = peers.iter().find(|p| {
                p.address.is_some_and(|ip| ip.to_string() == address)
                    && p.status == PeerStatus::Connected
            });
            match linked.and_then(|p| p.instance) {
                Some(instance) => {
                    from.insert(address.to_owned(), instance);
                }
                None => return Err(format!("not linked to {address}")),
            }
        }
        if from.is_empty() {
            return Err("import from whom? name the peers: import ADDRESS,...".into());
        }
        Ok(self.imports().import(from))
    }

    /// The per-node listing (`ctl -N`, SIGHUP): readiness, each peer, and TLS.
    fn listing(&self) -> serde_json::Value {
        let peers = self.peers().clone();
        let tls = self
            .tls
            .as_ref()
            .map_or_else(TlsStats::default, |t| t.stats());
        serde_json::json!({
            "ready": ready(&peers),
            "instance": self.instance,
            "nodes": peers,
            "tls": tls,
        })
    }
}

/// The signals `nvidia-imex` acts on, with the same meaning: SIGTERM, SIGINT and
/// SIGQUIT shut it down, SIGUSR1 reconnects (the real one also reloads its TLS
/// credentials), SIGHUP dumps what it knows (the real one, its verbose log buffer).
struct Signals {
    usr1: Signal,
    hup: Signal,
    term: Signal,
    int: Signal,
    quit: Signal,
}

enum Received {
    Reconnect,
    Dump,
    Shutdown(&'static str),
}

impl Signals {
    fn install() -> Result<Self, String> {
        let install = |kind: SignalKind, name: &str| {
            signal(kind).map_err(|e| format!("cannot handle {name}: {e}"))
        };
        Ok(Self {
            usr1: install(SignalKind::user_defined1(), "SIGUSR1")?,
            hup: install(SignalKind::hangup(), "SIGHUP")?,
            term: install(SignalKind::terminate(), "SIGTERM")?,
            int: install(SignalKind::interrupt(), "SIGINT")?,
            quit: install(SignalKind::quit(), "SIGQUIT")?,
        })
    }

    async fn next(&mut self) -> Received {
        tokio::select! {
            _ = self.usr1.recv() => Received::Reconnect,
            _ = self.hup.recv() => Received::Dump,
            _ = self.term.recv() => Received::Shutdown("SIGTERM"),
            _ = self.int.recv() => Received::Shutdown("SIGINT"),
            _ = self.quit.recv() => Received::Shutdown("SIGQUIT"),
        }
    }
}

/// The daemon's two listeners. It takes the installed handlers, unused, so that
/// nothing can listen before they are in place.
async fn listen(_: &Signals, config: &SimConfig) -> Result<(TcpListener, TcpListener), String> {
    let server = TcpListener::bind((config.bind_ip, config.server_port))
        .await
        .map_err(|e| {
            format!(
                "cannot listen on {}:{}: {e}",
                config.bind_ip, config.server_port
            )
        })?;
    let cmd = TcpListener::bind((config.cmd_ip, config.cmd_port))
        .await
        .map_err(|e| {
            format!(
                "cannot listen on {}:{} (command service): {e}",
                config.cmd_ip, config.cmd_port
            )
        })?;
    Ok((server, cmd))
}

/// Runs the simulated daemon until SIGTERM, SIGINT or SIGQUIT (or a `crash`).
pub async fn run_daemon(config_path: &Path) -> Result<(), String> {
    // Before anything else, and above all before listening: a supervisor may signal
    // the daemon as soon as it can reach it, and a signal with no handler yet (the
    // default action of SIGUSR1 and SIGHUP is to terminate) would kill it.
    let mut signals = Signals::install()?;
    let config = SimConfig::load(config_path)?;
    let hosts_path =
        std::env::var_os(HOSTS_ENV).map_or_else(|| PathBuf::from("/etc/hosts"), PathBuf::from);
    // Like IMEX, credentials it cannot load keep it from starting, never from using TLS.
    let tls = match &config.tls {
        Some(options) => Some(Arc::new(LinkTls::load(options.clone())?)),
        None => None,
    };
    let (server, cmd) = listen(&signals, &config).await?;
    let shared = Arc::new(Shared {
        instance: rand::random(),
        imports: Mutex::default(),
        config,
        hosts_path,
        peers: Mutex::new(Vec::new()),
        hung: Default::default(),
        tls,
    });
    println!(
        "imex-sim: listening on {} (command service {}), links {}",
        server.local_addr().map_err(|e| e.to_string())?,
        cmd.local_addr().map_err(|e| e.to_string())?,
        if shared.tls.is_some() {
            "over mutual TLS"
        } else {
            "in the clear"
        }
    );

    tokio::spawn(accept_peers(server, shared.clone()));
    tokio::spawn(serve_commands(cmd, shared.clone()));
    let mut dialers = connect_all(&shared);
    loop {
        let received = signals.next().await;
        if shared.hung.load(std::sync::atomic::Ordering::Relaxed) {
            if let Received::Shutdown(name) = received {
                println!("imex-sim: {name} ignored (hung)");
            }
            continue;
        }
        match received {
            Received::Reconnect => {
                if let Some(tls) = &shared.tls {
                    // As IMEX: credentials that do not load skip the rest of the reload.
                    if let Err(error) = tls.reload() {
                        eprintln!(
                            "imex-sim: SIGUSR1: cannot reload the TLS credentials, keeping the old ones and the connections: {error}"
                        );
                        continue;
                    }
                    println!("imex-sim: SIGUSR1: TLS credentials reloaded");
                }
                println!("imex-sim: SIGUSR1: re-resolving peers and reconnecting");
                dialers.abort_all();
                dialers = connect_all(&shared);
            }
            Received::Dump => {
                println!("imex-sim: SIGHUP: {}", shared.listing());
            }
            Received::Shutdown(name) => {
                println!("imex-sim: {name}: shutting down");
                return Ok(());
            }
        }
    }
}

/// Resolves the peers afresh and starts one dialer per resolvable remote peer.
fn connect_all(shared: &Arc<Shared>) -> JoinSet<()> {
    let nodes = std::fs::read_to_string(&shared.config.nodes_config).unwrap_or_default();
    let hosts_file = std::fs::read_to_string(&shared.hosts_path).unwrap_or_default();
    let peers = resolve(&nodes, &hosts_file, shared.config.bind_ip);
    let listed = peers
        .iter()
        .filter_map(|p| p.address)
        .map(|ip| ip.to_string())
        .collect();
    shared.imports().configured(&listed);
    let mut dialers = JoinSet::new();
    for peer in &peers {
        if peer.status == PeerStatus::Disconnected
            && let Some(ip) = peer.address
        {
            let target = SocketAddr::new(ip, shared.config.server_port);
            dialers.spawn(dial(shared.clone(), peer.index, target));
        }
    }
    *shared.peers() = peers;
    dialers
}

/// Keeps one connection to a peer, dialling again after it drops.
async fn dial(shared: Arc<Shared>, index: usize, target: SocketAddr) {
    loop {
        let wait = match link(&shared, target).await {
            Ok((stream, instance)) => {
                shared.linked(index, instance);
                keep_link(stream).await;
                shared.set_status(index, PeerStatus::Disconnected, None);
                REDIAL
            }
            Err(Link::Unreachable) => REDIAL,
            Err(Link::Refused(reason)) => {
                if let Some(tls) = &shared.tls {
                    tls.refused(&target.to_string(), reason.clone());
                }
                shared.set_status(index, PeerStatus::Disconnected, Some(reason));
                REDIAL_REFUSED
            }
        };
        tokio::time::sleep(wait).await;
    }
}

/// Why a dial gave no link.
enum Link {
    /// No TCP connection: the peer is down, or not listening yet.
    Unreachable,
    /// A connection, but the handshake failed either way.
    Refused(String),
}

trait PeerIo: AsyncRead + AsyncWrite + Unpin + Send {}
impl<T: AsyncRead + AsyncWrite + Unpin + Send> PeerIo for T {}
type PeerStream = Box<dyn PeerIo>;

/// How long each end waits for the other's instance once linked.
const INSTANCE_TIMEOUT: Duration = Duration::from_secs(2);

/// The dialler says its instance first, then hears the peer's.
async fn exchange_instances(stream: &mut PeerStream, mine: u64, first: bool) -> Option<u64> {
    let mut theirs = [0u8; 8];
    let exchange = async {
        if first {
            stream.write_all(&mine.to_be_bytes()).await?;
            stream.flush().await?;
            stream.read_exact(&mut theirs).await?;
        } else {
            stream.read_exact(&mut theirs).await?;
            stream.write_all(&mine.to_be_bytes()).await?;
            stream.flush().await?;
        }
        Ok::<_, std::io::Error>(u64::from_be_bytes(theirs))
    };
    timeout(INSTANCE_TIMEOUT, exchange).await.ok()?.ok()
}

/// A connection to `target` from our own IP (in the clear, or over TLS once both ends
/// accepted the other's certificate), and the instance of the daemon there.
async fn link(shared: &Shared, target: SocketAddr) -> Result<(PeerStream, u64), Link> {
    let mut stream = secure(shared, target).await?;
    let instance = exchange_instances(&mut stream, shared.instance, true)
        .await
        .ok_or(Link::Unreachable)?;
    Ok((stream, instance))
}

async fn secure(shared: &Shared, target: SocketAddr) -> Result<PeerStream, Link> {
    let socket = tokio::net::TcpSocket::new_v4()
        .and_then(|s| {
            s.bind(SocketAddr::new(shared.config.bind_ip, 0))?;
            Ok(s)
        })
        .map_err(|_| Link::Unreachable)?;
    let tcp = socket
        .connect(target)
        .await
        .map_err(|_| Link::Unreachable)?;
    let Some(tls) = &shared.tls else {
        return Ok(Box::new(tcp));
    };
    let name = ServerName::IpAddress(target.ip().into());
    let mut stream = match timeout(HANDSHAKE_TIMEOUT, tls.connector().connect(name, tcp)).await {
        Ok(Ok(stream)) => stream,
        Ok(Err(error)) if is_refusal(&error) => {
            return Err(Link::Refused(format!("handshake failed: {error}")));
        }
        // The peer went away or stalled mid-handshake (a restart, a pause): lost, not
        // refused.
        Ok(Err(_)) | Err(_) => return Err(Link::Unreachable),
    };
    let mut accepted = [0u8; 1];
    match timeout(HANDSHAKE_TIMEOUT, stream.read_exact(&mut accepted)).await {
        Ok(Ok(_)) if accepted[0] == ACCEPTED => {
            tls.accepted(&target.to_string());
            Ok(Box::new(stream))
        }
        Ok(Ok(_)) => Err(Link::Refused("the peer answered out of protocol".into())),
        Ok(Err(error)) if is_refusal(&error) => Err(Link::Refused(format!(
            "the peer refused our certificate: {error}"
        ))),
        Ok(Err(_)) | Err(_) => Err(Link::Unreachable),
    }
}

/// Whether a handshake failed on TLS's own terms (a certificate refused either way, or
/// something that is not TLS), not because the connection broke.
fn is_refusal(error: &std::io::Error) -> bool {
    error
        .get_ref()
        .is_some_and(|inner| inner.is::<rustls::Error>())
}

/// Accepts peers' connections and holds them until they close.
async fn accept_peers(listener: TcpListener, shared: Arc<Shared>) {
    let mut held = JoinSet::new();
    loop {
        tokio::select! {
            accepted = listener.accept() => {
                if let Ok((stream, from)) = accepted {
                    held.spawn(hold_peer(stream, from, shared.clone()));
                }
            }
            Some(_) = held.join_next(), if !held.is_empty() => {}
        }
    }
}

/// One accepted peer: over TLS only once its certificate chains to our CA.
async fn hold_peer(stream: TcpStream, from: SocketAddr, shared: Arc<Shared>) {
    let mut stream: PeerStream = match shared.tls.clone() {
        None => Box::new(stream),
        Some(tls) => {
            // A peer dials from its own IP and a port of the moment: the IP is who it is.
            let peer = from.ip().to_string();
            match timeout(HANDSHAKE_TIMEOUT, tls.acceptor().accept(stream)).await {
                Ok(Ok(mut stream)) => {
                    if stream.write_all(&[ACCEPTED]).await.is_err() || stream.flush().await.is_err()
                    {
                        return;
                    }
                    tls.accepted(&peer);
                    Box::new(stream)
                }
                Ok(Err(error)) if is_refusal(&error) => {
                    tls.refused(&peer, format!("handshake failed: {error}"));
                    return;
                }
                // Gone or stalled mid-handshake: nothing to hold, nothing refused.
                Ok(Err(_)) | Err(_) => return,
            }
        }
    };
    if exchange_instances(&mut stream, shared.instance, false)
        .await
        .is_none()
    {
        return;
    }
    keep_link(stream).await;
}

/// How often each end of a link says it is there, and how long a silent link lasts.
const HEARTBEAT: Duration = Duration::from_millis(250);
const LINK_TIMEOUT: Duration = Duration::from_secs(1);

/// Holds a link until it closes or goes silent. A cut that drops packets (a partition,
/// a dead host) closes nothing, so each end beats and gives up on a silent peer, as
/// IMEX notices a peer it no longer hears from; otherwise a peer cut off would look
/// connected forever.
async fn keep_link(stream: PeerStream) {
    let (mut reader, mut writer) = tokio::io::split(stream);
    let beat = async move {
        let mut tick = tokio::time::interval(HEARTBEAT);
        loop {
            tick.tick().await;
            if writer.write_all(&[0]).await.is_err() || writer.flush().await.is_err() {
                return;
            }
        }
    };
    let listen = async move {
        let mut buf = [0u8; 64];
        while let Ok(Ok(n)) = timeout(LINK_TIMEOUT, reader.read(&mut buf)).await {
            if n == 0 {
                return;
            }
        }
    };
    tokio::select! {
        () = beat => {}
        () = listen => {}
    }
}

async fn serve_commands(listener: TcpListener, shared: Arc<Shared>) {
    while let Ok((stream, _)) = listener.accept().await {
        tokio::spawn(answer(stream, shared.clone()));
    }
}

async fn answer(stream: TcpStream, shared: Arc<Shared>) {
    let (read_half, mut write_half) = stream.into_split();
    let mut lines = BufReader::new(read_half).lines();
    let Ok(Some(command)) = lines.next_line().await else {
        return;
    };
    if shared.hung.load(std::sync::atomic::Ordering::Relaxed) {
        // Hung: hold the connection and never answer.
        std::future::pending::<()>().await;
    }
    let reply = match command.trim() {
        "q" => {
            if ready(&shared.peers()) {
                "READY\n".to_owned()
            } else {
                "NOT_READY\n".to_owned()
            }
        }
        "N" => format!("{}\n", shared.listing()),
        import if import.starts_with("import ") => {
            match shared.import(&import["import ".len()..]) {
                Ok(id) => format!("IMPORT {id}\n"),
                Err(error) => format!("ERROR {error}\n"),
            }
        }
        "imports" => format!(
            "{}\n",
            serde_json::to_string(shared.imports().report()).unwrap_or_default()
        ),
        "crash" => {
            eprintln!("imex-sim: crashing on request");
            std::process::exit(134);
        }
        "hang" => {
            shared
                .hung
                .store(true, std::sync::atomic::Ordering::Relaxed);
            eprintln!("imex-sim: hanging on request");
            "HUNG\n".to_owned()
        }
        other => format!("ERROR unknown command {other:?}\n"),
    };
    let _ = write_half.write_all(reply.as_bytes()).await;
}

/// The `nvidia-imex-ctl` side: one command to the daemon's command service.
pub async fn run_ctl(config_path: &Path, command: &str, wait: Duration) -> Result<String, String> {
    let config = SimConfig::load(config_path)?;
    let target = SocketAddr::new(config.cmd_ip, config.cmd_port);
    let exchange = async {
        let mut stream = TcpStream::connect(target)
            .await
            .map_err(|e| format!("cannot reach the IMEX command service at {target}: {e}"))?;
        stream
            .write_all(format!("{command}\n").as_bytes())
            .await
            .map_err(|e| e.to_string())?;
        let mut reply = String::new();
        BufReader::new(stream)
            .read_line(&mut reply)
            .await
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(reply)
    };
    tokio::time::timeout(wait, exchange).await.map_err(|_| {
        format!("the IMEX command service at {target} did not answer within {wait:?}")
    })?
}

/// For tests: the listing as the adapter parses it.
pub fn listing_to_map(listing: &str) -> BTreeMap<String, String> {
    serde_json::from_str::<domaind_imex::daemon::Listing>(listing)
        .map(|l| l.nodes.into_iter().map(|n| (n.host, n.status)).collect())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolution_skips_parked_and_unknown_names_and_finds_itself() {
        let hosts =
            "10.0.0.1\tslot-0\n127.255.255.254\tslot-1 # domaind: unused slot\n10.0.0.3\tslot-2\n";
        let peers = resolve(
            "slot-0\nslot-1\nslot-2\nslot-3\n10.0.0.9\n",
            hosts,
            "10.0.0.1".parse().unwrap(),
        );
        let statuses: Vec<_> = peers.iter().map(|p| p.status).collect();
        assert_eq!(
            statuses,
            vec![
                PeerStatus::Myself,
                PeerStatus::Unresolved,
                PeerStatus::Disconnected,
                PeerStatus::Unresolved,
                PeerStatus::Disconnected
            ]
        );
        assert!(!ready(&peers));
    }

    #[test]
    fn ready_when_every_resolvable_peer_is_connected() {
        let mut peers = resolve(
            "a\nb\n",
            "10.0.0.1 a\n10.0.0.2 b\n",
            "10.0.0.1".parse().unwrap(),
        );
        peers[1].status = PeerStatus::Connected;
        assert!(ready(&peers));
    }
}
