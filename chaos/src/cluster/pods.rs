//! [`PodAccess`]: the daemons and the controller of a cluster where domaind runs from
//! the Helm chart (`deploy/helm/domaind`), reached through the API server alone.
//!
//! - A node's daemon is the chart's DaemonSet pod on it (`spec.nodeName`): Running,
//!   Ready and not being deleted. Its identity is the pod's name and uid, so the pod
//!   the DaemonSet makes after a deletion is told from the one before; its restarts
//!   are its container's restart count.
//! - `/state` listens on the node's loopback only (`--state-addr`, 127.0.0.1:9466 by
//!   default, which the chart keeps), out of reach of anything off the node. The pod
//!   uses the host network, so a port-forward to the pod (pods/portforward) reaches the
//!   node's loopback; the API server's proxy would not (it reaches the pod's IP, and
//!   refuses loopback addresses).
//! - The IMEX daemon is stopped by `domaind imex kill` run in the container that keeps
//!   it (pods/exec): the IMEX runner's where the node has a runner pod, the daemon's
//!   otherwise; the image has no shell and no `kill`. A node with a runner pod keeps
//!   its IMEX through a deletion of its daemon pod.
//! - `upgrade` is the node DaemonSet's rolling update, started as `kubectl rollout
//!   restart` starts one (a new pod template annotation) and done once the DaemonSet
//!   says every pod is updated and available.
//! - The workload stand-in's imports are not held: a real IMEX's imports are its
//!   jobs' own, so a cluster run through the chart's pods reports none.
//! - The controller is the chart's Deployment's pods; a restart deletes them all.
//!
//! Every port-forward and exec is bounded by [`PodAccessConfig::timeout`]: a runtime
//! that implements neither (a fake one) fails them at once, but one that accepts the
//! stream and never answers must not hang the run.

use std::time::Duration;

use anyhow::{Context as _, anyhow, bail};
use async_trait::async_trait;
use domaind_imex::processes::parse_killed;
use domaind_node::run::NodeView;
use domaind_testbed::rack::http_get_over;
use k8s_openapi::api::apps::v1::DaemonSet;
use k8s_openapi::api::core::v1::Pod;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Status;
use kube::api::{
    Api, AttachParams, DeleteParams, ListParams, ObjectList, Patch, PatchParams, Preconditions,
};
use kube::{Client, ResourceExt};
use tokio::io::{AsyncRead, AsyncReadExt as _, AsyncWrite};

use super::access::{ClusterAccess, DaemonInstance, JobImports};

/// The namespace the chart's documentation installs it in.
pub const DEFAULT_NAMESPACE: &str = "domaind";
/// The chart's label on the DaemonSet's pods.
pub const NODE_COMPONENT: &str = "app.kubernetes.io/component=node";
/// The chart's label on the IMEX runner DaemonSet's pods.
pub const RUNNER_COMPONENT: &str = "app.kubernetes.io/component=imex-runner";
/// The IMEX runner's container in the chart's runner DaemonSet.
pub const RUNNER_CONTAINER: &str = "imex-runner";
/// The pod template annotation whose change rolls the node DaemonSet, as `kubectl
/// rollout restart` does with its own.
pub const ROLLED_AT_ANNOTATION: &str = "domaind.io/chaos-rolled-at";
/// The chart's label on the controller Deployment's pods.
pub const CONTROLLER_COMPONENT: &str = "app.kubernetes.io/component=controller";
/// The chart's label naming the release, on every pod.
pub const INSTANCE_LABEL: &str = "app.kubernetes.io/instance";
/// The node daemon's container in the chart's DaemonSet.
pub const DAEMON_CONTAINER: &str = "domaind";
/// The port of `domaind run`'s default `--state-addr`, which the chart does not change.
pub const DEFAULT_STATE_PORT: u16 = 9466;
/// `domaind controller`'s default `--lease-name`, the chart's
/// `controller.leaderElection.leaseName`.
pub const DEFAULT_LEASE: &str = "domaind-controller";
/// How long one port-forward or exec may take, from the request to the answer.
pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(10);
/// What runs in the daemon's container to stop its IMEX daemon.
pub const KILL_COMMAND: [&str; 3] = ["domaind", "imex", "kill"];

