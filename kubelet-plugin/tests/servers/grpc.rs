//! The kubelet plugin's gRPC servers over real unix sockets, driven by the kubelet-style
//! client, with a fake node behind them.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use bytes::{Buf, BufMut, Bytes};
use domaind_kubelet_api::dra::v1;
use domaind_kubelet_api::pluginregistration as reg;
use domaind_kubelet_plugin::client::{self, ClaimAnswer, ClientError, KubeletClient};
use domaind_kubelet_plugin::testing::{
    FakeNodePlugin, Op, claim, config, device_for, serve, short_dir, within,
};
use domaind_kubelet_plugin::{
    DraVersion, KubeletPluginServer, PluginServerError, RegistrationState,
};
use tonic::Code;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::codegen::http::uri::PathAndQuery;
use tonic::transport::{Channel, Endpoint};
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

fn call_status(error: ClientError) -> tonic::Status {
    match error {
        ClientError::Call { status, .. } => status,
        other => panic!("expected a failed call, got {other}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn registration_then_both_versions_prepare_and_unprepare() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    assert_eq!(
        server.dra_socket(),
        dir.path()
            .join("plugins/compute-domain.nvidia.com/dra.sock")
    );
    assert_eq!(
        server.registration_socket(),
        dir.path()
            .join("registry/compute-domain.nvidia.com-reg.sock")
    );
    let mut state = server.registration();
    assert_eq!(*state.borrow(), RegistrationState::Pending);

    let registration = within("register", client::register(server.registration_socket()))
        .await
        .unwrap();
    assert_eq!(registration.driver_name, "compute-domain.nvidia.com");
    assert_eq!(registration.endpoint, server.dra_socket());
    assert_eq!(
        registration.supported_versions,
        [
            "v1.DRAPlugin",
            "v1beta1.DRAPlugin",
            "v1.DRAResourceHealth",
            "v1beta1.DRAResourceHealth",
            "v1alpha1.DRAResourceHealth",
        ]
    );
    assert_eq!(registration.preferred_version(), DraVersion::V1);
    within(
        "registered state",
        state.wait_for(|s| *s == RegistrationState::Registered),
    )
    .await
    .unwrap();

    let kubelet = KubeletClient::connect(&registration.endpoint)
        .await
        .unwrap();
    for version in DraVersion::ALL {
        let claims = [
            claim(&format!("{version}-ok"), "team-a", "ok"),
            claim(&format!("{version}-fail"), "team-b", "fail-config"),
            claim(&format!("{version}-retry"), "team-c", "retry-later"),
        ];
        let answers = within("prepare", kubelet.prepare(&claims, version))
            .await
            .unwrap();
        assert_eq!(
            answers,
            vec![
                ClaimAnswer {
                    claim: claims[0].clone(),
                    result: Ok(vec![device_for(&claims[0])]),
                },
                ClaimAnswer {
                    claim: claims[1].clone(),
                    result: Err("fail-config: broken for good".into()),
                },
                ClaimAnswer {
                    claim: claims[2].clone(),
                    result: Err("retry-later: not ready yet".into()),
                },
            ],
            "{version}"
        );

        let answers = within("unprepare", kubelet.unprepare(&claims[..2], version))
            .await
            .unwrap();
        assert_eq!(answers[0].result, Ok(()), "{version}");
        assert_eq!(
            answers[1].result,
            Err("fail-config: broken for good".into()),
            "{version}"
        );
    }
    let mut calls = plugin.calls();
    calls.sort_by(|a, b| a.1.uid.cmp(&b.1.uid).then((a.0 as u8).cmp(&(b.0 as u8))));
    let expected_for = |version: &str| {
        vec![
            (
                Op::Prepare,
                claim(&format!("{version}-fail"), "team-b", "fail-config"),
            ),
            (
                Op::Unprepare,
                claim(&format!("{version}-fail"), "team-b", "fail-config"),
            ),
            (Op::Prepare, claim(&format!("{version}-ok"), "team-a", "ok")),
            (
                Op::Unprepare,
                claim(&format!("{version}-ok"), "team-a", "ok"),
            ),
            (
                Op::Prepare,
                claim(&format!("{version}-retry"), "team-c", "retry-later"),
            ),
        ]
    };
    let mut expected = expected_for("v1");
    expected.extend(expected_for("v1beta1"));
    assert_eq!(calls, expected, "each claim reaches the node once, as sent");

    let report = within("shutdown", server.shutdown()).await;
    assert!(report.drained);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_claims_of_one_request_are_handled_concurrently() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let kubelet = KubeletClient::connect(server.dra_socket()).await.unwrap();
    // The first claim cannot finish before the node has been asked for the second: one
    // at a time, this call would never end.
    let claims = [claim("a", "ns", "wait-for-b"), claim("b", "ns", "b")];
    let answers = within("prepare", kubelet.prepare(&claims, DraVersion::V1))
        .await
        .unwrap();
    assert!(answers.iter().all(|a| a.result.is_ok()), "{answers:?}");
    let answers = within("unprepare", kubelet.unprepare(&claims, DraVersion::V1beta1))
        .await
        .unwrap();
    assert!(answers.iter().all(|a| a.result.is_ok()), "{answers:?}");
    within("shutdown", server.shutdown()).await;
}

#[tokio::test]
async fn a_refused_registration_is_exposed_to_the_daemon() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let mut state = server.registration();
    let channel = unix_channel(server.registration_socket()).await;
    let mut registration = reg::registration_client::RegistrationClient::new(channel);
    let info = registration
        .get_info(reg::InfoRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(info.r#type, "DRAPlugin");
    assert_eq!(info.name, "compute-domain.nvidia.com");
    assert_eq!(info.endpoint, server.dra_socket().to_str().unwrap());
    registration
        .notify_registration_status(reg::RegistrationStatus {
            plugin_registered: false,
            error: "driver name already taken".into(),
        })
        .await
        .unwrap();
    let refused = within(
        "refused state",
        state.wait_for(|s| matches!(s, RegistrationState::Refused { .. })),
    )
    .await
    .unwrap()
    .clone();
    assert_eq!(
        refused,
        RegistrationState::Refused {
            error: "driver name already taken".into()
        }
    );
    within("shutdown", server.shutdown()).await;
}

#[tokio::test]
async fn the_client_refuses_a_plugin_that_speaks_no_version_it_knows() {
    // A registration server of another plugin, offering only a future version.
    let dir = short_dir();
    let path = dir.path().join("other-reg.sock");
    let (notified_tx, mut notified) = tokio::sync::mpsc::unbounded_channel();
    let listener = tokio::net::UnixListener::bind(&path).unwrap();
    let stop = tokio_util::sync::CancellationToken::new();
    let server = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(reg::registration_server::RegistrationServer::new(
                FakeRegistration(notified_tx),
            ))
            .serve_with_incoming_shutdown(
                tokio_stream::wrappers::UnixListenerStream::new(listener),
                stop.clone().cancelled_owned(),
            ),
    );
    let error = within("register", client::register(&path))
        .await
        .unwrap_err();
    match &error {
        ClientError::Refused { reason, .. } => {
            assert!(reason.contains("v2.DRAPlugin"), "{reason}")
        }
        other => panic!("expected a refusal, got {other}"),
    }
    let status = within("notification", notified.recv()).await.unwrap();
    assert!(!status.plugin_registered);
    assert!(
        status.error.contains("none of the offered versions"),
        "{}",
        status.error
    );
    stop.cancel();
    within("fake server stop", server).await.unwrap().unwrap();
}

struct FakeRegistration(tokio::sync::mpsc::UnboundedSender<reg::RegistrationStatus>);

#[tonic::async_trait]
impl reg::registration_server::Registration for FakeRegistration {
    async fn get_info(
        &self,
        _: tonic::Request<reg::InfoRequest>,
    ) -> Result<tonic::Response<reg::PluginInfo>, tonic::Status> {
        Ok(tonic::Response::new(reg::PluginInfo {
            r#type: "DRAPlugin".into(),
            name: "future.example.com".into(),
            endpoint: "/nowhere/dra.sock".into(),
            supported_versions: vec!["v2.DRAPlugin".into()],
        }))
    }

    async fn notify_registration_status(
        &self,
        request: tonic::Request<reg::RegistrationStatus>,
    ) -> Result<tonic::Response<reg::RegistrationStatusResponse>, tonic::Status> {
        let _ = self.0.send(request.into_inner());
        Ok(tonic::Response::new(reg::RegistrationStatusResponse {}))
    }
}

async fn unix_channel(path: &Path) -> Channel {
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

async fn health_of(channel: Channel, service: &str) -> ServingStatus {
    let response = HealthClient::new(channel)
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .unwrap()
        .into_inner();
    ServingStatus::try_from(response.status).unwrap()
}

#[tokio::test]
async fn health_is_serving_until_shutdown_begins_on_the_socket_and_on_tcp() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let mut config = config(dir.path());
    config.health_addr = Some("127.0.0.1:0".parse().unwrap());
    let server = KubeletPluginServer::start(config, plugin.clone())
        .await
        .unwrap();
    let addr = server.health_addr().unwrap();
    assert_ne!(addr.port(), 0);
    let tcp = Endpoint::from_shared(format!("http://{addr}"))
        .unwrap()
        .connect()
        .await
        .unwrap();
    let unix = unix_channel(server.dra_socket()).await;
    let names = [
        "",
        "k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin",
        "k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin",
        "v1alpha1.DRAResourceHealth",
        "v1beta1.DRAResourceHealth",
        "v1.DRAResourceHealth",
    ];
    for name in names {
        assert_eq!(
            health_of(tcp.clone(), name).await,
            ServingStatus::Serving,
            "{name:?}"
        );
        assert_eq!(
            health_of(unix.clone(), name).await,
            ServingStatus::Serving,
            "{name:?}"
        );
    }

    server.begin_shutdown().await;
    for name in names {
        assert_eq!(
            health_of(tcp.clone(), name).await,
            ServingStatus::NotServing,
            "{name:?}"
        );
        assert_eq!(
            health_of(unix.clone(), name).await,
            ServingStatus::NotServing,
            "{name:?}"
        );
    }
    let dra_socket = server.dra_socket().to_path_buf();
    let report = within("shutdown", server.shutdown()).await;
    assert!(report.drained);
    assert!(!dra_socket.exists());
    assert!(
        tokio::net::TcpStream::connect(addr).await.is_err(),
        "the health port is closed"
    );
}

#[tokio::test]
async fn malformed_requests_are_refused_precisely() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let kubelet = KubeletClient::connect(server.dra_socket()).await.unwrap();

    for version in DraVersion::ALL {
        let status = call_status(kubelet.prepare(&[], version).await.unwrap_err());
        assert_eq!(status.code(), Code::InvalidArgument, "{version}");
        assert_eq!(status.message(), "the request names no claims");

        let status = call_status(
            kubelet
                .unprepare(&[claim("u", "ns", "a"), claim("", "ns", "b")], version)
                .await
                .unwrap_err(),
        );
        assert_eq!(status.code(), Code::InvalidArgument, "{version}");
        assert!(
            status.message().starts_with("claim 1 "),
            "{}",
            status.message()
        );
    }
    assert!(
        plugin.calls().is_empty(),
        "no claim of a refused call reached the node"
    );

    let claims = [
        claim("no-ns", "", "x"),
        claim("no-name", "ns", ""),
        claim("fine", "ns", "fine"),
    ];
    let answers = kubelet.prepare(&claims, DraVersion::V1).await.unwrap();
    assert!(
        answers[0]
            .result
            .as_ref()
            .unwrap_err()
            .contains("has no namespace"),
        "{answers:?}"
    );
    assert!(
        answers[1]
            .result
            .as_ref()
            .unwrap_err()
            .contains("has no name"),
        "{answers:?}"
    );
    assert_eq!(answers[2].result, Ok(vec![device_for(&claims[2])]));
    assert_eq!(plugin.called_names(), BTreeSet::from(["fine".to_string()]));
    within("shutdown", server.shutdown()).await;
}

