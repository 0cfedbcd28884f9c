//! The ResourceSlice publisher: what it writes, and that it writes again what
//! something else deletes.

use std::time::Duration;

use domaind_backends::kube::slices::tainted_slices;
use domaind_backends::kube::slices::{PoolSpec, desired_slices, slice_name};
use domaind_backends::kube::{SlicePublisher, delete_node_slices, inherited_taint, watch_slices};
use domaind_kube_api::names::NODE_FIELD_MANAGER;
use futures::StreamExt as _;
use futures::channel::mpsc;
use http::Method;
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{OwnerReference, Time};
use kube::Client;
use kube::runtime::watcher;
use metrics_util::debugging::DebuggingRecorder;
use serde_json::{Value, json};
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::apiserver::{Expect, counter, pair, status};

const NODE: &str = "gb200-rack1-n01";
const DRIVER: &str = "compute-domain.nvidia.com";
const CLIQUE: &str = "8c6d1a2f-1b1e-4d59-9b8b-3a3f8f7c2a10.32766";
const SLICES: &str = "/apis/resource.k8s.io/v1/resourceslices";
const NODE_PATH: &str = "/api/v1/nodes/gb200-rack1-n01";

fn pool(channels: u32) -> PoolSpec {
    PoolSpec {
        node: NODE.into(),
        driver: DRIVER.into(),
        clique: CLIQUE.into(),
        channels,
        gossip_addr: None,
    }
}

fn slice_path(index: usize) -> String {
    format!("{SLICES}/{}", slice_name(NODE, DRIVER, index))
}

fn node_object() -> Value {
    json!({"apiVersion": "v1", "kind": "Node",
           "metadata": {"name": NODE, "uid": "node-uid", "resourceVersion": "3"}})
}

fn owner() -> OwnerReference {
    OwnerReference {
        api_version: "v1".into(),
        kind: "Node".into(),
        name: NODE.into(),
        uid: "node-uid".into(),
        controller: Some(true),
        block_owner_deletion: None,
    }
}

/// The slices as the API server holds them after we published them.
fn published(channels: u32, generation: i64, owner: Option<&OwnerReference>) -> Vec<ResourceSlice> {
    desired_slices(&pool(channels), generation, owner)
        .into_iter()
        .enumerate()
        .map(|(i, mut slice)| {
            slice.metadata.uid = Some(format!("slice-uid-{i}"));
            slice.metadata.resource_version = Some(format!("{}", 20 + i));
            slice
        })
        .collect()
}

type Events = mpsc::UnboundedSender<Result<watcher::Event<ResourceSlice>, watcher::Error>>;

struct Running {
    pool: watch::Sender<PoolSpec>,
    events: Events,
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// A publisher whose watch events the test sends.
fn start(client: Client, channels: u32) -> Running {
    let (pool_tx, pool_rx) = watch::channel(pool(channels));
    let (events, rx) = mpsc::unbounded();
    let stop = CancellationToken::new();
    let task = tokio::spawn(
        SlicePublisher::new(client, pool_rx, Duration::from_secs(10)).run(rx.boxed(), stop.clone()),
    );
    Running {
        pool: pool_tx,
        events,
        stop,
        task,
    }
}

impl Running {
    fn send(&self, event: watcher::Event<ResourceSlice>) {
        self.events.unbounded_send(Ok(event)).unwrap();
    }

    /// The watch's first list: these slices.
    fn listed(&self, slices: Vec<ResourceSlice>) {
        self.send(watcher::Event::Init);
        for slice in slices {
            self.send(watcher::Event::InitApply(slice));
        }
        self.send(watcher::Event::InitDone);
    }

