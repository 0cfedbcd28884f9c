use axum::body::Bytes;
use axum::routing::{get, post};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpStream;
use tokio::time::Instant;

use super::*;

fn app() -> Router {
    Router::new().route("/", get(|| async { "ok\n" })).route(
        "/upload",
        post(|body: Bytes| async move { format!("{} bytes\n", body.len()) }),
    )
}

async fn start(limits: HttpLimits) -> (SocketAddr, CancellationToken, tokio::task::JoinHandle<()>) {
    let stop = CancellationToken::new();
    let (addr, task) = serve("127.0.0.1:0".parse().unwrap(), app(), limits, stop.clone())
        .await
        .unwrap();
    (addr, stop, task)
}

/// Everything the server sends until it closes the connection; a reset counts as closed.
async fn read_until_closed(stream: &mut TcpStream) -> String {
    let mut answer = Vec::new();
    let _ = stream.read_to_end(&mut answer).await;
    String::from_utf8_lossy(&answer).into_owned()
}

/// Refusals for `reason` since the last look (a snapshot takes the counts).
fn refused(recorder: &DebuggingRecorder, reason: &str) -> u64 {
    recorder
        .snapshotter()
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == REQUESTS_REFUSED)
        .filter(|(key, ..)| key.key().labels().any(|l| l.value() == reason))
        .map(|(.., value)| match value {
            DebugValue::Counter(count) => count,
            other => panic!("{REQUESTS_REFUSED} is a counter, not {other:?}"),
        })
        .sum()
}

#[tokio::test(start_paused = true)]
async fn a_request_whose_headers_never_finish_is_closed_at_the_deadline() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let limits = HttpLimits::default();
    let (addr, stop, task) = start(limits).await;

    let started = Instant::now();
    let mut slow = TcpStream::connect(addr).await.unwrap();
    // No blank line: the headers never end.
    slow.write_all(b"GET / HTTP/1.1\r\nHost: x\r\nX-Slow: ")
        .await
        .unwrap();
    let mut silent = TcpStream::connect(addr).await.unwrap();
    // Answered, then idle: waiting for a next request's headers is the same wait, but a
    // scraper's kept connection is not an attack and is not counted.
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    // Answered, then slow in its next request's headers: counted.
    let mut relapsed = TcpStream::connect(addr).await.unwrap();
    relapsed
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut head = [0u8; 12];
    relapsed.read_exact(&mut head).await.unwrap();
    assert_eq!(&head, b"HTTP/1.1 200");
    relapsed.write_all(b"GET / HTTP/1.1\r\n").await.unwrap();
    let closed = tokio::time::timeout(limits.header_read_timeout * 4, async {
        let answered = read_until_closed(&mut idle).await;
        read_until_closed(&mut slow).await;
        read_until_closed(&mut silent).await;
        read_until_closed(&mut relapsed).await;
        answered
    })
    .await;

    let answered = closed.expect("the connections are still open");
    assert!(answered.starts_with("HTTP/1.1 200"), "{answered}");
    let waited = started.elapsed();
    assert!(
        waited >= limits.header_read_timeout && waited < limits.header_read_timeout * 2,
        "closed after {waited:?}"
    );
    assert_eq!(refused(&recorder, "header_timeout"), 3);

    // The server still answers those that finish their headers.
    let mut prompt = TcpStream::connect(addr).await.unwrap();
    prompt
        .write_all(b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        .await
        .unwrap();
    assert!(
        read_until_closed(&mut prompt)
            .await
            .starts_with("HTTP/1.1 200")
    );

    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn oversized_headers_are_refused() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let limits = HttpLimits::default();
    let (addr, stop, task) = start(limits).await;

    let mut stream = TcpStream::connect(addr).await.unwrap();
    let padding = "a".repeat(limits.max_header_bytes);
    let request = format!("GET / HTTP/1.1\r\nHost: x\r\nX-Padding: {padding}\r\n\r\n");
    // The server may close before it has read it all: a failed write is fine.
    let _ = stream.write_all(request.as_bytes()).await;
    let answer = read_until_closed(&mut stream).await;

    assert!(answer.starts_with("HTTP/1.1 431"), "{answer}");
    assert_eq!(refused(&recorder, "headers_too_large"), 1);
    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn an_oversized_body_is_refused_before_it_is_read() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let limits = HttpLimits::default();
    let (addr, stop, task) = start(limits).await;

    let mut stream = TcpStream::connect(addr).await.unwrap();
    let announced = limits.max_body_bytes + 1;
    let request = format!("POST / HTTP/1.1\r\nHost: x\r\nContent-Length: {announced}\r\n\r\n");
    stream.write_all(request.as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut stream).await;

    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(refused(&recorder, "body_too_large"), 1);

    // A body within the limit reaches the router (which has no POST here).
    let mut stream = TcpStream::connect(addr).await.unwrap();
    stream
        .write_all(
            b"POST / HTTP/1.1\r\nHost: x\r\nConnection: close\r\nContent-Length: 2\r\n\r\nhi",
        )
        .await
        .unwrap();
    let answer = read_until_closed(&mut stream).await;
    assert!(answer.starts_with("HTTP/1.1 405"), "{answer}");
    assert_eq!(refused(&recorder, "body_too_large"), 0);

    stop.cancel();
    task.await.unwrap();
}

#[tokio::test]
async fn a_chunked_body_is_cut_off_at_the_limit() {
    let recorder = DebuggingRecorder::new();
    let _local = metrics::set_default_local_recorder(&recorder);
    let limits = HttpLimits::default();
    let (addr, stop, task) = start(limits).await;
    let chunked = |size: usize| {
        format!(
            "POST /upload HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\
             Transfer-Encoding: chunked\r\n\r\n{size:x}\r\n{}\r\n0\r\n\r\n",
            "a".repeat(size)
        )
    };

    let mut within = TcpStream::connect(addr).await.unwrap();
    within.write_all(chunked(10).as_bytes()).await.unwrap();
    let answer = read_until_closed(&mut within).await;
    assert!(answer.starts_with("HTTP/1.1 200"), "{answer}");
    assert!(answer.ends_with("10 bytes\n"), "{answer}");
    assert_eq!(refused(&recorder, "body_too_large"), 0);

    let mut over = TcpStream::connect(addr).await.unwrap();
    // The server may close before it has read it all: a failed write is fine.
    let _ = over
        .write_all(chunked(limits.max_body_bytes + 1).as_bytes())
        .await;
    let answer = read_until_closed(&mut over).await;
    assert!(answer.starts_with("HTTP/1.1 413"), "{answer}");
    assert_eq!(refused(&recorder, "body_too_large"), 1);

    stop.cancel();
    task.await.unwrap();
}

#[tokio::test(start_paused = true)]
async fn stopping_ends_the_server_and_its_idle_connections() {
    let limits = HttpLimits::default();
    let (addr, stop, task) = start(limits).await;
    let mut idle = TcpStream::connect(addr).await.unwrap();
    idle.write_all(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n")
        .await
        .unwrap();
    let mut first = [0u8; 12];
    idle.read_exact(&mut first).await.unwrap();
    assert_eq!(&first, b"HTTP/1.1 200");

    stop.cancel();
    // Well before the header deadline would close the connection anyway.
    tokio::time::timeout(limits.header_read_timeout / 2, task)
        .await
        .expect("the server waited on an idle keep-alive connection")
        .unwrap();
}