/// Where the chart's pods are and how to reach them.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PodAccessConfig {
    /// Where the chart is installed.
    pub namespace: String,
    /// Label selector of the node daemons' pods.
    pub daemon_selector: String,
    /// Label selector of the controller's pods.
    pub controller_selector: String,
    /// The daemon pods' container that runs `domaind run` (exec's target).
    pub daemon_container: String,
    /// Label selector of the IMEX runners' pods, and their container.
    pub runner_selector: String,
    pub runner_container: String,
    /// The port `/state` listens on, on the node's loopback.
    pub state_port: u16,
    /// The controller's leader-election Lease.
    pub lease_namespace: String,
    pub lease_name: String,
    /// Bounds each port-forward and each exec.
    pub timeout: Duration,
}

impl PodAccessConfig {
    /// The chart's defaults for an installation in `namespace`; `release` narrows the
    /// selectors to that release's pods (where several are installed).
    pub fn chart(namespace: &str, release: Option<&str>) -> Self {
        Self {
            namespace: namespace.to_owned(),
            daemon_selector: selector(NODE_COMPONENT, release),
            controller_selector: selector(CONTROLLER_COMPONENT, release),
            daemon_container: DAEMON_CONTAINER.to_owned(),
            runner_selector: selector(RUNNER_COMPONENT, release),
            runner_container: RUNNER_CONTAINER.to_owned(),
            state_port: DEFAULT_STATE_PORT,
            lease_namespace: namespace.to_owned(),
            lease_name: DEFAULT_LEASE.to_owned(),
            timeout: DEFAULT_TIMEOUT,
        }
    }
}

impl Default for PodAccessConfig {
    fn default() -> Self {
        Self::chart(DEFAULT_NAMESPACE, None)
    }
}

/// A component's selector, of one release's pods when `release` is given.
pub fn selector(component: &str, release: Option<&str>) -> String {
    match release {
        Some(release) => format!("{component},{INSTANCE_LABEL}={release}"),
        None => component.to_owned(),
    }
}

fn deleting(pod: &Pod) -> bool {
    pod.metadata.deletion_timestamp.is_some()
}

fn running_and_ready(pod: &Pod) -> bool {
    let Some(status) = &pod.status else {
        return false;
    };
    status.phase.as_deref() == Some("Running")
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The pod serving as `node`'s daemon among `pods`: on the node, Running, Ready and
/// not being deleted. Should two qualify (a DaemonSet mid-update), the newer.
pub fn daemon_pod<'a>(pods: &'a [Pod], node: &str) -> Option<&'a Pod> {
    pods.iter()
        .filter(|pod| pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node))
        .filter(|pod| running_and_ready(pod) && !deleting(pod))
        .max_by(|a, b| {
            let created = |p: &Pod| p.metadata.creation_timestamp.clone().map(|t| t.0);
            created(a)
                .cmp(&created(b))
                .then_with(|| a.name_any().cmp(&b.name_any()))
        })
}

/// A daemon pod as the harness tells instances apart: its name and uid, and its
/// daemon container's restarts.
pub fn instance(pod: &Pod, container: &str) -> DaemonInstance {
    let restarts = pod
        .status
        .as_ref()
        .and_then(|s| s.container_statuses.as_ref())
        .and_then(|statuses| statuses.iter().find(|c| c.name == container))
        .map_or(0, |c| u32::try_from(c.restart_count).unwrap_or(0));
    DaemonInstance {
        id: format!("{}/{}", pod.name_any(), pod.uid().unwrap_or_default()),
        restarts,
    }
}

/// Those of `nodes` with no daemon pod among `pods`.
pub fn nodes_without_daemon(pods: &[Pod], nodes: &[String]) -> Vec<String> {
    nodes
        .iter()
        .filter(|node| daemon_pod(pods, node).is_none())
        .cloned()
        .collect()
}

/// The names of the Ready controller pods not being deleted, sorted.
pub fn ready_controllers(pods: &[Pod]) -> Vec<String> {
    let mut names: Vec<String> = pods
        .iter()
        .filter(|pod| running_and_ready(pod) && !deleting(pod))
        .map(ResourceExt::name_any)
        .collect();
    names.sort();
    names
}

/// The pids `domaind imex kill` killed, from what its exec answered: its status (the
/// API's `Status`, `Success` for exit 0) and its output.
pub fn kill_outcome(
    pod: &str,
    status: Option<Status>,
    stdout: &str,
    stderr: &str,
) -> anyhow::Result<Vec<u32>> {
    let said = || {
        let text = [stderr.trim(), stdout.trim()]
            .into_iter()
            .filter(|s| !s.is_empty())
            .collect::<Vec<_>>()
            .join("; ");
        if text.is_empty() {
            "nothing".to_owned()
        } else {
            text
        }
    };
    let Some(status) = status else {
        bail!(
            "`{}` in pod {pod} ended without an exit status; it said: {}",
            KILL_COMMAND.join(" "),
            said()
        );
    };
    if status.status.as_deref() != Some("Success") {
        let why = status
            .message
            .or(status.reason)
            .unwrap_or_else(|| "failed".to_owned());
        bail!(
            "`{}` in pod {pod}: {why}; it said: {}",
            KILL_COMMAND.join(" "),
            said()
        );
    }
    let pids = parse_killed(stdout);
    if pids.is_empty() {
        bail!(
            "`{}` in pod {pod} succeeded but named no pid killed; it said: {}",
            KILL_COMMAND.join(" "),
            said()
        );
    }
    Ok(pids)
}

