//! Device health (`DRAResourceHealth`) over the real DRA socket, as the kubelet watches
//! it, in each version: the list at once, every change pushed, messages cut, a client
//! gone leaves nothing behind, shutdown ends the streams cleanly.

use std::path::Path;
use std::pin::Pin;

use domaind_kubelet_api::dra_health::{v1, v1alpha1, v1beta1};
use domaind_kubelet_plugin::testing::{FakeNodePlugin, PATIENCE, config, serve, short_dir, within};
use domaind_kubelet_plugin::{
    DeviceHealthEntry, DeviceHealthState, HEALTH_CHECK_TIMEOUT, HEALTH_STREAMS_TOTAL,
    HealthVersion, KubeletPluginServer, MAX_MESSAGE_BYTES, RunningPluginServer,
};
use futures::{Stream, StreamExt};
use tonic::transport::{Channel, Endpoint};
use tonic::{Code, Status};

use super::counter;

/// One received entry, whatever the version: (pool, device, health as the wire's
/// number, last_updated_time, health_check_timeout_seconds, message).
type Received = (String, String, i32, i64, i64, String);
type Lists = Pin<Box<dyn Stream<Item = Result<Vec<Received>, Status>> + Send>>;

async fn channel(path: &Path) -> Channel {
    let path = path.to_path_buf();
    Endpoint::from_static("http://localhost")
        .connect_with_connector(tower::service_fn(move |_| {
            let path = path.clone();
            async move {
                tokio::net::UnixStream::connect(path)
                    .await
                    .map(hyper_util::rt::TokioIo::new)
            }
        }))
        .await
        .unwrap()
}

macro_rules! watch_with {
    ($api:ident, $channel:expr) => {{
        let stream = $api::dra_resource_health_client::DraResourceHealthClient::new($channel)
            .node_watch_resources($api::NodeWatchResourcesRequest {})
            .await?
            .into_inner();
        Ok(Box::pin(stream.map(|response| {
            response.map(|response| {
                response
                    .devices
                    .into_iter()
                    .map(|d| {
                        let id = d.device.unwrap_or_default();
                        (
                            id.pool_name,
                            id.device_name,
                            d.health,
                            d.last_updated_time,
                            d.health_check_timeout_seconds,
                            d.message,
                        )
                    })
                    .collect()
            })
        })) as Lists)
    }};
}

/// Opens a `NodeWatchResources` stream of `version`, as the kubelet does.
async fn watch(channel: Channel, version: HealthVersion) -> Result<Lists, Status> {
    match version {
        HealthVersion::V1alpha1 => watch_with!(v1alpha1, channel),
        HealthVersion::V1beta1 => watch_with!(v1beta1, channel),
        HealthVersion::V1 => watch_with!(v1, channel),
    }
}

async fn next_list(lists: &mut Lists) -> Vec<Received> {
    within("a device health list", lists.next())
        .await
        .expect("the stream goes on")
        .expect("a list, not an error")
}

fn entry(device: &str, health: DeviceHealthState, message: &str) -> DeviceHealthEntry {
    DeviceHealthEntry {
        pool: "node-a".into(),
        device: device.into(),
        health,
        message: message.into(),
        last_updated_unix_s: 1_800_000_000,
    }
}

fn received(device: &str, health: i32, message: &str) -> Received {
    (
        "node-a".into(),
        device.into(),
        health,
        1_800_000_000,
        HEALTH_CHECK_TIMEOUT.as_secs() as i64,
        message.into(),
    )
}