    async fn stop(self) {
        self.stop.cancel();
        self.task.await.unwrap();
    }
}

/// An apply of slice `index` holding `devices` devices at `generation` in a pool of
/// `count` slices, answered with the object.
fn apply_slice(
    index: usize,
    generation: i64,
    count: i64,
    devices: usize,
    clique: &'static str,
    owned: bool,
) -> Expect {
    Expect::patch(slice_path(index))
        .apply_by(NODE_FIELD_MANAGER)
        .body(move |body: &Value| {
            assert_eq!(body["apiVersion"], "resource.k8s.io/v1");
            assert_eq!(body["kind"], "ResourceSlice");
            assert_eq!(body["metadata"]["name"], slice_name(NODE, DRIVER, index));
            let spec = &body["spec"];
            assert_eq!(spec["driver"], DRIVER);
            assert_eq!(spec["nodeName"], NODE);
            assert_eq!(
                spec["pool"],
                json!({"name": NODE, "generation": generation, "resourceSliceCount": count})
            );
            let list = spec["devices"].as_array().unwrap();
            assert_eq!(list.len(), devices);
            let first = index * 128;
            assert_eq!(list[0]["name"], format!("channel-{first}"));
            assert_eq!(
                list[0]["attributes"],
                json!({"type": {"string": "channel"}, "id": {"int": first},
                       "cliqueID": {"string": clique}})
            );
            let owners = &body["metadata"]["ownerReferences"];
            if owned {
                assert_eq!(
                    owners,
                    &json!([{"apiVersion": "v1", "kind": "Node", "name": NODE,
                             "uid": "node-uid", "controller": true}])
                );
            } else {
                assert!(owners.is_null(), "{owners}");
            }
        })
        .echo()
}

#[tokio::test]
async fn the_pool_is_published_and_published_again_when_deleted_or_changed() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (client, server) = pair();
    let running = start(client, 8);

    // The first list finds nothing: the Node is looked up (owner), the pool written.
    let script = server.play(vec![
        Expect::get(NODE_PATH).respond(200, node_object()),
        apply_slice(0, 1, 1, 8, CLIQUE, true),
    ]);
    running.listed(vec![]);
    let server = script.await.unwrap();

    // The watch reports our own write (nothing to do), then a kubelet deletes the
    // slice: the same slice again, same generation.
    let script = server.play(vec![apply_slice(0, 1, 1, 8, CLIQUE, true)]);
    let ours = published(8, 1, Some(&owner())).remove(0);
    running.send(watcher::Event::Apply(ours.clone()));
    running.send(watcher::Event::Delete(ours));
    let server = script.await.unwrap();

    // The clique changes: a new generation.
    let script = server.play(vec![apply_slice(0, 2, 1, 8, "other-cluster.3", true)]);
    running
        .pool
        .send_modify(|p| p.clique = "other-cluster.3".into());
    let mut server = script.await.unwrap();

    running.stop().await;
    server.assert_idle();
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(&snapshot, "domaind_resource_slices_lost_total", &[]),
        1
    );
    assert_eq!(
        counter(
            &snapshot,
            "domaind_resource_slice_writes_total",
            &[("op", "apply"), ("outcome", "ok")]
        ),
        3
    );
}

fn imex_taint(value: &str) -> DeviceTaint {
    DeviceTaint {
        key: format!("{DRIVER}/imex-failing"),
        value: Some(value.into()),
        effect: "NoSchedule".into(),
        time_added: Some(Time("2026-05-01T10:00:00Z".parse().unwrap())),
    }
}

/// An apply of the one slice of an 8-channel pool at `generation`, every device with
/// `taint` or none; answered with the body, less the taints where `drop_taints` (an
/// API server with `DRADeviceTaints` off).
fn apply_tainted(generation: i64, taint: Option<&'static str>, drop_taints: bool) -> Expect {
    let expect = Expect::patch(slice_path(0))
        .apply_by(NODE_FIELD_MANAGER)
        .body(move |body: &Value| {
            assert_eq!(body["spec"]["pool"]["generation"], generation);
            let devices = body["spec"]["devices"].as_array().unwrap();
            assert_eq!(devices.len(), 8);
            for device in devices {
                match taint {
                    Some(value) => assert_eq!(
                        device["taints"],
                        json!([{"key": format!("{DRIVER}/imex-failing"), "value": value,
                                "effect": "NoSchedule", "timeAdded": "2026-05-01T10:00:00Z"}])
                    ),
                    None => assert!(device["taints"].is_null(), "{device}"),
                }
            }
        });
    if drop_taints {
        expect.respond(200, json!(published(8, generation, Some(&owner()))[0]))
    } else {
        expect.echo()
    }
}