/// `GET /state` over a port-forward's stream to `port`; should the forward's error
/// channel speak first (the pod refused the connection), its message.
pub async fn get_state_over<S>(
    stream: S,
    refused: impl Future<Output = Option<String>>,
    port: u16,
) -> anyhow::Result<(u16, String)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let host = format!("localhost:{port}");
    tokio::select! {
        answer = http_get_over(stream, &host, "/state") => {
            answer.with_context(|| format!("GET /state through the port-forward to port {port}"))
        }
        Some(message) = refused => Err(anyhow!("the port-forward to port {port} failed: {message}")),
    }
}

/// A node's view from what its `/state` answered.
pub fn parse_state(status: u16, body: &str) -> anyhow::Result<NodeView> {
    if status != 200 {
        bail!("/state answered {status}: {}", body.trim());
    }
    serde_json::from_str(body).context("/state's answer is not a node's view")
}

async fn read_all(reader: Option<impl AsyncRead + Unpin>) -> String {
    let mut bytes = Vec::new();
    if let Some(mut reader) = reader {
        // What was read before an error is still worth showing.
        let _ = reader.read_to_end(&mut bytes).await;
    }
    String::from_utf8_lossy(&bytes).into_owned()
}

/// The chart's daemons and controller, reached through the API server.
#[derive(Clone)]
pub struct PodAccess {
    config: PodAccessConfig,
    pods: Api<Pod>,
    daemon_sets: Api<DaemonSet>,
    /// The node DaemonSets a rolling update was started on, and the generation each
    /// had once told.
    rolling: Vec<(String, i64)>,
}

impl std::fmt::Debug for PodAccess {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PodAccess")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl PodAccess {
    pub fn new(client: Client, config: PodAccessConfig) -> Self {
        let pods = Api::namespaced(client.clone(), &config.namespace);
        let daemon_sets = Api::namespaced(client, &config.namespace);
        Self {
            config,
            pods,
            daemon_sets,
            rolling: Vec::new(),
        }
    }

    pub fn config(&self) -> &PodAccessConfig {
        &self.config
    }

    /// Where the daemons are looked for, in words, for errors.
    fn daemons_where(&self) -> String {
        format!(
            "pods labelled {} in namespace {}",
            self.config.daemon_selector, self.config.namespace
        )
    }

    fn controllers_where(&self) -> String {
        format!(
            "pods labelled {} in namespace {}",
            self.config.controller_selector, self.config.namespace
        )
    }

    async fn list(&self, selector: &str, node: Option<&str>) -> anyhow::Result<Vec<Pod>> {
        let mut params = ListParams::default().labels(selector);
        if let Some(node) = node {
            params = params.fields(&format!("spec.nodeName={node}"));
        }
        let list = list_again_if_closed(&self.pods, &params)
            .await
            .with_context(|| {
                format!(
                    "cannot list pods labelled {selector} in namespace {}",
                    self.config.namespace
                )
            })?;
        Ok(list.items)
    }

    async fn daemon_pod_of(&self, node: &str) -> anyhow::Result<Option<Pod>> {
        let pods = self.list(&self.config.daemon_selector, Some(node)).await?;
        Ok(daemon_pod(&pods, node).cloned())
    }

    async fn require_daemon(&self, node: &str) -> anyhow::Result<Pod> {
        self.daemon_pod_of(node).await?.ok_or_else(|| {
            anyhow!(
                "node {node} has no Running, Ready daemon pod ({})",
                self.daemons_where()
            )
        })
    }

