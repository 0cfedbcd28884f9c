//! Gossip node certificates issued by the cluster, on the real API server: the
//! controller's signer and the node's CSR client (`domaind_node::certs`), with tokens
//! the API server mints as it does for pods.
//!
//! A Node object `c-node-<pid>` and pods bound to it stand in for a node daemon's pod
//! (no kubelet is needed: the API server fills `spec.extra` from the pod the token is
//! bound to). It shows:
//! - a token bound to a pod on node N gets a certificate naming N, chaining to the CA
//!   the controller publishes in its ConfigMap (gossip's own loader checks both);
//! - a CSR naming another node is denied `NameMismatch`, with a Warning event;
//! - a token not bound to a pod is denied `NotBoundToNode`;
//! - another ServiceAccount's pod on the node is denied `NotNodeDaemon`;
//! - a `domaind run --tls-mode csr` with the pod-bound token waits (with `/readyz`
//!   saying why) until the signer runs, then gets its certificate and is ready.
//!
//! In CI (`DOMAIND_E2E_CONTROLLER_KUBECONFIG`, `DOMAIND_E2E_NODE_KUBECONFIG`) the
//! controller runs with the chart's RBAC and the node daemon's ServiceAccount is the
//! chart's; otherwise the test makes a ServiceAccount and the CSR rule itself.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use domaind_gossip::NodeName;
use domaind_gossip::tls::{NodeTls, TlsPaths};
use domaind_kube_api::names::{
    GOSSIP_CA_BUNDLE, GOSSIP_CA_BUNDLE_KEY, GOSSIP_CA_SECRET, NODE_NAME_EXTRA,
};
use domaind_loopback::{E2E_CERTS, addr};
use domaind_node::certs::kube::{KubeSigner, csr_object};
use domaind_node::certs::{self, CertClient};
use domaind_testbed::rack::{LocalRack, RackSpec, short_temp_dir};
use k8s_openapi::api::authentication::v1::{SelfSubjectReview, TokenRequest};
use k8s_openapi::api::certificates::v1::CertificateSigningRequest;
use k8s_openapi::api::core::v1::{ConfigMap, Node, Pod, Secret, ServiceAccount};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::ClusterRoleBinding;
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, ResourceExt};
use rcgen::KeyPair;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use domaind_e2e::cluster::{
    LIMIT, create_namespace, kubeconfig_for, require, spawn_controller_with, wait_for,
};

/// Who the signer treats as the node daemon, and where its CA lives.
struct Setup {
    /// The node daemon ServiceAccount's namespace; the test's pods go there too.
    namespace: String,
    node_sa: String,
    /// Whether the namespace and the CSR rule are the test's own, to delete.
    own: bool,
}

async fn whoami(client: &Client) -> (String, BTreeMap<String, Vec<String>>) {
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .unwrap();
    let user = review.status.unwrap().user_info.unwrap();
    (
        user.username.unwrap_or_default(),
        user.extra.unwrap_or_default(),
    )
}

async fn client_from_file(path: &str) -> Client {
    let config = kube::Config::from_custom_kubeconfig(
        Kubeconfig::read_from(path).unwrap(),
        &KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    Client::try_from(config).unwrap()
}

/// A client of the API server `KUBECONFIG` names, authenticated by `token` alone.
async fn client_with_token(token: &str) -> Client {
    let mut config = kube::Config::infer().await.unwrap();
    config.auth_info = serde_json::from_value(json!({ "token": token })).unwrap();
    Client::try_from(config).unwrap()
}

/// A token of `sa`, bound to `pod` when given (as a pod's projected token is).
async fn token(client: &Client, namespace: &str, sa: &str, pod: Option<&Pod>) -> String {
    let bound = pod.map(
        |pod| json!({"kind": "Pod", "apiVersion": "v1", "name": pod.name_any(), "uid": pod.uid()}),
    );
    let request: TokenRequest = serde_json::from_value(json!({
        "spec": {"audiences": [], "expirationSeconds": 600, "boundObjectRef": bound}
    }))
    .unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create_token_request(sa, &PostParams::default(), &request)
        .await
        .unwrap()
        .status
        .unwrap()
        .token
}

async fn pod_on(client: &Client, namespace: &str, name: &str, sa: &str, node: &str) -> Pod {
    let pod: Pod = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"nodeName": node, "serviceAccountName": sa,
                 "containers": [{"name": "c", "image": "none"}]},
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap()
}

async fn service_account(client: &Client, namespace: &str, name: &str) {
    let sa: ServiceAccount = serde_json::from_value(json!({"metadata": {"name": name}})).unwrap();
    Api::<ServiceAccount>::namespaced(client.clone(), namespace)
        .create(&PostParams::default(), &sa)
        .await
        .unwrap();
}

