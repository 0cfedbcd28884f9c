//! One suite, run against every transport: mutual TLS over TCP, chitchat's in-memory
//! transport, and the in-memory transport wrapped with (inactive) fault injection.

mod common;

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU8, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use chitchat::transport::{ChannelTransport, Socket, Transport};
use common::{Pki, any_port, loopback, syn, within};
use domaind_gossip::transport::{FaultyTransport, NetworkFaults, TlsTransport, TransportLimits};

const LIMIT: Duration = Duration::from_secs(10);

/// A transport and a way to open a socket at a fresh address on it.
#[async_trait]
trait Subject: Send + Sync {
    fn transport(&self) -> &dyn Transport;
    async fn open_fresh(&self) -> (Box<dyn Socket>, SocketAddr);
}

struct Tls {
    transport: TlsTransport,
    _pki: Pki,
}

impl Tls {
    fn new() -> Self {
        let pki = Pki::new();
        let tls = pki.node_tls("node-a");
        Self {
            transport: TlsTransport::new(tls, 1, TransportLimits::default()),
            _pki: pki,
        }
    }
}

#[async_trait]
impl Subject for Tls {
    fn transport(&self) -> &dyn Transport {
        &self.transport
    }
    async fn open_fresh(&self) -> (Box<dyn Socket>, SocketAddr) {
        let addr = self.transport.bind(any_port(1)).await.unwrap();
        (self.transport.open(addr).await.unwrap(), addr)
    }
}

struct InMemory<T> {
    transport: T,
    next: AtomicU8,
}

impl<T> InMemory<T> {
    fn new(transport: T) -> Self {
        Self {
            transport,
            next: AtomicU8::new(1),
        }
    }
}

#[async_trait]
impl<T: Transport> Subject for InMemory<T> {
    fn transport(&self) -> &dyn Transport {
        &self.transport
    }
    async fn open_fresh(&self) -> (Box<dyn Socket>, SocketAddr) {
        let octet = self.next.fetch_add(1, Ordering::Relaxed);
        let addr = SocketAddr::new(loopback(octet), 7946);
        (self.transport.open(addr).await.unwrap(), addr)
    }
}

async fn cannot_open_an_address_twice(subject: &dyn Subject) {
    let (_socket, addr) = subject.open_fresh().await;
    assert!(subject.transport().open(addr).await.is_err());
}

async fn address_is_released_when_the_socket_drops(subject: &dyn Subject) {
    let (socket, addr) = subject.open_fresh().await;
    drop(socket);
    let _again = subject.transport().open(addr).await.unwrap();
}

async fn recv_waits_and_names_the_senders_gossip_address(subject: &dyn Subject) {
    let (mut a, a_addr) = subject.open_fresh().await;
    let (mut b, b_addr) = subject.open_fresh().await;
    assert!(
        tokio::time::timeout(Duration::from_millis(100), b.recv())
            .await
            .is_err(),
        "recv returned with nothing sent"
    );
    let receiving = tokio::spawn(async move {
        let received = b.recv().await.unwrap();
        (b, received)
    });
    a.send(b_addr, syn("conformance")).await.unwrap();
    let (mut b, (from, message)) = within("b to receive", LIMIT, receiving).await.unwrap();
    assert_eq!(from, a_addr, "recv must return the sender's listen address");
    assert_eq!(message, syn("conformance"));

    // chitchat replies to the address recv returned: the reply must reach `a`.
    b.send(from, syn("reply")).await.unwrap();
    let (from, message) = within("a to receive the reply", LIMIT, a.recv())
        .await
        .unwrap();
    assert_eq!(from, b_addr);
    assert_eq!(message, syn("reply"));
}

async fn sending_to_an_unbound_address_is_ok(subject: &dyn Subject) {
    let (mut socket, _) = subject.open_fresh().await;
    let (unbound, unbound_addr) = subject.open_fresh().await;
    drop(unbound);
    socket.send(unbound_addr, syn("nobody")).await.unwrap();
}

async fn a_burst_within_the_queue_bound_arrives_whole(subject: &dyn Subject) {
    let (mut a, _) = subject.open_fresh().await;
    let (mut b, b_addr) = subject.open_fresh().await;
    for i in 0..32 {
        a.send(b_addr, syn(&format!("burst-{i}"))).await.unwrap();
    }
    let mut received = Vec::new();
    for _ in 0..32 {
        let (_, message) = within("the burst", LIMIT, b.recv()).await.unwrap();
        received.push(message);
    }
    for i in 0..32 {
        assert!(
            received.contains(&syn(&format!("burst-{i}"))),
            "burst-{i} lost"
        );
    }
}

async fn suite(subject: &dyn Subject) {
    cannot_open_an_address_twice(subject).await;
    address_is_released_when_the_socket_drops(subject).await;
    recv_waits_and_names_the_senders_gossip_address(subject).await;
    sending_to_an_unbound_address_is_ok(subject).await;
    a_burst_within_the_queue_bound_arrives_whole(subject).await;
}

#[tokio::test]
async fn tls_transport_conforms() {
    suite(&Tls::new()).await;
}

#[tokio::test]
async fn channel_transport_conforms() {
    suite(&InMemory::new(ChannelTransport::with_mtu(65_507))).await;
}

#[tokio::test]
async fn faulty_transport_without_faults_conforms() {
    let transport = FaultyTransport::new(ChannelTransport::with_mtu(65_507), NetworkFaults::new(7));
    suite(&InMemory::new(transport)).await;
}
