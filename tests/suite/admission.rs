//! The chart's admission policies for the node daemon (`node.admissionPolicy`) on the
//! real API server, with the credentials a node daemon holds: tokens of the chart's node
//! ServiceAccount bound to a pod on a node, and one bound to nothing.
//!
//! Needs `KUBECONFIG` and `DOMAIND_E2E_NODE_KUBECONFIG` (the latter from
//! `tests/e2e/sa-kubeconfigs.sh`, which applies the chart's RBAC and these policies,
//! rendered by Helm's engine, and checks that they type-check).
//!
//! The writes are the daemon's own: its slices from `slices::desired_slices`, applied
//! under its field manager, and its status body from `status_apply_body`. What must
//! pass passes, and what must not is refused by the policy (403, the policy's message):
//! another node's slice, a slice of another node's pool, another node's slice deleted, a
//! token bound to no node; a domain's status written by a node listed in it neither
//! before nor after the write, unless it is the vacated status over one listing nobody.
//!
//! A claim's device status (`claim_status::apply_body`, under the driver's field
//! manager): a node writes the entries of the claims allocated to it; another node's
//! claim is refused by the API server itself (Kubernetes 1.36's `resourceclaims/driver`,
//! `associated-node`), and, with RBAC widened to any node, driver and binding, still by
//! the policy: another node's claim, another driver's entry, the allocation or the
//! reservations.

use domaind_actors::model::{AllocatedDevice, ClaimRef, CliqueId, DomainRef, DomainUid};
use domaind_actors::rules::channel_health::{ChannelHealth, DomainHealth, HealthReason};
use domaind_actors::{HealthView, PreparedDevice};
use domaind_backends::kube::claim_status::{Seen, apply_body, desired};
use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use k8s_openapi::api::resource::v1::{ResourceClaim, ResourceSlice};
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use domaind_backends::kube::slices::desired_slices;
use domaind_backends::kube::{PoolSpec, domain_ref, status_apply_body};
use domaind_e2e::cluster::{DRIVER, create_namespace, install_crd_and_device_classes, require};
use domaind_e2e::tokens::{NodeTokens, bound_node, client_from};
use domaind_kube_api::crd::{ComputeDomain, ComputeDomainNode, ComputeDomainStatus, Phase};
use domaind_kube_api::names::{
    DEFAULT_CHANNEL_DEVICE_CLASS, NODE_FIELD_MANAGER, claim_status_field_manager,
};

/// What the API server answered a write: `Ok`, or the refusal's code and message.
type Answer = Result<(), (u16, String)>;

fn answer<T>(result: Result<T, kube::Error>) -> Answer {
    match result {
        Ok(_) => Ok(()),
        Err(kube::Error::Api(status)) => Err((status.code, status.message)),
        Err(other) => panic!("no answer from the API server: {other}"),
    }
}

#[track_caller]
fn assert_refused(answer: &Answer, policy: &str, because: &str) {
    match answer {
        Err((403, message)) if message.contains(policy) && message.contains(because) => {}
        other => panic!("expected a 403 from {policy} saying {because:?}, got {other:?}"),
    }
}

/// `node`'s slice as its daemon would publish it, with the pool named `pool`; owned by
/// the Node, as the daemon's are, so that deleting the Node (the tokens' cleanup) takes
/// along whatever a failed run left.
fn slice_of(node: &Node, pool: &str) -> ResourceSlice {
    let spec = PoolSpec {
        node: node.name_any(),
        driver: DRIVER.to_owned(),
        clique: String::new(),
        channels: 2,
        gossip_addr: None,
    };
    let owner = node.controller_owner_ref(&()).unwrap();
    let mut slice = desired_slices(&spec, 1, Some(&owner)).remove(0);
    slice.spec.pool.name = pool.to_owned();
    slice
}

/// The daemon's write: server-side apply under its field manager, forced.
async fn apply_slice(client: &Client, slice: &ResourceSlice) -> Answer {
    answer(
        Api::<ResourceSlice>::all(client.clone())
            .patch(
                &slice.name_any(),
                &PatchParams::apply(NODE_FIELD_MANAGER).force(),
                &Patch::Apply(slice),
            )
            .await,
    )
}