/// Submits a CSR as `client` and waits for the signer's `Denied` condition: its reason.
async fn denial(
    admin: &Client,
    client: &Client,
    name_in_csr: &str,
    node_for_name: &str,
) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let pem = certs::request_for(name_in_csr, &certs::ImexNames::default(), &key).unwrap();
    let created = Api::<CertificateSigningRequest>::all(client.clone())
        .create(
            &PostParams::default(),
            &csr_object(node_for_name, &pem, Duration::from_secs(3600)),
        )
        .await
        .unwrap();
    let name = created.name_any();
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let reason = wait_for(&format!("the signer decides CSR {name}"), || async {
        let csr = csrs.get(&name).await.unwrap();
        let conditions = csr.status.and_then(|s| s.conditions).unwrap_or_default();
        let denied = conditions
            .iter()
            .find(|c| c.type_ == "Denied")
            .and_then(|c| c.reason.clone());
        (
            denied.is_some() || !conditions.is_empty(),
            (denied, conditions),
        )
    })
    .await;
    let (Some(reason), conditions) = reason else {
        panic!("CSR {name} was not denied: {:?}", reason.1);
    };
    assert!(
        !conditions.iter().any(|c| c.type_ == "Approved"),
        "{conditions:?}"
    );
    (name, reason)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG of a real API server (../shared/kube; docs/TESTING.md)"]