    async fn fetch_state(&self, node: &str, pod: &str) -> anyhow::Result<NodeView> {
        let port = self.config.state_port;
        let namespace = &self.config.namespace;
        let mut forwarder = self.pods.portforward(pod, &[port]).await.with_context(|| {
            format!("the port-forward to pod {namespace}/{pod} port {port} was refused")
        })?;
        let exchange = async {
            let stream = forwarder
                .take_stream(port)
                .context("the port-forward gave no stream")?;
            let refused = forwarder
                .take_error(port)
                .context("the port-forward gave no error channel")?;
            get_state_over(stream, refused, port).await
        };
        let answer = exchange.await;
        forwarder.abort();
        answer
            .and_then(|(status, body)| parse_state(status, &body))
            .with_context(|| format!("node {node}'s /state through pod {namespace}/{pod}"))
    }

    /// The Running, Ready IMEX runner pod on `node`, if it has one.
    async fn runner_pod_of(&self, node: &str) -> anyhow::Result<Option<Pod>> {
        let pods = self.list(&self.config.runner_selector, Some(node)).await?;
        Ok(daemon_pod(&pods, node).cloned())
    }

    async fn run_kill(&self, pod: &str, container: &str) -> anyhow::Result<Vec<u32>> {
        let namespace = &self.config.namespace;
        let params = AttachParams::default()
            .container(container)
            .stdin(false)
            .stdout(true)
            .stderr(true);
        let mut process = self
            .pods
            .exec(pod, KILL_COMMAND, &params)
            .await
            .with_context(|| {
                format!(
                    "the exec of `{}` in pod {namespace}/{pod} (container {container}) was \
                     refused",
                    KILL_COMMAND.join(" "),
                )
            })?;
        let status = process
            .take_status()
            .context("the exec gave no status channel")?;
        let (stdout, stderr, status) = tokio::join!(
            read_all(process.stdout()),
            read_all(process.stderr()),
            status
        );
        kill_outcome(&format!("{namespace}/{pod}"), status, &stdout, &stderr)
    }
}

/// `work`, unless it takes over `limit`: then an error saying what (`what`) took too
/// long.
pub async fn within<T>(
    limit: Duration,
    what: impl FnOnce() -> String,
    work: impl Future<Output = anyhow::Result<T>>,
) -> anyhow::Result<T> {
    tokio::time::timeout(limit, work)
        .await
        .map_err(|_| anyhow!("{} took over {limit:?}", what()))?
}

#[async_trait]
impl ClusterAccess for PodAccess {
    fn describe(&self) -> String {
        format!(
            "the chart's pods in namespace {}: daemons labelled {} (container {}), \
             controller labelled {} (Lease {}/{}); /state read by port-forward to each \
             daemon pod's port {}, IMEX stopped by `{}` through pods/exec in the IMEX \
             runner's pod ({}) or else the daemon's; upgrade rolls the node DaemonSet; no \
             imports held (a real IMEX's are its jobs')",
            self.config.namespace,
            self.config.daemon_selector,
            self.config.daemon_container,
            self.config.controller_selector,
            self.config.lease_namespace,
            self.config.lease_name,
            self.config.state_port,
            KILL_COMMAND.join(" "),
            self.config.runner_selector,
        )
    }

    async fn start(&mut self, nodes: &[String]) -> anyhow::Result<()> {
        let daemons = self.list(&self.config.daemon_selector, None).await?;
        let missing = nodes_without_daemon(&daemons, nodes);
        let controllers = self.list(&self.config.controller_selector, None).await?;
        let ready = ready_controllers(&controllers);
        let mut problems = Vec::new();
        if !missing.is_empty() {
            problems.push(format!(
                "no Running, Ready daemon pod on node(s) {} ({})",
                missing.join(", "),
                self.daemons_where()
            ));
        }
        if ready.is_empty() {
            problems.push(format!(
                "no Ready controller pod ({}; {} found)",
                self.controllers_where(),
                controllers.len()
            ));
        }
        if !problems.is_empty() {
            bail!(
                "domaind is not running where the chart puts it: {}",
                problems.join("; ")
            );
        }
        Ok(())
    }

    async fn daemon(&mut self, node: &str) -> anyhow::Result<Option<DaemonInstance>> {
        let pod = self.daemon_pod_of(node).await?;
        Ok(pod.map(|pod| instance(&pod, &self.config.daemon_container)))
    }

    async fn state(&mut self, node: &str) -> anyhow::Result<NodeView> {
        let pod = self.require_daemon(node).await?.name_any();
        let what = || {
            format!(
                "reading node {node}'s /state through a port-forward to pod {}/{pod}",
                self.config.namespace
            )
        };
        within(self.config.timeout, what, self.fetch_state(node, &pod)).await
    }

