//! Bad input at the gossip listener: each case is refused, counted with its reason,
//! and the listener goes on serving honest peers.

mod common;
use common::poll_until_true;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use chitchat::transport::Transport;
use chitchat::{ChitchatId, ChitchatMessage};
use common::{Metrics, Pki, any_port, client_config, loopback, name, syn, tcp_from, within};
use domaind_gossip::metrics::{
    CONNECTIONS_REFUSED, FRAMES_DROPPED, FRAMES_RECEIVED, FRAMES_REJECTED,
};
use domaind_gossip::pki::{DevCa, NodeCertRequest};
use domaind_gossip::transport::frame;
use domaind_gossip::transport::{TlsTransport, TransportLimits};
use domaind_gossip::{GossipConfig, GossipNode, cluster_id_for_clique};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::mpsc;
use tokio_rustls::TlsConnector;
use tokio_rustls::client::TlsStream;

const LIMIT: Duration = Duration::from_secs(10);

struct Listener {
    addr: SocketAddr,
    received: mpsc::UnboundedReceiver<(SocketAddr, ChitchatMessage)>,
    _task: tokio::task::JoinHandle<()>,
}

async fn listen(pki: &Pki, limits: TransportLimits) -> Listener {
    let transport = TlsTransport::new(pki.node_tls("server"), 1, limits);
    let addr = transport.bind(any_port(1)).await.unwrap();
    let mut socket = transport.open(addr).await.unwrap();
    let (tx, received) = mpsc::unbounded_channel();
    let task = tokio::spawn(async move {
        while let Ok(message) = socket.recv().await {
            if tx.send(message).is_err() {
                return;
            }
        }
    });
    Listener {
        addr,
        received,
        _task: task,
    }
}

/// An honest node on another address gets a message through.
async fn honest_peer_gets_through(pki: &Pki, listener: &mut Listener) {
    let transport = TlsTransport::new(pki.node_tls("honest"), 1, TransportLimits::default());
    let addr = transport.bind(any_port(2)).await.unwrap();
    let mut socket = transport.open(addr).await.unwrap();
    socket.send(listener.addr, syn("honest")).await.unwrap();
    let (from, message) = within("the honest message", LIMIT, listener.received.recv())
        .await
        .unwrap();
    assert_eq!((from, message), (addr, syn("honest")));
}

/// Connects and handshakes. With TLS 1.3 a client finishes before the server has
/// judged its certificate, so a refused client may still get a stream here.
async fn tls_connect(
    to: SocketAddr,
    config: Arc<ClientConfig>,
) -> std::io::Result<TlsStream<TcpStream>> {
    let tcp = tcp_from(1, to).await;
    TlsConnector::from(config)
        .connect(ServerName::try_from("server").unwrap(), tcp)
        .await
}

/// Waits until the server has closed the connection.
async fn closed_by_server<S: tokio::io::AsyncRead + Unpin>(mut stream: S) {
    let mut buf = [0u8; 256];
    within("the server to close the connection", LIMIT, async {
        loop {
            match stream.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(_) => {}
            }
        }
    })
    .await;
}

fn frame_as(node: &str, advertised: SocketAddr) -> Vec<u8> {
    let body = frame::encode(
        &ChitchatId::new(node, 1, advertised),
        &syn("spoof"),
        frame::DEFAULT_MAX_FRAME_BYTES,
    )
    .unwrap();
    frame::encode_with_prefix(&body).to_vec()
}

#[tokio::test]
async fn client_without_certificate_is_refused() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut listener = listen(&pki, TransportLimits::default()).await;
    if let Ok(stream) = tls_connect(listener.addr, client_config(pki.ca.cert_pem(), None)).await {
        closed_by_server(stream).await;
    }
    honest_peer_gets_through(&pki, &mut listener).await;
    assert_eq!(
        metrics.counter(CONNECTIONS_REFUSED, Some(("reason", "no_client_cert"))),
        1
    );
}

#[tokio::test]
async fn certificate_from_another_ca_is_refused() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut listener = listen(&pki, TransportLimits::default()).await;
    let rogue_ca = DevCa::generate("rogue", time::Duration::days(1)).unwrap();
    let rogue = rogue_ca
        .issue(&NodeCertRequest::new(
            name("node-a"),
            time::Duration::days(1),
        ))
        .unwrap();
    // The rogue trusts our CA, so it gets as far as presenting its certificate.
    let config = client_config(pki.ca.cert_pem(), Some(&rogue));
    if let Ok(stream) = tls_connect(listener.addr, config).await {
        closed_by_server(stream).await;
    }
    honest_peer_gets_through(&pki, &mut listener).await;
    assert_eq!(
        metrics.counter(CONNECTIONS_REFUSED, Some(("reason", "unknown_ca"))),
        1
    );
}

