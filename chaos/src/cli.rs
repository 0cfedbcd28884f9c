//! The command line of `domaind-chaos`.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::bail;
use clap::{Args, Parser, Subcommand};

use crate::cluster::workload::WorkloadKind;
use crate::cluster::{AccessChoice, ClusterConfig, NodeChoice};
use crate::harness::{RunConfig, Sampling};
use crate::schedule::{FaultKind, parse_scenario};

/// Chaos harness for domaind: runs a rack of real `domaind run` processes on loopback,
/// forms one ComputeDomain across them, injects faults from a seeded schedule, and
/// checks invariants from outside (IMEX hosts and nodes files, checkpoints, status
/// file, /state). Exits non-zero on any violation.
#[derive(Debug, Parser)]
#[command(name = "domaind-chaos", version)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Run a rack under faults and report detection and heal times and violations.
    ///
    /// The table goes to stdout, progress to stderr. Exit codes: 0 when no invariant
    /// was violated and no daemon crashed, 1 otherwise, 2 when the harness could not
    /// run (binaries missing, no rack), 130 when interrupted (SIGINT or SIGTERM: the
    /// rack, its network faults and its files are removed first).
    Run(Box<RunArgs>),

    /// Try to forge a running rack's gossip with a certificate of its CA.
    ///
    /// For a rack left by `domaind demo --keep` (its root is the parent of the
    /// `local_dir` it prints): a node outside the rack, certified by the rack's CA,
    /// sends every node forged state about the others (a ghost member, rewritten,
    /// moved and deleted values, a rollback, another CA's certificate, a bare max
    /// version, ghosts in digests). Prints what was sent and what the rack refused.
    /// Exit codes: 0 when every forgery was refused and counted and no node's domains,
    /// slots, IMEX peers or health changed; 1 otherwise; 2 when it could not run.
    Forge(ForgeArgs),

    /// Judge a soak's samples again (the CSV of `run --samples`), with another warm-up.
    ///
    /// Prints the soak's table: each vital's lives, first and last quarters, steepest
    /// slope per hour and the lives it grew over. Exit codes: 0 when nothing grew, 1
    /// when something did or no life was long enough to judge, 2 when the file cannot
    /// be read.
    Judge(JudgeArgs),
}

#[derive(Debug, Clone, Args)]
pub struct JudgeArgs {
    /// The samples (`run --samples FILE`).
    #[arg(long, value_name = "FILE")]
    pub samples: PathBuf,

    /// How much of each daemon's life is not judged.
    #[arg(long, default_value = "65m", value_parser = humantime::parse_duration)]
    pub warmup: Duration,

    /// The shortest life (after the warm-up) that is judged.
    #[arg(long, default_value = "30m", value_parser = humantime::parse_duration)]
    pub min_span: Duration,

    /// The interval the samples were taken at, for the table's heading.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    pub every: Duration,

    /// Write the judgement as JSON to this file too.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,
}

#[derive(Debug, Clone, Args)]
pub struct ForgeArgs {
    /// The rack's root directory (holds `ca/` and `node-*/state/run.json`).
    #[arg(long, value_name = "DIR")]
    pub rack: PathBuf,

    /// The rack's NVLink clique [default: the one a local rack simulates].
    #[arg(long)]
    pub clique: Option<String>,

    /// The forger's loopback address [default: .250 of the rack's /24].
    #[arg(long)]
    pub ip: Option<std::net::IpAddr>,
}

#[derive(Debug, Clone, Args)]
pub struct RunArgs {
    /// Daemons in the rack (2 to 18; an NVL72 rack has 18).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u16).range(2..=18))]
    pub nodes: u16,

    /// NVLink cliques of --nodes daemons each (1 to 8). Faults hit the first; each
    /// other clique forms its own domain beside it, and the cliques invariant checks
    /// that no node ever has a gossip member or IMEX peer of another clique.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=8))]
    pub cliques: u16,

    /// ComputeDomains on the clique's nodes. 1: one domain, IMEX its own. 2 or more:
    /// every domain has `isolation: Channel` and holds a claim on every node (one shared
    /// IMEX domain, a channel per domain), domain-churn may run, and the channels
    /// invariant checks that no pod holds another domain's channel and that no two live
    /// domains share one.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u16).range(1..=6))]
    pub domains: u16,

    /// Faults to inject: daemon-kill, node-kill, pause, imex-crash, restart, upgrade,
    /// partition, loss, churn, cert-rotate, imex-port, disk-full, domain-churn (with
    /// --domains 2 or more), or all; several as a comma list (e.g.
    /// daemon-kill,node-kill,pause,imex-crash,churn). partition and
    /// loss need root and iptables, disk-full needs root (a tmpfs over each state
    /// directory); without them they are skipped, and said so.
    #[arg(long, default_value = "all", value_parser = parse_scenario_arg)]
    pub scenario: Scenario,