    async fn delete_daemon(&mut self, node: &str) -> anyhow::Result<()> {
        let pod = self.require_daemon(node).await?;
        let name = pod.name_any();
        // The pod seen, not a replacement made meanwhile under the same name.
        let params = DeleteParams {
            preconditions: Some(Preconditions {
                uid: pod.uid(),
                resource_version: None,
            }),
            ..DeleteParams::default()
        };
        self.pods.delete(&name, &params).await.with_context(|| {
            format!(
                "cannot delete node {node}'s daemon pod {}/{name}",
                self.config.namespace
            )
        })?;
        Ok(())
    }

    async fn stop_imex(&mut self, node: &str) -> anyhow::Result<Vec<u32>> {
        let (pod, container) = match self.runner_pod_of(node).await? {
            Some(runner) => (runner.name_any(), self.config.runner_container.clone()),
            None => (
                self.require_daemon(node).await?.name_any(),
                self.config.daemon_container.clone(),
            ),
        };
        let what = || {
            format!(
                "stopping node {node}'s IMEX daemon through an exec in pod {}/{pod}",
                self.config.namespace
            )
        };
        within(self.config.timeout, what, self.run_kill(&pod, &container)).await
    }

    async fn restart_controller(&mut self) -> anyhow::Result<Vec<String>> {
        let pods = self.list(&self.config.controller_selector, None).await?;
        let running: Vec<String> = pods
            .iter()
            .filter(|pod| !deleting(pod))
            .map(ResourceExt::name_any)
            .collect();
        if running.is_empty() {
            bail!(
                "no controller pod to restart ({})",
                self.controllers_where()
            );
        }
        for name in &running {
            self.pods
                .delete(name, &DeleteParams::default())
                .await
                .with_context(|| {
                    format!(
                        "cannot delete controller pod {}/{name}",
                        self.config.namespace
                    )
                })?;
        }
        Ok(running)
    }

    async fn controllers(&mut self) -> anyhow::Result<Vec<String>> {
        let pods = self.list(&self.config.controller_selector, None).await?;
        Ok(ready_controllers(&pods))
    }

    fn controller_lease(&self) -> (String, String) {
        (
            self.config.lease_namespace.clone(),
            self.config.lease_name.clone(),
        )
    }

    async fn imex_outlives_daemon(&mut self, node: &str) -> anyhow::Result<bool> {
        Ok(self.runner_pod_of(node).await?.is_some())
    }

    async fn imex_pids(&mut self, _node: &str) -> anyhow::Result<Option<Vec<u32>>> {
        Ok(None)
    }

    async fn roll_daemons(&mut self, _nodes: &[String]) -> anyhow::Result<()> {
        let params = ListParams::default().labels(&self.config.daemon_selector);
        let found = list_again_if_closed(&self.daemon_sets, &params)
            .await
            .with_context(|| {
                format!(
                    "cannot list DaemonSets labelled {} in namespace {}",
                    self.config.daemon_selector, self.config.namespace
                )
            })?;
        if found.items.is_empty() {
            bail!("no node DaemonSet ({})", self.daemons_where());
        }
        let at = time::OffsetDateTime::now_utc()
            .format(&time::format_description::well_known::Rfc3339)
            .context("cannot format the time")?;
        let patch = serde_json::json!({"spec": {"template": {"metadata": {"annotations": {
            ROLLED_AT_ANNOTATION: at
        }}}}});
        self.rolling.clear();
        for daemon_set in found.items {
            let name = daemon_set.name_any();
            let patched = self
                .daemon_sets
                .patch(&name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .with_context(|| format!("cannot roll DaemonSet {name}"))?;
            self.rolling
                .push((name, patched.metadata.generation.unwrap_or_default()));
        }
        Ok(())
    }

    async fn rolled(&mut self) -> anyhow::Result<bool> {
        for (name, generation) in &self.rolling {
            let daemon_set = self
                .daemon_sets
                .get(name)
                .await
                .with_context(|| format!("cannot read DaemonSet {name}"))?;
            if !rollout_done(&daemon_set, *generation) {
                return Ok(false);
            }
        }
        Ok(true)
    }

    fn job_imports(&mut self) -> Option<&mut dyn JobImports> {
        None
    }

    async fn stop(&mut self) {}
}

/// Whether `daemon_set`'s rolling update to `generation` is done: observed, and every
/// scheduled pod updated and available.
pub fn rollout_done(daemon_set: &DaemonSet, generation: i64) -> bool {
    let Some(status) = &daemon_set.status else {
        return false;
    };
    status.observed_generation.unwrap_or_default() >= generation
        && status.updated_number_scheduled.unwrap_or_default() == status.desired_number_scheduled
        && status.number_available.unwrap_or_default() == status.desired_number_scheduled
        && status.number_unavailable.unwrap_or_default() == 0
}

/// Lists; a list that met a closed connection is sent again, once. A GET changes
/// nothing, and the API server closes the connection of a refused port-forward or exec,
/// which the client's pool can hand out again before it sees the close.
async fn list_again_if_closed<K>(api: &Api<K>, params: &ListParams) -> kube::Result<ObjectList<K>>
where
    K: Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.list(params).await {
        Err(error) if met_a_closed_connection(&error) => api.list(params).await,
        listed => listed,
    }
}

