//! The files `nvidia-imex` reads: its config file (`KEY=VALUE` lines), the nodes
//! config (one peer per line), in DNS-names mode the hosts mapping of slot names to
//! IPs, and with TLS on the key, certificate and CA bundle of its links.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use domaind_actors::model::Slot;
use domaind_gossip::identity::IMEX_SHARED_NAME;

/// How peers are written into the nodes config.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AddressingMode {
    /// One stable name per slot, resolved through the hosts file: membership changes
    /// rewrite the hosts file and send SIGUSR1, never restarting IMEX.
    DnsNames,
    /// Member IPs: every change restarts IMEX.
    Ips,
}

/// A program and the arguments it always takes (so `imex-sim ctl` can stand in for
/// `nvidia-imex-ctl`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Command {
    pub program: PathBuf,
    pub args: Vec<String>,
}

impl Command {
    pub fn new(program: impl Into<PathBuf>) -> Self {
        Self {
            program: program.into(),
            args: Vec::new(),
        }
    }

    pub fn arg(mut self, arg: impl Into<String>) -> Self {
        self.args.push(arg.into());
        self
    }
}

/// The host's systemd unit that runs IMEX, and how to reach its `systemctl`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostUnit {
    /// `nvidia-imex.service`, as NVIDIA's IMEX package installs it.
    pub unit: String,
    /// `systemctl`, or what reaches the host's from a pod: `nsenter --target 1 --mount
    /// -- systemctl` (with `hostPID`).
    pub systemctl: Command,
}

/// Everything the IMEX adapter needs.
#[derive(Debug, Clone, PartialEq)]
pub struct ImexSettings {
    /// The daemon: `nvidia-imex` (run in the foreground, `-c <config>` appended).
    pub daemon: Command,
    /// The query tool: `nvidia-imex-ctl` (`-c <config> -q` appended).
    pub ctl: Command,
    /// What the daemon is started through so that it dies with this process: our own
    /// binary's `imex-guard` ([`super::guard`]). `None` starts it directly, and a
    /// SIGKILLed domaind leaves it running (tests that never kill their process).
    pub guard: Option<Command>,
    /// Extra environment for the daemon (the simulator reads its hosts file from it).
    pub daemon_env: Vec<(String, String)>,
    /// The IMEX runner's socket ([`super::runner`]): the daemon is started, signalled
    /// and stopped through the runner, outlives this process, and is adopted by the
    /// next one. `None`: the daemon is this process's child and dies with it.
    pub runner: Option<PathBuf>,
    /// IMEX run by the host's systemd unit ([`super::host_service`]), which the adapter
    /// starts, signals, stops and queries: it outlives this process as the runner's
    /// daemon does. Exclusive with `runner` (`domaind run` refuses both; here the
    /// runner wins).
    pub host_service: Option<HostUnit>,
    /// Where config.cfg and nodes_config.cfg are written.
    pub config_dir: PathBuf,
    /// The hosts file IMEX resolves slot names through (DNS-names mode): `/etc/hosts`
    /// of the daemon's container in production. Only the block between domaind's
    /// markers is ours; every other line is kept.
    pub hosts_file: PathBuf,
    pub mode: AddressingMode,
    /// The node's IP: IMEX listens on it and its peers dial it.
    pub bind_ip: IpAddr,
    pub server_port: u16,
    pub cmd_port: u16,
    pub max_slots: Slot,
    /// Where empty slots' names point: a loopback address nothing listens on, so a
    /// connection is refused at once, nothing leaves the node, and the name never
    /// falls through to cluster DNS.
    pub unused_slot_ip: IpAddr,
    /// `IMEX_NODE_DISCONNECTED_GRACE_TIME`: seconds before a lost peer's imports are
    /// cleaned up.
    pub disconnected_grace: Duration,
    pub log_level: u8,
    /// SIGTERM, then this long, then SIGKILL.
    pub stop_timeout: Duration,
    /// IMEX acts on at most one SIGUSR1 per ~5 s; reloads closer than this coalesce.
    pub reload_min_interval: Duration,
    /// How long a status query may take.
    pub query_timeout: Duration,
    /// After adopting a runner's daemon, how long the peers it serves are kept besides
    /// those asked for: a restarted node re-learns its peers from gossip, and handing
    /// IMEX the few it knows at first would drop the links its jobs import over.
    pub adoption_hold: Duration,
    /// A ready node whose IMEX we reload stays ready this long while the only links
    /// down are those the reload restarted ([`super::relink`]).
    pub relink_hold: Duration,
    /// IMEX's links run over mutual TLS with the node's gossip certificate: the config
    /// turns IMEX's SSL/TLS on and names the files the adapter writes from the
    /// credentials it is given ([`super::ImexDaemon::with_credentials`]).
    pub tls: bool,
    /// With TLS in DNS-names mode: the node's certificate carries IMEX's shared name, so
    /// the config makes it the name IMEX checks (`IMEX_SECURITY_TARGET_OVERRIDE`).
    /// Without it no override is written, and the config stays what the previous
    /// release wrote, so a daemon restarted across the upgrade can adopt its IMEX.
    pub shared_name: bool,
}

