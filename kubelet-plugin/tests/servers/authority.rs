//! The kubelet plugin's sockets answer the `:authority` values real clients send, which
//! tonic's own client never sends: grpc-go in the kubelet's plugin watcher dials the
//! registration socket by path and sends the percent-encoded path; Python's grpc sends
//! the same on any unix socket. A raw HTTP/2 client sends them here, as those clients do.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use domaind_actors::model::ClaimRef;
use domaind_kubelet_api::pluginregistration::PluginInfo;
use domaind_kubelet_plugin::{
    AUTHORITY_REWRITES_TOTAL, BAD_FRAMES_TOTAL, ClaimFailure, KubeletPluginServer, NodePlugin,
    PluginServerConfig, PreparedDevice, RunningPluginServer,
};
use loona_hpack::{Decoder, Encoder};
use prost::Message;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::UnixStream;

const LIMIT: Duration = Duration::from_secs(10);
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// Prepares nothing: these tests only call registration and health.
struct NoClaims;

#[async_trait]
impl NodePlugin for NoClaims {
    async fn prepare(&self, _: ClaimRef) -> Result<Vec<PreparedDevice>, ClaimFailure> {
        Err(ClaimFailure::permanent("no claims here"))
    }

    async fn unprepare(&self, _: ClaimRef) -> Result<(), ClaimFailure> {
        Ok(())
    }
}

fn counter(name: &str, socket: &str) -> u64 {
    crate::counter(name, &[("socket", socket)])
}

async fn start(dir: &Path) -> RunningPluginServer {
    let config = PluginServerConfig {
        plugins_dir: dir.join("plugins"),
        registry_dir: dir.join("plugins_registry"),
        ..PluginServerConfig::default()
    };
    KubeletPluginServer::start(config, Arc::new(NoClaims))
        .await
        .unwrap()
}

/// grpc-go's and Python grpc's default authority for a unix socket path.
fn percent_encoded(path: &Path) -> String {
    path.to_str()
        .unwrap()
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'-' | b'.' | b'_' | b'~' => {
                (b as char).to_string()
            }
            other => format!("%{other:02X}"),
        })
        .collect()
}

fn frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let mut out = (payload.len() as u32).to_be_bytes()[1..].to_vec();
    out.extend([frame_type, flags]);
    out.extend(stream.to_be_bytes());
    out.extend(payload);
    out
}

/// What came back for one unary call.
#[derive(Debug, Default)]
struct Answer {
    headers: Vec<(String, String)>,
    body: Vec<u8>,
    reset: Option<u32>,
}

impl Answer {
    fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_str())
    }
}

/// One unary gRPC call over a fresh connection, with `authority` as the client sends it.
async fn call(socket: &Path, authority: &str, path: &str, message: &[u8]) -> Answer {
    let mut stream = UnixStream::connect(socket).await.unwrap();
    let mut encoder = Encoder::new();
    let headers = [
        (":method", "POST"),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
        ("content-type", "application/grpc"),
        ("te", "trailers"),
        ("user-agent", "grpc-go/1.72.1"),
    ];
    let block = encoder.encode(headers.iter().map(|(n, v)| (n.as_bytes(), v.as_bytes())));
    let mut body = vec![0];
    body.extend((message.len() as u32).to_be_bytes());
    body.extend(message);

    let mut out = PREFACE.to_vec();
    out.extend(frame(0x4, 0, 0, &[]));
    out.extend(frame(0x1, 0x4, 1, &block));
    out.extend(frame(0x0, 0x1, 1, &body));
    stream.write_all(&out).await.unwrap();

    let mut decoder = Decoder::new();
    let mut answer = Answer::default();
    tokio::time::timeout(LIMIT, async {
        loop {
            let mut header = [0u8; 9];
            stream.read_exact(&mut header).await.unwrap();
            let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
            let mut payload = vec![0; len];
            stream.read_exact(&mut payload).await.unwrap();
            let (frame_type, flags) = (header[3], header[4]);
            let id = u32::from_be_bytes([header[5], header[6], header[7], header[8]]);
            match frame_type {
                // SETTINGS from the server: acknowledge, as every client does.
                0x4 if flags & 0x1 == 0 => {
                    stream.write_all(&frame(0x4, 0x1, 0, &[])).await.unwrap()
                }
                0x1 if id == 1 => {
                    assert_eq!(flags & 0x4, 0x4, "small answers fit in one frame");
                    for (name, value) in decoder.decode(&payload).unwrap() {
                        answer.headers.push((
                            String::from_utf8(name).unwrap(),
                            String::from_utf8(value).unwrap(),
                        ));
                    }
                    if flags & 0x1 != 0 {
                        return;
                    }
                }
                0x0 if id == 1 => answer.body.extend(&payload),
                0x3 if id == 1 => {
                    answer.reset = Some(u32::from_be_bytes(payload[..4].try_into().unwrap()));
                    return;
                }
                0x7 => panic!("GOAWAY: {payload:?}"),
                _ => {}
            }
        }
    })
    .await
    .expect("an answer within the limit");
    answer
}