#[tokio::test]
async fn expired_certificate_is_refused() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut listener = listen(&pki, TransportLimits::default()).await;
    let expired = pki.issue_expired("node-a");
    let config = client_config(pki.ca.cert_pem(), Some(&expired));
    if let Ok(stream) = tls_connect(listener.addr, config).await {
        closed_by_server(stream).await;
    }
    honest_peer_gets_through(&pki, &mut listener).await;
    assert_eq!(
        metrics.counter(CONNECTIONS_REFUSED, Some(("reason", "expired"))),
        1
    );
}

#[tokio::test]
async fn certificate_of_node_a_cannot_gossip_as_node_b() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut listener = listen(&pki, TransportLimits::default()).await;
    let config = client_config(pki.ca.cert_pem(), Some(&pki.issue("node-a")));
    let mut stream = tls_connect(listener.addr, config).await.unwrap();
    let advertised = SocketAddr::new(loopback(1), 7946);
    stream
        .write_all(&frame_as("node-b", advertised))
        .await
        .unwrap();
    stream.flush().await.unwrap();
    closed_by_server(stream).await;
    honest_peer_gets_through(&pki, &mut listener).await;
    assert_eq!(
        metrics.counter(FRAMES_REJECTED, Some(("reason", "identity_mismatch"))),
        1
    );
    assert!(
        listener.received.try_recv().is_err(),
        "the spoofed frame was delivered"
    );
}

#[tokio::test]
async fn frame_advertising_someone_elses_address_is_refused() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut listener = listen(&pki, TransportLimits::default()).await;
    let config = client_config(pki.ca.cert_pem(), Some(&pki.issue("node-a")));
    let mut stream = tls_connect(listener.addr, config).await.unwrap();
    let elsewhere = SocketAddr::new(loopback(9), 7946);
    stream
        .write_all(&frame_as("node-a", elsewhere))
        .await
        .unwrap();
    closed_by_server(stream).await;
    honest_peer_gets_through(&pki, &mut listener).await;
    assert_eq!(
        metrics.counter(FRAMES_REJECTED, Some(("reason", "address_mismatch"))),
        1
    );
}

async fn authenticated_stream(pki: &Pki, listener: &Listener) -> TlsStream<TcpStream> {
    let config = client_config(pki.ca.cert_pem(), Some(&pki.issue("node-a")));
    tls_connect(listener.addr, config).await.unwrap()
}

#[tokio::test]
async fn frame_larger_than_the_limit_is_refused() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut listener = listen(&pki, TransportLimits::default()).await;
    let mut stream = authenticated_stream(&pki, &listener).await;
    let oversized = vec![0u8; frame::DEFAULT_MAX_FRAME_BYTES + 1];
    // The server refuses on the length prefix and may close before all is written.
    let _ = stream
        .write_all(&frame::encode_with_prefix(&oversized))
        .await;
    closed_by_server(stream).await;
    honest_peer_gets_through(&pki, &mut listener).await;
    assert_eq!(
        metrics.counter(FRAMES_REJECTED, Some(("reason", "oversized"))),
        1
    );
}

#[tokio::test]
async fn truncated_frame_is_refused() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut listener = listen(&pki, TransportLimits::default()).await;
    let mut stream = authenticated_stream(&pki, &listener).await;
    let whole = frame_as("node-a", SocketAddr::new(loopback(1), 7946));
    stream.write_all(&whole[..whole.len() / 2]).await.unwrap();
    stream.shutdown().await.unwrap();
    closed_by_server(stream).await;
    honest_peer_gets_through(&pki, &mut listener).await;
    assert_eq!(
        metrics.counter(FRAMES_REJECTED, Some(("reason", "truncated"))),
        1
    );
    assert!(listener.received.try_recv().is_err());
}

