//! End to end with real kubelets: the kubelet's own plugin watcher registers our
//! daemons, the real scheduler allocates channels from our ResourceSlices, the kubelets
//! call NodePrepareResources, and NVIDIA's blog workload runs.
//!
//! Needs `../shared/kube` (or any cluster made by its scripts) and root, for the
//! kubelets: `KUBECONFIG` and `DOMAIND_E2E_KUBE_DIR` (the directory holding
//! `kubelet.sh`). Ignored unless asked for (`--ignored`), as every cluster test.
//!
//! 1. Three fake nodes (`kubelet.sh`), labelled with one NVLink clique and four
//!    `nvidia.com/gpu` each; three `domaind run --backend kube` serving their kubelet's
//!    plugin directories; `domaind controller`.
//! 2. NVIDIA's blog ComputeDomain and Deployment (`fixtures/nvidia-blog-workload.yaml`):
//!    three pods Running, one per node; `kubectl get computedomains` Ready 3/3.
//! 3. One daemon SIGKILLed while its IMEX runner keeps IMEX (issue 28): the survivors
//!    hold it, and once it is back its IMEX has the same pid, no job's import broke,
//!    the ComputeDomain's Ready condition never changed, no NodeLost was told and no
//!    survivor's IMEX was started or reloaded. Then the whole node (daemon and IMEX)
//!    SIGKILLed: NotReady, and a NodeLost event; restarted: Ready 3/3.
//! 4. Two pods per node (six pods of one ComputeDomain on three nodes): Running, Ready.
//! 5. Teardown: the pods go, the kubelets unprepare every claim, no CDI spec is left;
//!    the ComputeDomain is deleted, its template goes and its finalizer is released.
//!
//! Prints the formation times it saw (docs/BENCHMARKS.md).
//!
//! Environment (optional): `DOMAIND_E2E_KUBELET_NODES` (names) and
//! `DOMAIND_E2E_KUBELET_IPS` (127.0.0.2-4); `DOMAIND_E2E_NODE_KUBECONFIG` and
//! `DOMAIND_E2E_CONTROLLER_KUBECONFIG` (the chart's ServiceAccounts: RBAC is tested; each
//! daemon gets a token of the node's bound to a pod on its node, which the chart's
//! admission policy asks for: `domaind_e2e::tokens`);
//! `KV` (the kube scripts' state prefix, default `/tmp/domaind-kube`);
//! `DOMAIND_E2E_KEEP=1` leaves the namespace and nodes.

use std::net::IpAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use domaind_kube_api::crd::{ComputeDomain, Phase as CrdPhase, READY_CONDITION};
use domaind_testbed::rack::{LocalRack, RackBackend, RackSpec, short_temp_dir};
use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceClaimTemplate, ResourceSlice};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};

use domaind_e2e::cluster::{
    DRIVER, create_namespace, documents, env_list, install_crd_and_device_classes, repo_file,
    require, spawn_controller, wait_every, wait_for, wait_node_lost_event,
};
use domaind_e2e::kubelet_log::health_stream_errors;
use domaind_e2e::tokens::node_tokens_for_rack;

const CLIQUE_LABEL: &str = "nvidia.com/gpu.clique";
const CD_NAME: &str = "compute-domain-0";
const TEMPLATE_NAME: &str = "compute-domain-0-rct";

/// Fake nodes made with `kubelet.sh`; stopped and deleted when dropped. Before they
/// stop, each kubelet's log since this start is checked for errors of our plugin's
/// device-health stream ([`health_stream_errors`]): the test fails with the lines found.
pub(crate) struct FakeNodes {
    script: PathBuf,
    names: Vec<String>,
    /// Each node's `kubelet.log` and its length before this start: `kubelet.sh` appends
    /// to a node's log across runs, so only what follows is this test's.
    logs: Vec<(PathBuf, u64)>,
    keep: bool,
    /// The kubelets' working directory. The fake runtime reports containers with an
    /// empty log path, and the kubelet's container log cleanup then removes what it can
    /// of its working directory (a test's is the package: it took `Cargo.toml`).
    cwd: tempfile::TempDir,
}