/// The config keys of IMEX's SSL/TLS mode, as NVIDIA's IMEX guide names them. Shared by
/// what we write and what `imex-sim` reads, so the two cannot drift apart.
pub mod tls_keys {
    /// `1` turns authentication and encryption between IMEX daemons on.
    pub const ENABLE: &str = "IMEX_ENABLE_AUTH_ENCRYPTION";
    /// `SSL_TLS` (the other modes are Kerberos through GSSAPI).
    pub const MODE: &str = "IMEX_AUTH_ENCRYPTION_MODE";
    pub const MODE_SSL_TLS: &str = "SSL_TLS";
    /// `FILE`: the six values below are paths (`ENV_PATH` and `ENV_VAL` name
    /// environment variables instead).
    pub const SOURCE: &str = "IMEX_AUTH_SOURCE";
    pub const SOURCE_FILE: &str = "FILE";
    /// What the daemon presents and trusts when it accepts a peer's connection.
    pub const SERVER_KEY: &str = "IMEX_SERVER_KEY";
    pub const SERVER_CERT: &str = "IMEX_SERVER_CERT";
    pub const SERVER_CERT_AUTH: &str = "IMEX_SERVER_CERT_AUTH";
    /// What it presents and trusts when it dials a peer.
    pub const CLIENT_KEY: &str = "IMEX_CLIENT_KEY";
    pub const CLIENT_CERT: &str = "IMEX_CLIENT_CERT";
    pub const CLIENT_CERT_AUTH: &str = "IMEX_CLIENT_CERT_AUTH";
    /// The one name a dialler checks every server's certificate against, instead of the
    /// address it dialled. Set in DNS-names mode only, to IMEX's shared name where the
    /// certificate carries it: the slot names dialled move between nodes. In IPs mode
    /// the dialled IP is checked, which
    /// pins each address to its node. `imex-sim` honours it as IMEX does.
    pub const TARGET_OVERRIDE: &str = "IMEX_SECURITY_TARGET_OVERRIDE";
}

/// The files IMEX's TLS reads, in the config directory. Mode 0600: only root (IMEX and
/// domaind) reads them.
pub const TLS_KEY_FILE: &str = "imex-tls.key";
pub const TLS_CERT_FILE: &str = "imex-tls.crt";
pub const TLS_CA_FILE: &str = "imex-ca.crt";
pub const TLS_FILE_MODE: u32 = 0o600;

impl ImexSettings {
    pub fn new(config_dir: impl Into<PathBuf>, bind_ip: IpAddr) -> Self {
        Self {
            daemon: Command::new("nvidia-imex"),
            ctl: Command::new("nvidia-imex-ctl"),
            guard: None,
            daemon_env: Vec::new(),
            runner: None,
            host_service: None,
            config_dir: config_dir.into(),
            hosts_file: PathBuf::from("/etc/hosts"),
            mode: AddressingMode::DnsNames,
            bind_ip,
            server_port: 50000,
            cmd_port: 50005,
            max_slots: domaind_actors::model::DEFAULT_MAX_SLOTS,
            unused_slot_ip: IpAddr::from([127, 255, 255, 254]),
            disconnected_grace: Duration::from_secs(120),
            log_level: 4,
            stop_timeout: Duration::from_secs(10),
            reload_min_interval: Duration::from_secs(5),
            query_timeout: Duration::from_secs(3),
            adoption_hold: Duration::from_secs(10),
            relink_hold: Duration::from_secs(2),
            tls: false,
            shared_name: false,
        }
    }