async fn delete_slice(client: &Client, name: &str) -> Answer {
    answer(
        Api::<ResourceSlice>::all(client.clone())
            .delete(name, &DeleteParams::default())
            .await,
    )
}

fn row(node: &str) -> ComputeDomainNode {
    ComputeDomainNode {
        name: node.to_owned(),
        ip_address: "127.0.122.1".into(),
        clique_id: String::new(),
        index: Some(0),
        status: Phase::Ready,
    }
}

fn status_listing(nodes: &[&str]) -> ComputeDomainStatus {
    let count = u32::try_from(nodes.len()).unwrap();
    ComputeDomainStatus {
        status: if nodes.is_empty() {
            Phase::NotReady
        } else {
            Phase::Ready
        },
        nodes: nodes.iter().map(|n| row(n)).collect(),
        ready_nodes: count,
        total_nodes: count,
        conditions: Vec::new(),
        observed_generation: Some(1),
        channel: None,
    }
}

/// The daemon's status write (`KubeStatusSink`): apply to the status subresource.
async fn apply_status(client: &Client, cd: &ComputeDomain, status: &ComputeDomainStatus) -> Answer {
    let domain = domain_ref(cd).unwrap();
    let api = Api::<DynamicObject>::namespaced_with(
        client.clone(),
        &domain.namespace,
        &ApiResource::erase::<ComputeDomain>(&()),
    );
    answer(
        api.patch_status(
            &domain.name,
            &PatchParams::apply(NODE_FIELD_MANAGER).force(),
            &Patch::Apply(&status_apply_body(&domain, status)),
        )
        .await,
    )
}