    /// Seed of the fault schedule: the same seed, nodes, scenario and duration give
    /// the same faults on the same nodes at the same planned times.
    #[arg(long, default_value_t = 1)]
    pub seed: u64,

    /// How long faults are scheduled for, in seconds or with a unit (90, 2m).
    /// Formation before and the final checks after come on top.
    #[arg(long, default_value = "60", value_parser = parse_duration)]
    pub duration: Duration,

    /// Write the report as JSON to this file too.
    #[arg(long, value_name = "FILE")]
    pub json: Option<PathBuf>,

    /// The domaind binary [default: next to this one].
    #[arg(long, value_name = "PATH")]
    pub domaind: Option<PathBuf>,

    /// The imex-sim binary [default: next to this one].
    #[arg(long, value_name = "PATH")]
    pub imex_sim: Option<PathBuf>,

    /// The rack's loopback subnet: nodes get 127.0.<subnet>.1, .2, ... Network faults
    /// touch only 127.0.<subnet>.0/24.
    #[arg(long, default_value_t = domaind_loopback::CHAOS_RUN, value_parser = clap::value_parser!(u8).range(1..=254))]
    pub subnet: u8,

    /// Isolation: how long after a node unprepared its last claim (or after an
    /// observer started or resumed) it may still appear in a peer set.
    #[arg(long, default_value = "5s", value_parser = humantime::parse_duration)]
    pub isolation_grace: Duration,

    /// The daemons' anti-entropy interval (chitchat's rounds; liveness is pulsed every
    /// 150 ms whatever this is).
    #[arg(long, default_value = "10s", value_parser = humantime::parse_duration)]
    pub gossip_interval: Duration,

    /// The daemons' log filter (their logs are in the rack's directory).
    #[arg(long, default_value = "info")]
    pub daemon_log: String,

    /// Keep the rack's directory (daemon logs, state, IMEX files) and print where.
    #[arg(long)]
    pub keep_files: bool,

    /// No progress lines on stderr; the table still goes to stdout.
    #[arg(long)]
    pub quiet: bool,

    /// The least quiet between one fault's heal allowance and the next fault (up to
    /// 2 s more are drawn). A soak's low rate: e.g. 60s.
    #[arg(long, default_value = "1s", value_parser = humantime::parse_duration, help_heading = "Soaks")]
    pub fault_gap: Duration,

    /// The rack's last N nodes get no fault of their own: one process each for the
    /// whole run, living through every other node's faults (a soak's witnesses).
    #[arg(long, default_value_t = 0, help_heading = "Soaks")]
    pub spare: u16,

    /// A soak: sample every daemon's resident memory, file descriptors, threads,
    /// checkpoint journal, metric series and gossip state this often, and judge each
    /// daemon's life (after --soak-warmup, at least 30 min of it) for growth; growth, or
    /// no life long enough to judge, fails the run. Slopes per hour in the report.
    #[arg(long, value_parser = humantime::parse_duration, help_heading = "Soaks")]
    pub sample_every: Option<Duration>,

    /// How much of each daemon's life a soak does not judge: gossip keeps a dead
    /// incarnation's state and a deleted key's tombstone for an hour by design, so its
    /// state levels off only after that.
    #[arg(long, default_value = "65m", value_parser = humantime::parse_duration, help_heading = "Soaks")]
    pub soak_warmup: Duration,