async fn until_streams(server: &RunningPluginServer, open: usize) {
    domaind_testkit::poll_until_true(
        &format!("{open} device health streams open"),
        PATIENCE,
        async || server.health_streams() == open,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_version_gets_the_list_at_once_and_each_change() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    plugin.set_device_health(vec![entry("channel-0", DeviceHealthState::Healthy, "")]);
    let server = serve(dir.path(), &plugin).await;
    let channel = channel(server.dra_socket()).await;

    let mut streams = Vec::new();
    for version in HealthVersion::ALL {
        let mut lists = within("open a stream", watch(channel.clone(), version))
            .await
            .unwrap();
        assert_eq!(
            next_list(&mut lists).await,
            [received("channel-0", 1, "")],
            "{version}"
        );
        streams.push((version, lists));
    }
    assert_eq!(server.health_streams(), 3);

    plugin.set_device_health(vec![
        entry("channel-0", DeviceHealthState::Unhealthy, "IMEX down"),
        entry("channel-1", DeviceHealthState::Unknown, ""),
        entry("channel-2", DeviceHealthState::Healthy, ""),
    ]);
    for (version, lists) in &mut streams {
        assert_eq!(
            next_list(lists).await,
            [
                received("channel-0", 2, "IMEX down"),
                received("channel-1", 0, ""),
                received("channel-2", 1, ""),
            ],
            "{version}"
        );
    }

    plugin.set_device_health(Vec::new());
    for (version, lists) in &mut streams {
        assert_eq!(next_list(lists).await, [], "{version}");
    }
    within("shutdown", server.shutdown()).await;
}

#[tokio::test]
async fn a_long_message_arrives_cut_to_1024_bytes() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let long = format!("{}é", "x".repeat(MAX_MESSAGE_BYTES));
    plugin.set_device_health(vec![entry(
        "channel-0",
        DeviceHealthState::Unhealthy,
        &long,
    )]);
    let server = serve(dir.path(), &plugin).await;
    let mut lists = watch(channel(server.dra_socket()).await, HealthVersion::V1alpha1)
        .await
        .unwrap();
    let list = next_list(&mut lists).await;
    let message = &list[0].5;
    assert_eq!(message.len(), MAX_MESSAGE_BYTES);
    assert_eq!(
        *message,
        format!("{}...", "x".repeat(MAX_MESSAGE_BYTES - 3))
    );
    within("shutdown", server.shutdown()).await;
}

#[tokio::test]
async fn without_a_feed_the_list_is_empty() {
    let dir = short_dir();
    let server = KubeletPluginServer::start(config(dir.path()), FakeNodePlugin::new())
        .await
        .unwrap();
    for version in HealthVersion::ALL {
        let mut lists = watch(channel(server.dra_socket()).await, version)
            .await
            .unwrap();
        assert_eq!(next_list(&mut lists).await, [], "{version}");
    }
    within("shutdown", server.shutdown()).await;
}

#[tokio::test]
async fn a_kubelet_gone_leaves_no_stream_behind() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    plugin.set_device_health(vec![entry("channel-0", DeviceHealthState::Healthy, "")]);
    let server = serve(dir.path(), &plugin).await;

    // The stream dropped, the connection kept.
    let kept = channel(server.dra_socket()).await;
    let mut lists = watch(kept.clone(), HealthVersion::V1beta1).await.unwrap();
    next_list(&mut lists).await;
    assert_eq!(server.health_streams(), 1);
    drop(lists);
    until_streams(&server, 0).await;

    // The connection gone, as when the kubelet dies.
    let mut lists = watch(channel(server.dra_socket()).await, HealthVersion::V1)
        .await
        .unwrap();
    next_list(&mut lists).await;
    assert_eq!(server.health_streams(), 1);
    drop(lists);
    until_streams(&server, 0).await;

    // The server still answers.
    let mut lists = watch(kept, HealthVersion::V1alpha1).await.unwrap();
    assert_eq!(next_list(&mut lists).await.len(), 1);
    drop(lists);
    until_streams(&server, 0).await;
    let report = within("shutdown", server.shutdown()).await;
    assert!(report.drained);
}

#[tokio::test]
async fn shutdown_ends_the_streams_cleanly_and_refuses_new_ones() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let channel = channel(server.dra_socket()).await;
    let mut lists = watch(channel.clone(), HealthVersion::V1alpha1)
        .await
        .unwrap();
    next_list(&mut lists).await;

    server.begin_shutdown().await;
    // The end of the stream with status OK: the kubelet reads EOF, which it does not
    // log as an error.
    let end = within("the end of the stream", lists.next()).await;
    assert!(end.is_none(), "{end:?}");
    until_streams(&server, 0).await;

    let refused_before = counter(
        HEALTH_STREAMS_TOTAL,
        &[("version", "v1"), ("outcome", "unavailable")],
    );
    let refused = watch(channel, HealthVersion::V1).await.err().unwrap();
    assert_eq!(refused.code(), Code::Unavailable);
    assert_eq!(
        counter(
            HEALTH_STREAMS_TOTAL,
            &[("version", "v1"), ("outcome", "unavailable")]
        ),
        refused_before + 1
    );
    let report = within("shutdown", server.shutdown()).await;
    assert!(report.drained, "{report:?}");
}