#[tokio::test]
async fn random_bytes_after_the_handshake_are_refused() {
    use rand::{RngCore, SeedableRng};
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut listener = listen(&pki, TransportLimits::default()).await;
    let mut rng = rand::rngs::SmallRng::seed_from_u64(0x5eed);

    // Garbage inside a well-formed length prefix: malformed.
    let mut garbage = vec![0u8; 200];
    rng.fill_bytes(&mut garbage);
    let mut stream = authenticated_stream(&pki, &listener).await;
    stream
        .write_all(&frame::encode_with_prefix(&garbage))
        .await
        .unwrap();
    closed_by_server(stream).await;

    // Garbage where the length prefix should be: an absurd length, refused unread.
    let mut stream = authenticated_stream(&pki, &listener).await;
    let _ = stream.write_all(&[0xde, 0xad, 0xbe, 0xef, 1, 2, 3]).await;
    closed_by_server(stream).await;

    honest_peer_gets_through(&pki, &mut listener).await;
    assert_eq!(
        metrics.counter(FRAMES_REJECTED, Some(("reason", "malformed"))),
        1
    );
    assert_eq!(
        metrics.counter(FRAMES_REJECTED, Some(("reason", "oversized"))),
        1
    );
}

#[tokio::test(start_paused = true)]
async fn peer_that_connects_and_never_speaks_is_cut_off() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let listener = listen(&pki, TransportLimits::default()).await;
    // Time stands still until every task waits; then it jumps to the handshake deadline.
    let silent = tcp_from(1, listener.addr).await;
    closed_by_server(silent).await;
    assert_eq!(
        metrics.counter(CONNECTIONS_REFUSED, Some(("reason", "handshake_timeout"))),
        1
    );
}

#[tokio::test]
async fn flood_of_connections_from_one_address_is_bounded() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let limits = TransportLimits {
        max_connections_per_ip: 4,
        ..TransportLimits::default()
    };
    let mut listener = listen(&pki, limits).await;
    // Silent connections hold their places until the handshake deadline.
    let mut flood = Vec::new();
    for _ in 0..4 {
        flood.push(tcp_from(1, listener.addr).await);
    }
    // The listener accepts inside recv(); an honest message proves it has seen the four.
    honest_peer_gets_through(&pki, &mut listener).await;
    let mut refused = Vec::new();
    for _ in 0..10 {
        refused.push(tcp_from(1, listener.addr).await);
    }
    for stream in refused {
        closed_by_server(stream).await;
    }
    assert_eq!(
        metrics.counter(CONNECTIONS_REFUSED, Some(("reason", "connection_limit"))),
        10
    );
    honest_peer_gets_through(&pki, &mut listener).await;
    drop(flood);
}

/// An Ack whose one node delta carries a key at `key_version` and then lowers the
/// node's max version to `max_version`: chitchat's decoder accepts it, and applying it
/// trips `assert!(node_delta.max_version >= self.max_version)` in chitchat's state.
/// Wire form: magic, protocol 0, type Ack, one uncompressed block of delta ops
/// (node, key-value, set-max-version), end of blocks.
fn ack_lowering_max_version(about: &ChitchatId, key_version: u64, max_version: u64) -> Vec<u8> {
    use chitchat::Deserializable;
    let bytes = raw_ack(about, "forged", "x", key_version, Some(max_version));
    ChitchatMessage::deserialize(&mut &bytes[..]).expect("chitchat's decoder accepts it");
    bytes
}

/// An Ack in one uncompressed block, written by hand: one node part about `about` with
/// one key-value, then a set-max-version op when given one.
fn raw_ack(
    about: &ChitchatId,
    key: &str,
    value: &str,
    version: u64,
    max_version: Option<u64>,
) -> Vec<u8> {
    use chitchat::Serializable;
    let mut ops = vec![0u8];
    about.serialize(&mut ops);
    0u64.serialize(&mut ops); // last GC version
    0u64.serialize(&mut ops); // from version (excluded)
    ops.push(1);
    key.to_string().serialize(&mut ops);
    value.to_string().serialize(&mut ops);
    version.serialize(&mut ops);
    ops.push(0); // set, not deleted
    if let Some(max_version) = max_version {
        ops.push(2);
        max_version.serialize(&mut ops);
    }
    let mut bytes = 45_139u16.to_le_bytes().to_vec();
    bytes.extend([0u8, 2u8, 2u8]);
    (ops.len() as u16).serialize(&mut bytes);
    bytes.extend(ops);
    bytes.push(0);
    bytes
}

fn sees_all(node: &GossipNode, nodes: &[&str]) -> bool {
    let live = node.live_nodes();
    live.len() == nodes.len() && nodes.iter().all(|n| live.contains_key(*n))
}