/// Whether a request failed because its connection closed before the response came.
fn met_a_closed_connection(error: &kube::Error) -> bool {
    let mut cause: Option<&(dyn std::error::Error + 'static)> = Some(error);
    while let Some(error) = cause {
        if error
            .downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_incomplete_message)
        {
            return true;
        }
        cause = error.source();
    }
    false
}

#[cfg(test)]
mod tests {
    use std::net::SocketAddr;

    use serde_json::{Value, json};

    use super::*;

    fn pod(name: &str, node: &str, phase: &str, ready: bool) -> Value {
        json!({
            "metadata": {
                "name": name,
                "uid": format!("uid-{name}"),
                "creationTimestamp": "2026-01-01T00:00:00Z",
            },
            "spec": {"nodeName": node, "containers": [{"name": "domaind"}]},
            "status": {
                "phase": phase,
                "conditions": [{"type": "Ready", "status": if ready { "True" } else { "False" }}],
                "containerStatuses": [
                    {"name": "sidecar", "restartCount": 9, "ready": true, "image": "x", "imageID": ""},
                    {"name": "domaind", "restartCount": 2, "ready": ready, "image": "x", "imageID": ""},
                ],
            },
        })
    }

    fn pods(values: Vec<Value>) -> Vec<Pod> {
        values
            .into_iter()
            .map(|v| serde_json::from_value(v).unwrap())
            .collect()
    }

    fn deleting(mut value: Value) -> Value {
        value["metadata"]["deletionTimestamp"] = json!("2026-01-01T00:01:00Z");
        value
    }

    fn created(mut value: Value, at: &str) -> Value {
        value["metadata"]["creationTimestamp"] = json!(at);
        value
    }

    #[test]
    fn the_charts_selectors_narrow_to_a_release() {
        assert_eq!(
            selector(NODE_COMPONENT, None),
            "app.kubernetes.io/component=node"
        );
        assert_eq!(
            selector(CONTROLLER_COMPONENT, Some("dm")),
            "app.kubernetes.io/component=controller,app.kubernetes.io/instance=dm"
        );
        let config = PodAccessConfig::chart("gpu-system", Some("dm"));
        assert_eq!(
            config.daemon_selector,
            "app.kubernetes.io/component=node,app.kubernetes.io/instance=dm"
        );
        assert_eq!(
            (config.lease_namespace.as_str(), config.lease_name.as_str()),
            ("gpu-system", "domaind-controller")
        );
        assert_eq!(PodAccessConfig::default().namespace, "domaind");
    }

    #[test]
    fn the_state_port_is_the_node_daemons_default() {
        let addr: SocketAddr = domaind_node::run::DEFAULT_STATE_ADDR.parse().unwrap();
        assert_eq!(addr.port(), DEFAULT_STATE_PORT);
        assert!(addr.ip().is_loopback());
    }

    #[test]
    fn the_daemon_is_the_running_ready_pod_of_the_node_not_being_deleted() {
        let list = pods(vec![
            pod("d-other", "n2", "Running", true),
            deleting(pod("d-old", "n1", "Running", true)),
            pod("d-pending", "n1", "Pending", false),
            pod("d-unready", "n1", "Running", false),
            pod("d-new", "n1", "Running", true),
        ]);
        let picked = daemon_pod(&list, "n1").unwrap();
        assert_eq!(picked.name_any(), "d-new");
        assert_eq!(
            instance(picked, DAEMON_CONTAINER),
            DaemonInstance {
                id: "d-new/uid-d-new".into(),
                restarts: 2
            }
        );
        assert_eq!(instance(picked, "absent").restarts, 0);
        assert_eq!(daemon_pod(&list, "n2").unwrap().name_any(), "d-other");
        assert!(daemon_pod(&list, "n3").is_none());
        // Only the deleting and the unready ones left: no daemon.
        assert!(daemon_pod(&list[1..4], "n1").is_none());
    }