    pub fn config_path(&self) -> PathBuf {
        self.config_dir.join("config.cfg")
    }

    pub fn nodes_config_path(&self) -> PathBuf {
        self.config_dir.join("nodes_config.cfg")
    }

    pub fn log_path(&self) -> PathBuf {
        self.config_dir.join("nvidia-imex.log")
    }

    pub fn tls_key_path(&self) -> PathBuf {
        self.config_dir.join(TLS_KEY_FILE)
    }

    pub fn tls_cert_path(&self) -> PathBuf {
        self.config_dir.join(TLS_CERT_FILE)
    }

    pub fn tls_ca_path(&self) -> PathBuf {
        self.config_dir.join(TLS_CA_FILE)
    }
}

/// The daemon's config file. `DAEMONIZE=0` keeps IMEX in the foreground as our
/// child; `IMEX_WAIT_FOR_QUORUM=RECOVERY` waits for former importers only after an
/// unclean stop. With TLS the node's one certificate serves both ends of a link: it
/// carries both the server and the client usage, and in DNS-names mode, where it
/// carries IMEX's shared name, the override makes that the name checked.
pub fn render_config(settings: &ImexSettings) -> String {
    let mut lines = vec![
        ("DAEMONIZE", "0".to_owned()),
        ("BIND_INTERFACE_IP", settings.bind_ip.to_string()),
        ("SERVER_PORT", settings.server_port.to_string()),
        ("IMEX_CMD_ENABLED", "1".to_owned()),
        ("IMEX_CMD_PORT", settings.cmd_port.to_string()),
        ("IMEX_CMD_BIND_INTERFACE_IP", settings.bind_ip.to_string()),
        (
            "IMEX_NODE_CONFIG_FILE",
            settings.nodes_config_path().display().to_string(),
        ),
        ("IMEX_WAIT_FOR_QUORUM", "RECOVERY".to_owned()),
        (
            "IMEX_NODE_DISCONNECTED_GRACE_TIME",
            settings.disconnected_grace.as_secs().to_string(),
        ),
        ("LOG_FILE_NAME", settings.log_path().display().to_string()),
        ("LOG_LOCAL_LEVEL", settings.log_level.to_string()),
        ("LOG_APPEND_TO_LOG", "1".to_owned()),
    ];
    if settings.tls {
        let path = |p: PathBuf| p.display().to_string();
        lines.extend([
            (tls_keys::ENABLE, "1".to_owned()),
            (tls_keys::MODE, tls_keys::MODE_SSL_TLS.to_owned()),
            (tls_keys::SOURCE, tls_keys::SOURCE_FILE.to_owned()),
            (tls_keys::SERVER_KEY, path(settings.tls_key_path())),
            (tls_keys::SERVER_CERT, path(settings.tls_cert_path())),
            (tls_keys::SERVER_CERT_AUTH, path(settings.tls_ca_path())),
            (tls_keys::CLIENT_KEY, path(settings.tls_key_path())),
            (tls_keys::CLIENT_CERT, path(settings.tls_cert_path())),
            (tls_keys::CLIENT_CERT_AUTH, path(settings.tls_ca_path())),
        ]);
        if settings.mode == AddressingMode::DnsNames && settings.shared_name {
            lines.push((tls_keys::TARGET_OVERRIDE, IMEX_SHARED_NAME.to_owned()));
        }
    }
    let mut out = String::from("# Written by domaind. Changes are overwritten.\n");
    for (key, value) in lines {
        out.push_str(&format!("{key}={value}\n"));
    }
    out
}

/// Parses `KEY=VALUE` lines; `#` starts a comment; unknown keys are kept.
pub fn parse_config(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .map(|line| line.split('#').next().unwrap_or("").trim())
        .filter_map(|line| line.split_once('='))
        .map(|(k, v)| (k.trim().to_owned(), v.trim().to_owned()))
        .collect()
}