/// Sends bytes as a gRPC message, as they are: for protobufs no encoder would write.
#[derive(Debug, Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Bytes;
    type Decode = Bytes;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> RawCodec {
        RawCodec
    }

    fn decoder(&mut self) -> RawCodec {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn encode(&mut self, item: Bytes, dst: &mut EncodeBuf<'_>) -> Result<(), tonic::Status> {
        dst.put(item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Bytes;
    type Error = tonic::Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Bytes>, tonic::Status> {
        Ok(Some(src.copy_to_bytes(src.remaining())))
    }
}

#[tokio::test]
async fn a_malformed_protobuf_is_refused_counted_and_the_server_goes_on() {
    // Only this test sends malformed requests, so these counts are its own. The
    // recorder is installed before the servers start counting.
    crate::process_metrics();
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let channel = unix_channel(server.dra_socket()).await;
    let garbage: [&[u8]; 3] = [
        // claims (field 1) says 127 bytes follow; 2 do.
        &[0x0a, 0x7f, 0x12, 0x00],
        // a claim whose uid is not UTF-8.
        &[0x0a, 0x03, 0x12, 0x01, 0xff],
        // a varint that never ends.
        &[
            0x08, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff,
        ],
    ];
    for path in [
        "/k8s.io.kubelet.pkg.apis.dra.v1.DRAPlugin/NodePrepareResources",
        "/k8s.io.kubelet.pkg.apis.dra.v1beta1.DRAPlugin/NodeUnprepareResources",
    ] {
        for bytes in garbage {
            let mut grpc = tonic::client::Grpc::new(channel.clone());
            grpc.ready().await.unwrap();
            let status = grpc
                .unary(
                    tonic::Request::new(Bytes::copy_from_slice(bytes)),
                    PathAndQuery::from_static(path),
                    RawCodec,
                )
                .await
                .unwrap_err();
            assert_eq!(
                status.code(),
                Code::Internal,
                "{path} {bytes:?}: {status:?}"
            );
        }
    }
    assert!(plugin.calls().is_empty());
    let malformed = |method: &str, version: &str| -> u64 {
        crate::counter(
            domaind_kubelet_plugin::REQUESTS_TOTAL,
            &[
                ("method", method),
                ("version", version),
                ("outcome", "malformed"),
            ],
        )
    };
    assert_eq!(malformed("NodePrepareResources", "v1"), 3);
    assert_eq!(malformed("NodeUnprepareResources", "v1beta1"), 3);

    // The same connection, then a new one, still get answers.
    let mut dra = v1::dra_plugin_client::DraPluginClient::new(channel);
    let response = dra
        .node_prepare_resources(v1::NodePrepareResourcesRequest {
            claims: vec![v1::Claim {
                namespace: "ns".into(),
                uid: "u".into(),
                name: "ok".into(),
            }],
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(response.claims["u"].error, "");
    assert_eq!(response.claims["u"].devices[0].device_name, "channel-ok");
    let kubelet = KubeletClient::connect(server.dra_socket()).await.unwrap();
    let answers = kubelet
        .unprepare(&[claim("u", "ns", "ok")], DraVersion::V1beta1)
        .await
        .unwrap();
    assert_eq!(answers[0].result, Ok(()));
    within("shutdown", server.shutdown()).await;
}

#[tokio::test]
async fn shutdown_refuses_new_calls_and_lets_calls_in_flight_finish() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let sockets = [
        server.dra_socket().to_path_buf(),
        server.registration_socket().to_path_buf(),
    ];
    let kubelet = KubeletClient::connect(server.dra_socket()).await.unwrap();
    let in_flight = tokio::spawn({
        let kubelet = kubelet.clone();
        async move {
            kubelet
                .prepare(&[claim("slow", "ns", "block-slow")], DraVersion::V1)
                .await
        }
    });
    plugin.until_called("block-slow").await;
    assert_eq!(server.calls_in_flight(), 1);

    server.begin_shutdown().await;
    for version in DraVersion::ALL {
        let status = call_status(
            kubelet
                .prepare(&[claim("late", "ns", "late")], version)
                .await
                .unwrap_err(),
        );
        assert_eq!(status.code(), Code::Unavailable, "{version}");
        assert!(
            status.message().contains("shutting down"),
            "{}",
            status.message()
        );
    }
    let status = call_status(
        client::register(server.registration_socket())
            .await
            .unwrap_err(),
    );
    assert_eq!(status.code(), Code::Unavailable);
    assert!(!plugin.called_names().contains("late"));

    let shutdown = tokio::spawn(server.shutdown());
    plugin.release();
    let answers = within("the call in flight", in_flight)
        .await
        .unwrap()
        .unwrap();
    assert_eq!(answers[0].result, Ok(vec![device_for(&answers[0].claim)]));
    let report = within("shutdown", shutdown).await.unwrap();
    assert!(report.drained, "{report:?}");
    assert_eq!(report.abandoned_calls, 0);
    for socket in &sockets {
        assert!(!socket.exists(), "{} removed", socket.display());
    }
    assert!(KubeletClient::connect(&sockets[0]).await.is_err());
}

#[tokio::test]
async fn shutdown_stops_waiting_for_a_call_after_the_drain_timeout() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let mut config = config(dir.path());
    config.drain_timeout = Duration::from_millis(100);
    let server = KubeletPluginServer::start(config, plugin.clone())
        .await
        .unwrap();
    let dra_socket = server.dra_socket().to_path_buf();
    let kubelet = KubeletClient::connect(&dra_socket).await.unwrap();
    let stuck = tokio::spawn(async move {
        kubelet
            .prepare(&[claim("stuck", "ns", "block-stuck")], DraVersion::V1)
            .await
    });
    plugin.until_called("block-stuck").await;
    let report = within("shutdown", server.shutdown()).await;
    assert!(!report.drained);
    assert_eq!(report.abandoned_calls, 1);
    assert!(!dra_socket.exists());
    let cut_off = within("the abandoned call", stuck).await.unwrap();
    assert!(cut_off.is_err(), "{cut_off:?}");
    within(
        "the abandoned call to be dropped",
        plugin.active.subscribe().wait_for(|n| *n == 0),
    )
    .await
    .unwrap();
}

fn socket_kind(path: &Path) -> &'static str {
    use std::os::unix::fs::FileTypeExt;
    match std::fs::symlink_metadata(path) {
        Ok(meta) if meta.file_type().is_socket() => "socket",
        Ok(_) => "other",
        Err(_) => "missing",
    }
}

#[tokio::test]
async fn a_stale_socket_is_replaced() {
    let dir = short_dir();
    let config = config(dir.path());
    for path in [config.dra_socket(), config.registration_socket()] {
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        // Bound and closed: the file stays, nobody listens.
        drop(std::os::unix::net::UnixListener::bind(&path).unwrap());
        assert_eq!(socket_kind(&path), "socket");
    }
    let plugin = FakeNodePlugin::new();
    let server = KubeletPluginServer::start(config, plugin.clone())
        .await
        .unwrap();
    let kubelet = KubeletClient::connect(server.dra_socket()).await.unwrap();
    let answers = kubelet
        .prepare(&[claim("u", "ns", "ok")], DraVersion::V1)
        .await
        .unwrap();
    assert!(answers[0].result.is_ok());
    within("register", client::register(server.registration_socket()))
        .await
        .unwrap();
    within("shutdown", server.shutdown()).await;
}

#[tokio::test]
async fn a_live_socket_is_never_taken_over() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let first = serve(dir.path(), &plugin).await;
    let error = KubeletPluginServer::start(config(dir.path()), plugin.clone())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, PluginServerError::SocketInUse { path } if path == first.dra_socket()),
        "{error}"
    );
    assert!(error.to_string().contains("socket path in use"), "{error}");
    // The first server is untouched.
    let kubelet = KubeletClient::connect(first.dra_socket()).await.unwrap();
    assert!(
        kubelet
            .prepare(&[claim("u", "ns", "ok")], DraVersion::V1)
            .await
            .unwrap()[0]
            .result
            .is_ok()
    );
    within("shutdown", first.shutdown()).await;
}

