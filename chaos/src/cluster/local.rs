//! [`LocalAccess`]: the harness as the DaemonSet and the Deployment, for a cluster
//! whose nodes are kubelets on this machine with a container runtime that runs nothing
//! (`../shared/kube`). See [`super::access`].

use std::collections::{BTreeMap, VecDeque};
use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use async_trait::async_trait;
use domaind_node::run::NodeView;
use domaind_testbed::imex_sim::imports::Import;
use domaind_testbed::rack::{HeldImport, LocalRack, RackBackend, RackSpec, http_get, node_view};
use domaind_testkit::{poll_every, poll_every_blocking};
use k8s_openapi::api::core::v1::Node;
use kube::Client;
use kube::api::Api;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use super::access::{ClusterAccess, DaemonInstance, ImportState, JobImports};

/// A daemon writes run.json within this.
const START_LIMIT: Duration = Duration::from_secs(60);
/// A graceful stop, as a pod's termination grace period.
const STOP_GRACE: Duration = Duration::from_secs(30);
const LEASE_NAME: &str = "domaind-controller";

/// Where the local cluster keeps its nodes, and what to run.
#[derive(Debug, Clone)]
pub struct LocalConfig {
    /// The kube scripts' state prefix: node `NAME`'s kubelet root is `<dir>/nodes/NAME`.
    pub kube_state_dir: PathBuf,
    pub domaind: PathBuf,
    /// Where the daemons' and the controller's files and logs go.
    pub work_dir: PathBuf,
    /// The controller's Lease goes here (the run's namespace).
    pub lease_namespace: String,
    /// The daemons' and the controller's `--log`.
    pub log_filter: String,
}

/// A controller process and the identity it holds the Lease under.
#[derive(Debug)]
struct ControllerProcess {
    child: Child,
    identity: String,
}

/// A run dropped where it stands (interrupted) must not leave a controller behind; the
/// rack kills its daemons itself.
impl Drop for ControllerProcess {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

pub struct LocalAccess {
    client: Client,
    config: LocalConfig,
    rack: Option<LocalRack>,
    /// Exits on their own so far, by rack index: a container's restart count.
    restarts: Vec<u32>,
    controller: Option<ControllerProcess>,
    controllers_started: u32,
    /// A rolling update under way: the nodes still to go, by rack index, and the one
    /// whose new daemon is awaited.
    rolling: VecDeque<usize>,
    rolling_now: Option<usize>,
}

impl std::fmt::Debug for LocalAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocalAccess")
            .field("config", &self.config)
            .field("restarts", &self.restarts)
            .finish_non_exhaustive()
    }
}

impl LocalAccess {
    pub fn new(client: Client, config: LocalConfig) -> Self {
        Self {
            client,
            config,
            rack: None,
            restarts: Vec::new(),
            controller: None,
            controllers_started: 0,
            rolling: VecDeque::new(),
            rolling_now: None,
        }
    }

    fn name_of(&self, index: usize) -> String {
        self.rack
            .as_ref()
            .map(|r| r.node(index).name().to_owned())
            .unwrap_or_default()
    }

    /// Whether the daemon of rack node `index` serves and its kubelet registered it.
    async fn serving(&mut self, index: usize) -> bool {
        let rack = match self.rack() {
            Ok(rack) => rack,
            Err(_) => return false,
        };
        let info = match rack.node(index).info() {
            Some(info) => info.clone(),
            None => match tokio::task::block_in_place(|| rack.wait_ready(index, Duration::ZERO)) {
                Ok(info) => info,
                Err(_) => return false,
            },
        };
        matches!(http_get(info.http_addr, "/readyz").await, Ok((200, _)))
    }

    fn index(&self, node: &str) -> anyhow::Result<usize> {
        self.rack
            .as_ref()
            .and_then(|r| r.nodes().iter().position(|n| n.name() == node))
            .with_context(|| format!("{node} is not one of the run's nodes"))
    }

    fn rack(&mut self) -> anyhow::Result<&mut LocalRack> {
        self.rack.as_mut().context("the daemons are not started")
    }

