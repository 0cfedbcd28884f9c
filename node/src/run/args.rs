//! `domaind run`'s flags. Every flag has an environment fallback, so that a DaemonSet
//! can pass the node name and pod IP through the downward API.

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use clap::{Args, ValueEnum};
use domaind_actors::model::{DEFAULT_MAX_SLOTS, ReadinessPolicy, Slot};
use domaind_gossip::NodeName;
use domaind_kube_api::args::{HttpArgs, KubeArgs, NodeHttp};

use crate::certs::ImexNames;
use domaind_imex::{Command, HostUnit};
use domaind_prepare::cdi::DEFAULT_CDI_DIR;

/// Where a node learns its clique-mates' gossip addresses (`--seed-discovery`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SeedDiscovery {
    /// `api-server` with --backend kube and no --seed; `static` otherwise.
    Auto,
    /// The clique-mates' addresses from their ResourceSlices, watched (--backend kube).
    ApiServer,
    /// Only --seed.
    Static,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// The DRA driver name and the Kubernetes backend's API timeout.
    #[command(flatten)]
    pub kube: KubeArgs,

    /// /metrics, /healthz and /readyz.
    #[command(flatten)]
    pub http: HttpArgs<NodeHttp>,

    /// Where /state is served, or `off`. It tells anyone who can reach it the node's
    /// claims, domains and IMEX peers, unauthenticated: keep it on loopback (the node
    /// daemon runs in the host network, so --http-addr is reachable from the network).
    #[arg(long, env = "DOMAIND_STATE_ADDR", default_value = DEFAULT_STATE_ADDR, value_parser = parse_state_addr)]
    pub state_addr: StateAddr,

    /// This node's Kubernetes name: its gossip identity, which its certificate must carry.
    #[arg(long, env = "NODE_NAME")]
    pub node_name: NodeName,

    /// This node's IP: gossip listens and IMEX binds on it, and peers dial it.
    #[arg(long, env = "POD_IP")]
    pub pod_ip: IpAddr,

    /// The gossip port, on --pod-ip.
    #[arg(long, env = "DOMAIND_GOSSIP_PORT", default_value_t = 7946)]
    pub gossip_port: u16,

    /// Gossip seeds, `ip:port` or `host:port`, for --seed-discovery static; any one
    /// live clique-mate is enough. A name is resolved every minute and gives at most 32
    /// of its addresses. Repeat the flag, or separate with commas.
    #[arg(long = "seed", env = "DOMAIND_SEEDS", value_delimiter = ',')]
    pub seeds: Vec<String>,

    /// Where gossip seeds come from: `api-server` (the clique-mates' addresses on
    /// their ResourceSlices, watched; --backend kube), `static` (--seed), or `auto`
    /// (api-server with --backend kube and no --seed, static otherwise). A node without
    /// fabric gossips with nobody either way.
    #[arg(long, env = "DOMAIND_SEED_DISCOVERY", value_enum, default_value_t = SeedDiscovery::Auto)]
    pub seed_discovery: SeedDiscovery,

    /// How often chitchat's anti-entropy rounds run. Each sends every clique-mate's
    /// digest (about 50 bytes a node) to three peers; news does not wait for them (it is
    /// pushed at once), so they only repair what a lost message missed.
    #[arg(long, env = "DOMAIND_GOSSIP_INTERVAL", default_value = "10s", value_parser = humantime::parse_duration)]
    pub gossip_interval: Duration,

    /// How often this node's liveness pulse goes to a peer (two bytes per clique-mate).
    #[arg(long, env = "DOMAIND_PULSE_INTERVAL", default_value = "150ms", value_parser = humantime::parse_duration)]
    pub pulse_interval: Duration,

    /// A clique-mate with no pulse and no news for this long is dead: it leaves the
    /// membership, and its IMEX peers drop it. Shorter notices sooner; too short for
    /// the network's loss and jitter removes live nodes.
    #[arg(long, env = "DOMAIND_GOSSIP_DEAD_AFTER", default_value = "2s", value_parser = humantime::parse_duration)]
    pub gossip_dead_after: Duration,

    /// Eager gossip: how many random live peers hear of this node's own changes at once
    /// instead of at the next round (news from others goes on to 3). The default covers
    /// an NVL72 rack's other nodes. 0 turns eager gossip off: news waits for the rounds,
    /// and a domain forms in about a second instead of a fifth.
    #[arg(long, env = "DOMAIND_GOSSIP_PUSH_FANOUT", default_value_t = domaind_gossip::EagerGossip::default().origin_fanout)]
    pub gossip_push_fanout: usize,

    /// Directory with this node's gossip TLS files: ca.crt, tls.crt and tls.key (as a
    /// cert-manager Secret mounts them). Reloaded when they change. With --tls-mode csr
    /// the daemon writes tls.key (0600) and tls.crt here itself.
    #[arg(long, env = "DOMAIND_TLS_DIR", default_value = "/etc/domaind/tls")]
    pub tls_dir: PathBuf,

    /// Where the node's certificate comes from: `files` (--tls-dir, put there by
    /// someone else) or `csr` (asked of the cluster's signer, the controller, through a
    /// CertificateSigningRequest, and renewed at two thirds of its life; needs the
    /// Kubernetes API and a ServiceAccount token bound to this node's pod).
    #[arg(long, env = "DOMAIND_TLS_MODE", value_enum, default_value_t = TlsMode::Files)]
    pub tls_mode: TlsMode,

    /// The CA certificate peers' certificates must chain to. Default: ca.crt in
    /// --tls-dir. With --tls-mode csr, the controller's CA bundle ConfigMap mounted as a
    /// file; reloaded when it changes.
    #[arg(long, env = "DOMAIND_TLS_CA_FILE")]
    pub tls_ca_file: Option<PathBuf>,

    /// --tls-mode csr: the lifetime each request asks for (the signer may give less).
    #[arg(long, env = "DOMAIND_CSR_LIFETIME", default_value = "24h", value_parser = humantime::parse_duration)]
    pub csr_lifetime: Duration,

    /// --tls-mode csr: how long to wait for the signer's answer before asking again.
    #[arg(long, env = "DOMAIND_CSR_TIMEOUT", default_value = "5m", value_parser = humantime::parse_duration)]
    pub csr_timeout: Duration,

    /// The kubelet's plugins directory: the DRA socket is <dir>/<driver>/dra.sock.
    #[arg(
        long,
        env = "DOMAIND_KUBELET_PLUGINS_DIR",
        default_value = "/var/lib/kubelet/plugins"
    )]
    pub kubelet_plugins_dir: PathBuf,

    /// The kubelet's plugin registration directory: the registration socket is
    /// <dir>/<driver>-reg.sock.
    #[arg(
        long,
        env = "DOMAIND_KUBELET_REGISTRY_DIR",
        default_value = "/var/lib/kubelet/plugins_registry"
    )]
    pub kubelet_registry_dir: PathBuf,

    /// Hold /readyz at 503 until the kubelet has registered the DRA plugin (and while it
    /// refuses it), saying why: a DaemonSet rollout then moves on to the next node only
    /// once the kubelet here can call the new daemon. For daemons under a kubelet (the
    /// chart turns it on); a daemon with no kubelet (the demo, a local rack) would never
    /// be ready.
    #[arg(long, env = "DOMAIND_READY_NEEDS_KUBELET")]
    pub ready_needs_kubelet: bool,

    /// domaind's own state: the checkpoint of prepared claims, IMEX's config files (unless
    /// --imex-config-dir says otherwise) and run.json, the addresses this run listens on.
    #[arg(long, env = "DOMAIND_STATE_DIR", default_value = "/var/lib/domaind")]
    pub state_dir: PathBuf,

    /// Where claims come from and status goes: `local` reads claim files from and writes
    /// status files to --local-dir (no cluster; see the README); `kube` talks to the
    /// Kubernetes API server (in-cluster service account, or KUBECONFIG): ResourceClaims,
    /// ComputeDomain status and Events, and this node's ResourceSlices.
    #[arg(long, env = "DOMAIND_BACKEND", value_enum, default_value_t = Backend::Local)]
    pub backend: Backend,

    /// The local backend's directory, shared by every daemon of a local rack.
    #[arg(long, env = "DOMAIND_LOCAL_DIR", required_if_eq("backend", "local"))]
    pub local_dir: Option<PathBuf>,

    /// Kubernetes backend: channel devices this node publishes in its ResourceSlices
    /// (channel-0 .. channel-N-1). Each pod's claim takes one, so this is how many pods of
    /// one ComputeDomain can run on the node; every one gets the domain's channel.
    #[arg(long, env = "DOMAIND_CHANNEL_DEVICES", default_value_t = domaind_backends::kube::slices::DEFAULT_CHANNEL_DEVICES, value_parser = clap::value_parser!(u32).range(1..=i64::from(domaind_backends::kube::slices::MAX_CHANNEL_DEVICES)))]
    pub channel_devices: u32,

    /// Kubernetes backend: what happens to this node's ResourceSlices when the daemon
    /// stops. `keep` (restarts and upgrades leave the node schedulable; on a cluster the
    /// kubelet removes the slices of a driver whose plugin stays gone) or `delete`
    /// (removed at once: for daemons stopped for good).
    #[arg(long, env = "DOMAIND_SLICES_ON_EXIT", value_enum, default_value_t = SlicesOnExit::Keep)]
    pub slices_on_exit: SlicesOnExit,

    /// Kubernetes backend: when the checkpoint is missing or corrupt, how long rebuilding
    /// the prepared claims from the API server may take before the node starts with none.
    #[arg(long, env = "DOMAIND_RECONCILE_TIMEOUT", default_value = "30s", value_parser = humantime::parse_duration)]
    pub reconcile_timeout: Duration,

    /// How often every checkpointed claim is checked against the API server (or the
    /// local backend's claim files), besides once at start-up: a claim whose
    /// ResourceClaim or ComputeDomain is gone (deleted while the daemon was down, or
    /// force-deleted) is released as an unprepare would release it, so that it does not
    /// keep the node from serving another ComputeDomain. `0s` turns the check off.
    #[arg(long, env = "DOMAIND_STALE_CLAIM_CHECK_INTERVAL", default_value = "5m", value_parser = humantime::parse_duration)]
    pub stale_claim_check_interval: Duration,

    /// How often the node reads its NVLink fabric again (NVML, or the fake's topology
    /// file) to learn whether it registered in another clique; it also reads it when
    /// its IMEX daemon starts failing. A new clique is moved to once two reads in a row,
    /// at least 10 s apart (or this interval, if shorter), give it. `0s` reads the
    /// clique once, at start.
    #[arg(long, env = "DOMAIND_CLIQUE_CHECK_INTERVAL", default_value = "60s", value_parser = humantime::parse_duration)]
    pub clique_check_interval: Duration,

    /// The CDI spec directory the container runtime reads.
    #[arg(long, env = "DOMAIND_CDI_DIR", default_value = DEFAULT_CDI_DIR)]
    pub cdi_dir: PathBuf,

    /// A fake GPU topology file instead of NVML, for machines without GPUs (the demo,
    /// tests). Without it, NVML must be loadable.
    #[arg(long, env = "DOMAIND_GPU_TOPOLOGY")]
    pub gpu_topology: Option<PathBuf>,

    /// The NVML library to load: a file name, looked for on the loader's search path and
    /// then in --driver-root's library directories, or a path, loaded as it is.
    #[arg(long, env = "DOMAIND_NVML_LIBRARY", default_value = domaind_gpu::DEFAULT_NVML_LIBRARY)]
    pub nvml_library: PathBuf,

    /// Where the NVIDIA driver's files are mounted in the container (the chart's
    /// node.driverRoot): NVML is looked for in its library directories when the loader
    /// does not find it. Nothing mounted there: only the loader's search path is used.
    #[arg(long, env = "DOMAIND_DRIVER_ROOT", default_value = domaind_gpu::DEFAULT_DRIVER_ROOT)]
    pub driver_root: PathBuf,

    /// The IMEX daemon.
    #[arg(long, env = "DOMAIND_IMEX_BIN", default_value = "nvidia-imex")]
    pub imex_bin: PathBuf,

    /// The IMEX control tool (readiness queries).
    #[arg(long, env = "DOMAIND_IMEX_CTL", default_value = "nvidia-imex-ctl")]
    pub imex_ctl: PathBuf,

    /// Run `imex-sim` (this path) instead of nvidia-imex and nvidia-imex-ctl: for
    /// machines without the driver. It really connects to its peers over TCP.
    #[arg(long, env = "DOMAIND_IMEX_SIM", conflicts_with_all = ["imex_bin", "imex_ctl"])]
    pub imex_sim: Option<PathBuf>,

    /// Run the IMEX simulator built into this binary (`domaind imex-sim`), as --imex-sim
    /// does with a separate binary.
    #[arg(long, env = "DOMAIND_IMEX_SIM_BUILTIN", conflicts_with_all = ["imex_bin", "imex_ctl", "imex_sim"])]
    pub imex_sim_builtin: bool,

    /// The socket of the IMEX runner (`domaind imex-runner`) that keeps this node's IMEX
    /// daemon: IMEX then outlives this process, a restart of it (a crash, an upgrade)
    /// adopts the running daemon, and a stop is not a departure from the node's
    /// domains. Unset (and no --imex-host-service): IMEX is this process's child and
    /// dies with it.
    #[arg(
        long,
        env = "DOMAIND_IMEX_RUNNER",
        conflicts_with = "imex_host_service"
    )]
    pub imex_runner: Option<PathBuf>,

    /// The host's systemd unit that runs IMEX (NVIDIA's `nvidia-imex.service`, with a
    /// drop-in that runs it in the foreground on this node's config: docs/OPERATIONS.md,
    /// "Host-managed IMEX"). This process writes IMEX's config and starts, reloads,
    /// stops and follows the unit through --imex-systemctl; IMEX outlives it, and a
    /// restart of it adopts the running daemon, as with --imex-runner.
    #[arg(long, env = "DOMAIND_IMEX_HOST_SERVICE", value_name = "UNIT")]
    pub imex_host_service: Option<String>,

    /// How to run the host's systemctl, for --imex-host-service: a command and its
    /// leading arguments, split at whitespace. In a pod: `nsenter --target 1 --mount --
    /// systemctl` (with hostPID).
    #[arg(
        long,
        env = "DOMAIND_IMEX_SYSTEMCTL",
        default_value = "systemctl",
        value_name = "CMD"
    )]
    pub imex_systemctl: String,

    /// Where IMEX's config.cfg and nodes_config.cfg are written; <state-dir>/imex if unset.
    #[arg(long, env = "DOMAIND_IMEX_CONFIG_DIR")]
    pub imex_config_dir: Option<PathBuf>,

    /// The hosts file IMEX resolves slot names through (DNS-names mode). Only the block
    /// between domaind's markers is touched. Default: /etc/hosts, or
    /// <imex-config-dir>/hosts with --imex-sim.
    #[arg(long, env = "DOMAIND_IMEX_HOSTS_FILE")]
    pub imex_hosts_file: Option<PathBuf>,

    /// How IMEX addresses its peers: stable slot names (membership changes reload IMEX)
    /// or IPs (membership changes restart it).
    #[arg(long, env = "DOMAIND_IMEX_ADDRESSING", value_enum, default_value_t = Addressing::DnsNames)]
    pub imex_addressing: Addressing,

    /// IMEX's peer port, the same on every node.
    #[arg(long, env = "DOMAIND_IMEX_PORT", default_value_t = 50000)]
    pub imex_port: u16,

    /// IMEX's command port, for readiness queries.
    #[arg(long, env = "DOMAIND_IMEX_CMD_PORT", default_value_t = 50005)]
    pub imex_cmd_port: u16,

    /// Whether IMEX's own links run over mutual TLS with this node's gossip certificate
    /// (key, certificate and CA written beside IMEX's config, only root may read them;
    /// reloaded with SIGUSR1 when the certificate rotates). IMEX checks each peer's
    /// certificate against the IP it dialled (--imex-addressing ips) or, in DNS-names
    /// mode, against IMEX's shared name (`IMEX_SECURITY_TARGET_OVERRIDE`). `auto`: on
    /// when the node's certificate carries that (with --tls-mode csr the IP is asked
    /// for, and the shared name with --imex-shared-name), with nvidia-imex and the
    /// simulator alike (docs/ARCHITECTURE.md, "IMEX over mutual TLS"). `on`: always.
    /// `off`: for IMEX versions without SSL/TLS.
    #[arg(long, env = "DOMAIND_IMEX_TLS", value_enum, default_value_t = ImexTls::Auto)]
    pub imex_tls: ImexTls,

    /// Ask for IMEX's shared name in this node's certificate (--tls-mode csr, DNS-names
    /// mode), which --imex-tls auto needs there. Off by default for one release: daemons
    /// of the previous release refuse gossip from a certificate with a second DNS name,
    /// so a rolling upgrade would split the rack. Turn it on once every node runs this
    /// release; a later release turns it on by default.
    #[arg(long, env = "DOMAIND_IMEX_SHARED_NAME")]
    pub imex_shared_name: bool,

    /// Whether domaind makes the channel device nodes (/dev/nvidia-caps-imex-channels)
    /// its claims hand out, or leaves them to the driver or an administrator.
    #[arg(long, env = "DOMAIND_CHANNEL_NODES", value_enum, default_value_t = ChannelNodes::Create)]
    pub channel_nodes: ChannelNodes,

    /// The host's /dev, where channel nodes are made.
    #[arg(long, env = "DOMAIND_DEV_ROOT", default_value = "/dev")]
    pub dev_root: PathBuf,

    /// The file listing character device majors.
    #[arg(long, env = "DOMAIND_PROC_DEVICES", default_value = "/proc/devices")]
    pub proc_devices: PathBuf,

    /// How many channels a claim with allocationMode All gets (channels 0 to N-1).
    #[arg(long, env = "DOMAIND_ALL_CHANNELS", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(1..=1_048_576))]
    pub all_channels: u32,

    /// When a prepared claim's pod may start, for claims whose config does not say:
    /// `local` once this node's IMEX is ready, `domain` once every member's is.
    #[arg(long, env = "DOMAIND_DEFAULT_READINESS", value_enum, default_value_t = Readiness::Local)]
    pub default_readiness: Readiness,

    /// IMEX slots per domain: 18 for an NVL72 rack, up to the clique's size.
    #[arg(long, env = "DOMAIND_MAX_SLOTS", default_value_t = DEFAULT_MAX_SLOTS, value_parser = clap::value_parser!(u16).range(1..=1024))]
    pub max_slots: Slot,

    /// How long a prepare call waits for readiness before answering with a retryable
    /// error (the kubelet calls again, a minute or more later). The kubelet gives a call
    /// 45 s: waiting most of it answers a pod as soon as its domain is ready.
    #[arg(long, env = "DOMAIND_PREPARE_DEADLINE", default_value = "40s", value_parser = humantime::parse_duration)]
    pub prepare_deadline: Duration,

    /// `isolation: Channel` domains: how long this node must have advertised a
    /// domain's channel, unchanged and agreed by every node of the clique's shared
    /// IMEX domain, before a pod gets it. Must exceed the time gossip takes to spread
    /// a change across the clique: two domains formed at once on nodes that have not
    /// heard of each other then never get one channel.
    #[arg(long, env = "DOMAIND_CHANNEL_SETTLE", default_value = "1s", value_parser = humantime::parse_duration)]
    pub channel_settle: Duration,

    /// Also serve the standard gRPC health service on this TCP address, for
    /// Kubernetes grpc probes (it is always served on the DRA socket).
    #[arg(long, env = "DOMAIND_HEALTH_GRPC_ADDR")]
    pub health_grpc_addr: Option<SocketAddr>,

    /// How often IMEX's status is queried once it is ready and nothing changes (after a
    /// start, a reload or a peer joining or leaving it is queried within tens of
    /// milliseconds, backing off to this). A link lost at steady state is seen this
    /// late at most; an exit is seen at once whatever this says.
    #[arg(long, env = "DOMAIND_IMEX_POLL_STEADY", default_value = "5s", value_parser = parse_poll_steady)]
    pub imex_poll_steady: Duration,

    /// Kubernetes backend: how long after its IMEX daemon's first failure (one not
    /// since followed by --imex-untaint-after of health) a node still failing taints
    /// every channel device `<driver>/imex-failing:NoSchedule`, so that the scheduler
    /// places no new claim here. `0s`: at the first failure.
    #[arg(long, env = "DOMAIND_IMEX_TAINT_AFTER", default_value = "5s", value_parser = humantime::parse_duration)]
    pub imex_taint_after: Duration,

    /// Kubernetes backend: how long the IMEX daemon must have been healthy, in a row,
    /// before the taint is removed.
    #[arg(long, env = "DOMAIND_IMEX_UNTAINT_AFTER", default_value = "30s", value_parser = humantime::parse_duration)]
    pub imex_untaint_after: Duration,

    /// How long a graceful stop may take before the process exits anyway.
    #[arg(long, env = "DOMAIND_SHUTDOWN_TIMEOUT", default_value = "20s", value_parser = humantime::parse_duration)]
    pub shutdown_timeout: Duration,
}