impl FakeNodes {
    pub(crate) fn start(kube_dir: &Path, names: &[String], ips: &[IpAddr], clique: &str) -> Self {
        let script = kube_dir.join("kubelet.sh");
        let cwd = short_temp_dir("dmkl-cwd").unwrap();
        let logs = names
            .iter()
            .map(|name| {
                let log = kube_state_dir()
                    .join("nodes")
                    .join(name)
                    .join("logs/kubelet.log");
                let start = std::fs::metadata(&log).map_or(0, |m| m.len());
                (log, start)
            })
            .collect();
        let nodes = Self {
            script: script.clone(),
            names: names.to_vec(),
            logs,
            keep: std::env::var("DOMAIND_E2E_KEEP").as_deref() == Ok("1"),
            cwd,
        };
        for (name, ip) in names.iter().zip(ips) {
            let status = Command::new(&script)
                .current_dir(nodes.cwd.path())
                .args([name.as_str(), &ip.to_string(), "--wait"])
                .env("NODE_LABELS", format!("{CLIQUE_LABEL}={clique}"))
                .status()
                .unwrap();
            assert!(status.success(), "kubelet.sh {name} {ip}: {status}");
        }
        nodes
    }

    /// The health-stream errors each kubelet logged since this start, as
    /// `node: line`; a log that cannot be read counts as one.
    fn health_stream_errors(&self) -> Vec<String> {
        let mut found = Vec::new();
        for (name, (log, start)) in self.names.iter().zip(&self.logs) {
            let text = match std::fs::read(log) {
                Ok(text) => text,
                Err(e) => {
                    found.push(format!("{name}: cannot read {}: {e}", log.display()));
                    continue;
                }
            };
            // A log shorter than at start was replaced: all of it is this test's.
            let start = usize::try_from(*start).unwrap_or(usize::MAX);
            let since = text.get(start..).unwrap_or(&text);
            found.extend(
                health_stream_errors(&String::from_utf8_lossy(since))
                    .into_iter()
                    .map(|line| format!("{name}: {line}")),
            );
        }
        found
    }

    fn stop(&self) {
        for name in &self.names {
            let _ = Command::new(&self.script)
                .current_dir(self.cwd.path())
                .args(["--stop", name])
                .status();
            let _ = Command::new("kubectl")
                .args(["delete", "node", name, "--ignore-not-found", "--wait=false"])
                .status();
        }
    }
}

impl Drop for FakeNodes {
    fn drop(&mut self) {
        let found = self.health_stream_errors();
        if !self.keep {
            self.stop();
        }
        if found.is_empty() {
            return;
        }
        let report = format!(
            "the kubelets logged {} error(s) of our device-health stream \
             (DRAResourceHealth/NodeWatchResources):\n{}",
            found.len(),
            found.join("\n")
        );
        if std::thread::panicking() {
            eprintln!("{report}");
        } else {
            panic!("{report}");
        }
    }
}

/// The fake nodes of one test: `{prefix}-1`, `-2`... on 127.0.0.`last` for each of
/// `lasts`, labelled with `clique`, and a client of the cluster.
pub(crate) struct FakeCluster {
    pub(crate) client: Client,
    pub(crate) names: Vec<String>,
    pub(crate) ips: Vec<IpAddr>,
    /// Held for its drop: the nodes are stopped and deleted with the cluster.
    _nodes: FakeNodes,
}

impl FakeCluster {
    pub(crate) async fn start(prefix: &str, lasts: &[u8], clique: &str) -> Self {
        require(&["DOMAIND_E2E_KUBE_DIR"]);
        assert!(
            nix::unistd::geteuid().is_root(),
            "the kubelets of ../shared/kube need root"
        );
        let client = Client::try_default().await.unwrap();
        let kube_dir = PathBuf::from(std::env::var("DOMAIND_E2E_KUBE_DIR").unwrap());
        let names: Vec<String> = (1..=lasts.len()).map(|i| format!("{prefix}-{i}")).collect();
        let ips: Vec<IpAddr> = lasts
            .iter()
            .map(|i| IpAddr::from([127, 0, 0, *i]))
            .collect();
        let nodes = FakeNodes::start(&kube_dir, &names, &ips, clique);
        Self {
            client,
            names,
            ips,
            _nodes: nodes,
        }
    }
}

/// The kube scripts' state prefix: where each node's kubelet root lives.
pub(crate) fn kube_state_dir() -> PathBuf {
    std::env::var_os("KV")
        .map(PathBuf::from)
        .unwrap_or_else(|| std::env::temp_dir().join("domaind-kube"))
}