    async fn node_ip(&self, name: &str) -> anyhow::Result<IpAddr> {
        let node = Api::<Node>::all(self.client.clone())
            .get(name)
            .await
            .with_context(|| format!("cannot read node {name}"))?;
        let address = node
            .status
            .and_then(|s| s.addresses)
            .unwrap_or_default()
            .into_iter()
            .find(|a| a.type_ == "InternalIP")
            .with_context(|| format!("node {name} has no InternalIP"))?;
        let ip: IpAddr = address
            .address
            .parse()
            .with_context(|| format!("node {name}'s InternalIP {:?}", address.address))?;
        if !ip.is_loopback() {
            bail!(
                "node {name} is at {ip}: --local-daemons runs daemons on this machine, for \
                 nodes on loopback addresses (../shared/kube); a real cluster's daemons are \
                 its DaemonSet's pods (leave out --local-daemons)"
            );
        }
        Ok(ip)
    }

    fn start_controller(&mut self) -> anyhow::Result<()> {
        self.controllers_started += 1;
        let identity = format!("domaind-chaos-controller-{}", self.controllers_started);
        let log = std::fs::File::create(self.config.work_dir.join(format!("{identity}.log")))?;
        let child = Command::new(&self.config.domaind)
            .args(["--log", &self.config.log_filter, "controller"])
            .args(["--http-addr", "127.0.0.1:0"])
            .args(["--lease-namespace", &self.config.lease_namespace])
            .args(["--lease-name", LEASE_NAME])
            .args(["--leader-identity", &identity])
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()
            .with_context(|| format!("cannot start {}", self.config.domaind.display()))?;
        self.controller = Some(ControllerProcess { child, identity });
        Ok(())
    }

    /// SIGTERM, as the kubelet stops a container, then SIGKILL past the grace.
    fn stop_controller(&mut self) -> Option<String> {
        let mut process = self.controller.take()?;
        let _ = kill(Pid::from_raw(process.child.id() as i32), Signal::SIGTERM);
        let _ = poll_every_blocking(Duration::from_millis(50), STOP_GRACE, || {
            match process.child.try_wait() {
                Ok(None) => Err(()),
                _ => Ok(()),
            }
        });
        // Dropping it kills what is left past the grace.
        Some(process.identity.clone())
    }
}

/// Waits until the daemon at `http` is ready, which with `--ready-needs-kubelet` (as
/// the chart runs it) includes its kubelet's registration of the plugin.
async fn wait_ready_for_kubelet(http: SocketAddr, node: &str) -> anyhow::Result<()> {
    // A closure that returns a future owning what it uses, not an async closure: the
    // future of an async closure, awaited inside an async_trait method, must be Send
    // for every lifetime, which the compiler cannot show.
    poll_every(
        Duration::from_millis(200),
        START_LIMIT,
        move || async move {
            let (code, body) = http_get(http, "/readyz").await.unwrap_or_default();
            if code == 200 { Ok(()) } else { Err(body) }
        },
    )
    .await
    .map_err(|body| anyhow!("{node}'s daemon was not ready within {START_LIMIT:?}: {body}"))
}

#[async_trait]
impl ClusterAccess for LocalAccess {
    fn describe(&self) -> String {
        format!(
            "local: the harness runs the daemons (each with an IMEX runner) and the \
             controller as processes on this machine (kubelet roots under {}, files in {}); \
             /state read directly; the jobs' imports held through each node's imex-sim",
            self.config.kube_state_dir.join("nodes").display(),
            self.config.work_dir.display()
        )
    }

