//! Command-line interface.

use std::net::IpAddr;
use std::path::PathBuf;

use clap::{Args, Parser, Subcommand, ValueEnum};
use domaind_gossip::NodeName;

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
    /// Run the node daemon: the kubelet's DRA plugin, a gossip member of this node's
    /// NVLink clique, and the supervisor of the local IMEX daemon.
    ///
    /// Every flag can also be set through the environment variable named in its help,
    /// so that a DaemonSet can pass the node name and pod IP from the downward API.
    /// SIGTERM stops gracefully: new kubelet calls are refused, the node retracts
    /// itself from its domains so that peers drop it at once, IMEX is stopped and the
    /// checkpoint flushed. A restart restores the checkpoint and rejoins.
    Run(Box<domaind::run::RunArgs>),
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
    /// The IMEX simulator built into this binary (what `run --imex-sim-builtin` starts);
    /// the same command line as the `imex-sim` binary.
    #[command(hide = true, disable_help_flag = true)]
    ImexSim {
        #[arg(trailing_var_arg = true, allow_hyphen_values = true)]
        args: Vec<String>,
    },
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
        /// The Kubernetes node name. It becomes the certificate's only DNS name and the
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