/// A GB200 node's four GPUs, as GPU feature discovery would advertise them: the blog's
/// pods ask for all four.
pub(crate) async fn advertise_gpus(client: &Client, node: &str, gpus: u32) {
    // Allocatable too: the scheduler places by allocatable, which the kubelet copies
    // from capacity only at its next status sync (10 s); with capacity alone every pod
    // waited for it ("Insufficient nvidia.com/gpu").
    let gpus = gpus.to_string();
    let patch = json!({"status": {
        "capacity": {"nvidia.com/gpu": gpus},
        "allocatable": {"nvidia.com/gpu": gpus},
    }});
    Api::<Node>::all(client.clone())
        .patch_status(node, &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .unwrap();
}

/// The pods of `selector`, as (name, node, phase).
pub(crate) async fn pods_of(pods: &Api<Pod>, selector: &str) -> Vec<(String, String, String)> {
    pods.list(&ListParams::default().labels(selector))
        .await
        .unwrap()
        .items
        .into_iter()
        .map(|p| {
            let node = p.spec.as_ref().and_then(|s| s.node_name.clone());
            let phase = p.status.as_ref().and_then(|s| s.phase.clone());
            (
                p.name_any(),
                node.unwrap_or_default(),
                phase.unwrap_or_default(),
            )
        })
        .collect()
}

pub(crate) async fn wait_running(pods: &Api<Pod>, selector: &str, count: usize, per_node: usize) {
    wait_every(
        &format!("{count} pods of {selector} Running, {per_node} per node"),
        Duration::from_millis(50),
        || async {
            let seen = pods_of(pods, selector).await;
            let running: Vec<_> = seen.iter().filter(|(_, _, p)| p == "Running").collect();
            let mut nodes: Vec<&String> = running.iter().map(|(_, n, _)| n).collect();
            nodes.sort();
            let most = nodes
                .chunk_by(|a, b| a == b)
                .map(<[_]>::len)
                .max()
                .unwrap_or(0);
            (running.len() == count && most == per_node, seen)
        },
    )
    .await;
}

async fn wait_cd(cds: &Api<ComputeDomain>, what: &str, want: impl Fn(&Value) -> bool) -> Value {
    wait_every(what, Duration::from_millis(50), || async {
        let status = cds
            .get_opt(CD_NAME)
            .await
            .unwrap()
            .and_then(|cd| cd.status)
            .map(|s| serde_json::to_value(s).unwrap())
            .unwrap_or(Value::Null);
        (want(&status), status)
    })
    .await
}

fn ready(total: u64) -> impl Fn(&Value) -> bool {
    move |s: &Value| {
        s["status"] == "Ready"
            && s["readyNodes"] == json!(total)
            && s["nodes"]
                .as_array()
                .is_some_and(|n| n.len() as u64 == total)
    }
}

/// A ComputeDomain of `num_nodes` whose template is `<name>-rct`.
pub(crate) fn compute_domain_of(name: &str, num_nodes: u32) -> Value {
    json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": name},
        "spec": {
            "numNodes": num_nodes,
            "channel": {"resourceClaimTemplate": {"name": format!("{name}-rct")}},
        },
    })
}

/// A Deployment `job` of `replicas` pods, one per node labelled with `clique`, each
/// holding a claim from `template`. No GPUs asked, so that no other test's pods (which
/// ask for GPUs) land on these nodes, nor these on theirs.
pub(crate) fn spread_workload(job: &str, template: &str, clique: &str, replicas: u32) -> Value {
    json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": {"name": job},
        "spec": {
            "replicas": replicas,
            "selector": {"matchLabels": {"job": job}},
            "template": {
                "metadata": {"labels": {"job": job}},
                "spec": {
                    "resourceClaims": [{"name": "cd", "resourceClaimTemplateName": template}],
                    "nodeSelector": {CLIQUE_LABEL: clique},
                    "affinity": {"podAntiAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": [{
                        "labelSelector": {"matchLabels": {"job": job}},
                        "topologyKey": "kubernetes.io/hostname",
                    }]}},
                    "containers": [{
                        "name": "ctr",
                        "image": "ubuntu:22.04",
                        "command": ["sleep", "infinity"],
                        "resources": {"claims": [{"name": "cd"}]},
                    }],
                },
            },
        },
    })
}