#[tokio::test]
async fn ack_that_would_trip_chitchats_assertion_is_refused_and_gossip_lives_on() {
    const CLUSTER: Duration = Duration::from_secs(30);
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut nodes = Vec::new();
    for (i, octet) in [41u8, 42, 43].into_iter().enumerate() {
        let node = format!("node-{i}");
        let mut config =
            GossipConfig::new(name(&node), any_port(octet), cluster_id_for_clique("c-1.0"));
        config.seeds = nodes
            .iter()
            .map(|n: &GossipNode| n.gossip_addr().to_string())
            .collect();
        config.generation = 1;
        nodes.push(
            GossipNode::start_tls(config, pki.node_tls(&node), TransportLimits::default())
                .await
                .unwrap(),
        );
    }
    let all = ["node-0", "node-1", "node-2"];
    poll_until_true("the three nodes to see each other", CLUSTER, async || {
        nodes.iter().all(|n| sees_all(n, &all))
    })
    .await;

    // A node our CA certified, outside the clique, sends node-1 a delta about node-0
    // that is newer than what node-1 holds (so chitchat applies it) and inconsistent.
    let target = nodes[1].gossip_addr();
    let node_0 = ChitchatId::new("node-0", 1, nodes[0].gossip_addr());
    let attacker = ChitchatId::new("node-x", 1, SocketAddr::new(loopback(44), 7946));
    // Written by hand: chitchat re-encodes a decoded delta compressed, and asserts
    // that the length is what it decoded.
    let mut body = vec![frame::FRAME_VERSION];
    chitchat::Serializable::serialize(&attacker, &mut body);
    body.extend(ack_lowering_max_version(&node_0, 2_000_000, 1_000_000));
    let config = client_config(pki.ca.cert_pem(), Some(&pki.issue("node-x")));
    let tcp = tcp_from(44, target).await;
    let mut stream = TlsConnector::from(config)
        .connect(ServerName::try_from("node-1").unwrap(), tcp)
        .await
        .unwrap();
    stream
        .write_all(&frame::encode_with_prefix(&body))
        .await
        .unwrap();
    closed_by_server(stream).await;
    assert_eq!(
        metrics.counter(FRAMES_REJECTED, Some(("reason", "version_above_max"))),
        1
    );

    // node-1's gossip is alive: it hears news from both sides, and they hear it.
    nodes[0].set("probe/0", "after").await;
    nodes[1].set("probe/1", "after").await;
    poll_until_true("news to cross node-1 both ways", CLUSTER, async || {
        let has = |observer: &GossipNode, node: &str, key: &str| {
            observer
                .live_nodes()
                .get(node)
                .is_some_and(|m| m.keys.get(key).is_some_and(|v| v == "after"))
        };
        has(&nodes[1], "node-0", "probe/0")
            && has(&nodes[0], "node-1", "probe/1")
            && has(&nodes[2], "node-1", "probe/1")
    })
    .await;
    assert!(nodes.iter().all(|n| sees_all(n, &all)));
    // The forged key never reached node-0's state as node-1 sees it.
    assert!(!nodes[1].live_nodes()["node-0"].keys.contains_key("forged"));
    for node in nodes {
        node.stop().await.unwrap();
    }
}

/// A certified node outside the clique sends pulses that are garbage, that promise
/// more counts than a pulse may carry, and that are well-formed but speak of nodes
/// nobody knows: each malformed one is refused and counted, and the clique's own
/// pulses go on (nobody is declared dead for lack of them).
#[tokio::test]
async fn bad_pulses_are_refused_and_counted_and_liveness_lives_on() {
    use domaind_gossip::pulse::wire::{Beats, Kind, MAX_BEATS, Pulse};
    use domaind_gossip::pulse::{NODES_SILENT, PULSES_REFUSED};
    const CLUSTER: Duration = Duration::from_secs(30);
    let metrics = Metrics::install();
    let pki = Pki::new();
    let mut nodes = Vec::new();
    for (i, octet) in [51u8, 52].into_iter().enumerate() {
        let node = format!("node-{i}");
        let mut config =
            GossipConfig::new(name(&node), any_port(octet), cluster_id_for_clique("c-1.0"));
        config.seeds = nodes
            .iter()
            .map(|n: &GossipNode| n.gossip_addr().to_string())
            .collect();
        nodes.push(
            GossipNode::start_tls(config, pki.node_tls(&node), TransportLimits::default())
                .await
                .unwrap(),
        );
    }
    let all = ["node-0", "node-1"];
    poll_until_true("the two nodes to see each other", CLUSTER, async || {
        nodes.iter().all(|n| sees_all(n, &all))
    })
    .await;

    let attacker = ChitchatId::new("node-x", 1, SocketAddr::new(loopback(53), 7946));
    let mut too_many = vec![1u8, 1, 0, 0, 0, 0, 0, 0, 0, 0];
    too_many.extend_from_slice(&(MAX_BEATS as u16 + 1).to_be_bytes());
    let strangers = Pulse {
        kind: Kind::Push,
        state: 0,
        beats: Beats::Keyed(vec![(0xdead_beef, 7), (0x0bad_f00d, 9)]),
    }
    .encode();
    let config = client_config(pki.ca.cert_pem(), Some(&pki.issue("node-x")));
    let tcp = tcp_from(53, nodes[1].gossip_addr()).await;
    let mut stream = TlsConnector::from(config)
        .connect(ServerName::try_from("node-1").unwrap(), tcp)
        .await
        .unwrap();
    for pulse in [&[0xff, 0x00, 0x01][..], &too_many, &strangers] {
        let body = frame::encode_pulse(&attacker, pulse, frame::DEFAULT_MAX_FRAME_BYTES).unwrap();
        stream
            .write_all(&frame::encode_with_prefix(&body))
            .await
            .unwrap();
    }
    poll_until_true("both bad pulses to be counted", CLUSTER, async || {
        metrics.counter(PULSES_REFUSED, Some(("reason", "malformed"))) == 1
            && metrics.counter(PULSES_REFUSED, Some(("reason", "oversized"))) == 1
    })
    .await;

    // Longer than the dead-after time: the clique's pulses kept both alive.
    tokio::time::sleep(Duration::from_secs(3)).await;
    assert!(nodes.iter().all(|n| sees_all(n, &all)));
    assert_eq!(metrics.counter(NODES_SILENT, None), 0);
}