    async fn start(&mut self, nodes: &[String]) -> anyhow::Result<()> {
        let mut ips = Vec::with_capacity(nodes.len());
        for name in nodes {
            ips.push(self.node_ip(name).await?);
        }
        let kubelet_dirs: Vec<PathBuf> = nodes
            .iter()
            .map(|n| self.config.kube_state_dir.join("nodes").join(n))
            .collect();
        for dir in &kubelet_dirs {
            if !dir.join("plugins_registry").is_dir() {
                bail!(
                    "{} has no plugins_registry/: is it a node of the kube scripts under {}?",
                    dir.display(),
                    self.config.kube_state_dir.display()
                );
            }
        }
        let mut spec = RackSpec::self_contained(
            nodes.len(),
            self.config.domaind.clone(),
            self.config.work_dir.join("rack"),
        );
        spec.names = Some(nodes.to_vec());
        spec.ips = Some(ips);
        spec.backend = RackBackend::Kube;
        spec.kubelet_dirs = Some(kubelet_dirs);
        spec.log_filter = self.config.log_filter.clone();
        spec.extra_args = vec!["--ready-needs-kubelet".into()];
        // As the chart installs it: IMEX kept by a runner beside each daemon.
        spec.imex_runner = true;
        let mut rack = LocalRack::create(spec)?;
        tokio::task::block_in_place(|| -> anyhow::Result<()> {
            rack.start_all()?;
            rack.wait_all_ready(START_LIMIT)?;
            Ok(())
        })?;
        // A pod placed on a node before its kubelet registered the plugin fails its
        // prepare and waits out the kubelet's retry (a minute): as a DaemonSet would have
        // been running (and Ready) long before a workload comes, the run starts once
        // every daemon is.
        let daemons = rack
            .nodes()
            .iter()
            .map(|node| {
                let info = node.info().context("ready without its run.json")?;
                Ok((info.http_addr, node.name().to_owned()))
            })
            .collect::<anyhow::Result<Vec<_>>>()?;
        for (http, name) in &daemons {
            wait_ready_for_kubelet(*http, name).await?;
        }
        self.restarts = vec![0; nodes.len()];
        self.rack = Some(rack);
        self.start_controller()
    }

    async fn daemon(&mut self, node: &str) -> anyhow::Result<Option<DaemonInstance>> {
        let index = self.index(node)?;
        let rack = self.rack()?;
        if rack.unexpected_exits().iter().any(|n| n == node) {
            // As a kubelet restarts a container that exited: counted, started again.
            tokio::task::block_in_place(|| rack.start(index))?;
            self.restarts[index] += 1;
        }
        let rack = self.rack()?;
        if !rack.running(index) {
            return Ok(None);
        }
        let pid = rack.node(index).pid().context("running without a pid")?;
        Ok(Some(DaemonInstance {
            id: format!("pid {pid}"),
            restarts: self.restarts[index],
        }))
    }

    async fn state(&mut self, node: &str) -> anyhow::Result<NodeView> {
        let index = self.index(node)?;
        let rack = self.rack()?;
        let info = match rack.node(index).info() {
            Some(info) => info.clone(),
            None => tokio::task::block_in_place(|| rack.wait_ready(index, Duration::ZERO))
                .with_context(|| format!("{node}'s daemon is not ready yet"))?,
        };
        node_view(&info).await
    }

    async fn delete_daemon(&mut self, node: &str) -> anyhow::Result<()> {
        let index = self.index(node)?;
        let rack = self.rack()?;
        tokio::task::block_in_place(|| -> anyhow::Result<()> {
            rack.stop(index, STOP_GRACE)?;
            rack.start(index)
        })
    }

    async fn stop_imex(&mut self, node: &str) -> anyhow::Result<Vec<u32>> {
        let index = self.index(node)?;
        let pids = self.rack()?.imex_daemons()?.swap_remove(index);
        if pids.is_empty() {
            bail!("{node} runs no IMEX daemon");
        }
        for pid in &pids {
            kill(Pid::from_raw(*pid as i32), Signal::SIGKILL)
                .with_context(|| format!("cannot kill {node}'s IMEX daemon {pid}"))?;
        }
        Ok(pids)
    }

    async fn restart_controller(&mut self) -> anyhow::Result<Vec<String>> {
        let stopped = tokio::task::block_in_place(|| self.stop_controller());
        self.start_controller()?;
        Ok(stopped.into_iter().collect())
    }

