//! Node daemons' credentials as a cluster gives them: a token of the node daemon's
//! ServiceAccount bound to a pod on the node the daemon stands for.
//!
//! The chart's admission policy (`node.admissionPolicy`) lets the node daemon's
//! ServiceAccount write only the slices and domain status of the node its token is bound
//! to, which the API server reads from a pod-bound token (the user's extra
//! `authentication.kubernetes.io/node-name`). In a cluster the kubelet mints that token
//! for the DaemonSet's pod. Here the daemons run outside any pod, so for each node
//! this makes what the kubelet's token stands on: a Pod of the ServiceAccount bound to
//! the node (the Node object made first if no kubelet has one), and a token bound to
//! that Pod. The Pods never run anything that matters: on a fake node the fake runtime
//! "runs" them, on a Node object without a kubelet they stay bound and unstarted; they
//! tolerate every taint, so an unreachable Node does not evict them (which would void
//! the tokens). Everything made is deleted when the [`NodeTokens`] is dropped.

use std::path::{Path, PathBuf};

use k8s_openapi::api::authentication::v1::{
    BoundObjectReference, SelfSubjectReview, TokenRequest, TokenRequestSpec,
};
use k8s_openapi::api::core::v1::{Node, Pod, ServiceAccount};
use kube::api::{Api, DeleteParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::{Client, Config, ResourceExt};
use serde_json::{Value, json};

/// The extra the API server derives from a pod-bound token: the pod's node.
pub const NODE_NAME_EXTRA: &str = "authentication.kubernetes.io/node-name";

/// A token's lifetime: longer than any test.
const TOKEN_SECONDS: i64 = 2 * 3600;

/// A ServiceAccount, from its user name `system:serviceaccount:<namespace>:<name>`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ServiceAccountRef {
    pub namespace: String,
    pub name: String,
}

impl ServiceAccountRef {
    pub fn from_username(username: &str) -> Option<Self> {
        let rest = username.strip_prefix("system:serviceaccount:")?;
        let (namespace, name) = rest.split_once(':')?;
        (!namespace.is_empty() && !name.is_empty() && !name.contains(':')).then(|| Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
        })
    }

    pub fn username(&self) -> String {
        format!("system:serviceaccount:{}:{}", self.namespace, self.name)
    }
}

