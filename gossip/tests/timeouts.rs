//! Every timeout of the TLS transport, in paused time: the clock jumps to the next
//! deadline as soon as every task waits, so these tests take no wall time.

mod common;
use common::poll_until_true;

use std::net::SocketAddr;
use std::time::Duration;

use chitchat::transport::Transport;
use common::{Metrics, Pki, any_port, syn, within};
use domaind_gossip::metrics::{CONNECT_FAILURES, FRAMES_DROPPED, FRAMES_SENT};
use domaind_gossip::transport::{TlsTransport, TransportLimits};
use futures::StreamExt;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tokio_rustls::TlsAcceptor;
use tokio_util::codec::FramedRead;

const LIMIT: Duration = Duration::from_secs(600);

async fn sender(pki: &Pki, limits: TransportLimits) -> Box<dyn chitchat::transport::Socket> {
    let transport = TlsTransport::new(pki.node_tls("sender"), 1, limits);
    let addr = transport.bind(any_port(1)).await.unwrap();
    transport.open(addr).await.unwrap()
}

#[tokio::test(start_paused = true)]
async fn idle_outbound_connection_is_closed_after_its_timeout() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let limits = TransportLimits::default();
    let idle = limits.outbound_idle_timeout;
    let mut socket = sender(&pki, limits).await;

    // A peer that accepts, reads one frame, then waits for the sender to hang up.
    let peer_tls = pki.node_tls("peer");
    let listener = TcpListener::bind(any_port(2)).await.unwrap();
    let peer_addr = listener.local_addr().unwrap();
    let peer = tokio::spawn(async move {
        let (tcp, _) = listener.accept().await.unwrap();
        let tls = TlsAcceptor::from(peer_tls.material().server_config())
            .accept(tcp)
            .await
            .unwrap();
        let mut frames = FramedRead::new(tls, domaind_gossip::transport::frame::codec(1 << 20));
        frames.next().await.unwrap().unwrap();
        let read_first = tokio::time::Instant::now();
        assert!(frames.next().await.is_none_or(|r| r.is_err()));
        read_first.elapsed()
    });

    socket.send(peer_addr, syn("hello")).await.unwrap();
    let held_open = within("the sender to close its idle connection", LIMIT, peer)
        .await
        .unwrap();
    assert!(
        held_open >= idle,
        "closed after {held_open:?}, before the idle timeout {idle:?}"
    );
    assert_eq!(metrics.counter(FRAMES_SENT, None), 1);
}

#[tokio::test(start_paused = true)]
async fn idle_inbound_connection_is_closed_after_its_timeout() {
    let pki = Pki::new();
    let limits = TransportLimits::default();
    let idle = limits.inbound_idle_timeout;
    let transport = TlsTransport::new(pki.node_tls("receiver"), 1, limits);
    let addr = transport.bind(any_port(1)).await.unwrap();
    let mut receiver = transport.open(addr).await.unwrap();

    // A raw client: handshakes, sends nothing, and measures how long it is tolerated.
    let client_tls = pki.node_tls("client");
    let client = tokio::spawn(async move {
        let tcp = tokio::net::TcpStream::connect(addr).await.unwrap();
        let mut tls = tokio_rustls::TlsConnector::from(client_tls.material().client_config())
            .connect(
                rustls_pki_types::ServerName::IpAddress(addr.ip().into()),
                tcp,
            )
            .await
            .unwrap();
        let connected = tokio::time::Instant::now();
        let mut buf = [0u8; 16];
        while let Ok(n) = tls.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
        connected.elapsed()
    });
    let held_open = within("the receiver to close the idle connection", LIMIT, async {
        tokio::select! {
            held = client => held.unwrap(),
            _ = receiver.recv() => panic!("nothing was sent"),
        }
    })
    .await;
    assert!(
        held_open >= idle,
        "closed after {held_open:?}, before {idle:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn connect_timeout_then_backoff_without_blocking_send() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut socket = sender(&pki, TransportLimits::default()).await;

    // Listening but never accepting: TCP connects (the kernel's backlog), TLS never
    // answers, so the connect deadline decides.
    let black_hole = TcpListener::bind(any_port(3)).await.unwrap();
    let black_hole_addr: SocketAddr = black_hole.local_addr().unwrap();

    socket.send(black_hole_addr, syn("one")).await.unwrap();
    poll_until_true("the connect attempt to time out", LIMIT, async || {
        metrics.counter(CONNECT_FAILURES, None) == 1
    })
    .await;

    // Inside the backoff window the frame is dropped without a new attempt.
    socket.send(black_hole_addr, syn("two")).await.unwrap();
    poll_until_true("the second frame to be dropped", LIMIT, async || {
        metrics.counter(FRAMES_DROPPED, Some(("reason", "peer_unreachable"))) == 2
    })
    .await;
    assert_eq!(metrics.counter(CONNECT_FAILURES, None), 1);
    drop(black_hole);
}

#[tokio::test(start_paused = true)]
async fn send_never_blocks_when_a_peer_queue_is_full() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let limits = TransportLimits {
        outbound_queue: 4,
        ..TransportLimits::default()
    };
    let mut socket = sender(&pki, limits).await;
    let black_hole = TcpListener::bind(any_port(4)).await.unwrap();
    let addr = black_hole.local_addr().unwrap();
    // The writer is stuck connecting; the queue fills, then sends drop at once.
    for i in 0..20 {
        within(
            "send to return",
            Duration::from_millis(1),
            socket.send(addr, syn(&format!("{i}"))),
        )
        .await
        .unwrap();
    }
    assert!(metrics.counter(FRAMES_DROPPED, Some(("reason", "queue_full"))) >= 15);
    drop(black_hole);
}
