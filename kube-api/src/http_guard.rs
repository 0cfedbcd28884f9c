//! The HTTP/1 server under every endpoint we serve over TCP, with limits a network peer
//! cannot get around: request headers must arrive within a deadline (a slowloris
//! connection is closed instead of holding a task and a socket for good), and headers and
//! bodies have a size limit. The limits are hyper's (header deadline and size) and
//! tower-http's (body size); this module adds what they lack: counting and logging
//! refusals, telling an idle keep-alive connection from a slow one, and stopping.
//!
//! Each refusal counts in `domaind_http_requests_refused_total` with its reason, and the
//! first of each reason is logged at warn (later ones at debug: a peer that floods us
//! must not flood the log). A keep-alive connection left idle after an answer is closed
//! by the same deadline without counting as a refusal.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Duration;

use axum::Router;
use axum::http::{Request, Response, StatusCode};
use hyper::body::Incoming;
use hyper_util::rt::{TokioIo, TokioTimer};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::TcpListener;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt as _;
use tower_http::limit::RequestBodyLimitLayer;

pub const REQUESTS_REFUSED: &str = "domaind_http_requests_refused_total";

/// What a request may cost us.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct HttpLimits {
    /// From the moment the server waits for a request until its headers are complete;
    /// an idle keep-alive connection is closed after it too.
    pub header_read_timeout: Duration,
    /// The request line and headers together, in bytes.
    pub max_header_bytes: usize,
    /// A body announced larger is refused with 413 before the router sees it; a chunked
    /// one is cut off there.
    pub max_body_bytes: usize,
}

impl Default for HttpLimits {
    /// Our requests are probes and scrapes: a few hundred bytes, no body, sent at once.
    fn default() -> Self {
        Self {
            header_read_timeout: Duration::from_secs(5),
            max_header_bytes: 16 * 1024,
            max_body_bytes: 64 * 1024,
        }
    }
}

/// Why a request or connection was refused: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Refusal {
    HeaderTimeout,
    HeadersTooLarge,
    BodyTooLarge,
}

impl Refusal {
    const ALL: [Refusal; 3] = [
        Refusal::HeaderTimeout,
        Refusal::HeadersTooLarge,
        Refusal::BodyTooLarge,
    ];

    fn label(self) -> &'static str {
        match self {
            Refusal::HeaderTimeout => "header_timeout",
            Refusal::HeadersTooLarge => "headers_too_large",
            Refusal::BodyTooLarge => "body_too_large",
        }
    }

    fn of(error: &hyper::Error) -> Option<Self> {
        if error.is_timeout() {
            Some(Refusal::HeaderTimeout)
        } else if error.is_parse_too_large() {
            Some(Refusal::HeadersTooLarge)
        } else {
            None
        }
    }
}

/// Counts refusals, and remembers which reasons this server has logged at warn.
#[derive(Debug, Default)]
struct Refusals {
    warned: [AtomicBool; Refusal::ALL.len()],
}

impl Refusals {
    fn record(&self, refusal: Refusal, server: SocketAddr, peer: SocketAddr) {
        metrics::counter!(REQUESTS_REFUSED, "reason" => refusal.label()).increment(1);
        let first = !self.warned[refusal as usize].swap(true, Ordering::Relaxed);
        let reason = refusal.label();
        if first {
            tracing::warn!(%server, %peer, reason, "HTTP request refused (later ones are logged at debug)");
        } else {
            tracing::debug!(%server, %peer, reason, "HTTP request refused");
        }
    }
}

/// Binds `addr` and serves `app` under `limits` until `stop` is cancelled; then stops
/// accepting, lets requests in flight finish, and ends. Returns the bound address (the
/// port may have been 0) and the server's task.
pub async fn serve(
    addr: SocketAddr,
    app: Router,
    limits: HttpLimits,
    stop: CancellationToken,
) -> std::io::Result<(SocketAddr, tokio::task::JoinHandle<()>)> {
    let listener = TcpListener::bind(addr).await?;
    let bound = listener.local_addr()?;
    let task = tokio::spawn(accept(listener, bound, app, limits, stop));
    Ok((bound, task))
}