fn grpc_message(body: &[u8]) -> &[u8] {
    assert!(body.len() >= 5, "a gRPC message: {body:?}");
    assert_eq!(body[0], 0, "not compressed");
    &body[5..]
}

#[tokio::test]
async fn the_kubelets_and_pythons_authorities_are_answered_on_both_sockets() {
    let before = (
        counter(AUTHORITY_REWRITES_TOTAL, "registration"),
        counter(AUTHORITY_REWRITES_TOTAL, "dra"),
    );
    let dir = tempfile::Builder::new()
        .prefix("dmauth")
        .tempdir_in("/tmp")
        .unwrap();
    let server = start(dir.path()).await;

    // What the kubelet's plugin watcher sends: the registration socket's path.
    let registration = server.registration_socket().to_path_buf();
    let answer = call(
        &registration,
        &percent_encoded(&registration),
        "/pluginregistration.Registration/GetInfo",
        &[],
    )
    .await;
    assert_eq!(answer.reset, None, "{answer:?}");
    assert_eq!(answer.header(":status"), Some("200"));
    assert_eq!(answer.header("grpc-status"), Some("0"), "{answer:?}");
    let info = PluginInfo::decode(grpc_message(&answer.body)).unwrap();
    assert_eq!(info.name, "compute-domain.nvidia.com");
    assert_eq!(info.endpoint, server.dra_socket().to_str().unwrap());

    // What Python's grpc sends for `unix:<path>`: the DRA socket's path; health answers.
    let dra = server.dra_socket().to_path_buf();
    let answer = call(
        &dra,
        &percent_encoded(&dra),
        "/grpc.health.v1.Health/Check",
        &[],
    )
    .await;
    assert_eq!(answer.reset, None, "{answer:?}");
    assert_eq!(answer.header("grpc-status"), Some("0"), "{answer:?}");
    // HealthCheckResponse { status: SERVING (1) }.
    assert_eq!(grpc_message(&answer.body), [0x08, 0x01]);

    // A plain path, as grpc-java and older clients send it, and a valid one, untouched.
    let answer = call(
        &dra,
        dra.to_str().unwrap(),
        "/grpc.health.v1.Health/Check",
        &[],
    )
    .await;
    assert_eq!(answer.header("grpc-status"), Some("0"), "{answer:?}");
    let answer = call(&dra, "localhost", "/grpc.health.v1.Health/Check", &[]).await;
    assert_eq!(answer.header("grpc-status"), Some("0"), "{answer:?}");

    assert_eq!(
        counter(AUTHORITY_REWRITES_TOTAL, "registration") - before.0,
        1
    );
    assert_eq!(counter(AUTHORITY_REWRITES_TOTAL, "dra") - before.1, 2);
    server.shutdown().await;
}

#[tokio::test]
async fn a_connection_that_is_not_http2_is_closed_counted_and_the_socket_serves_on() {
    let dir = tempfile::Builder::new()
        .prefix("dmauth")
        .tempdir_in("/tmp")
        .unwrap();
    let server = start(dir.path()).await;
    let registration = server.registration_socket().to_path_buf();
    let before = counter(BAD_FRAMES_TOTAL, "registration");

    let mut stream = UnixStream::connect(&registration).await.unwrap();
    stream
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut rest = Vec::new();
    let read = tokio::time::timeout(LIMIT, stream.read_to_end(&mut rest))
        .await
        .expect("the connection is closed");
    drop(read);
    assert_eq!(counter(BAD_FRAMES_TOTAL, "registration") - before, 1);

    let answer = call(
        &registration,
        "localhost",
        "/pluginregistration.Registration/GetInfo",
        &[],
    )
    .await;
    assert_eq!(answer.header("grpc-status"), Some("0"), "{answer:?}");
    server.shutdown().await;
}