async fn nodes_get_certificates_for_their_own_node_only() {
    require(&[]);
    let admin = Client::try_default().await.unwrap();
    let pid = std::process::id();
    let tmp = tempfile::tempdir().unwrap();

    // Who is the node daemon: the chart's ServiceAccount in CI, else one of ours.
    let controller_kubeconfig = kubeconfig_for("DOMAIND_E2E_CONTROLLER_KUBECONFIG");
    let setup = match std::env::var("DOMAIND_E2E_NODE_KUBECONFIG") {
        Ok(path) if !controller_kubeconfig.is_empty() => {
            let (user, _) = whoami(&client_from_file(&path).await).await;
            let parts: Vec<&str> = user.split(':').collect();
            assert_eq!(
                parts.len(),
                4,
                "the node kubeconfig is a ServiceAccount's: {user}"
            );
            Setup {
                namespace: parts[2].into(),
                node_sa: parts[3].into(),
                own: false,
            }
        }
        _ => {
            let namespace = format!("c-certs-{pid}");
            // Only ServiceAccounts go in it, which hold no device: nothing to clear
            // should the test panic.
            drop(create_namespace(&admin, &namespace).await);
            service_account(&admin, &namespace, "c-node").await;
            Setup {
                namespace,
                node_sa: "c-node".into(),
                own: true,
            }
        }
    };
    let ns = setup.namespace.as_str();
    let other_sa = format!("c-other-{pid}");
    service_account(&admin, ns, &other_sa).await;
    // Kubernetes' own role for CSR clients (create, get, list, watch): for the other
    // ServiceAccount, and for ours outside CI (in CI the chart's rule covers it).
    let mut subjects = vec![json!({"kind": "ServiceAccount", "name": other_sa, "namespace": ns})];
    if setup.own {
        subjects.push(json!({"kind": "ServiceAccount", "name": setup.node_sa, "namespace": ns}));
    }
    let binding: ClusterRoleBinding = serde_json::from_value(json!({
        "metadata": {"name": format!("c-certs-{pid}")},
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "system:node-bootstrapper"},
        "subjects": subjects,
    }))
    .unwrap();
    Api::<ClusterRoleBinding>::all(admin.clone())
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();

    // A node, and the node daemon's pod on it.
    let node = format!("c-node-{pid}");
    let node_object: Node = serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
    Api::<Node>::all(admin.clone())
        .create(&PostParams::default(), &node_object)
        .await
        .unwrap();
    let daemon_pod = pod_on(
        &admin,
        ns,
        &format!("c-daemon-{pid}"),
        &setup.node_sa,
        &node,
    )
    .await;
    let bound =
        client_with_token(&token(&admin, ns, &setup.node_sa, Some(&daemon_pod)).await).await;
    let (user, extra) = whoami(&bound).await;
    assert_eq!(
        user,
        format!("system:serviceaccount:{ns}:{}", setup.node_sa)
    );
    assert_eq!(
        extra.get(NODE_NAME_EXTRA),
        Some(&vec![node.clone()]),
        "the pod-bound token names the node: {extra:?}"
    );

    // (e, first half) A node daemon in csr mode with that token, before any signer
    // runs: it waits, /healthz answers and /readyz says why it is not ready.
    let bundle_file = tmp.path().join("bundle").join("ca.crt");
    let kubeconfig = tmp.path().join("bound.kubeconfig");
    write_token_kubeconfig(
        &kubeconfig,
        &token(&admin, ns, &setup.node_sa, Some(&daemon_pod)).await,
    );
    let rack_root = short_temp_dir("cert").unwrap();
    let mut spec = RackSpec::self_contained(
        1,
        domaind_e2e::binaries().domaind.clone(),
        rack_root.path().join("rack"),
    );
    spec.names = Some(vec![node.clone()]);
    spec.ips = Some(vec![IpAddr::from(addr(E2E_CERTS, 1))]);
    spec.env = vec![
        ("KUBECONFIG".into(), kubeconfig.display().to_string()),
        ("NO_COLOR".into(), "1".into()),
    ];
    spec.extra_args = [
        "--tls-mode",
        "csr",
        "--tls-ca-file",
        &bundle_file.display().to_string(),
        "--csr-lifetime",
        "1h",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let mut rack = LocalRack::create(spec).unwrap();
    // The rack's own development certificate is not what this daemon may use.
    let daemon_tls = rack.node(0).dir().join("tls");
    std::fs::remove_file(daemon_tls.join("tls.crt")).unwrap();
    std::fs::remove_file(daemon_tls.join("tls.key")).unwrap();
    rack.start(0).unwrap();
    let log = rack.node(0).log_path();
    let interim = wait_for("the daemon serves /readyz while it waits", || async {
        let text = std::fs::read_to_string(&log).unwrap_or_default();
        let addr = text
            .lines()
            .find(|l| l.contains("waiting for this node's gossip certificate"))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("http=")))
            .map(str::to_string);
        (addr.is_some(), addr.unwrap_or(text))
    })
    .await;
    let (code, body) = http_get(&interim, "/readyz");
    assert_eq!(code, 503, "{body}");
    assert!(body.contains("no gossip certificate"), "{body}");
    assert_eq!(http_get(&interim, "/healthz").0, 200);

    // The signer, with --leader-elect=false: another test's controller may hold the
    // chart's Lease.
    let args: Vec<String> = [
        "--leader-elect=false",
        "--node-service-account",
        &setup.node_sa,
        "--node-service-account-namespace",
        ns,
        "--gossip-ca-namespace",
        ns,
        "--node-cert-lifetime",
        "2h",
    ]
    .iter()
    .map(|a| a.to_string())
    .collect();
    let controller = spawn_controller_with(
        &domaind_e2e::binaries().domaind,
        &args,
        controller_kubeconfig,
        tmp.path(),
        "controller",
    );

    // (a) The node's CSR client gets a certificate for its node.
    let signer = KubeSigner::new(bound.clone(), Duration::from_secs(10), LIMIT);
    let (mut client, _state) = CertClient::new(
        &node,
        &tmp.path().join("tls"),
        Duration::from_secs(3600),
        Arc::new(signer),
        certs::system_clock(),
        certs::retry_backoff(),
    );
    let issued = tokio::time::timeout(LIMIT, client.first(&CancellationToken::new()))
        .await
        .unwrap_or_else(|_| {
            panic!(
                "no certificate within {LIMIT:?}; see {}",
                tmp.path().display()
            )
        })
        .unwrap();
    let lifetime = issued.not_after.duration_since(issued.not_before).unwrap();
    assert_eq!(
        lifetime,
        Duration::from_secs(3600 + 300),
        "asked 1h, backdated 5 min"
    );

    // The bundle the nodes mount is the CA's certificate, and the certificate chains to
    // it and names the node: gossip's own loader says so.
    let secret = Api::<Secret>::namespaced(admin.clone(), ns)
        .get(GOSSIP_CA_SECRET)
        .await
        .unwrap();
    assert_eq!(secret.type_.as_deref(), Some("kubernetes.io/tls"));
    let ca_cert = secret.data.unwrap()["tls.crt"].0.clone();
    let bundle = wait_for("the controller publishes the CA bundle", || async {
        let cm = Api::<ConfigMap>::namespaced(admin.clone(), ns)
            .get_opt(GOSSIP_CA_BUNDLE)
            .await
            .unwrap();
        let ca = cm
            .and_then(|cm| cm.data)
            .and_then(|d| d.get(GOSSIP_CA_BUNDLE_KEY).cloned());
        (ca.is_some(), ca)
    })
    .await
    .unwrap();
    assert_eq!(
        bundle.as_bytes(),
        ca_cert.as_slice(),
        "the bundle is the CA certificate"
    );
    assert!(!bundle.contains("PRIVATE KEY"));
    let ca_file = tmp.path().join("ca.crt");
    std::fs::write(&ca_file, &bundle).unwrap();
    let paths = TlsPaths {
        ca_cert: ca_file,
        cert: client.cert_path(),
        key: client.key_path(),
    };
    let tls = NodeTls::load(paths, NodeName::new(&node).unwrap()).unwrap();
    assert_eq!(tls.node().as_str(), node);

    // (b) A CSR naming another node: denied, with a Warning event on it.
    let (csr, reason) = denial(&admin, &bound, "c-elsewhere", &node).await;
    assert_eq!(reason, "NameMismatch");
    let events = Api::<Event>::namespaced(admin.clone(), "default");
    wait_for("a Warning event on the denied CSR", || async {
        let list = events.list(&Default::default()).await.unwrap();
        let found = list.items.iter().any(|e| {
            e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(csr.as_str())
                && e.reason.as_deref() == Some("NameMismatch")
                && e.type_.as_deref() == Some("Warning")
        });
        (found, list.items.len())
    })
    .await;

    // (c) The node daemon's ServiceAccount with a token bound to no pod.
    let unbound = client_with_token(&token(&admin, ns, &setup.node_sa, None).await).await;
    assert!(!whoami(&unbound).await.1.contains_key(NODE_NAME_EXTRA));
    assert_eq!(
        denial(&admin, &unbound, &node, &node).await.1,
        "NotBoundToNode"
    );

    // (d) Another ServiceAccount's pod on the same node.
    let other_pod = pod_on(&admin, ns, &format!("c-other-{pid}"), &other_sa, &node).await;
    let other = client_with_token(&token(&admin, ns, &other_sa, Some(&other_pod)).await).await;
    assert_eq!(
        denial(&admin, &other, &node, &node).await.1,
        "NotNodeDaemon"
    );

    // (e, second half) The daemon got its certificate once the signer ran, and gossips
    // with it: ready, its files name its node and chain to the published CA.
    std::fs::create_dir_all(bundle_file.parent().unwrap()).unwrap();
    std::fs::write(&bundle_file, &bundle).unwrap();
    let info = tokio::task::block_in_place(|| rack.wait_ready(0, LIMIT)).unwrap();
    let daemon_paths = TlsPaths {
        ca_cert: bundle_file.clone(),
        cert: daemon_tls.join("tls.crt"),
        key: daemon_tls.join("tls.key"),
    };
    NodeTls::load(daemon_paths, NodeName::new(&node).unwrap()).unwrap();
    let (code, body) = http_get(&info.http_addr.to_string(), "/readyz");
    assert_eq!(code, 200, "{body}");
    drop(rack);

    drop(controller);
    cleanup(&admin, &setup, &node, pid, &[&daemon_pod, &other_pod]).await;
}