    /// Write every sample as a CSV line to this file as it is taken.
    #[arg(
        long,
        value_name = "FILE",
        requires = "sample_every",
        help_heading = "Soaks"
    )]
    pub samples: Option<PathBuf>,

    /// Run against the cluster of KUBECONFIG instead of a loopback rack: a ComputeDomain
    /// and a workload in a namespace of the run's own, faults that exist on a cluster
    /// (daemon-delete, imex-crash, drain, pod-delete, controller-restart, upgrade; `all`
    /// is those), invariants read from the API server and each daemon's /state. domaind
    /// must be installed (the chart), or --local-daemons given.
    #[arg(long, help_heading = "Cluster runs", conflicts_with_all = ["cliques", "domains", "subnet", "imex_sim", "gossip_interval", "spare", "sample_every"])]
    pub cluster: bool,

    /// Print the nodes, the objects and the faults a cluster run would make, and stop:
    /// nothing is created (the API server is only read).
    #[arg(long, help_heading = "Cluster runs", requires = "cluster")]
    pub dry_run: bool,

    /// A node to run on (repeat for each). Without it, --nodes Ready, schedulable nodes
    /// of one NVLink clique among those matching --node-selector.
    #[arg(
        long = "node",
        value_name = "NAME",
        help_heading = "Cluster runs",
        requires = "cluster"
    )]
    pub node_names: Vec<String>,

    /// The label selector of the nodes to choose from.
    #[arg(long, default_value = domaind_kube_api::names::CLIQUE_LABEL, help_heading = "Cluster runs")]
    pub node_selector: String,

    /// The run's own namespace, which must not exist [default: domaind-chaos-<seed>].
    #[arg(long, help_heading = "Cluster runs", requires = "cluster")]
    pub namespace: Option<String>,

    /// The workload's image: any with `sleep` (it runs `sleep infinity`).
    #[arg(long, default_value = "busybox:1.37", help_heading = "Cluster runs")]
    pub image: String,

    /// What runs the workload's pods.
    #[arg(
        long,
        value_enum,
        default_value = "deployment",
        help_heading = "Cluster runs"
    )]
    pub workload: WorkloadKind,

    /// `nvidia.com/gpu` each pod asks for (0: only its ComputeDomain channel).
    #[arg(long, default_value_t = 0, help_heading = "Cluster runs")]
    pub gpus_per_pod: u32,

    /// The namespace domaind's chart is installed in.
    #[arg(long, default_value = "domaind", help_heading = "Cluster runs")]
    pub system_namespace: String,

    /// The chart's release name, when several are installed.
    #[arg(long, help_heading = "Cluster runs")]
    pub release: Option<String>,

    /// The controller's leader-election Lease, in --system-namespace (the chart's
    /// controller.leaderElection.leaseName).
    #[arg(
        long,
        default_value = "domaind-controller",
        help_heading = "Cluster runs"
    )]
    pub controller_lease: String,

    /// For a cluster whose nodes are kubelets on this machine (../shared/kube; DIR is
    /// its state prefix, $KV): the run starts a daemon per node and the controller as
    /// processes here, and plays their DaemonSet and Deployment.
    #[arg(
        long,
        value_name = "DIR",
        help_heading = "Cluster runs",
        requires = "cluster"
    )]
    pub local_daemons: Option<PathBuf>,

    /// Workload created → the domain whole (image pulls included).
    #[arg(long, default_value = "5m", value_parser = humantime::parse_duration, help_heading = "Cluster runs")]
    pub form_timeout: Duration,

    /// A fault's end → the domain whole again.
    #[arg(long, default_value = "3m", value_parser = humantime::parse_duration, help_heading = "Cluster runs")]
    pub heal_timeout: Duration,

    /// Leave the run's namespace and objects behind (daemons a --local-daemons run
    /// started are stopped all the same).
    #[arg(long, help_heading = "Cluster runs", requires = "cluster")]
    pub keep_namespace: bool,
}

/// The kinds of `--scenario`.
#[derive(Debug, Clone)]
pub struct Scenario {
    pub kinds: Vec<FaultKind>,
    /// Whether it said `all`: with `--domains`, all takes domain-churn too.
    pub all: bool,
}

fn parse_scenario_arg(text: &str) -> Result<Scenario, String> {
    Ok(Scenario {
        kinds: parse_scenario(text)?,
        all: text.split(',').any(|w| w.trim() == "all"),
    })
}

/// The run's kinds: `all` with several domains takes the sharing kinds too; a sharing
/// kind needs several domains.
fn scenario_kinds(scenario: &Scenario, domains: u16) -> anyhow::Result<Vec<FaultKind>> {
    let mut kinds = scenario.kinds.clone();
    if let Some(kind) = kinds.iter().find(|k| !k.on_loopback()) {
        bail!("{kind} is a fault of cluster runs: add --cluster");
    }
    if domains < 2 {
        if let Some(kind) = kinds.iter().find(|k| k.needs_sharing()) {
            bail!(
                "{kind} needs --domains 2 or more: it creates and deletes domains that share \
                 the nodes with isolation: Channel"
            );
        }
    } else if scenario.all {
        for kind in FaultKind::SHARING {
            if !kinds.contains(&kind) {
                kinds.push(kind);
            }
        }
    }
    Ok(kinds)
}

/// A cluster run's kinds: `all` is every cluster kind; a loopback-only kind is refused.
fn cluster_kinds(scenario: &Scenario) -> anyhow::Result<Vec<FaultKind>> {
    if scenario.all {
        return Ok(FaultKind::CLUSTER.to_vec());
    }
    if let Some(kind) = scenario.kinds.iter().find(|k| !k.in_cluster()) {
        bail!(
            "{kind} is a fault of loopback racks; a cluster run takes {}",
            FaultKind::CLUSTER.map(|k| k.name()).join(", ")
        );
    }
    Ok(scenario.kinds.clone())
}