#[tokio::test]
async fn the_taint_is_merged_into_the_pool_and_one_the_api_server_drops_is_not_asked_again() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (client, server) = pair();
    let (pool_tx, pool_rx) = watch::channel(pool(8));
    let (taint_tx, taint_rx) = watch::channel(None);
    let (events, rx) = mpsc::unbounded();
    let stop = CancellationToken::new();
    let task = tokio::spawn(
        SlicePublisher::new(client, pool_rx, Duration::from_secs(10))
            .with_taint(taint_rx)
            .run(rx.boxed(), stop.clone()),
    );
    let running = Running {
        pool: pool_tx,
        events,
        stop,
        task,
    };
    let script = server.play(vec![
        Expect::get(NODE_PATH).respond(200, node_object()),
        apply_tainted(1, None, false),
    ]);
    running.listed(vec![]);
    let server = script.await.unwrap();

    // Tainted: every device, at a new generation; the API server keeps it.
    let script = server.play(vec![apply_tainted(2, Some("exited"), false)]);
    taint_tx.send_replace(Some(imex_taint("exited")));
    let server = script.await.unwrap();
    // Untainted.
    let script = server.play(vec![apply_tainted(3, None, false)]);
    taint_tx.send_replace(None);
    let server = script.await.unwrap();

    // An API server that drops taints: written once, then the pool is written without.
    let script = server.play(vec![apply_tainted(4, Some("exited"), true)]);
    taint_tx.send_replace(Some(imex_taint("exited")));
    let server = script.await.unwrap();
    let stripped = published(8, 4, Some(&owner())).remove(0);
    running.send(watcher::Event::Apply(stripped));
    // The clique changes: the next write, at once, no taint asked for.
    let script = server.play(vec![
        Expect::patch(slice_path(0))
            .apply_by(NODE_FIELD_MANAGER)
            .body(|body: &Value| {
                assert_eq!(body["spec"]["pool"]["generation"], 5);
                assert!(body["spec"]["devices"][0]["taints"].is_null(), "{body}");
            })
            .echo(),
    ]);
    running
        .pool
        .send_modify(|p| p.clique = "other-cluster.3".into());
    let mut server = script.await.unwrap();
    running.stop().await;
    server.assert_idle();
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(&snapshot, "domaind_device_taints_dropped_total", &[]),
        1
    );
}

#[tokio::test]
async fn a_restarted_daemon_finds_the_taint_its_predecessor_left() {
    let (client, server) = pair();
    let selector = "spec.nodeName=gb200-rack1-n01,spec.driver=compute-domain.nvidia.com";
    let tainted = tainted_slices(&pool(8), &[imex_taint("exited")], 3, Some(&owner()));
    let list = |items: Vec<ResourceSlice>| {
        json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
               "metadata": {"resourceVersion": "50"}, "items": items})
    };
    let script = server.play(vec![
        Expect::get(SLICES)
            .query("fieldSelector", selector)
            .respond(200, list(tainted)),
        Expect::get(SLICES)
            .query("fieldSelector", selector)
            .respond(200, list(published(8, 1, None))),
        // Unreadable: nothing is kept (the next write goes without it).
        Expect::get(SLICES).respond(503, status(503, "ServiceUnavailable", "starting")),
    ]);
    let timeout = Duration::from_secs(10);
    assert_eq!(
        inherited_taint(client.clone(), NODE, DRIVER, timeout).await,
        Some(imex_taint("exited"))
    );
    assert_eq!(
        inherited_taint(client.clone(), NODE, DRIVER, timeout).await,
        None
    );
    assert_eq!(inherited_taint(client, NODE, DRIVER, timeout).await, None);
    let mut server = script.await.unwrap();
    server.assert_idle();
}

#[tokio::test]
async fn large_pools_span_slices_and_shrinking_deletes_the_extra_ones() {
    let (client, server) = pair();
    let running = start(client, 300);
    // No Node object of that name (a test cluster pretending): no owner.
    let script = server.play(vec![
        Expect::get(NODE_PATH).respond(
            404,
            status(404, "NotFound", "nodes \"gb200-rack1-n01\" not found"),
        ),
        apply_slice(0, 1, 3, 128, CLIQUE, false),
        apply_slice(1, 1, 3, 128, CLIQUE, false),
        apply_slice(2, 1, 3, 44, CLIQUE, false),
    ]);
    running.listed(vec![]);
    let server = script.await.unwrap();

    let script = server.play(vec![
        apply_slice(0, 2, 1, 8, CLIQUE, false),
        Expect::new(Method::DELETE, slice_path(1)).respond(200, json!(published(300, 1, None)[1])),
        Expect::new(Method::DELETE, slice_path(2))
            .respond(404, status(404, "NotFound", "already gone")),
    ]);
    for slice in published(300, 1, None) {
        running.send(watcher::Event::Apply(slice));
    }
    running.pool.send_modify(|p| p.channels = 8);
    let mut server = script.await.unwrap();
    running.stop().await;
    server.assert_idle();
}