#[tokio::test]
async fn a_live_registration_socket_fails_start_and_leaves_no_dra_socket_behind() {
    let dir = short_dir();
    let config = config(dir.path());
    let registration = config.registration_socket();
    std::fs::create_dir_all(registration.parent().unwrap()).unwrap();
    let _someone_else = std::os::unix::net::UnixListener::bind(&registration).unwrap();
    let dra_socket = config.dra_socket();
    let error = KubeletPluginServer::start(config, FakeNodePlugin::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, PluginServerError::SocketInUse { path } if *path == registration),
        "{error}"
    );
    assert_eq!(socket_kind(&dra_socket), "missing");
    assert_eq!(socket_kind(&registration), "socket");
}

#[tokio::test]
async fn a_file_that_is_not_a_socket_is_never_deleted() {
    let dir = short_dir();
    let config = config(dir.path());
    let path: PathBuf = config.dra_socket();
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    std::fs::write(&path, "precious").unwrap();
    let error = KubeletPluginServer::start(config.clone(), FakeNodePlugin::new())
        .await
        .unwrap_err();
    assert!(
        matches!(&error, PluginServerError::NotASocket { path: p, found: "regular file" } if *p == path),
        "{error}"
    );
    assert!(error.to_string().contains("not a unix socket"), "{error}");
    assert_eq!(std::fs::read_to_string(&path).unwrap(), "precious");

    std::fs::remove_file(&path).unwrap();
    std::fs::create_dir(&path).unwrap();
    let error = KubeletPluginServer::start(config, FakeNodePlugin::new())
        .await
        .unwrap_err();
    assert!(
        matches!(
            &error,
            PluginServerError::NotASocket {
                found: "directory",
                ..
            }
        ),
        "{error}"
    );
    assert!(path.is_dir());
}