/// Two node names of this run (`domaind-admission-<pid><tag>-a`, `-b`) and a node
/// daemon's token bound to each (kept in the returned directory).
async fn two_node_tokens(
    admin: &Client,
    template: &std::path::Path,
    tag: &str,
) -> (String, String, tempfile::TempDir, NodeTokens) {
    let pid = std::process::id();
    let (a, b) = (
        format!("domaind-admission-{pid}{tag}-a"),
        format!("domaind-admission-{pid}{tag}-b"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let tokens = NodeTokens::mint(
        admin,
        template,
        &[a.clone(), b.clone()],
        tmp.path(),
        &format!("admission{tag}-{pid}"),
    )
    .await;
    (a, b, tmp, tokens)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG and DOMAIND_E2E_NODE_KUBECONFIG (../shared/kube, tests/e2e/sa-kubeconfigs.sh; docs/TESTING.md)"]
async fn a_node_daemons_token_writes_only_its_own_nodes_slices_and_its_domains_status() {
    require(&["DOMAIND_E2E_NODE_KUBECONFIG"]);
    let admin = Client::try_default().await.unwrap();
    let pid = std::process::id();
    let template = std::path::PathBuf::from(std::env::var("DOMAIND_E2E_NODE_KUBECONFIG").unwrap());
    let (a, b, _tmp, tokens) = two_node_tokens(&admin, &template, "").await;
    let nodes = Api::<Node>::all(admin.clone());
    let (node_a, node_b) = (nodes.get(&a).await.unwrap(), nodes.get(&b).await.unwrap());
    let on_a = client_from(&tokens.kubeconfigs[0]).await;
    let on_b = client_from(&tokens.kubeconfigs[1]).await;
    let unbound = client_from(&template).await;
    assert_eq!(
        bound_node(&unbound).await,
        None,
        "the plain token names no node"
    );
    let slices_policy = "-node-slices'";
    let status_policy = "-node-status'";

    // Slices: a node's own pass; another node's, another node's pool, and any written
    // with a token bound to no node are refused.
    assert_eq!(apply_slice(&on_a, &slice_of(&node_a, &a)).await, Ok(()));
    assert_eq!(
        apply_slice(&on_a, &slice_of(&node_a, &a)).await,
        Ok(()),
        "again: an update"
    );
    assert_refused(
        &apply_slice(&on_a, &slice_of(&node_b, &b)).await,
        slices_policy,
        &format!("the token is bound to node {a}: a node daemon writes only its own node's slices"),
    );
    let mut other_pool = slice_of(&node_a, &b);
    other_pool.metadata.name = Some(format!("{a}-pool-of-b"));
    assert_refused(
        &apply_slice(&on_a, &other_pool).await,
        slices_policy,
        &format!("pool '{b}' of driver {DRIVER}"),
    );
    assert_refused(
        &apply_slice(&unbound, &slice_of(&node_a, &a)).await,
        slices_policy,
        "presented a token bound to no node",
    );
    assert_eq!(apply_slice(&on_b, &slice_of(&node_b, &b)).await, Ok(()));
    let a_slice = slice_of(&node_a, &a).name_any();
    let b_slice = slice_of(&node_b, &b).name_any();
    assert_refused(
        &delete_slice(&on_a, &b_slice).await,
        slices_policy,
        &format!("DELETE of ResourceSlice {b_slice} refused: its spec.nodeName is '{b}'"),
    );
    assert_refused(
        &delete_slice(&unbound, &a_slice).await,
        slices_policy,
        "bound to no node",
    );
    assert_eq!(delete_slice(&on_a, &a_slice).await, Ok(()));
    assert_eq!(delete_slice(&on_b, &b_slice).await, Ok(()));

    // ComputeDomain status: the writer must be listed before or after its write.
    install_crd_and_device_classes(&admin).await;
    let namespace = format!("domaind-admission-{pid}");
    let _cleared_on_panic = create_namespace(&admin, &namespace).await;
    let cds = Api::<ComputeDomain>::namespaced(admin.clone(), &namespace);
    let cd: ComputeDomain = serde_json::from_value(json!({
        "apiVersion": "resource.nvidia.com/v1beta1",
        "kind": "ComputeDomain",
        "metadata": {"name": "training", "namespace": namespace},
        "spec": {"channel": {"resourceClaimTemplate": {"name": "training-channel"}}},
    }))
    .unwrap();
    let cd = cds.create(&PostParams::default(), &cd).await.unwrap();
    let not_member = "is in status.nodes neither before nor after the write";

    // B, in no status, may not write A's membership, nor a Ready domain of no nodes.
    let mut ready_with_none = status_listing(&[]);
    ready_with_none.status = Phase::Ready;
    assert_refused(
        &apply_status(&on_b, &cd, &status_listing(&[&a])).await,
        status_policy,
        &format!("node {b} (the token's) {not_member}"),
    );
    assert_refused(
        &apply_status(&on_b, &cd, &ready_with_none).await,
        status_policy,
        not_member,
    );
    assert_refused(
        &apply_status(&unbound, &cd, &status_listing(&[&a])).await,
        status_policy,
        "bound to no node",
    );
    // A reporter's first document lists itself; then it reports A and B as members.
    assert_eq!(
        apply_status(&on_a, &cd, &status_listing(&[&a])).await,
        Ok(())
    );
    assert_eq!(
        apply_status(&on_a, &cd, &status_listing(&[&a, &b])).await,
        Ok(())
    );
    // B is listed now: as the domain's next reporter it may write, and drop A.
    assert_eq!(
        apply_status(&on_b, &cd, &status_listing(&[&b])).await,
        Ok(())
    );
    // A, no longer listed, may not rewrite it.
    assert_refused(
        &apply_status(&on_a, &cd, &status_listing(&[&b])).await,
        status_policy,
        not_member,
    );
    // Vacating a status that lists another node is that node's to do.
    assert_refused(
        &apply_status(&on_a, &cd, &status_listing(&[])).await,
        status_policy,
        not_member,
    );
    // The last member out writes the vacated status. Members that left together, and
    // were dropped from it already, may write the same again, and nothing else.
    assert_eq!(apply_status(&on_b, &cd, &status_listing(&[])).await, Ok(()));
    assert_eq!(apply_status(&on_a, &cd, &status_listing(&[])).await, Ok(()));
    assert_refused(
        &apply_status(&on_a, &cd, &ready_with_none).await,
        status_policy,
        not_member,
    );
    let mut counts_with_none = status_listing(&[]);
    counts_with_none.total_nodes = 3;
    assert_refused(
        &apply_status(&on_a, &cd, &counts_with_none).await,
        status_policy,
        not_member,
    );
    // What the API server cannot tell: membership is decided in gossip, so a node that
    // lists itself is taken at its word (docs/ARCHITECTURE.md, "Least privilege").
    assert_eq!(
        apply_status(&on_a, &cd, &status_listing(&[&a])).await,
        Ok(())
    );
    let written = cds.get("training").await.unwrap().status.unwrap();
    assert_eq!(written.nodes, vec![row(&a)]);

    Api::<Namespace>::all(admin.clone())
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
    drop(tokens);
}

/// Another driver's device, allocated beside ours in the claims below.
const OTHER_DRIVER: &str = "gpu.example.com";

/// A claim of a channel (ours) and a GPU (another driver's), allocated on `node` as the
/// scheduler would, by the administrator.
async fn claim_allocated_on(admin: &Client, namespace: &str, name: &str, node: &str) -> ClaimRef {
    let claims = Api::<ResourceClaim>::namespaced(admin.clone(), namespace);
    let claim: ResourceClaim = serde_json::from_value(json!({
        "metadata": {"name": name, "namespace": namespace},
        "spec": {"devices": {"requests": [
            {"name": "channel", "exactly": {"deviceClassName": DEFAULT_CHANNEL_DEVICE_CLASS}},
            {"name": "gpu", "exactly": {"deviceClassName": "gpu.example.com"}},
        ]}},
    }))
    .unwrap();
    let claim = claims.create(&PostParams::default(), &claim).await.unwrap();
    let allocation = json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "status": {
            "allocation": {
                "devices": {"results": [
                    {"driver": DRIVER, "pool": node, "device": "channel-0", "request": "channel"},
                    {"driver": OTHER_DRIVER, "pool": node, "device": "gpu-0", "request": "gpu"},
                ]},
                "nodeSelector": {"nodeSelectorTerms": [{"matchFields": [
                    {"key": "metadata.name", "operator": "In", "values": [node]}
                ]}]},
            },
            "reservedFor": [{"resource": "pods", "name": format!("{name}-pod"),
                             "uid": "00000000-0000-4000-8000-000000000001"}],
        }
    });
    claims
        .patch_status(
            name,
            &PatchParams::apply(domaind_e2e::cluster::MANAGER).force(),
            &Patch::Apply(&allocation),
        )
        .await
        .unwrap();
    ClaimRef {
        uid: claim.uid().unwrap(),
        namespace: namespace.to_owned(),
        name: name.to_owned(),
    }
}

/// The daemon's body for `claim`'s channel in `pool`: Ready, as `claim_status` writes it.
fn device_status_body(claim: &ClaimRef, pool: &str) -> serde_json::Value {
    device_status_body_linked(claim, pool, 1)
}

/// The same with `linked` IMEX peers of 1 linked: a write that changes the entry (the
/// API server checks only entries that change).
fn device_status_body_linked(claim: &ClaimRef, pool: &str, linked: usize) -> serde_json::Value {
    let view = HealthView {
        devices: vec![PreparedDevice {
            claim: claim.clone(),
            device: AllocatedDevice {
                request: "channel".into(),
                pool: pool.to_owned(),
                device: "channel-0".into(),
            },
            domain: DomainRef {
                uid: DomainUid("cd-uid".into()),
                namespace: claim.namespace.clone(),
                name: "training".into(),
                num_nodes: 0,
            },
            status: Some(DomainHealth {
                health: ChannelHealth::Healthy,
                reason: HealthReason::ImexReady,
                clique: CliqueId("c.1".into()),
                index: Some(0),
                channel: None,
                linked_peers: linked,
                peers: 1,
                imex_failing: None,
            }),
        }],
        imex_failing: None,
    };
    let want = &desired(&view)[&claim.uid];
    apply_body(
        DRIVER,
        want,
        &Seen::default(),
        time::OffsetDateTime::now_utc(),
    )
}

/// The daemon's write (`KubeClaimStatus`): apply to the status subresource under the
/// driver's field manager.
async fn apply_claim_status(client: &Client, claim: &ClaimRef, body: &serde_json::Value) -> Answer {
    answer(
        Api::<ResourceClaim>::namespaced(client.clone(), &claim.namespace)
            .patch_status(
                &claim.name,
                &PatchParams::apply(&claim_status_field_manager(DRIVER)).force(),
                &Patch::Apply(body),
            )
            .await,
    )
}

/// Refused by the policy (403) or by the API server's own check of `status.devices`
/// (Kubernetes 1.36: 422, `resourceclaims/driver`), whichever the API server asks first.
#[track_caller]
fn assert_refused_by_either(answer: &Answer, policy: &str, because: &str) {
    match answer {
        Err((403, message)) if message.contains(policy) && message.contains(because) => {}
        Err((422, message)) if message.contains("requires resource=\"resourceclaims/driver\"") => {}
        other => panic!(
            "expected a 403 from {policy} saying {because:?} or the API server's 422 of \
             resourceclaims/driver, got {other:?}"
        ),
    }
}

/// A ClusterRole widening the node's ServiceAccount to any node's device status of any
/// driver and to claims' binding, bound to it; both deleted when dropped, a panic too.
struct Widened {
    admin: Client,
    name: String,
}

impl Widened {
    async fn bind(
        admin: &Client,
        name: &str,
        account: &domaind_e2e::tokens::ServiceAccountRef,
    ) -> Self {
        let widened = Self {
            admin: admin.clone(),
            name: name.to_owned(),
        };
        let role: ClusterRole = serde_json::from_value(json!({
            "metadata": {"name": name},
            "rules": [
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/driver"],
                 "verbs": ["arbitrary-node:patch", "associated-node:patch"]},
                {"apiGroups": ["resource.k8s.io"], "resources": ["resourceclaims/binding"],
                 "verbs": ["patch"]},
            ],
        }))
        .unwrap();
        Api::<ClusterRole>::all(admin.clone())
            .create(&PostParams::default(), &role)
            .await
            .unwrap();
        let binding: ClusterRoleBinding = serde_json::from_value(json!({
            "metadata": {"name": name},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": name},
            "subjects": [{"kind": "ServiceAccount", "name": account.name,
                          "namespace": account.namespace}],
        }))
        .unwrap();
        Api::<ClusterRoleBinding>::all(admin.clone())
            .create(&PostParams::default(), &binding)
            .await
            .unwrap();
        widened
    }
}