/// `--imex-poll-steady`: from 10 ms (below that the status tool's own start-up is
/// the poll) to 60 s (past that a lost link waits on it more than on its grace).
impl RunArgs {
    /// The host's IMEX unit and how to reach its systemctl (--imex-host-service,
    /// --imex-systemctl), when IMEX is host-managed.
    pub fn imex_host_unit(&self) -> anyhow::Result<Option<HostUnit>> {
        let Some(unit) = self.imex_host_service.clone() else {
            return Ok(None);
        };
        let mut words = self.imex_systemctl.split_whitespace();
        let program = words
            .next()
            .ok_or_else(|| anyhow::anyhow!("--imex-systemctl names no command"))?;
        Ok(Some(HostUnit {
            unit,
            systemctl: words.fold(Command::new(program), Command::arg),
        }))
    }
}

fn parse_poll_steady(text: &str) -> Result<Duration, String> {
    let value = humantime::parse_duration(text).map_err(|e| e.to_string())?;
    if !(Duration::from_millis(10)..=Duration::from_secs(60)).contains(&value) {
        return Err(format!("{text} is not between 10ms and 60s"));
    }
    Ok(value)
}

pub const DEFAULT_STATE_ADDR: &str = "127.0.0.1:9466";

/// `--state-addr`: an address, or `None` for `off`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StateAddr(pub Option<SocketAddr>);