#[tokio::test]
async fn a_socket_path_too_long_for_unix_sockets_is_refused_up_front() {
    let dir = short_dir();
    let mut config = config(dir.path());
    config.plugins_dir = dir.path().join("p".repeat(100));
    let error = KubeletPluginServer::start(config, FakeNodePlugin::new())
        .await
        .unwrap_err();
    assert!(
        matches!(error, PluginServerError::SocketPathTooLong { max: 107, .. }),
        "{error}"
    );
}

#[tokio::test]
async fn dropping_the_handle_stops_the_servers_and_removes_the_sockets() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let sockets = [
        server.dra_socket().to_path_buf(),
        server.registration_socket().to_path_buf(),
    ];
    drop(server);
    for socket in &sockets {
        assert_eq!(socket_kind(socket), "missing", "{}", socket.display());
    }
    // The same paths can be served again at once.
    let again = serve(dir.path(), &plugin).await;
    within("shutdown", again.shutdown()).await;
}

#[tokio::test]
async fn a_health_watch_sees_not_serving_and_does_not_hold_shutdown_up() {
    let dir = short_dir();
    let plugin = FakeNodePlugin::new();
    let server = serve(dir.path(), &plugin).await;
    let channel = unix_channel(server.dra_socket()).await;
    let mut watch = HealthClient::new(channel)
        .watch(HealthCheckRequest {
            service: String::new(),
        })
        .await
        .unwrap()
        .into_inner();
    let status = |message: Option<tonic_health::pb::HealthCheckResponse>| {
        ServingStatus::try_from(message.unwrap().status).unwrap()
    };
    let first = within("first health", watch.message()).await.unwrap();
    assert_eq!(status(first), ServingStatus::Serving);

    let dra_socket = server.dra_socket().to_path_buf();
    let shutdown = tokio::spawn(server.shutdown());
    let next = within("health change", watch.message()).await.unwrap();
    assert_eq!(status(next), ServingStatus::NotServing);
    // The open stream keeps its connection busy: shutdown cuts it after a grace.
    let report = within("shutdown", shutdown).await.unwrap();
    assert!(report.drained);
    assert!(!dra_socket.exists());
    let end = within("end of the watch", watch.message()).await;
    assert!(!matches!(end, Ok(Some(_))), "{end:?}");
}