    async fn controllers(&mut self) -> anyhow::Result<Vec<String>> {
        let exited = match &mut self.controller {
            Some(process) => !matches!(process.child.try_wait(), Ok(None)),
            None => return Ok(Vec::new()),
        };
        if exited {
            // As the Deployment would: a new one, under a new identity (the harness
            // tells a crash from the identity that went).
            self.controller = None;
            self.start_controller()?;
        }
        Ok(self
            .controller
            .iter()
            .map(|process| process.identity.clone())
            .collect())
    }

    fn controller_lease(&self) -> (String, String) {
        (self.config.lease_namespace.clone(), LEASE_NAME.to_owned())
    }

    async fn imex_outlives_daemon(&mut self, node: &str) -> anyhow::Result<bool> {
        self.index(node)?;
        Ok(true)
    }

    async fn imex_pids(&mut self, node: &str) -> anyhow::Result<Option<Vec<u32>>> {
        let index = self.index(node)?;
        Ok(Some(self.rack()?.imex_daemons()?.swap_remove(index)))
    }

    async fn roll_daemons(&mut self, nodes: &[String]) -> anyhow::Result<()> {
        let order = nodes
            .iter()
            .map(|n| self.index(n))
            .collect::<anyhow::Result<VecDeque<usize>>>()?;
        self.rolling = order;
        self.rolling_now = None;
        self.rolled().await.map(|_| ())
    }

    async fn rolled(&mut self) -> anyhow::Result<bool> {
        if let Some(index) = self.rolling_now {
            if !self.serving(index).await {
                return Ok(false);
            }
            self.rolling_now = None;
        }
        let Some(next) = self.rolling.pop_front() else {
            return Ok(true);
        };
        let rack = self.rack()?;
        tokio::task::block_in_place(|| -> anyhow::Result<()> {
            rack.stop(next, STOP_GRACE)?;
            rack.start(next)
        })
        .with_context(|| format!("rolling {}'s daemon", self.name_of(next)))?;
        self.rolling_now = Some(next);
        Ok(false)
    }

    fn job_imports(&mut self) -> Option<&mut dyn JobImports> {
        Some(self)
    }

    async fn stop(&mut self) {
        tokio::task::block_in_place(|| {
            self.stop_controller();
            if let Some(rack) = &mut self.rack {
                rack.stop_all(STOP_GRACE);
            }
        });
    }
}

#[async_trait]
impl JobImports for LocalAccess {
    async fn import(&mut self, node: &str, from: &[String]) -> anyhow::Result<u64> {
        let index = self.index(node)?;
        let peers = from
            .iter()
            .map(|n| self.index(n))
            .collect::<anyhow::Result<Vec<usize>>>()?;
        Ok(self.rack()?.import_from(index, &peers).await?.id)
    }

    async fn check(&mut self, held: &[(String, u64)]) -> BTreeMap<(String, u64), ImportState> {
        let Some(rack) = self.rack.as_ref() else {
            return BTreeMap::new();
        };
        let index = |name: &str| rack.nodes().iter().position(|n| n.name() == name);
        let handles: Vec<HeldImport> = held
            .iter()
            .filter_map(|(node, id)| {
                Some(HeldImport {
                    node: index(node)?,
                    id: *id,
                })
            })
            .collect();
        // imex-sim starts a broken import's reason with the exporter's address.
        let exporter = |why: &str| {
            rack.nodes()
                .iter()
                .find(|n| {
                    why.strip_prefix(&n.ip().to_string())
                        .is_some_and(|rest| rest.starts_with(' '))
                })
                .map(|n| n.name().to_owned())
        };
        rack.check_imports(&handles)
            .await
            .into_iter()
            .map(|(handle, found)| {
                let state = match found {
                    Ok(Import { broken: None, .. }) => ImportState::Whole,
                    Ok(Import {
                        broken: Some(why), ..
                    }) => ImportState::Broken {
                        exporter: exporter(&why),
                        why,
                    },
                    Err(why) => ImportState::Lost(why),
                };
                ((rack.node(handle.node).name().to_owned(), handle.id), state)
            })
            .collect()
    }
}