#[tokio::test(start_paused = true)]
async fn a_failed_write_is_retried_with_backoff() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let (client, server) = pair();
    let running = start(client, 8);
    let script = server.play(vec![
        // The API server is down: even the Node cannot be read; nothing is written.
        Expect::get(NODE_PATH).respond(503, status(503, "ServiceUnavailable", "starting")),
        Expect::get(NODE_PATH).respond(200, node_object()),
        Expect::patch(slice_path(0)).respond(500, status(500, "InternalError", "etcd timeout")),
        apply_slice(0, 1, 1, 8, CLIQUE, true),
    ]);
    let started = tokio::time::Instant::now();
    running.listed(vec![]);
    let mut server = script.await.unwrap();
    assert!(
        started.elapsed() >= Duration::from_millis(150),
        "retries wait"
    );
    running.stop().await;
    server.assert_idle();
    let snapshot = snapshotter.snapshot().into_vec();
    assert_eq!(
        counter(
            &snapshot,
            "domaind_resource_slice_writes_total",
            &[("outcome", "failed")]
        ),
        1
    );
}

#[tokio::test]
async fn the_watch_of_this_nodes_slices_brings_a_deletion_to_a_republish() {
    let (client, server) = pair();
    let (pool_tx, pool_rx) = watch::channel(pool(8));
    let stop = CancellationToken::new();
    let task = tokio::spawn(
        SlicePublisher::new(client.clone(), pool_rx, Duration::from_secs(10))
            .run(watch_slices(client, NODE, DRIVER), stop.clone()),
    );
    let ours = published(8, 1, Some(&owner())).remove(0);
    let mut deleted = serde_json::to_value(&ours).unwrap();
    deleted["metadata"]["resourceVersion"] = json!("31");
    let line = serde_json::to_vec(&json!({"type": "DELETED", "object": deleted})).unwrap();
    let selector = "spec.nodeName=gb200-rack1-n01,spec.driver=compute-domain.nvidia.com";
    let script = server.play(vec![
        // The watcher's list: our slice is there, as published.
        Expect::get(SLICES)
            .query("fieldSelector", selector)
            .respond(
                200,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                   "metadata": {"resourceVersion": "30"}, "items": [ours]}),
            ),
        // The watch from the list's version: a kubelet deletes the slice.
        Expect::get(SLICES)
            .query("watch", "true")
            .query("resourceVersion", "30")
            .query("fieldSelector", selector)
            .respond_raw(200, [line, b"\n".to_vec()].concat()),
        // Meanwhile the first sync: the slice is as desired, only the owner is looked up.
        Expect::get(NODE_PATH).respond(200, node_object()),
        // The deletion read, the watch resumes after it ...
        Expect::get(SLICES)
            .query("watch", "true")
            .query("resourceVersion", "31")
            .hang(),
        // ... and the slice is published again at once, at the same generation.
        apply_slice(0, 1, 1, 8, CLIQUE, true),
    ]);
    let mut server = script.await.unwrap();
    stop.cancel();
    task.await.unwrap();
    drop(pool_tx);
    server.assert_idle();
}

#[tokio::test]
async fn an_uninstall_deletes_exactly_this_nodes_slices() {
    let (client, server) = pair();
    let mut stranger = published(8, 1, None).remove(0);
    stranger.metadata.name = Some("gb200-rack1-n02-compute-domain.nvidia.com-0".into());
    stranger.spec.node_name = Some("gb200-rack1-n02".into());
    let ours = published(300, 1, None);
    let selector = "spec.nodeName=gb200-rack1-n01,spec.driver=compute-domain.nvidia.com";
    let script = server.play(vec![
        Expect::get(SLICES)
            .query("fieldSelector", selector)
            .respond(
                200,
                json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceSliceList",
                   "metadata": {"resourceVersion": "40"},
                   "items": [ours[0], stranger, ours[1]]}),
            ),
        Expect::new(Method::DELETE, slice_path(0)).respond(200, json!(ours[0])),
        Expect::new(Method::DELETE, slice_path(1)).respond(404, status(404, "NotFound", "gone")),
    ]);
    let deleted = delete_node_slices(client, NODE, DRIVER, Duration::from_secs(10))
        .await
        .unwrap();
    assert_eq!(deleted, 1);
    let mut server = script.await.unwrap();
    server.assert_idle();
}

#[tokio::test(start_paused = true)]
async fn a_stop_does_not_wait_for_an_api_server_that_hangs() {
    let (client, server) = pair();
    let running = start(client, 8);
    let script = server.play(vec![Expect::get(NODE_PATH).hang()]);
    running.listed(vec![]);
    let mut server = script.await.unwrap();
    let started = tokio::time::Instant::now();
    running.stop().await;
    assert!(
        started.elapsed() < Duration::from_secs(1),
        "stopped after {:?}",
        started.elapsed()
    );
    server.assert_idle();
}