/// Seconds, or a humantime duration.
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = match text.parse::<u64>() {
        Ok(secs) => Duration::from_secs(secs),
        Err(_) => humantime::parse_duration(text).map_err(|e| e.to_string())?,
    };
    if duration < Duration::from_secs(1) || duration > Duration::from_secs(6 * 3600) {
        return Err("the duration must be between 1 s and 6 h".into());
    }
    Ok(duration)
}

impl RunArgs {
    /// The run's configuration; binaries default to this executable's directory.
    pub fn config(&self) -> anyhow::Result<RunConfig> {
        let scenario = scenario_kinds(&self.scenario, self.domains)?;
        let here = std::env::current_exe()
            .ok()
            .and_then(|exe| exe.parent().map(Path::to_path_buf));
        let domaind = locate(self.domaind.as_deref(), here.as_deref(), "domaind")?;
        let imex_sim = locate(self.imex_sim.as_deref(), here.as_deref(), "imex-sim")?;
        if self.spare + 2 > self.nodes {
            bail!(
                "--spare {} leaves fewer than 2 of the {} nodes to take faults",
                self.spare,
                self.nodes
            );
        }
        Ok(RunConfig {
            nodes: self.nodes.into(),
            cliques: self.cliques.into(),
            domains: self.domains.into(),
            scenario,
            seed: self.seed,
            duration: self.duration,
            domaind,
            imex_sim,
            subnet: self.subnet,
            isolation_grace: self.isolation_grace,
            gossip_interval: self.gossip_interval,
            log_filter: self.daemon_log.clone(),
            keep_files: self.keep_files,
            quiet: self.quiet,
            fault_gap: self.fault_gap,
            spare: self.spare.into(),
            sampling: self.sample_every.map(|every| Sampling {
                every,
                warmup: self.soak_warmup,
                csv: self.samples.clone(),
            }),
        })
    }
}

impl RunArgs {
    /// A cluster run's configuration (`--cluster`).
    pub fn cluster_config(&self) -> anyhow::Result<ClusterConfig> {
        let access = match &self.local_daemons {
            Some(dir) => {
                let here = std::env::current_exe()
                    .ok()
                    .and_then(|exe| exe.parent().map(Path::to_path_buf));
                AccessChoice::Local {
                    kube_state_dir: dir.clone(),
                    domaind: locate(self.domaind.as_deref(), here.as_deref(), "domaind")?,
                }
            }
            None => AccessChoice::Pods {
                namespace: self.system_namespace.clone(),
                release: self.release.clone(),
                lease_name: self.controller_lease.clone(),
            },
        };
        let nodes = if self.node_names.is_empty() {
            NodeChoice::Selected {
                selector: self.node_selector.clone(),
                count: self.nodes.into(),
            }
        } else {
            NodeChoice::Named(self.node_names.clone())
        };
        Ok(ClusterConfig {
            nodes,
            namespace: self
                .namespace
                .clone()
                .unwrap_or_else(|| format!("domaind-chaos-{}", self.seed)),
            image: self.image.clone(),
            workload: self.workload,
            gpus_per_pod: self.gpus_per_pod,
            scenario: cluster_kinds(&self.scenario)?,
            seed: self.seed,
            duration: self.duration,
            access,
            grace: self.isolation_grace,
            form_limit: self.form_timeout,
            heal_limit: self.heal_timeout,
            dry_run: self.dry_run,
            keep: self.keep_namespace,
            quiet: self.quiet,
            daemon_log: self.daemon_log.clone(),
        })
    }
}

