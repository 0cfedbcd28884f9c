//! Talking to a rack's daemons from outside, as an operator would: their HTTP
//! endpoints, and prepare calls over the kubelet's socket.

use std::net::SocketAddr;
use std::time::Duration;

use anyhow::{Context as _, bail};
use http_body_util::{BodyExt as _, Empty};
use hyper::body::Bytes;
use hyper_util::rt::TokioIo;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;

use domaind_actors::model::ClaimRef;

use domaind_kubelet_plugin::client::KubeletClient;
use domaind_kubelet_plugin::{DraVersion, PreparedDevice};
use domaind_node::run::{NodeView, RunInfo};

/// How long one HTTP request may take.
const HTTP_TIMEOUT: Duration = Duration::from_secs(5);

/// `GET path` on `addr`: the status code and body.
pub async fn http_get(addr: SocketAddr, path: &str) -> anyhow::Result<(u16, String)> {
    let exchange = async {
        let stream = TcpStream::connect(addr).await?;
        http_get_over(stream, &addr.to_string(), path).await
    };
    tokio::time::timeout(HTTP_TIMEOUT, exchange)
        .await
        .with_context(|| format!("GET {path} on {addr} took over {HTTP_TIMEOUT:?}"))?
        .with_context(|| format!("GET {path} on {addr}"))
}

/// `GET path` over a connection already open (a port-forward's stream), `host` as the
/// Host header: the status code and body. Not bounded: the caller bounds it.
pub async fn http_get_over<S>(stream: S, host: &str, path: &str) -> anyhow::Result<(u16, String)>
where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let (mut sender, connection) =
        hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    tokio::spawn(connection);
    let request = hyper::Request::get(path)
        .header(hyper::header::HOST, host)
        .body(Empty::<Bytes>::new())?;
    let response = sender.send_request(request).await?;
    let status = response.status().as_u16();
    let body = response.into_body().collect().await?.to_bytes();
    Ok((status, String::from_utf8_lossy(&body).into_owned()))
}

/// A daemon's `/state`, from the listener its `run.json` names.
pub async fn node_view(info: &RunInfo) -> anyhow::Result<NodeView> {
    let Some(addr) = info.state_addr else {
        bail!("{} serves no /state (--state-addr off)", info.node);
    };
    let (status, body) = http_get(addr, "/state").await?;
    if status != 200 {
        bail!("/state on {addr} answered {status}: {body}");
    }
    serde_json::from_str(&body).with_context(|| format!("/state on {addr}"))
}

/// What a prepare call for one claim answered.
pub type PrepareAnswer = Result<Vec<PreparedDevice>, String>;

/// Prepares `claim` over `dra_socket` until it succeeds, as the kubelet retries; an
/// answer that is not about readiness, or `limit` passing, ends it with that answer.
pub async fn prepare_until_ready(
    dra_socket: &std::path::Path,
    claim: &ClaimRef,
    version: DraVersion,
    limit: Duration,
) -> anyhow::Result<PrepareAnswer> {
    let deadline = tokio::time::Instant::now() + limit;
    let client = KubeletClient::connect(dra_socket).await?;
    loop {
        let mut answers = client.prepare(std::slice::from_ref(claim), version).await?;
        let answer = answers
            .pop()
            .context("the plugin answered no claim")?
            .result;
        match answer {
            Err(error)
                if error.contains("not ready yet") && tokio::time::Instant::now() < deadline => {}
            answer => return Ok(answer),
        }
    }
}