/// A peer whose messages come faster than the gossip loop takes them: what waits is
/// held to the byte budget, the rest dropped and counted; taking them frees it.
#[tokio::test]
async fn messages_waiting_for_the_gossip_loop_are_held_to_a_byte_budget() {
    // Each message holds its wire form and its value: between 2 and 2.1 times this.
    const VALUE: usize = 10_000;
    let metrics = Metrics::install();
    let pki = Pki::new();
    let limits = TransportLimits {
        inbound_queue_bytes: 9 * VALUE,
        ..TransportLimits::default()
    };
    let transport = TlsTransport::new(pki.node_tls("server"), 1, limits);
    let addr = transport.bind(any_port(1)).await.unwrap();
    let mut socket = transport.open(addr).await.unwrap();

    let advertised = SocketAddr::new(loopback(1), 7946);
    let sender = ChitchatId::new("node-a", 1, advertised);
    let about = ChitchatId::new("node-z", 1, SocketAddr::new(loopback(9), 7946));
    let framed = |version: u64| {
        let mut body = vec![frame::FRAME_VERSION];
        chitchat::Serializable::serialize(&sender, &mut body);
        body.extend(raw_ack(&about, "bulk", &"x".repeat(VALUE), version, None));
        frame::encode_with_prefix(&body)
    };
    let config = client_config(pki.ca.cert_pem(), Some(&pki.issue("node-a")));
    let tcp = tcp_from(1, addr).await;
    let connect = TlsConnector::from(config).connect(ServerName::try_from("server").unwrap(), tcp);
    // The socket accepts the connection only while it is asked for a message.
    let (stream, first) = tokio::join!(
        async {
            let mut stream = connect.await.unwrap();
            stream.write_all(&framed(1)).await.unwrap();
            stream
        },
        within("the first message", LIMIT, socket.recv())
    );
    assert_eq!(first.unwrap().0, advertised);

    // Ten more while nobody takes any: four fit the budget.
    let mut stream = stream;
    for version in 2..=11 {
        stream.write_all(&framed(version)).await.unwrap();
    }
    poll_until_true("the ten frames to be read", LIMIT, async || {
        metrics.counter(FRAMES_RECEIVED, None) == 11
    })
    .await;
    assert_eq!(
        metrics.counter(FRAMES_DROPPED, Some(("reason", "inbound_queue_full"))),
        6
    );
    for _ in 0..4 {
        within("a queued message", LIMIT, socket.recv())
            .await
            .unwrap();
    }
    // Taken, they gave their share back: the next one is queued, and the one after.
    stream.write_all(&framed(12)).await.unwrap();
    stream.write_all(&framed(13)).await.unwrap();
    for _ in 0..2 {
        within("a message after the backlog", LIMIT, socket.recv())
            .await
            .unwrap();
    }
    assert_eq!(
        metrics.counter(FRAMES_DROPPED, Some(("reason", "inbound_queue_full"))),
        6
    );
}