/// Files in a node's CDI directory: one spec per prepared claim.
pub(crate) fn cdi_specs(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|entries| {
            entries
                .filter_map(Result::ok)
                .map(|e| e.file_name().to_string_lossy().into_owned())
                .collect()
        })
        .unwrap_or_default()
}

pub(crate) async fn create_from_yaml(client: &Client, namespace: &str, document: &Value) {
    let params = PostParams::default();
    match document["kind"].as_str() {
        Some("ComputeDomain") => {
            let cd: ComputeDomain = serde_json::from_value(document.clone()).unwrap();
            Api::<ComputeDomain>::namespaced(client.clone(), namespace)
                .create(&params, &cd)
                .await
                .unwrap();
        }
        Some("Deployment") => {
            let deployment: Deployment = serde_json::from_value(document.clone()).unwrap();
            Api::<Deployment>::namespaced(client.clone(), namespace)
                .create(&params, &deployment)
                .await
                .unwrap();
        }
        other => panic!("unexpected kind {other:?}"),
    }
}

/// Issue 28's "done when", on real kubelets: SIGKILL node `victim`'s daemon (its IMEX
/// runner keeps IMEX), wait until every survivor holds it, start it again, wait until
/// the survivors take it back; meanwhile nothing a job depends on changed.
/// Returns how long the restarted daemon took to be taken back: from its start until it
/// serves (Ready) and no survivor holds it any more.
async fn daemon_kill_is_felt_by_no_job(
    client: &Client,
    namespace: &str,
    cds: &Api<ComputeDomain>,
    rack: &mut LocalRack,
    cd_uid: &str,
    victim: usize,
) -> Duration {
    use domaind_testbed::rack::{http_get, node_view};

    let nodes = rack.nodes().len();
    let survivors: Vec<usize> = (0..nodes).filter(|i| *i != victim).collect();
    let mut imports = Vec::new();
    for node in 0..nodes {
        imports.push(rack.import(node).await.unwrap());
    }
    let imex = tokio::task::block_in_place(|| rack.imex_daemons()).unwrap();
    let ready_condition = async || {
        let status = cds.get(CD_NAME).await.unwrap().status.unwrap();
        let ready = status.condition(READY_CONDITION).cloned();
        (status.status, ready)
    };
    let condition = ready_condition().await;
    assert_eq!(condition.0, CrdPhase::Ready, "{condition:?}");
    let survivor_imex = async |rack: &LocalRack| -> Vec<String> {
        let mut lines = Vec::new();
        for i in &survivors {
            let addr = rack.node(*i).info().unwrap().http_addr;
            let (_, metrics) = http_get(addr, "/metrics").await.unwrap();
            lines.extend(
                metrics
                    .lines()
                    .filter(|l| {
                        l.starts_with("domaind_imex_starts_total")
                            || l.starts_with("domaind_imex_reloads")
                    })
                    .map(|l| format!("{i}: {l}")),
            );
        }
        // The exporter's order is its own.
        lines.sort();
        lines
    };
    let before = survivor_imex(rack).await;
    let held_by_all = async |rack: &LocalRack, want: bool| {
        let mut seen = Vec::new();
        for i in &survivors {
            let view = node_view(rack.node(*i).info().unwrap()).await.unwrap();
            let domain = view.domains.first();
            seen.push((
                domain.map(|d| d.held.clone()).unwrap_or_default(),
                domain.map(|d| format!("{:?} {}/{}", d.phase, d.ready, d.total)),
            ));
        }
        let victim = rack.node(victim).name().to_owned();
        let done = seen.iter().all(|(held, _)| held.contains(&victim) == want);
        (done, seen)
    };

    rack.kill(victim).unwrap();
    wait_for(
        "every survivor holds the node whose daemon died",
        || async { held_by_all(rack, true).await },
    )
    .await;
    let restarted = Instant::now();
    rack.start(victim).unwrap();
    tokio::task::block_in_place(|| rack.wait_ready(victim, domaind_e2e::cluster::LIMIT)).unwrap();
    // Polled often: this is the rejoin figure.
    wait_every(
        "every survivor takes the node back",
        Duration::from_millis(10),
        || async { held_by_all(rack, false).await },
    )
    .await;
    let rejoin = restarted.elapsed();

    let after = tokio::task::block_in_place(|| rack.imex_daemons()).unwrap();
    assert_eq!(after[victim], imex[victim], "the same IMEX process");
    assert_eq!(rack.broken_imports(&imports).await, vec![]);
    assert_eq!(ready_condition().await, condition, "Ready throughout");
    assert_eq!(
        survivor_imex(rack).await,
        before,
        "no survivor's IMEX changed"
    );
    let events = Api::<k8s_openapi::api::core::v1::Event>::namespaced(client.clone(), namespace);
    let told: Vec<_> = events
        .list(&ListParams::default())
        .await
        .unwrap()
        .items
        .into_iter()
        .filter(|e| e.involved_object.uid.as_deref() == Some(cd_uid))
        .filter(|e| e.reason.as_deref() == Some("NodeLost"))
        .map(|e| e.message)
        .collect();
    assert_eq!(
        told,
        Vec::<Option<String>>::new(),
        "no NodeLost for a daemon restart"
    );
    rejoin
}