    #[test]
    fn of_two_daemons_the_newer_is_picked() {
        let list = pods(vec![
            created(pod("d-b", "n1", "Running", true), "2026-01-01T00:00:05Z"),
            created(pod("d-a", "n1", "Running", true), "2026-01-01T00:00:09Z"),
        ]);
        assert_eq!(daemon_pod(&list, "n1").unwrap().name_any(), "d-a");
    }

    #[test]
    fn a_rollout_is_done_once_observed_and_every_pod_updated_and_available() {
        let daemon_set = |observed: i64, updated: i32, available: i32, unavailable: i32| {
            serde_json::from_value::<DaemonSet>(json!({
                "metadata": {"name": "domaind-node", "generation": 3},
                "status": {
                    "observedGeneration": observed, "desiredNumberScheduled": 3,
                    "currentNumberScheduled": 3, "numberMisscheduled": 0, "numberReady": 3,
                    "updatedNumberScheduled": updated, "numberAvailable": available,
                    "numberUnavailable": unavailable,
                },
            }))
            .unwrap()
        };
        assert!(rollout_done(&daemon_set(3, 3, 3, 0), 3));
        // Not yet seen by the DaemonSet controller: the old status says nothing.
        assert!(!rollout_done(&daemon_set(2, 3, 3, 0), 3));
        // One pod still to replace, or a new one not yet available.
        assert!(!rollout_done(&daemon_set(3, 2, 3, 0), 3));
        assert!(!rollout_done(&daemon_set(3, 3, 2, 1), 3));
        assert!(!rollout_done(&DaemonSet::default(), 3));
    }

    #[test]
    fn nodes_without_a_daemon_are_named() {
        let list = pods(vec![
            pod("d1", "n1", "Running", true),
            pod("d2", "n2", "Running", false),
            deleting(pod("d3", "n3", "Running", true)),
        ]);
        let nodes: Vec<String> = ["n1", "n2", "n3", "n4"].map(String::from).to_vec();
        assert_eq!(nodes_without_daemon(&list, &nodes), ["n2", "n3", "n4"]);
    }

    #[test]
    fn controllers_are_the_ready_pods_not_being_deleted() {
        let list = pods(vec![
            pod("c-b", "n1", "Running", true),
            deleting(pod("c-old", "n1", "Running", true)),
            pod("c-starting", "n2", "Running", false),
            pod("c-a", "n2", "Running", true),
        ]);
        assert_eq!(ready_controllers(&list), ["c-a", "c-b"]);
    }

    fn status(value: Value) -> Option<Status> {
        Some(serde_json::from_value(value).unwrap())
    }

    #[test]
    fn a_kill_that_succeeded_gives_its_pids() {
        let out = "killed IMEX daemon 41 (child of domaind run 1): nvidia-imex -c /c\n";
        let pids = kill_outcome("ns/p", status(json!({"status": "Success"})), out, "");
        assert_eq!(pids.unwrap(), [41]);
    }

    #[test]
    fn a_kill_that_failed_says_why() {
        let failed = status(json!({
            "status": "Failure",
            "reason": "NonZeroExitCode",
            "message": "command terminated with non-zero exit code: error executing command [domaind imex kill], exit code 1",
        }));
        let stderr = "domaind: error: no IMEX daemon runs under `domaind run` (pid 1)\n";
        let error = kill_outcome("ns/p", failed, "", stderr)
            .unwrap_err()
            .to_string();
        assert!(error.contains("in pod ns/p: command terminated"), "{error}");
        assert!(error.contains("no IMEX daemon runs under"), "{error}");

        let silent = kill_outcome("ns/p", status(json!({"status": "Success"})), "", "")
            .unwrap_err()
            .to_string();
        assert!(
            silent.contains("named no pid killed; it said: nothing"),
            "{silent}"
        );

        let cut = kill_outcome("ns/p", None, "partial", "")
            .unwrap_err()
            .to_string();
        assert!(
            cut.contains("without an exit status; it said: partial"),
            "{cut}"
        );
    }

    fn view() -> NodeView {
        NodeView {
            node: "n1".into(),
            claims: vec!["c1".into()],
            prepared: vec!["c1".into()],
            imex: domaind_node::run::ImexView {
                running: true,
                starts: 2,
                restarts: 1,
                last_failure: None,
                restart_delay_ms: None,
                failing: false,
                failures_in_a_row: 0,
            },
            domains: Vec::new(),
            gossip: Default::default(),
            checkpoint: Default::default(),
            channels: Vec::new(),
            shared_imex: None,
        }
    }