/// `given`, or `name` in `dir` (cargo puts every binary of a workspace in one target
/// directory).
fn locate(given: Option<&Path>, dir: Option<&Path>, name: &str) -> anyhow::Result<PathBuf> {
    if let Some(path) = given {
        if !path.is_file() {
            bail!("{name}: {} is not a file", path.display());
        }
        return Ok(path.to_path_buf());
    }
    let Some(dir) = dir else {
        bail!("cannot tell where this executable is; pass --{name} PATH");
    };
    let path = dir.join(name);
    if !path.is_file() {
        bail!(
            "{name} is not next to domaind-chaos (looked for {}): build them first: \
             cargo build --release --bin domaind --bin imex-sim (or pass --domaind and --imex-sim)",
            path.display()
        );
    }
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::CommandFactory as _;

    #[test]
    fn the_command_line_is_consistent() {
        Cli::command().debug_assert();
    }

    /// The book's page of this command line (docs/src/reference/chaos-cli.md).
    #[test]
    fn reference_pages_match_the_code() {
        let regenerate =
            "DOMAIND_WRITE_REFERENCE=1 cargo test -p domaind-chaos --lib reference_pages";
        let page = domaind_docs_gen::page::render(
            regenerate,
            &domaind_docs_gen::cli::render(Cli::command()),
        );
        if let Err(error) = domaind_docs_gen::page::check("chaos-cli.md", &page, regenerate) {
            panic!("{error}");
        }
    }

    #[test]
    fn durations_take_seconds_or_units() {
        assert_eq!(parse_duration("90").unwrap(), Duration::from_secs(90));
        assert_eq!(parse_duration("2m").unwrap(), Duration::from_secs(120));
        assert!(parse_duration("0").is_err());
        assert!(parse_duration("soon").is_err());
    }

    #[test]
    fn domain_churn_needs_several_domains_and_all_takes_it_with_them() {
        let kill_churn = parse_scenario_arg("node-kill,domain-churn").unwrap();
        let error = scenario_kinds(&kill_churn, 1).unwrap_err().to_string();
        assert!(error.contains("--domains 2"), "{error}");
        assert_eq!(
            scenario_kinds(&kill_churn, 3).unwrap(),
            vec![FaultKind::NodeKill, FaultKind::DomainChurn]
        );
        let all = parse_scenario_arg("all").unwrap();
        assert_eq!(scenario_kinds(&all, 1).unwrap(), FaultKind::ALL.to_vec());
        let with_sharing = scenario_kinds(&all, 2).unwrap();
        assert_eq!(with_sharing.len(), FaultKind::ALL.len() + 1);
        assert_eq!(with_sharing.last(), Some(&FaultKind::DomainChurn));
        let kill = parse_scenario_arg("daemon-kill").unwrap();
        assert_eq!(
            scenario_kinds(&kill, 2).unwrap(),
            vec![FaultKind::DaemonKill]
        );
    }

    fn parse_run(args: &[&str]) -> Result<RunArgs, clap::Error> {
        let mut argv = vec!["domaind-chaos", "run"];
        argv.extend_from_slice(args);
        Cli::try_parse_from(argv).map(|cli| match cli.command {
            Command::Run(args) => *args,
            Command::Forge(_) | Command::Judge(_) => unreachable!("run was asked for"),
        })
    }

    #[test]
    fn cluster_runs_take_cluster_faults_and_loopback_runs_refuse_them() {
        let all = parse_run(&["--cluster"]).unwrap().cluster_config().unwrap();
        assert_eq!(all.scenario, FaultKind::CLUSTER.to_vec());
        assert_eq!(all.namespace, "domaind-chaos-1");
        assert_eq!(
            all.nodes,
            NodeChoice::Selected {
                selector: domaind_kube_api::names::CLIQUE_LABEL.into(),
                count: 5
            }
        );
        let named = parse_run(&[
            "--cluster",
            "--node",
            "a",
            "--node",
            "b",
            "--scenario",
            "drain,imex-crash",
        ])
        .unwrap()
        .cluster_config()
        .unwrap();
        assert_eq!(named.nodes, NodeChoice::Named(vec!["a".into(), "b".into()]));
        assert_eq!(named.scenario, vec![FaultKind::Drain, FaultKind::ImexCrash]);
        let error = parse_run(&["--cluster", "--scenario", "node-kill"])
            .unwrap()
            .cluster_config()
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("loopback") && error.contains("daemon-delete"),
            "{error}"
        );
        let error = parse_run(&["--scenario", "drain"])
            .unwrap()
            .config()
            .unwrap_err()
            .to_string();
        assert!(error.contains("--cluster"), "{error}");
        // Loopback-rack flags make no sense on a cluster, and cluster flags need it.
        assert!(parse_run(&["--cluster", "--cliques", "2"]).is_err());
        assert!(parse_run(&["--dry-run"]).is_err());
        assert!(parse_run(&["--local-daemons", "/tmp"]).is_err());
    }

    #[test]
    fn missing_binaries_say_how_to_build_them() {
        let dir = tempfile::tempdir().unwrap();
        let error = locate(None, Some(dir.path()), "domaind")
            .unwrap_err()
            .to_string();
        assert!(
            error.contains("cargo build --release --bin domaind --bin imex-sim"),
            "{error}"
        );
        let error = locate(Some(&dir.path().join("nope")), None, "imex-sim")
            .unwrap_err()
            .to_string();
        assert!(error.contains("is not a file"), "{error}");
    }
}