/// A `domaind run --backend kube` per node, serving its kubelet's plugin directories,
/// with the chart's ServiceAccount tokens where the environment gives them.
pub(crate) async fn start_daemons(
    client: &Client,
    names: &[String],
    ips: &[IpAddr],
    dir: &Path,
    pod_prefix: &str,
) -> (LocalRack, Option<domaind_e2e::tokens::NodeTokens>) {
    start_daemons_with(client, names, ips, dir, pod_prefix, &[]).await
}

/// [`start_daemons`], each daemon given `extra_args` too.
pub(crate) async fn start_daemons_with(
    client: &Client,
    names: &[String],
    ips: &[IpAddr],
    dir: &Path,
    pod_prefix: &str,
    extra_args: &[&str],
) -> (LocalRack, Option<domaind_e2e::tokens::NodeTokens>) {
    let state = kube_state_dir();
    let mut spec = RackSpec::self_contained(
        names.len(),
        domaind_e2e::binaries().domaind.clone(),
        dir.join("rack"),
    );
    spec.names = Some(names.to_vec());
    spec.ips = Some(ips.to_vec());
    spec.backend = RackBackend::Kube;
    spec.kubelet_dirs = Some(names.iter().map(|n| state.join("nodes").join(n)).collect());
    // As the chart installs it.
    spec.imex_runner = true;
    spec.extra_args
        .extend(extra_args.iter().map(|a| (*a).to_owned()));
    let tokens = node_tokens_for_rack(
        &mut spec.node_env,
        client,
        names,
        dir,
        &format!("{pod_prefix}-{}", std::process::id()),
    )
    .await;
    let mut rack = LocalRack::create(spec).unwrap();
    rack.start_all().unwrap();
    tokio::task::block_in_place(|| rack.wait_all_ready(domaind_e2e::cluster::LIMIT)).unwrap();
    (rack, tokens)
}