impl Drop for Widened {
    fn drop(&mut self) {
        let (admin, name) = (self.admin.clone(), self.name.clone());
        tokio::task::block_in_place(|| {
            tokio::runtime::Handle::current().block_on(async move {
                let params = DeleteParams::default();
                let _ = Api::<ClusterRoleBinding>::all(admin.clone())
                    .delete(&name, &params)
                    .await;
                let _ = Api::<ClusterRole>::all(admin).delete(&name, &params).await;
            })
        });
    }
}

/// Whether the API server's authorizer lets the node's ServiceAccount patch any node's
/// device status of our driver in `namespace` (a SubjectAccessReview, as the
/// administrator).
async fn may_patch_any_nodes_claims(admin: &Client, account: &str, namespace: &str) -> bool {
    use k8s_openapi::api::authorization::v1::SubjectAccessReview;
    let review: SubjectAccessReview = serde_json::from_value(json!({
        "spec": {
            "user": account,
            "groups": ["system:serviceaccounts", "system:authenticated"],
            "resourceAttributes": {
                "group": "resource.k8s.io", "resource": "resourceclaims",
                "subresource": "driver", "verb": "arbitrary-node:patch",
                "name": DRIVER, "namespace": namespace,
            },
        },
    }))
    .unwrap();
    Api::<SubjectAccessReview>::all(admin.clone())
        .create(&PostParams::default(), &review)
        .await
        .unwrap()
        .status
        .is_some_and(|s| s.allowed)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG and DOMAIND_E2E_NODE_KUBECONFIG (../shared/kube, tests/e2e/sa-kubeconfigs.sh; docs/TESTING.md)"]
async fn a_node_daemons_token_writes_device_status_only_of_claims_allocated_to_its_node() {
    require(&["DOMAIND_E2E_NODE_KUBECONFIG"]);
    let admin = Client::try_default().await.unwrap();
    let pid = std::process::id();
    let template = std::path::PathBuf::from(std::env::var("DOMAIND_E2E_NODE_KUBECONFIG").unwrap());
    let (a, b, _tmp, tokens) = two_node_tokens(&admin, &template, "-claims").await;
    let on_a = client_from(&tokens.kubeconfigs[0]).await;
    let on_b = client_from(&tokens.kubeconfigs[1]).await;
    let unbound = client_from(&template).await;
    install_crd_and_device_classes(&admin).await;
    let namespace = format!("domaind-admission-claims-{pid}");
    let _cleared_on_panic = create_namespace(&admin, &namespace).await;
    let of_a = claim_allocated_on(&admin, &namespace, "of-a", &a).await;
    let of_b = claim_allocated_on(&admin, &namespace, "of-b", &b).await;
    let claims_policy = "-node-claims'";
    let elsewhere = format!(
        "it is allocated to node {a}, and the token is bound to node {b}: a node daemon \
         writes only the device status of claims allocated to its node"
    );

    // Each node writes its own claim's entries (the chart's RBAC suffices: the API
    // server's associated-node check passes), neither another node's claim nor, bound to
    // no node, any.
    assert_eq!(
        apply_claim_status(&on_a, &of_a, &device_status_body(&of_a, &a)).await,
        Ok(())
    );
    let claims = Api::<ResourceClaim>::namespaced(admin.clone(), &namespace);
    let written = claims.get("of-a").await.unwrap();
    let entries = written.status.unwrap().devices.unwrap();
    assert_eq!(entries.len(), 1, "{entries:?}");
    assert_eq!(
        (entries[0].driver.as_str(), entries[0].pool.as_str()),
        (DRIVER, a.as_str())
    );
    let ready = &entries[0].conditions.as_ref().unwrap()[0];
    assert_eq!(
        (ready.type_.as_str(), ready.status.as_str()),
        ("Ready", "True")
    );
    assert_eq!(
        apply_claim_status(&on_b, &of_b, &device_status_body(&of_b, &b)).await,
        Ok(())
    );
    assert_refused_by_either(
        &apply_claim_status(&on_b, &of_a, &device_status_body_linked(&of_a, &a, 0)).await,
        claims_policy,
        &elsewhere,
    );
    assert_refused_by_either(
        &apply_claim_status(&unbound, &of_a, &device_status_body_linked(&of_a, &a, 0)).await,
        claims_policy,
        "presented a token bound to no node",
    );

    // RBAC widened (any node, any driver, the binding; cluster-wide, as the binding
    // check is, and removed when the test ends): the policy still keeps each node to its
    // own claims and to our driver's entries.
    let _widened = Widened::bind(
        &admin,
        &format!("domaind-admission-claims-{pid}"),
        &tokens.account,
    )
    .await;
    // RBAC is a cache: the widened binding takes a moment to reach the authorizer.
    let account = tokens.account.username();
    domaind_e2e::cluster::wait_for("the widened RBAC is in force", || async {
        let widened = may_patch_any_nodes_claims(&admin, &account, &namespace).await;
        (widened, ())
    })
    .await;
    assert_refused(
        &apply_claim_status(&on_b, &of_a, &device_status_body_linked(&of_a, &a, 0)).await,
        claims_policy,
        &elsewhere,
    );
    assert_refused(
        &apply_claim_status(&unbound, &of_a, &device_status_body_linked(&of_a, &a, 0)).await,
        claims_policy,
        "presented a token bound to no node",
    );
    let mut others_entry = device_status_body(&of_a, &a);
    others_entry["status"]["devices"]
        .as_array_mut()
        .unwrap()
        .push(json!({"driver": OTHER_DRIVER, "pool": a, "device": "gpu-0"}));
    assert_refused(
        &apply_claim_status(&on_a, &of_a, &others_entry).await,
        claims_policy,
        &format!("a node daemon writes only driver {DRIVER}'s entries of status.devices"),
    );
    let mut reserving = device_status_body(&of_a, &a);
    reserving["status"]["reservedFor"] = json!([{"resource": "pods", "name": "someone-else",
        "uid": "00000000-0000-4000-8000-000000000002"}]);
    assert_refused(
        &apply_claim_status(&on_a, &of_a, &reserving).await,
        claims_policy,
        "changes neither a claim's allocation nor its reservations",
    );
    // Its own claim's entries, changed, as before.
    assert_eq!(
        apply_claim_status(&on_a, &of_a, &device_status_body_linked(&of_a, &a, 0)).await,
        Ok(())
    );

    Api::<Namespace>::all(admin.clone())
        .delete(&namespace, &DeleteParams::default())
        .await
        .unwrap();
    drop(tokens);
}