    /// The far end of a port-forward: reads one request and answers `response`.
    fn daemon_end(response: String) -> (tokio::io::DuplexStream, tokio::task::JoinHandle<String>) {
        use tokio::io::AsyncWriteExt as _;
        let (ours, mut theirs) = tokio::io::duplex(64 * 1024);
        let served = tokio::spawn(async move {
            let mut request = Vec::new();
            let mut buf = [0u8; 1024];
            while !request.ends_with(b"\r\n\r\n") {
                let n = theirs.read(&mut buf).await.unwrap();
                assert!(n > 0, "the request ended early");
                request.extend_from_slice(&buf[..n]);
            }
            theirs.write_all(response.as_bytes()).await.unwrap();
            String::from_utf8(request).unwrap()
        });
        (ours, served)
    }

    fn http(status: &str, body: &str) -> String {
        format!(
            "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
            body.len()
        )
    }

    #[tokio::test]
    async fn state_is_read_over_the_forwarded_stream() {
        let body = serde_json::to_string(&view()).unwrap();
        let (stream, served) = daemon_end(http("200 OK", &body));
        let never = std::future::pending::<Option<String>>();
        let (status, got) = get_state_over(stream, never, 9466).await.unwrap();
        let request = served.await.unwrap();
        assert!(request.starts_with("GET /state HTTP/1.1\r\n"), "{request}");
        assert!(
            request.to_lowercase().contains("host: localhost:9466"),
            "{request}"
        );
        assert_eq!(parse_state(status, &got).unwrap(), view());
    }

    #[tokio::test]
    async fn a_refused_forward_says_what_the_pod_answered() {
        let (stream, _theirs) = tokio::io::duplex(1024);
        let refused =
            async { Some("error forwarding port 9466 to pod x: connection refused".to_owned()) };
        let error = get_state_over(stream, refused, 9466).await.unwrap_err();
        assert_eq!(
            error.to_string(),
            "the port-forward to port 9466 failed: error forwarding port 9466 to pod x: connection refused"
        );
    }

    #[test]
    fn a_bad_answer_is_named() {
        let refused = parse_state(503, "not ready\n").unwrap_err().to_string();
        assert_eq!(refused, "/state answered 503: not ready");
        let garbage = format!("{:#}", parse_state(200, "{\"node\": 1}").unwrap_err());
        assert!(
            garbage.starts_with("/state's answer is not a node's view: "),
            "{garbage}"
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_stream_that_never_answers_is_cut_off() {
        let hung = within(
            Duration::from_secs(10),
            || "reading node n1's /state".to_owned(),
            std::future::pending::<anyhow::Result<()>>(),
        );
        let error = hung.await.unwrap_err().to_string();
        assert_eq!(error, "reading node n1's /state took over 10s");
        let answered = within(Duration::from_secs(10), String::new, async { Ok(7) });
        assert_eq!(answered.await.unwrap(), 7);
    }

    /// An API server stand-in on 127.0.0.1 that closes each of its first `closing`
    /// connections once it has read the request, then lists no pods.
    async fn closing_server(closing: usize) -> SocketAddr {
        use tokio::io::AsyncWriteExt as _;
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            for served in 0.. {
                let (mut stream, _) = listener.accept().await.unwrap();
                let mut request = Vec::new();
                let mut buf = [0u8; 1024];
                while !request.windows(4).any(|w| w == b"\r\n\r\n") {
                    let n = stream.read(&mut buf).await.unwrap();
                    assert!(n > 0, "the client hung up mid-request");
                    request.extend_from_slice(&buf[..n]);
                }
                if served >= closing {
                    let list = r#"{"apiVersion":"v1","kind":"PodList","metadata":{},"items":[]}"#;
                    let answer = format!(
                        "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{list}",
                        list.len()
                    );
                    stream.write_all(answer.as_bytes()).await.unwrap();
                }
            }
        });
        addr
    }

    async fn access_to(addr: SocketAddr) -> PodAccess {
        let config = kube::Config::new(format!("http://{addr}").parse().unwrap());
        PodAccess::new(
            Client::try_from(config).unwrap(),
            PodAccessConfig::default(),
        )
    }

    #[tokio::test]
    async fn a_list_that_met_a_closed_connection_is_sent_again_once() {
        let access = access_to(closing_server(1).await).await;
        let listed = access.list("app=x", None).await.unwrap();
        assert!(listed.is_empty());

        let access = access_to(closing_server(2).await).await;
        let error = format!("{:#}", access.list("app=x", None).await.unwrap_err());
        assert!(
            error.contains("connection closed before message completed"),
            "{error}"
        );
    }
}