/// The kubelet registered each daemon through its plugin watcher, and each daemon
/// published its node's channels.
pub(crate) async fn wait_registered(client: &Client, names: &[String], rack: &LocalRack) {
    let slices = Api::<ResourceSlice>::all(client.clone());
    wait_for("every node's ResourceSlice is published", || async {
        let list = slices.list(&ListParams::default()).await.unwrap();
        let pools: Vec<String> = list
            .items
            .iter()
            .filter(|s| s.spec.driver == DRIVER)
            .filter_map(|s| s.spec.node_name.clone())
            .collect();
        (names.iter().all(|n| pools.contains(n)), pools)
    })
    .await;
    for node in rack.nodes() {
        let http = node.info().unwrap().http_addr;
        wait_for("the kubelet registered the plugin", || async move {
            let (_, metrics) = domaind_testbed::rack::http_get(http, "/metrics")
                .await
                .unwrap_or_default();
            let registered = metrics.lines().any(|l| {
                l.starts_with("domaind_kubelet_registrations_total{outcome=\"registered\"}")
            });
            (registered, ())
        })
        .await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster with real kubelets, as root: KUBECONFIG and DOMAIND_E2E_KUBE_DIR (../shared/kube; docs/TESTING.md)"]
async fn nvidias_blog_workload_runs_on_real_kubelets() {
    require(&["DOMAIND_E2E_KUBE_DIR"]);
    assert!(
        nix::unistd::geteuid().is_root(),
        "the kubelets of ../shared/kube need root"
    );
    let client = Client::try_default().await.unwrap();
    let kube_dir = PathBuf::from(std::env::var("DOMAIND_E2E_KUBE_DIR").unwrap());
    let names = env_list("DOMAIND_E2E_KUBELET_NODES")
        .unwrap_or_else(|| (1..=3).map(|i| format!("domaind-kubelet-{i}")).collect());
    let ips: Vec<IpAddr> = env_list("DOMAIND_E2E_KUBELET_IPS")
        .map(|ips| ips.iter().map(|ip| ip.parse().unwrap()).collect())
        .unwrap_or_else(|| {
            domaind_loopback::kubelets::BLOG
                .iter()
                .map(|i| IpAddr::from([127, 0, 0, *i]))
                .collect()
        });
    assert_eq!((names.len(), ips.len()), (3, 3), "three nodes");

    // 1. Nodes, the CRD, the controller and the daemons.
    let _nodes = FakeNodes::start(&kube_dir, &names, &ips, "e2e-cluster.1");
    for name in &names {
        advertise_gpus(&client, name, 4).await;
    }
    install_crd_and_device_classes(&client).await;
    let namespace = format!("domaind-kubelet-e2e-{}", std::process::id());
    let _cleared_on_panic = create_namespace(&client, &namespace).await;

    let tmp = short_temp_dir("dmkl").unwrap();
    let controller = spawn_controller(&domaind_e2e::binaries().domaind, &namespace, tmp.path());

    let (mut rack, _tokens) = start_daemons(&client, &names, &ips, tmp.path(), "kubelet-e2e").await;
    wait_registered(&client, &names, &rack).await;

    // 2. NVIDIA's blog: the ComputeDomain, then the Deployment.
    let blog = documents(&repo_file("tests/fixtures/nvidia-blog-workload.yaml"));
    let cds = Api::<ComputeDomain>::namespaced(client.clone(), &namespace);
    let pods = Api::<Pod>::namespaced(client.clone(), &namespace);
    let deployments = Api::<Deployment>::namespaced(client.clone(), &namespace);
    let templates = Api::<ResourceClaimTemplate>::namespaced(client.clone(), &namespace);
    create_from_yaml(&client, &namespace, &blog[0]).await;
    wait_for("the controller creates the template", || async {
        let t = templates.get_opt(TEMPLATE_NAME).await.unwrap();
        (t.is_some(), ())
    })
    .await;
    let created = Instant::now();
    create_from_yaml(&client, &namespace, &blog[1]).await;
    wait_running(&pods, "job=ex1", 3, 1).await;
    let running = created.elapsed();
    let status = wait_cd(&cds, "the ComputeDomain is Ready 3/3", ready(3)).await;
    let formed = created.elapsed();
    eprintln!(
        "FIGURE real kubelets, 3 nodes: Deployment created -> 3 pods Running {} ms, -> ComputeDomain Ready 3/3 {} ms",
        running.as_millis(),
        formed.as_millis()
    );
    let mut listed: Vec<&str> = status["nodes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|n| n["name"].as_str().unwrap())
        .collect();
    listed.sort_unstable();
    assert_eq!(listed, names.iter().map(String::as_str).collect::<Vec<_>>());

    // 3. The daemon alone dies, and comes back: no job feels it. As often as asked, for
    // the rejoin's distribution.
    let cd_uid = cds.get(CD_NAME).await.unwrap().uid().unwrap();
    let restarts: usize = std::env::var("DOMAIND_E2E_KUBELET_RESTARTS").map_or(1, |n| {
        n.parse().expect("DOMAIND_E2E_KUBELET_RESTARTS: a count")
    });
    let mut rejoins = Vec::new();
    for restart in 1..=restarts {
        let rejoin =
            daemon_kill_is_felt_by_no_job(&client, &namespace, &cds, &mut rack, &cd_uid, 2).await;
        eprintln!(
            "FIGURE real kubelets, daemon restart {restart}/{restarts}: started -> taken back by every survivor {} ms",
            rejoin.as_millis()
        );
        rejoins.push(rejoin);
    }
    rejoins.sort_unstable();
    let at = |q: f64| rejoins[((rejoins.len() - 1) as f64 * q).ceil() as usize].as_millis();
    eprintln!(
        "FIGURE real kubelets, {restarts} daemon restarts: rejoin p50 {} ms, p90 {} ms, p99 {} ms, max {} ms",
        at(0.5),
        at(0.9),
        at(0.99),
        at(1.0)
    );

    // The node dies, daemon and IMEX: NotReady and NodeLost; it comes back: Ready.
    let lost = names[2].clone();
    rack.kill_node(2).unwrap();
    wait_cd(&cds, "the ComputeDomain goes NotReady", |s| {
        s["status"] == "NotReady"
            && s["nodes"].as_array().is_some_and(|n| {
                n.iter()
                    .any(|n| n["name"] == lost.as_str() && n["status"] == "NotReady")
            })
    })
    .await;
    wait_node_lost_event(&client, &namespace, &cd_uid, &lost).await;
    // A restarted node must never write a status with fewer nodes while the others are
    // alive: every status seen until Ready again lists all three.
    rack.start(2).unwrap();
    let fewest = std::cell::Cell::new(3);
    wait_cd(&cds, "the ComputeDomain is Ready 3/3 again", |s| {
        fewest.set(fewest.get().min(s["nodes"].as_array().map_or(0, Vec::len)));
        ready(3)(s)
    })
    .await;
    assert_eq!(
        fewest.get(),
        3,
        "a status with fewer nodes was written during the restart"
    );

    // 4. Two pods per node: NVIDIA's driver allows one.
    deployments
        .delete("example-mnnvl-workload", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("the blog's pods are gone", || async {
        let left = pods_of(&pods, "job=ex1").await;
        (left.is_empty(), left)
    })
    .await;
    let mut two_per_node = blog[1].clone();
    two_per_node["metadata"]["name"] = json!("two-per-node");
    two_per_node["spec"]["replicas"] = json!(6);
    two_per_node["spec"]["selector"]["matchLabels"] = json!({"job": "ex2"});
    two_per_node["spec"]["template"]["metadata"]["labels"] = json!({"job": "ex2"});
    let pod_spec = &mut two_per_node["spec"]["template"]["spec"];
    pod_spec["affinity"]["podAffinity"]["requiredDuringSchedulingIgnoredDuringExecution"][0]["labelSelector"]
        ["matchExpressions"][0]["values"] = json!(["ex2"]);
    pod_spec["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = json!(2);
    create_from_yaml(&client, &namespace, &two_per_node).await;
    wait_running(&pods, "job=ex2", 6, 2).await;
    wait_cd(&cds, "Ready 3/3 with two pods per node", ready(3)).await;
    for node in rack.nodes() {
        let specs = cdi_specs(&node.cdi_dir());
        assert_eq!(
            specs.len(),
            2,
            "{}: one CDI spec per claim: {specs:?}",
            node.name()
        );
    }

    // 5. Teardown: pods, claims, ComputeDomain.
    deployments
        .delete("two-per-node", &DeleteParams::default())
        .await
        .unwrap();
    let claims = Api::<ResourceClaim>::namespaced(client.clone(), &namespace);
    wait_for("every claim unprepared and gone", || async {
        let left = pods_of(&pods, "job=ex2").await;
        let claims_left = claims
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .len();
        let specs: Vec<Vec<String>> = rack
            .nodes()
            .iter()
            .map(|n| cdi_specs(&n.cdi_dir()))
            .collect();
        (
            left.is_empty() && claims_left == 0 && specs.iter().all(Vec::is_empty),
            (left, claims_left, specs),
        )
    })
    .await;
    // The workload is gone: the status says so (NotReady, no nodes), not Ready 3/3.
    wait_cd(&cds, "the status is vacated once the workload left", |s| {
        s["status"] == "NotReady" && s["nodes"].as_array().is_none_or(Vec::is_empty)
    })
    .await;
    cds.delete(CD_NAME, &DeleteParams::default()).await.unwrap();
    wait_for("the ComputeDomain and its template are gone", || async {
        let cd = cds.get_opt(CD_NAME).await.unwrap();
        let template = templates.get_opt(TEMPLATE_NAME).await.unwrap();
        (
            cd.is_none() && template.is_none(),
            (cd.map(|c| c.metadata.finalizers), template.is_some()),
        )
    })
    .await;

    rack.stop_all(Duration::from_secs(20));
    assert!(rack.unexpected_exits().is_empty());
    drop(controller);
    if std::env::var("DOMAIND_E2E_KEEP").as_deref() == Ok("1") {
        eprintln!(
            "kept: the daemons' and controller's files in {}",
            tmp.keep().display()
        );
    } else {
        Api::<Namespace>::all(client.clone())
            .delete(&namespace, &DeleteParams::default())
            .await
            .unwrap();
    }
}