async fn cleanup(admin: &Client, setup: &Setup, node: &str, pid: u32, pods: &[&Pod]) {
    let ns = setup.namespace.as_str();
    let gone = DeleteParams::default();
    let csrs = Api::<CertificateSigningRequest>::all(admin.clone());
    let prefix = format!("domaind-gossip-{node}-");
    for csr in csrs.list(&Default::default()).await.unwrap() {
        if csr.name_any().starts_with(&prefix) {
            let _ = csrs.delete(&csr.name_any(), &gone).await;
        }
    }
    let _ = Api::<Node>::all(admin.clone()).delete(node, &gone).await;
    let _ = Api::<ClusterRoleBinding>::all(admin.clone())
        .delete(&format!("c-certs-{pid}"), &gone)
        .await;
    if setup.own {
        let _ = Api::<k8s_openapi::api::core::v1::Namespace>::all(admin.clone())
            .delete(ns, &gone)
            .await;
    } else {
        let pods_api = Api::<Pod>::namespaced(admin.clone(), ns);
        for pod in pods {
            let _ = pods_api
                .delete(&pod.name_any(), &DeleteParams::background().grace_period(0))
                .await;
        }
        let _ = Api::<ServiceAccount>::namespaced(admin.clone(), ns)
            .delete(&format!("c-other-{pid}"), &gone)
            .await;
    }
}

/// A kubeconfig for `KUBECONFIG`'s API server that authenticates with `token` alone.
fn write_token_kubeconfig(path: &std::path::Path, token: &str) {
    let admin = Kubeconfig::read().unwrap();
    let cluster = admin.clusters.first().expect("KUBECONFIG names a cluster");
    let config = json!({
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [serde_json::to_value(cluster).unwrap()],
        "users": [{"name": "bound", "user": {"token": token}}],
        "contexts": [{"name": "bound", "context": {"cluster": cluster.name, "user": "bound"}}],
        "current-context": "bound",
    });
    std::fs::write(path, serde_json::to_vec(&config).unwrap()).unwrap();
}

/// One plain HTTP/1.0 GET: the status code and the body.
fn http_get(addr: &str, path: &str) -> (u16, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10)))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let code = response
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = response
        .split("\r\n\r\n")
        .nth(1)
        .unwrap_or_default()
        .to_string();
    (code, body)
}