async fn accept(
    listener: TcpListener,
    bound: SocketAddr,
    app: Router,
    limits: HttpLimits,
    stop: CancellationToken,
) {
    let refusals = Arc::new(Refusals::default());
    let mut connections = JoinSet::new();
    loop {
        tokio::select! {
            () = stop.cancelled() => break,
            Some(_) = connections.join_next(), if !connections.is_empty() => {}
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    connections.spawn(connection(
                        stream,
                        peer,
                        bound,
                        app.clone(),
                        limits,
                        refusals.clone(),
                        stop.clone(),
                    ));
                }
                // Out of file descriptors and the like: the next accept may succeed, and
                // a peer must not be able to stop the server by provoking one.
                Err(error) => tracing::warn!(server = %bound, %error, "accepting an HTTP connection failed"),
            },
        }
    }
    drop(listener);
    while connections.join_next().await.is_some() {}
}

async fn connection(
    stream: tokio::net::TcpStream,
    peer: SocketAddr,
    server: SocketAddr,
    app: Router,
    limits: HttpLimits,
    refusals: Arc<Refusals>,
    stop: CancellationToken,
) {
    let stream = Watched::new(stream);
    let progress = stream.progress.clone();
    let body_refusals = refusals.clone();
    // A 413 is the limit's: tower-http's answer to an announced length, or the router's
    // when the limited body of a chunked request runs out. Hyper closes the connection
    // after it unless the unread body was already on the wire to be drained.
    let guarded = tower::ServiceBuilder::new()
        .map_response(move |response: Response<_>| {
            if response.status() == StatusCode::PAYLOAD_TOO_LARGE {
                body_refusals.record(Refusal::BodyTooLarge, server, peer);
            }
            response
        })
        .layer(RequestBodyLimitLayer::new(limits.max_body_bytes))
        .service(app);
    let service = hyper::service::service_fn(move |request: Request<Incoming>| {
        progress.request_read();
        guarded.clone().oneshot(request)
    });
    let mut builder = hyper::server::conn::http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout)
        .max_header_size(limits.max_header_bytes);
    let progress = stream.progress.clone();
    let served = builder.serve_connection(TokioIo::new(stream), service);
    tokio::pin!(served);
    let outcome = tokio::select! {
        outcome = served.as_mut() => outcome,
        () = stop.cancelled() => {
            served.as_mut().graceful_shutdown();
            served.await
        }
    };
    if let Err(error) = outcome {
        match Refusal::of(&error) {
            // A keep-alive connection nobody used since its last answer (a scraper's,
            // between scrapes) is closed by the same deadline, and is no refusal.
            Some(Refusal::HeaderTimeout) if progress.idle() => {
                tracing::debug!(%server, %peer, "idle HTTP connection closed");
            }
            Some(refusal) => refusals.record(refusal, server, peer),
            None => tracing::debug!(%server, %peer, %error, "HTTP connection ended with an error"),
        }
    }
}

/// How far a connection got: bytes read in all, and how many of them had been read when
/// the last request's headers were complete.
#[derive(Debug, Default)]
struct Progress {
    read: AtomicU64,
    at_last_request: AtomicU64,
    requests: AtomicU64,
}

impl Progress {
    fn request_read(&self) {
        self.requests.fetch_add(1, Ordering::Relaxed);
        self.at_last_request
            .store(self.read.load(Ordering::Relaxed), Ordering::Relaxed);
    }

    /// Answered at least once, and not a byte of another request since (a body read
    /// after the headers also counts as a byte: such a connection is not called idle).
    fn idle(&self) -> bool {
        self.requests.load(Ordering::Relaxed) > 0
            && self.read.load(Ordering::Relaxed) == self.at_last_request.load(Ordering::Relaxed)
    }
}

/// A stream that tells [`Progress`] what it reads.
struct Watched<S> {
    inner: S,
    progress: Arc<Progress>,
}

impl<S> Watched<S> {
    fn new(inner: S) -> Self {
        Self {
            inner,
            progress: Arc::default(),
        }
    }
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let before = buf.filled().len();
        let polled = Pin::new(&mut self.inner).poll_read(cx, buf);
        let read = (buf.filled().len() - before) as u64;
        self.progress.read.fetch_add(read, Ordering::Relaxed);
        polled
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write(cx, buf)
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[std::io::IoSlice<'_>],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.inner).poll_write_vectored(cx, bufs)
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests;