/// A client that authenticates with the kubeconfig at `path`.
pub async fn client_from(path: &Path) -> Client {
    let kubeconfig =
        Kubeconfig::read_from(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    let config = Config::from_custom_kubeconfig(kubeconfig, &KubeConfigOptions::default())
        .await
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    Client::try_from(config).unwrap()
}

/// Who the API server says `client` is: user name and extra.
pub async fn whoami(client: &Client) -> (String, Value) {
    let review: SelfSubjectReview = serde_json::from_value(json!({
        "apiVersion": "authentication.k8s.io/v1",
        "kind": "SelfSubjectReview",
    }))
    .unwrap();
    let review = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap();
    let user = review.status.and_then(|s| s.user_info).unwrap_or_default();
    (
        user.username.unwrap_or_default(),
        serde_json::to_value(user.extra.unwrap_or_default()).unwrap(),
    )
}

/// The node name a client's token is bound to, if any.
pub async fn bound_node(client: &Client) -> Option<String> {
    let (_, extra) = whoami(client).await;
    match extra[NODE_NAME_EXTRA].as_array().map(Vec::as_slice) {
        Some([Value::String(node)]) => Some(node.clone()),
        _ => None,
    }
}

/// `template` (a kubeconfig) with `token` as its users' credential.
pub fn with_token(template: &Value, token: &str) -> Value {
    let mut kubeconfig = template.clone();
    for user in kubeconfig["users"].as_array_mut().into_iter().flatten() {
        user["user"] = json!({"token": token});
    }
    kubeconfig
}

/// Pods (and Node objects) bound to nodes, and a kubeconfig per node whose token is bound
/// to that node's pod; all deleted when dropped.
#[derive(Debug)]
pub struct NodeTokens {
    pub account: ServiceAccountRef,
    /// One per node, in the order asked for.
    pub kubeconfigs: Vec<PathBuf>,
    pods: Vec<String>,
    created_nodes: Vec<String>,
}

impl NodeTokens {
    /// For each of `nodes`, a kubeconfig in `dir` like the one at `template` (its server,
    /// CA and context) but with a token of `template`'s ServiceAccount bound to a pod on
    /// that node. `pod_prefix` names the pods (`<prefix>-<node>`); `client` (an
    /// administrator's) makes them. Panics if a token does not carry its node.
    pub async fn mint(
        client: &Client,
        template: &Path,
        nodes: &[String],
        dir: &Path,
        pod_prefix: &str,
    ) -> Self {
        let (username, _) = whoami(&client_from(template).await).await;
        let account = ServiceAccountRef::from_username(&username).unwrap_or_else(|| {
            panic!(
                "{} authenticates as {username}, not a ServiceAccount",
                template.display()
            )
        });
        let text = std::fs::read_to_string(template).unwrap();
        let template_doc: Value = serde_saphyr::from_str(&text).unwrap();
        let mut tokens = Self {
            account,
            kubeconfigs: Vec::new(),
            pods: Vec::new(),
            created_nodes: Vec::new(),
        };
        let node_api = Api::<Node>::all(client.clone());
        let pods = Api::<Pod>::namespaced(client.clone(), &tokens.account.namespace);
        let accounts = Api::<ServiceAccount>::namespaced(client.clone(), &tokens.account.namespace);
        for node in nodes {
            if node_api.get_opt(node).await.unwrap().is_none() {
                let object: Node =
                    serde_json::from_value(json!({"metadata": {"name": node}})).unwrap();
                node_api
                    .create(&PostParams::default(), &object)
                    .await
                    .unwrap();
                tokens.created_nodes.push(node.clone());
            }
            let pod_name = format!("{pod_prefix}-{node}");
            let pod: Pod = serde_json::from_value(json!({
                "metadata": {"name": pod_name},
                "spec": {
                    "nodeName": node,
                    "serviceAccountName": tokens.account.name,
                    "automountServiceAccountToken": false,
                    "terminationGracePeriodSeconds": 0,
                    "tolerations": [{"operator": "Exists"}],
                    "containers": [{"name": "token-holder", "image": "domaind-e2e.invalid/none"}],
                }
            }))
            .unwrap();
            let pod = pods.create(&PostParams::default(), &pod).await.unwrap();
            tokens.pods.push(pod_name.clone());
            let request = TokenRequest {
                spec: TokenRequestSpec {
                    // Empty: the API server's own audience.
                    audiences: Vec::new(),
                    bound_object_ref: Some(BoundObjectReference {
                        api_version: Some("v1".into()),
                        kind: Some("Pod".into()),
                        name: Some(pod_name.clone()),
                        uid: pod.uid(),
                    }),
                    expiration_seconds: Some(TOKEN_SECONDS),
                },
                ..TokenRequest::default()
            };
            let token = accounts
                .create_token_request(&tokens.account.name, &PostParams::default(), &request)
                .await
                .unwrap()
                .status
                .expect("a TokenRequest's answer has a status")
                .token;
            let path = dir.join(format!("node-{node}.kubeconfig"));
            write_private(&path, &with_token(&template_doc, &token));
            let seen = bound_node(&client_from(&path).await).await;
            assert_eq!(
                seen.as_deref(),
                Some(node.as_str()),
                "a token bound to pod {pod_name} on node {node} should carry {NODE_NAME_EXTRA}"
            );
            tokens.kubeconfigs.push(path);
        }
        tokens
    }

    /// Each node's `KUBECONFIG`, in the nodes' order: a rack's `RackSpec::node_env`.
    pub fn node_env(&self) -> Vec<Vec<(String, String)>> {
        self.kubeconfigs
            .iter()
            .map(|p| vec![("KUBECONFIG".to_owned(), p.display().to_string())])
            .collect()
    }
}

/// The node daemons' credentials for a test: with `DOMAIND_E2E_NODE_KUBECONFIG` (the
/// chart's node ServiceAccount, from `tests/e2e/sa-kubeconfigs.sh`), a pod-bound token
/// of it per node; without, `None`, and the daemons run as the test's own user.
pub async fn node_tokens_from_env(
    client: &Client,
    nodes: &[String],
    dir: &Path,
    pod_prefix: &str,
) -> Option<NodeTokens> {
    let template = PathBuf::from(std::env::var_os("DOMAIND_E2E_NODE_KUBECONFIG")?);
    Some(NodeTokens::mint(client, &template, nodes, dir, pod_prefix).await)
}

/// [`node_tokens_from_env`] for the nodes of a rack about to be created: each daemon
/// gets its own token through `node_env` (the rack spec's per-node environment; empty
/// without tokens). Keep what it returns for as long as the rack runs: the tokens'
/// pods are deleted with it.
pub async fn node_tokens_for_rack(
    node_env: &mut Vec<Vec<(String, String)>>,
    client: &Client,
    nodes: &[String],
    dir: &Path,
    pod_prefix: &str,
) -> Option<NodeTokens> {
    let tokens = node_tokens_from_env(client, nodes, dir, pod_prefix).await;
    *node_env = tokens
        .as_ref()
        .map(NodeTokens::node_env)
        .unwrap_or_default();
    tokens
}

/// A kubeconfig holds a token: readable by its owner only.
fn write_private(path: &Path, document: &Value) {
    use std::io::Write as _;
    use std::os::unix::fs::OpenOptionsExt as _;
    let mut file = std::fs::OpenOptions::new()
        .write(true)
        .create(true)
        .truncate(true)
        .mode(0o600)
        .open(path)
        .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    file.write_all(serde_json::to_string_pretty(document).unwrap().as_bytes())
        .unwrap();
}

impl Drop for NodeTokens {
    fn drop(&mut self) {
        if self.pods.is_empty() && self.created_nodes.is_empty() {
            return;
        }
        let namespace = self.account.namespace.clone();
        let pods = std::mem::take(&mut self.pods);
        let nodes = std::mem::take(&mut self.created_nodes);
        // Drop runs inside the test's runtime, which cannot be blocked on: a runtime of
        // its own, on a thread of its own, with a client of its own.
        let cleanup = std::thread::spawn(move || {
            let runtime = tokio::runtime::Builder::new_current_thread()
                .enable_all()
                .build()
                .unwrap();
            runtime.block_on(async move {
                let Ok(client) = Client::try_default().await else {
                    return;
                };
                let now = DeleteParams {
                    grace_period_seconds: Some(0),
                    ..DeleteParams::default()
                };
                let pod_api = Api::<Pod>::namespaced(client.clone(), &namespace);
                for pod in &pods {
                    let _ = pod_api.delete(pod, &now).await;
                }
                let node_api = Api::<Node>::all(client);
                for node in &nodes {
                    let _ = node_api.delete(node, &DeleteParams::default()).await;
                }
            });
        });
        let _ = cleanup.join();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_service_account_is_read_from_its_user_name() {
        let sa = ServiceAccountRef::from_username("system:serviceaccount:ns:domaind-node");
        assert_eq!(
            sa,
            Some(ServiceAccountRef {
                namespace: "ns".into(),
                name: "domaind-node".into()
            })
        );
        assert_eq!(
            sa.unwrap().username(),
            "system:serviceaccount:ns:domaind-node"
        );
        for not_one in [
            "kubernetes-admin",
            "system:serviceaccount:ns",
            "system:serviceaccount::x",
            "system:serviceaccount:ns:",
            "system:serviceaccount:ns:a:b",
            "system:node:n1",
        ] {
            assert_eq!(ServiceAccountRef::from_username(not_one), None, "{not_one}");
        }
    }

    #[test]
    fn the_token_replaces_every_users_credential_and_nothing_else() {
        let template = json!({
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "c", "cluster": {"server": "https://127.0.0.1:6443"}}],
            "users": [{"name": "u", "user": {"token": "old", "client-key-data": "k"}}],
            "current-context": "u",
        });
        let kubeconfig = with_token(&template, "new");
        assert_eq!(kubeconfig["users"][0]["user"], json!({"token": "new"}));
        assert_eq!(kubeconfig["clusters"], template["clusters"]);
        assert_eq!(kubeconfig["current-context"], "u");
    }
}
