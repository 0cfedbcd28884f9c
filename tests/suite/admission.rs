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

use k8s_openapi::api::core::v1::{Namespace, Node};
use k8s_openapi::api::resource::v1::ResourceSlice;
use kube::api::{Api, ApiResource, DeleteParams, DynamicObject, Patch, PatchParams, PostParams};
use kube::{Client, Resource, ResourceExt};
use serde_json::json;

use domaind_backends::kube::slices::desired_slices;
use domaind_backends::kube::{PoolSpec, domain_ref, status_apply_body};
use domaind_e2e::cluster::{DRIVER, create_namespace, install_crd_and_device_classes, require};
use domaind_e2e::tokens::{NodeTokens, bound_node, client_from};
use domaind_kube_api::crd::{ComputeDomain, ComputeDomainNode, ComputeDomainStatus, Phase};
use domaind_kube_api::names::NODE_FIELD_MANAGER;

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

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs a cluster: KUBECONFIG and DOMAIND_E2E_NODE_KUBECONFIG (../shared/kube, tests/e2e/sa-kubeconfigs.sh; docs/TESTING.md)"]
async fn a_node_daemons_token_writes_only_its_own_nodes_slices_and_its_domains_status() {
    require(&["DOMAIND_E2E_NODE_KUBECONFIG"]);
    let admin = Client::try_default().await.unwrap();
    let pid = std::process::id();
    let (a, b) = (
        format!("domaind-admission-{pid}-a"),
        format!("domaind-admission-{pid}-b"),
    );
    let tmp = tempfile::tempdir().unwrap();
    let template = std::path::PathBuf::from(std::env::var("DOMAIND_E2E_NODE_KUBECONFIG").unwrap());
    let tokens = NodeTokens::mint(
        &admin,
        &template,
        &[a.clone(), b.clone()],
        tmp.path(),
        &format!("admission-{pid}"),
    )
    .await;
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