/// Reads a file, naming it in the error.
pub fn read(path: &Path) -> std::io::Result<String> {
    std::fs::read_to_string(path)
        .map_err(|e| std::io::Error::new(e.kind(), format!("cannot read {}: {e}", path.display())))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn config_has_the_keys_imex_needs_and_parses_back() {
        let settings = ImexSettings::new("/run/domaind/imex", "10.1.2.3".parse().unwrap());
        let parsed = parse_config(&render_config(&settings));
        assert_eq!(parsed["SERVER_PORT"], "50000");
        assert_eq!(parsed["IMEX_CMD_PORT"], "50005");
        assert_eq!(parsed["IMEX_CMD_BIND_INTERFACE_IP"], "10.1.2.3");
        assert_eq!(parsed["BIND_INTERFACE_IP"], "10.1.2.3");
        assert_eq!(
            parsed["IMEX_NODE_CONFIG_FILE"],
            "/run/domaind/imex/nodes_config.cfg"
        );
        assert_eq!(parsed["IMEX_WAIT_FOR_QUORUM"], "RECOVERY");
        assert_eq!(parsed["IMEX_NODE_DISCONNECTED_GRACE_TIME"], "120");
        assert_eq!(parsed["DAEMONIZE"], "0");
    }

    #[test]
    fn without_tls_the_config_says_nothing_of_it() {
        let settings = ImexSettings::new("/run/domaind/imex", "10.1.2.3".parse().unwrap());
        let text = render_config(&settings);
        assert!(!text.contains("IMEX_ENABLE_AUTH_ENCRYPTION"), "{text}");
        assert!(!text.contains("IMEX_SERVER_"), "{text}");
        assert!(!text.contains("IMEX_CLIENT_"), "{text}");
    }

    #[test]
    fn with_tls_the_config_turns_imex_ssl_on_with_our_files_at_both_ends() {
        let mut settings = ImexSettings::new("/run/domaind/imex", "10.1.2.3".parse().unwrap());
        settings.tls = true;
        let parsed = parse_config(&render_config(&settings));
        // The option names and values of NVIDIA's IMEX guide, spelled out here rather
        // than through `tls_keys`, so that a typo there fails this test.
        assert_eq!(parsed["IMEX_ENABLE_AUTH_ENCRYPTION"], "1");
        assert_eq!(parsed["IMEX_AUTH_ENCRYPTION_MODE"], "SSL_TLS");
        assert_eq!(parsed["IMEX_AUTH_SOURCE"], "FILE");
        for end in ["SERVER", "CLIENT"] {
            assert_eq!(
                parsed[&format!("IMEX_{end}_KEY")],
                "/run/domaind/imex/imex-tls.key"
            );
            assert_eq!(
                parsed[&format!("IMEX_{end}_CERT")],
                "/run/domaind/imex/imex-tls.crt"
            );
            assert_eq!(
                parsed[&format!("IMEX_{end}_CERT_AUTH")],
                "/run/domaind/imex/imex-ca.crt"
            );
        }
        // Everything else is as without TLS.
        assert_eq!(parsed["SERVER_PORT"], "50000");
        assert_eq!(parsed["DAEMONIZE"], "0");
    }

    #[test]
    fn the_override_names_the_shared_name_in_dns_names_mode_where_the_certificate_carries_it() {
        let mut settings = ImexSettings::new("/run/domaind/imex", "10.1.2.3".parse().unwrap());
        settings.tls = true;
        assert_eq!(settings.mode, AddressingMode::DnsNames);
        let without = render_config(&settings);
        assert!(
            !without.contains("IMEX_SECURITY_TARGET_OVERRIDE"),
            "{without}"
        );
        settings.shared_name = true;
        let parsed = parse_config(&render_config(&settings));
        assert_eq!(
            parsed["IMEX_SECURITY_TARGET_OVERRIDE"],
            "imex.domaind.invalid"
        );
        assert_eq!(parsed["IMEX_SECURITY_TARGET_OVERRIDE"], IMEX_SHARED_NAME);
        settings.mode = AddressingMode::Ips;
        let ips = render_config(&settings);
        assert!(!ips.contains("IMEX_SECURITY_TARGET_OVERRIDE"), "{ips}");
        settings.mode = AddressingMode::DnsNames;
        settings.tls = false;
        let clear = render_config(&settings);
        assert!(!clear.contains("IMEX_SECURITY_TARGET_OVERRIDE"), "{clear}");
    }

    #[test]
    fn parsing_ignores_comments_and_blank_lines() {
        let parsed = parse_config("# c\n\nA=1 # trailing\n B = two \nnot a pair\n");
        assert_eq!(parsed.len(), 2);
        assert_eq!(parsed["A"], "1");
        assert_eq!(parsed["B"], "two");
    }
}
