//! Command-line interface.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use domaind_actors::model::ClaimRef;
use domaind_gossip::NodeName;
use domaind_kubelet_plugin::DraVersion;

#[derive(Debug, Parser)]
#[command(
    name = "domaind",
    version,
    about = "ComputeDomains for NVIDIA GB200/GB300 racks: IMEX domains formed peer to peer, by gossip over mutual TLS",
    long_about = "domaind runs on every node of a multi-node NVLink cluster. Daemons of one NVLink \
clique gossip over mutual TLS and form the IMEX domain of a ComputeDomain around the nodes where \
its pods land, in seconds and without routing coordination through the API server."
)]
pub struct Cli {
    #[command(flatten)]
    pub logging: LoggingArgs,
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Args)]
pub struct LoggingArgs {
    /// Log format: human-readable text, or one JSON object per line.
    #[arg(long, global = true, env = "DOMAIND_LOG_FORMAT", value_enum, default_value_t = LogFormat::Text)]
    pub log_format: LogFormat,
    /// Log filter, in tracing's env-filter syntax (e.g. `info,domaind_gossip=debug`).
    /// kube-client's own line per failed API request is off unless the filter names
    /// `kube_client`: domaind logs those failures itself, saying what it was doing.
    #[arg(long, global = true, env = "DOMAIND_LOG", default_value = "info")]
    pub log: String,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    Text,
    Json,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a whole rack on this machine, no cluster needed: N `domaind run` processes on
    /// 127.0.77.x (`--subnet`) form a ComputeDomain through the kubelet's socket, lose a
    /// node to SIGKILL, heal, and take it back; a live table shows it happen.
    ///
    /// Needs no root and no GPU: each node gets its own certificates, the IMEX
    /// simulator built into domaind, fake GB200 GPUs in one NVLink clique, and the local
    /// backend. Every child process and temporary file is removed at the end, on
    /// Ctrl-C too.
    Demo(crate::demo::DemoArgs),
    /// Measure the product on a rack of real daemons on loopback, as the demo runs it:
    /// prepare latency through a node's DRA socket (`bench prepare`), and the demo's
    /// figures as distributions over many runs (`bench demo`). Prints the
    /// figures docs/BENCHMARKS.md records.
    #[command(subcommand)]
    Bench(crate::bench::BenchCommand),
    /// Run the node daemon: the kubelet's DRA plugin, a gossip member of this node's
    /// NVLink clique, and the supervisor of the local IMEX daemon.
    ///
    /// Every flag can also be set through the environment variable named in its help,
    /// so that a DaemonSet can pass the node name and pod IP from the downward API.
    /// SIGTERM stops gracefully: new kubelet calls are refused, the node retracts
    /// itself from its domains so that peers drop it at once, IMEX is stopped and the
    /// checkpoint flushed. A restart restores the checkpoint and rejoins.
    Run(Box<domaind_node::run::RunArgs>),
    /// Run the controller: the thin central part. Per ComputeDomain it adds a finalizer
    /// and creates the ResourceClaimTemplate its spec names; when the domain is deleted,
    /// it deletes the template and releases the domain once none of its claims is
    /// allocated. In rack mode it also creates a ComputeDomain per NVLink clique.
    ///
    /// Several replicas are safe: with leader election (on by default) only the holder
    /// of a Lease acts, and it stops when it cannot renew. It never writes per-node
    /// status: that is the node daemons' job. Connects with the in-cluster config, or
    /// KUBECONFIG.
    Controller(Box<domaind_controller::ControllerArgs>),
    /// Make a development CA and node certificates for gossip's mutual TLS.
    ///
    /// For development, the demo and tests. In production, mount certificates from
    /// your certificate manager in the same layout: ca.crt, tls.crt, tls.key.
    #[command(subcommand)]
    Certs(CertsCommand),
    /// Write a FAKE GPU topology file, for running `domaind run --gpu-topology FILE` on
    /// machines without NVIDIA GPUs.
    #[command(subcommand)]
    Topology(TopologyCommand),
    /// Print the ComputeDomain CRD (YAML), as deploy/crds/ holds it.
    Crdgen,
    /// This node's GPUs as `run` reads them through NVML: each GPU's NVLink fabric
    /// registration (state, cluster UUID, clique id, error) and the clique the node
    /// joins (`<clusterUUID>.<cliqueId>`, or none). Exits 0 when the clique is known
    /// (none included), 1 when it is not (GPUs that disagree, a registration under way),
    /// and fails when the GPUs cannot be read.
    Gpus(crate::commands::gpus::GpusArgs),
    /// Keep this node's IMEX daemons running while `domaind run` restarts: what `run
    /// --imex-runner SOCKET` asks to start, signal and stop IMEX, and what a restarted
    /// `run` adopts IMEX from. Rarely updated, in a DaemonSet of its own: a restart of
    /// the runner restarts IMEX. Runs until SIGTERM or SIGINT, then stops its daemons.
    ImexRunner {
        /// The socket to serve; its directory is made root's alone.
        #[arg(long, env = "DOMAIND_IMEX_RUNNER")]
        socket: std::path::PathBuf,
    },
    /// Before moving a cluster over from NVIDIA's ComputeDomain stack: `--check` lists
    /// what it holds (its driver, per-domain IMEX DaemonSets, claims its plugin
    /// allocated, ComputeDomains and their status, leftovers) and says what to do about
    /// each. Changes nothing. Exits 0 when nothing blocks the switch, 1 when something
    /// does, 2 when the cluster cannot be inspected. Connects with KUBECONFIG or the
    /// in-cluster config.
    Migrate(crate::commands::migrate::MigrateArgs),
    /// Act on this node's IMEX daemon, as an operator does from inside the node
    /// daemon's container (`kubectl exec`), whose image holds no shell, only `domaind`.
    #[command(subcommand)]
    Imex(ImexCommand),
    /// The IMEX simulator built into this binary (what `run --imex-sim-builtin` starts);
    /// the same command line as the `imex-sim` binary.
    #[command(hide = true, disable_help_flag = true)]
    ImexSim {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
    /// What `run` starts the IMEX daemon through, so that the daemon dies with it even
    /// on SIGKILL: sets a parent-death signal, checks the parent, execs the daemon
    /// (`imex-guard --parent PID -- PROGRAM ARGS...`).
    #[command(hide = true, disable_help_flag = true)]
    ImexGuard {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<std::ffi::OsString>,
    },
    /// Talk to a DRA kubelet plugin as the kubelet does: register, prepare, unprepare.
    ///
    /// For tests, the demo and debugging on a machine without a kubelet. Prints the
    /// answer as JSON on stdout; exits non-zero when a call or any claim failed.
    #[command(subcommand)]
    KubeletSim(KubeletSimCommand),
}

#[derive(Debug, Subcommand)]
pub enum ImexCommand {
    /// Kill the IMEX daemon with SIGKILL, so that `domaind run` starts it again (after
    /// its restart backoff): how to force an IMEX restart.
    ///
    /// Finds the IMEX daemons that are children of a `domaind run` or a `domaind
    /// imex-runner` among the processes it can see (in the runner's container, or the
    /// node daemon's without a runner), not status queries. Prints one line per daemon
    /// killed (`killed IMEX daemon PID (child of domaind run|imex-runner PID):
    /// COMMAND`); exits 1 when there is none, saying why.
    Kill {
        /// Only the IMEX daemon of this `domaind run` or `domaind imex-runner` process,
        /// where several run (a machine running a loopback rack).
        #[arg(long, value_name = "PID")]
        parent: Option<u32>,
    },
}

#[derive(Debug, Subcommand)]
pub enum KubeletSimCommand {
    /// Register a plugin as the kubelet's plugin watcher does: ask who it is (GetInfo),
    /// check it is a DRA plugin offering v1 or v1beta1, and tell it the outcome
    /// (NotifyRegistrationStatus). Prints the driver name, DRA endpoint and versions.
    Register {
        /// The plugin's registration socket, e.g.
        /// /var/lib/kubelet/plugins_registry/compute-domain.nvidia.com-reg.sock.
        #[arg(long, value_name = "PATH")]
        registry_socket: PathBuf,
    },
    /// Call NodePrepareResources for the claims; prints each claim's devices or error.
    Prepare(ClaimCallArgs),
    /// Call NodeUnprepareResources for the claims; prints each claim's outcome.
    Unprepare(ClaimCallArgs),
}

#[derive(Debug, Args)]
pub struct ClaimCallArgs {
    /// The plugin's DRA socket (the endpoint `register` prints), e.g.
    /// /var/lib/kubelet/plugins/compute-domain.nvidia.com/dra.sock.
    #[arg(long, value_name = "PATH")]
    pub socket: PathBuf,
    /// The DRA API version to call: v1 (which a kubelet calls when a plugin offers both)
    /// or v1beta1.
    #[arg(long, default_value = "v1", value_name = "VERSION")]
    pub version: DraVersion,
    /// A ResourceClaim, as UID:NAMESPACE:NAME; repeat for several claims in one call.
    /// Fields may be left empty to see how the plugin answers a malformed claim.
    #[arg(long = "claim", required = true, value_name = "UID:NAMESPACE:NAME", value_parser = parse_claim)]
    pub claims: Vec<ClaimRef>,
}

fn parse_claim(value: &str) -> Result<ClaimRef, String> {
    let fields: Vec<&str> = value.split(':').collect();
    match fields[..] {
        [uid, namespace, name] => Ok(ClaimRef {
            uid: uid.to_string(),
            namespace: namespace.to_string(),
            name: name.to_string(),
        }),
        _ => Err(format!(
            "expected UID:NAMESPACE:NAME (three fields separated by ':'), got {} field(s)",
            fields.len()
        )),
    }
}

#[derive(Debug, Subcommand)]
pub enum CertsCommand {
    /// Create a CA: writes ca.crt and ca.key (mode 0600) into --out.
    Init {
        /// Directory to write the CA into; created if missing. Existing files are never
        /// overwritten.
        #[arg(long)]
        out: PathBuf,
        /// Common name of the CA certificate.
        #[arg(long, default_value = "domaind development CA")]
        name: String,
        /// How long the CA is valid, in days.
        #[arg(long, default_value_t = 3650, value_parser = clap::value_parser!(u32).range(1..=36500))]
        valid_days: u32,
    },
    /// Issue a node certificate signed by the CA in --ca: writes tls.crt, tls.key (mode
    /// 0600) and ca.crt into --out.
    Issue {
        /// Directory holding ca.crt and ca.key, as written by `certs init`.
        #[arg(long)]
        ca: PathBuf,
        /// The Kubernetes node name. It becomes the certificate's DNS name and the
        /// node's gossip identity.
        #[arg(long)]
        node: NodeName,
        /// Directory to write the node's files into; created if missing. Existing files
        /// are replaced atomically (rotation).
        #[arg(long)]
        out: PathBuf,
        /// Extra IP address to name in the certificate (repeatable). Not an identity.
        #[arg(long = "ip")]
        ips: Vec<IpAddr>,
        /// Also name IMEX's shared name, imex.domaind.invalid, which `domaind run
        /// --imex-tls auto` needs in DNS-names mode. Daemons of the previous release
        /// refuse gossip from a certificate with a second DNS name: issue it once every
        /// node runs this release.
        #[arg(long)]
        imex_shared_name: bool,
        /// How long the certificate is valid, in days.
        #[arg(long, default_value_t = 365, value_parser = clap::value_parser!(u32).range(1..=36500))]
        valid_days: u32,
    },
}

#[derive(Debug, Subcommand)]
pub enum TopologyCommand {
    /// A rack whose nodes' GPUs (4 each, as a GB200 tray) are all in one NVLink clique.
    Simulate {
        /// A node of the rack (repeatable, or comma-separated), named as `--node-name`
        /// will name it.
        #[arg(long = "node", required = true, value_delimiter = ',')]
        nodes: Vec<NodeName>,
        /// The rack's number: racks with different numbers are different cliques.
        #[arg(long, default_value_t = 1)]
        rack: u32,
        /// Where to write the file.
        #[arg(long)]
        out: PathBuf,
    },
}