fn parse_state_addr(value: &str) -> Result<StateAddr, String> {
    if value == "off" {
        return Ok(StateAddr(None));
    }
    value
        .parse()
        .map(|addr| StateAddr(Some(addr)))
        .map_err(|error| format!("{error}: expected IP:PORT or `off`"))
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Backend {
    /// Claim files and status files in --local-dir.
    Local,
    /// The Kubernetes API server.
    Kube,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TlsMode {
    /// tls.crt and tls.key from --tls-dir, as someone else put them there.
    Files,
    /// Asked of the cluster's signer and renewed by the daemon.
    Csr,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum SlicesOnExit {
    /// Leave them: a restart or upgrade keeps the node schedulable.
    Keep,
    /// Delete them at a graceful stop: for daemons stopped for good.
    Delete,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Addressing {
    DnsNames,
    Ips,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ImexTls {
    /// On where the node's certificate carries what IMEX checks.
    Auto,
    On,
    Off,
}

/// What IMEX (and `imex-sim`, which checks as it does) holds a peer's certificate to,
/// and whether this node's certificate carries it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DialledNames {
    /// DNS-names mode: the slot names dialled move between nodes, so the config's
    /// `IMEX_SECURITY_TARGET_OVERRIDE` names IMEX's shared name instead, where the
    /// certificate carries it.
    SharedName { in_certificate: bool },
    /// IPs mode: the member's IP, as an IP SAN.
    Ips { in_certificate: bool },
}

impl ImexTls {
    /// Whether IMEX's links use TLS, given what IMEX will check a peer's certificate
    /// against.
    pub fn enabled(self, dialled: DialledNames) -> bool {
        match (self, dialled) {
            (Self::On, _) => true,
            (Self::Off, _) => false,
            (
                Self::Auto,
                DialledNames::SharedName { in_certificate } | DialledNames::Ips { in_certificate },
            ) => in_certificate,
        }
    }
}

impl RunArgs {
    /// What IMEX will hold a peer's certificate to, and whether the node's certificate
    /// at `cert` carries it.
    pub fn imex_dialled(&self, cert: &Path) -> DialledNames {
        match self.imex_addressing {
            Addressing::DnsNames => DialledNames::SharedName {
                in_certificate: crate::certs::carries_imex_shared_name(cert),
            },
            Addressing::Ips => DialledNames::Ips {
                in_certificate: crate::certs::carries_ip(cert, self.pod_ip),
            },
        }
    }

    /// What this node's certificate carries for IMEX where its links may run over TLS:
    /// --pod-ip in IPs mode, IMEX's shared name in DNS-names mode with
    /// --imex-shared-name; nothing with TLS off (gossip names nodes by their DNS name
    /// alone). The previous release's gossip takes an IP SAN, but not a second DNS name.
    pub fn imex_names(&self) -> ImexNames {
        match (self.imex_tls, self.imex_addressing) {
            (ImexTls::Off, _) => ImexNames::default(),
            (_, Addressing::Ips) => ImexNames {
                shared_name: false,
                ips: vec![self.pod_ip],
            },
            (_, Addressing::DnsNames) => ImexNames {
                shared_name: self.imex_shared_name,
                ips: Vec::new(),
            },
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum ChannelNodes {
    /// Make missing nodes with mknod (needs CAP_MKNOD).
    Create,
    /// Describe the nodes in CDI specs but do not make them.
    Skip,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Readiness {
    Local,
    Domain,
}

impl From<Readiness> for ReadinessPolicy {
    fn from(readiness: Readiness) -> Self {
        match readiness {
            Readiness::Local => ReadinessPolicy::Local,
            Readiness::Domain => ReadinessPolicy::Domain,
        }
    }
}

#[cfg(test)]
mod tests {
    use clap::Parser;

    use super::*;

    #[derive(Debug, Parser)]
    struct Run {
        #[command(flatten)]
        args: RunArgs,
    }

    fn parse(extra: &[&str]) -> Result<RunArgs, clap::Error> {
        let required = ["run", "--node-name", "node-a", "--pod-ip", "10.0.0.1"];
        Run::try_parse_from(required.iter().chain(extra)).map(|run| run.args)
    }

    #[test]
    fn state_is_served_on_loopback_by_default_and_never_on_the_http_address() {
        let args = parse(&[]).unwrap();
        let state = args.state_addr.0.expect("on by default");
        assert!(state.ip().is_loopback(), "{state}");
        assert_ne!(state, args.http.http_addr);
        assert!(!args.http.http_addr.ip().is_loopback());
    }

    #[test]
    fn state_can_be_moved_or_turned_off() {
        let moved = parse(&["--state-addr", "127.0.115.1:0"]).unwrap();
        assert_eq!(moved.state_addr.0, Some("127.0.115.1:0".parse().unwrap()));
        assert_eq!(parse(&["--state-addr", "off"]).unwrap().state_addr.0, None);
        let bad = parse(&["--state-addr", "loopback"])
            .unwrap_err()
            .to_string();
        assert!(bad.contains("expected IP:PORT or `off`"), "{bad}");
    }

    #[test]
    fn imex_is_kept_by_the_runner_or_the_host_unit_never_both() {
        let host = parse(&[
            "--imex-host-service",
            "nvidia-imex.service",
            "--imex-systemctl",
            "nsenter --target 1 --mount -- systemctl",
        ])
        .unwrap();
        let unit = host.imex_host_unit().unwrap().unwrap();
        assert_eq!(unit.unit, "nvidia-imex.service");
        assert_eq!(unit.systemctl.program, PathBuf::from("nsenter"));
        assert_eq!(
            unit.systemctl.args,
            ["--target", "1", "--mount", "--", "systemctl"]
        );
        assert_eq!(parse(&[]).unwrap().imex_host_unit().unwrap(), None);
        let blank = parse(&["--imex-host-service", "u", "--imex-systemctl", " "]).unwrap();
        assert!(blank.imex_host_unit().is_err());
        let both = parse(&[
            "--imex-host-service",
            "nvidia-imex.service",
            "--imex-runner",
            "/run/runner.sock",
        ])
        .unwrap_err()
        .to_string();
        assert!(
            both.contains("--imex-host-service") && both.contains("--imex-runner"),
            "{both}"
        );
    }

    #[test]
    fn imex_tls_auto_is_on_where_the_certificate_carries_what_imex_checks() {
        let carried = [
            DialledNames::Ips {
                in_certificate: true,
            },
            DialledNames::SharedName {
                in_certificate: true,
            },
        ];
        let missing = [
            DialledNames::Ips {
                in_certificate: false,
            },
            DialledNames::SharedName {
                in_certificate: false,
            },
        ];
        let auto = parse(&[]).unwrap().imex_tls;
        assert_eq!(auto, ImexTls::Auto);
        let on = parse(&["--imex-tls", "on"]).unwrap().imex_tls;
        let off = parse(&["--imex-tls", "off"]).unwrap().imex_tls;
        for dialled in carried {
            assert!(auto.enabled(dialled) && on.enabled(dialled) && !off.enabled(dialled));
        }
        for dialled in missing {
            assert!(!auto.enabled(dialled) && on.enabled(dialled) && !off.enabled(dialled));
        }
        let error = parse(&["--imex-tls", "yes"]).unwrap_err().to_string();
        assert!(error.contains("--imex-tls"), "{error}");
    }

    #[test]
    fn the_certificate_asks_for_the_pod_ip_in_ips_mode_and_the_shared_name_only_when_told() {
        let dns = parse(&[]).unwrap();
        assert!(!dns.imex_shared_name);
        assert_eq!(dns.imex_names(), ImexNames::default());
        let shared = parse(&["--imex-shared-name"]).unwrap().imex_names();
        assert!(shared.shared_name && shared.ips.is_empty(), "{shared:?}");
        for extra in [&[][..], &["--imex-shared-name"]] {
            let ips = parse(&[&["--imex-addressing", "ips"], extra].concat()).unwrap();
            assert_eq!(
                ips.imex_names(),
                ImexNames {
                    shared_name: false,
                    ips: vec![ips.pod_ip]
                },
                "{extra:?}"
            );
        }
        for mode in ["ips", "dns-names"] {
            let off = parse(&[
                "--imex-addressing",
                mode,
                "--imex-tls",
                "off",
                "--imex-shared-name",
            ])
            .unwrap();
            assert_eq!(off.imex_names(), ImexNames::default(), "{mode}");
        }
    }

    /// From flags to IMEX's TLS: the certificate a signer issues for what the flags ask
    /// for, then `auto`'s decision on it. Without --imex-shared-name DNS-names mode stays
    /// in the clear, as the previous release did with nvidia-imex.
    #[test]
    fn imex_tls_auto_in_each_mode_follows_what_the_flags_ask_the_certificate_to_carry() {
        use domaind_gossip::pki::{DevCa, NodeCertRequest};

        let ca = DevCa::generate("test", time::Duration::days(1)).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cases: [(&[&str], bool); 5] = [
            (&[], false),
            (&["--imex-shared-name"], true),
            (&["--imex-addressing", "ips"], true),
            (&["--imex-addressing", "ips", "--imex-shared-name"], true),
            (&["--imex-shared-name", "--imex-tls", "off"], false),
        ];
        for (i, (flags, tls)) in cases.into_iter().enumerate() {
            let args = parse(flags).unwrap();
            let names = args.imex_names();
            let mut request = NodeCertRequest::new(args.node_name.clone(), time::Duration::days(1));
            request.imex_shared_name = names.shared_name;
            request.ips = names.ips;
            let out = dir.path().join(i.to_string());
            let cert = ca.issue(&request).unwrap().write(&out).unwrap().cert;
            let dialled = args.imex_dialled(&cert);
            assert_eq!(
                args.imex_tls.enabled(dialled),
                tls,
                "{flags:?}: {dialled:?}"
            );
        }
    }

    #[test]
    fn the_steady_imex_poll_is_5_s_unless_set_within_its_bounds() {
        assert_eq!(parse(&[]).unwrap().imex_poll_steady, Duration::from_secs(5));
        let set = parse(&["--imex-poll-steady", "250ms"]).unwrap();
        assert_eq!(set.imex_poll_steady, Duration::from_millis(250));
        for bad in ["1ms", "2m", "often"] {
            let error = parse(&["--imex-poll-steady", bad]).unwrap_err().to_string();
            assert!(error.contains("--imex-poll-steady"), "{bad}: {error}");
        }
        let error = parse(&["--imex-poll-steady", "2m"])
            .unwrap_err()
            .to_string();
        assert!(error.contains("not between 10ms and 60s"), "{error}");
    }
}
