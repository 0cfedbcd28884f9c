//! Chitchat's `Transport` over TCP and mutual TLS.
//!
//! Inbound: one listener; each connection is admitted (per-address and total bounds),
//! handshaken under a deadline, its peer named by its client certificate, then read as
//! length-prefixed frames. A frame whose sender is not the certificate's node, or whose
//! advertised address is not the connection's source address, is refused and the
//! connection closed. Outbound: one writer task and one bounded queue per peer address,
//! so `send` never waits on the network; writers connect on demand, back off after
//! failures, and close when idle.
//!
//! The listener is polled inside `recv()` rather than by a task of its own: chitchat
//! polls `recv()` whenever it is not busy, and dropping the socket then closes the
//! listener and every connection at once.

mod budget;
mod inbound;
mod outbound;

use inbound::serve_connection;
pub use inbound::{Judged, judge_frame};
use outbound::{HEARD_PRUNE_AT, connect, write_to_peer};

use std::collections::{HashMap, HashSet};
use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex, OnceLock, Weak};

use anyhow::Context;
use async_trait::async_trait;
use bytes::Bytes;
use chitchat::transport::{Socket, Transport};
use chitchat::{ChitchatId, ChitchatMessage};
use domaind_backoff::Backoff;
use futures::{SinkExt, StreamExt};
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt, AsyncWriteExt, ReadHalf, WriteHalf};
use tokio::net::{TcpListener, TcpSocket, TcpStream};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio::time::{Instant, timeout};
use tokio_rustls::{TlsAcceptor, TlsConnector};
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodecError};
use tracing::{debug, info, warn};

use budget::{Held, InboundBudget};

use super::admission::{Admission, Admitted};
use super::episodes::Episodes;
use super::limits::TransportLimits;
use super::{frame, guard};
use crate::identity::{NodeName, node_name_of};
use crate::metrics::{self, RefusedConnection};
use crate::pulse::{PulseArrival, PulseEndpoint, PulseOut};
use crate::signed::{StateCheck, Verdict};
use crate::tls::NodeTls;
use crate::version::{NewerVersions, WireVersion};

/// A TLS transport for one node: its certificate, its generation, its limits.
#[derive(Debug)]
pub struct TlsTransport {
    tls: Arc<NodeTls>,
    generation: u64,
    advertise_addr: Option<SocketAddr>,
    limits: TransportLimits,
    prebound: Mutex<Option<TcpListener>>,
    state: Option<Arc<StateCheck>>,
    /// Pulses ride the gossip connections: received ones go here...
    pulses_in: mpsc::Sender<PulseArrival>,
    pulse_inbox: Mutex<Option<mpsc::Receiver<PulseArrival>>>,
    /// ...and sent ones through the open socket's peer queues, once there is one.
    opened: Arc<OnceLock<Weak<Shared>>>,
    wire: WireVersion,
}

/// Pulses waiting for the pulse task: a few rounds' worth from every peer of a large
/// clique; more are dropped.
const PULSE_INBOX: usize = 1024;

impl TlsTransport {
    pub fn new(tls: Arc<NodeTls>, generation: u64, limits: TransportLimits) -> Self {
        let (pulses_in, pulse_inbox) = mpsc::channel(PULSE_INBOX);
        Self {
            tls,
            generation,
            advertise_addr: None,
            limits,
            prebound: Mutex::new(None),
            state: None,
            pulses_in,
            pulse_inbox: Mutex::new(Some(pulse_inbox)),
            opened: Arc::new(OnceLock::new()),
            wire: WireVersion::Current,
        }
    }

    /// Writes frames as `wire` says (a later version only in tests).
    pub fn with_wire_version(mut self, wire: WireVersion) -> Self {
        self.wire = wire;
        self
    }

    /// This node's pulses over the gossip connections; `None` once taken. Pulses sent
    /// before chitchat opens the socket, or after it closed, are dropped.
    pub(crate) fn pulse_endpoint(&self) -> Option<PulseEndpoint> {
        let inbox = self
            .pulse_inbox
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()?;
        Some(PulseEndpoint {
            out: Arc::new(TlsPulses {
                opened: self.opened.clone(),
            }),
            inbox,
        })
    }

    /// Runs `check` on the wire form of every delta received, before chitchat.
    pub(crate) fn with_state_check(mut self, check: Arc<StateCheck>) -> Self {
        self.state = Some(check);
        self
    }

    /// The address peers dial, when it is not the listen address (e.g. listening on
    /// 0.0.0.0). Outbound connections are made from its IP.
    pub fn with_advertise_addr(mut self, addr: SocketAddr) -> Self {
        self.advertise_addr = Some(addr);
        self
    }

    /// Binds the listener now and returns its address: with port 0, the caller learns
    /// the port before handing the address to chitchat, which then `open`s it.
    pub async fn bind(&self, addr: SocketAddr) -> io::Result<SocketAddr> {
        let listener = bind_listener(addr)?;
        let local = listener.local_addr()?;
        *self.prebound.lock().unwrap_or_else(|p| p.into_inner()) = Some(listener);
        Ok(local)
    }

    fn take_prebound(&self, addr: SocketAddr) -> Option<TcpListener> {
        let mut slot = self.prebound.lock().unwrap_or_else(|p| p.into_inner());
        match slot.as_ref().map(TcpListener::local_addr) {
            Some(Ok(local)) if local == addr => slot.take(),
            _ => None,
        }
    }
}

fn bind_listener(addr: SocketAddr) -> io::Result<TcpListener> {
    let socket = if addr.is_ipv4() {
        TcpSocket::new_v4()?
    } else {
        TcpSocket::new_v6()?
    };
    // Lets a restarted node rebind while old connections sit in TIME_WAIT. Two live
    // listeners on one address are still refused.
    socket.set_reuseaddr(true)?;
    socket.bind(addr)?;
    socket.listen(1024)
}

#[async_trait]
impl Transport for TlsTransport {
    async fn open(&self, listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let listener = match self.take_prebound(listen_addr) {
            Some(listener) => listener,
            None => bind_listener(listen_addr)
                .with_context(|| format!("cannot listen for gossip on {listen_addr}"))?,
        };
        let local = listener.local_addr()?;
        let advertise = self.advertise_addr.unwrap_or(local);
        anyhow::ensure!(
            !advertise.ip().is_unspecified() && advertise.port() != 0,
            "gossip advertise address {advertise} is not dialable; set an explicit advertise address"
        );
        let (inbound_tx, inbound_rx) = mpsc::channel(self.limits.inbound_queue);
        let shared = Arc::new(Shared {
            tls: self.tls.clone(),
            sender: ChitchatId::new(self.tls.node().as_str(), self.generation, advertise),
            limits: self.limits.clone(),
            refusals: Mutex::new(Episodes::default()),
            state: self.state.clone(),
            peers: Mutex::new(HashMap::new()),
            pulses: self.pulses_in.clone(),
            wire: self.wire,
            newer: NewerVersions::default(),
            heard: Mutex::new(HashMap::new()),
            probing: Mutex::new(HashSet::new()),
            inbound_budget: InboundBudget::new(self.limits.inbound_queue_bytes),
        });
        let _ = self.opened.set(Arc::downgrade(&shared));
        info!(node = %self.tls.node(), listen = %local, advertise = %advertise, "gossip listening (mutual TLS)");
        Ok(Box::new(TlsSocket {
            admission: Admission::new(
                self.limits.max_connections_per_ip,
                self.limits.max_connections,
            ),
            shared,
            listener,
            connections: JoinSet::new(),
            inbound_tx,
            inbound_rx,
            checking: None,
        }))
    }
}

/// What every task of one socket needs.
#[derive(Debug)]
struct Shared {
    tls: Arc<NodeTls>,
    /// Written into every outbound frame.
    sender: ChitchatId,
    limits: TransportLimits,
    /// Refused frames, so that a peer that keeps sending them is logged once.
    refusals: Mutex<Episodes>,
    /// Checks every node's state in a delta against its owner's signature.
    state: Option<Arc<StateCheck>>,
    /// One queue per peer, drained by its writer task; chitchat's messages and pulses
    /// share them.
    peers: Mutex<HashMap<SocketAddr, mpsc::Sender<Bytes>>>,
    /// Where pulses received go, and word of peers found gone.
    pulses: mpsc::Sender<PulseArrival>,
    /// Peers whose address is being dialled to learn whether they are gone.
    probing: Mutex<HashSet<SocketAddr>>,
    /// The version frames are written in.
    wire: WireVersion,
    /// Peers met speaking a newer frame version.
    newer: NewerVersions,
    /// When each peer (by advertised address) last spoke to us: a peer we backed off
    /// from that speaks is up, and our link to it is tried again at once.
    heard: Mutex<HashMap<SocketAddr, Instant>>,
    /// Bounds what received messages hold while they wait for the gossip loop.
    inbound_budget: Arc<InboundBudget>,
}

impl Shared {
    fn heard_from(&self, peer: SocketAddr) {
        let now = Instant::now();
        let mut heard = self.heard.lock().unwrap_or_else(|p| p.into_inner());
        // Only news younger than the longest backoff matters: addresses of peers gone
        // for good (restarted elsewhere) are forgotten rather than kept for ever.
        if heard.len() >= HEARD_PRUNE_AT {
            let horizon = self.limits.reconnect_backoff_max;
            heard.retain(|_, at| now.saturating_duration_since(*at) < horizon);
        }
        heard.insert(peer, now);
    }

    /// Whether `peer` spoke to us after `since`.
    fn heard_since(&self, peer: SocketAddr, since: Instant) -> bool {
        self.heard
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .get(&peer)
            .is_some_and(|at| *at > since)
    }

    /// Nothing listens at `peer`'s gossip address: its daemon is gone.
    fn tell_gone(&self, peer: SocketAddr) {
        if let Err(mpsc::error::TrySendError::Full(_)) =
            self.pulses.try_send(PulseArrival::Gone(peer))
        {
            metrics::frame_dropped("pulse_queue_full");
        }
    }

    /// A connection from `peer` ended without our closing it: its daemon may have
    /// died, or only closed an idle connection. A dial tells which at once: refused,
    /// nothing listens there any more. Waiting for its pulses to stop would take the
    /// dead-after time.
    fn check_gone(self: &Arc<Self>, peer: SocketAddr) {
        if !self
            .probing
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(peer)
        {
            return;
        }
        let shared = self.clone();
        tokio::spawn(async move {
            match timeout(shared.limits.connect_timeout, connect(peer, &shared)).await {
                Ok(Err(error)) if error.kind() == io::ErrorKind::ConnectionRefused => {
                    shared.tell_gone(peer);
                }
                // It lives. Closed with a TLS close_notify, as a connection that never
                // carried a frame: the peer neither logs it nor dials back.
                Ok(Ok(open)) => {
                    let _ = open
                        .closed
                        .unsplit(open.writer.into_inner())
                        .shutdown()
                        .await;
                }
                // Unreachable or slow is no proof of death: the pulses will tell.
                _ => {}
            }
            shared
                .probing
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .remove(&peer);
        });
    }

    /// Queues a frame for `to`, starting its writer if there is none; never waits.
    fn enqueue(self: &Arc<Self>, to: SocketAddr, body: Bytes) {
        let mut peers = self.peers.lock().unwrap_or_else(|p| p.into_inner());
        let queue = Self::peer_queue(self, &mut peers, to);
        match queue.try_send(body) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => metrics::frame_dropped("queue_full"),
            // The writer closed an idle connection and ended between our check and
            // the send; start a new one.
            Err(mpsc::error::TrySendError::Closed(body)) => {
                peers.remove(&to);
                if Self::peer_queue(self, &mut peers, to)
                    .try_send(body)
                    .is_err()
                {
                    metrics::frame_dropped("queue_full");
                }
            }
        }
    }

    fn peer_queue<'a>(
        self: &Arc<Self>,
        peers: &'a mut HashMap<SocketAddr, mpsc::Sender<Bytes>>,
        to: SocketAddr,
    ) -> &'a mpsc::Sender<Bytes> {
        if peers.get(&to).is_none_or(mpsc::Sender::is_closed) {
            peers.retain(|_, queue| !queue.is_closed());
            let (tx, rx) = mpsc::channel(self.limits.outbound_queue);
            tokio::spawn(write_to_peer(to, rx, self.clone()));
            peers.insert(to, tx);
        }
        &peers[&to]
    }
}

/// Sends pulses through the open socket's peer queues.
struct TlsPulses {
    opened: Arc<OnceLock<Weak<Shared>>>,
}

impl PulseOut for TlsPulses {
    fn send(&self, to: SocketAddr, pulse: Bytes) {
        let Some(shared) = self.opened.get().and_then(Weak::upgrade) else {
            return;
        };
        match frame::encode_pulse_as(
            shared.wire,
            &shared.sender,
            &pulse,
            shared.limits.max_frame_bytes,
        ) {
            Ok(body) => shared.enqueue(to, body),
            Err(error) => {
                metrics::frame_dropped("oversized_outbound");
                warn!(peer = %to, %error, "pulse too large to send; dropped");
            }
        }
    }
}

/// A chitchat message as a connection received it.
struct Received {
    /// The sender's advertised address.
    from: SocketAddr,
    message: ChitchatMessage,
    /// Its wire form, which the state check reads: re-encoding a decoded delta is not
    /// possible in general (chitchat asserts the encoding comes out the length it was
    /// read at).
    wire: Bytes,
    /// What it holds while it waits: its wire form and its delta's keys and values.
    size: usize,
}

/// A received message waiting for the gossip loop, with its share of the budget.
struct Inbound {
    received: Received,
    held: Held,
}

struct TlsSocket {
    shared: Arc<Shared>,
    listener: TcpListener,
    admission: Admission,
    connections: JoinSet<()>,
    inbound_tx: mpsc::Sender<Inbound>,
    inbound_rx: mpsc::Receiver<Inbound>,
    /// A message taken from the inbound queue whose state check has not finished.
    /// Chitchat races `recv` against its gossip tick and its commands and drops the
    /// losing future, so the message waits here rather than in that future: a
    /// check cut short starts again at the next `recv`, and nothing is lost.
    checking: Option<Inbound>,
}

impl Drop for TlsSocket {
    /// Writers hold the shared state and the shared state holds their queues: closing
    /// the queues here ends the writers when the socket goes, as before pulses shared
    /// them.
    fn drop(&mut self) {
        self.shared
            .peers
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clear();
    }
}

/// The state check of one received message.
async fn check(state: Option<&StateCheck>, inbound: Option<&Inbound>) -> Verdict {
    match state.zip(inbound) {
        Some((state, Inbound { received, .. })) => {
            state
                .check_wire(received.from, &received.message, &received.wire)
                .await
        }
        None => Verdict::Pass,
    }
}

#[async_trait]
impl Socket for TlsSocket {
    async fn send(&mut self, to: SocketAddr, message: ChitchatMessage) -> anyhow::Result<()> {
        let body = match frame::encode_as(
            self.shared.wire,
            &self.shared.sender,
            &message,
            self.shared.limits.max_frame_bytes,
        ) {
            Ok(body) => body,
            Err(error) => {
                metrics::frame_dropped("oversized_outbound");
                warn!(peer = %to, %error, "gossip message too large to send; dropped");
                return Ok(());
            }
        };
        self.shared.enqueue(to, body);
        Ok(())
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        loop {
            tokio::select! {
                received = self.inbound_rx.recv(), if self.checking.is_none() => {
                    // We hold a sender ourselves, so the channel never closes.
                    let inbound = received.context("gossip inbound channel closed")?;
                    if self.shared.state.is_none() {
                        return Ok((inbound.received.from, inbound.received.message));
                    }
                    self.checking = Some(inbound);
                }
                verdict = check(self.shared.state.as_deref(), self.checking.as_ref()), if self.checking.is_some() => {
                    let Inbound { received: Received { from, message, .. }, held } =
                        self.checking.take().expect("checked while checking");
                    // Chitchat owns the message from here; the filtered copy, if any,
                    // is no larger.
                    drop(held);
                    match verdict {
                        Verdict::Pass => return Ok((from, message)),
                        Verdict::Filtered(filtered) => return Ok((from, filtered)),
                        Verdict::Drop => {}
                    }
                }
                accepted = self.listener.accept() => match accepted {
                    Ok((stream, peer)) => self.admit(stream, peer),
                    Err(error) => {
                        // Out of file descriptors and the like: the listener itself
                        // is fine, the next accept may succeed.
                        warn!(%error, "gossip accept failed");
                    }
                },
                Some(_) = self.connections.join_next(), if !self.connections.is_empty() => {}
            }
        }
    }
}

impl TlsSocket {
    fn admit(&mut self, stream: TcpStream, peer: SocketAddr) {
        match self.admission.admit(peer.ip()) {
            Ok(place) => {
                let shared = self.shared.clone();
                let inbound = self.inbound_tx.clone();
                self.connections
                    .spawn(serve_connection(stream, peer, place, shared, inbound));
            }
            Err(refusal) => {
                metrics::connection_refused(RefusedConnection::ConnectionLimit);
                if refusal.first {
                    warn!(%peer, "too many gossip connections from this address; refusing more until some close");
                }
            }
        }
    }
}

type TlsClient = tokio_rustls::client::TlsStream<TcpStream>;

#[cfg(test)]
mod tests {
    use super::inbound::{Accepted, accept_frame};
    use super::outbound::bind_source;
    use super::*;

    #[test]
    fn a_source_port_to_avoid_is_passed_over() {
        let ip = IpAddr::from([127, 0, 0, 1]);
        let seen = std::sync::Mutex::new(Vec::new());
        // Refuses the first three ports it is offered, whatever they are.
        let socket = bind_source(ip, |port| {
            let mut seen = seen.lock().unwrap();
            seen.push(port);
            seen.len() <= 3
        })
        .unwrap();
        let chosen = socket.local_addr().unwrap().port();
        let seen = seen.into_inner().unwrap();
        assert_eq!(seen.len(), 4, "{seen:?}");
        assert_eq!(seen[3], chosen);
        assert!(!seen[..3].contains(&chosen), "{seen:?}");
    }

    #[test]
    fn a_port_to_avoid_is_taken_when_nothing_else_is_offered() {
        let ip = IpAddr::from([127, 0, 0, 1]);
        let socket = bind_source(ip, |_| true).unwrap();
        assert!(socket.local_addr().unwrap().port() > 0);
    }

    fn receiver() -> ChitchatId {
        ChitchatId::new("node-r", 1, "127.0.0.3:7000".parse().unwrap())
    }

    fn body(node: &str, addr: &str) -> Bytes {
        let message = frame::syn_for_tests("c");
        frame::encode(
            &ChitchatId::new(node, 1, addr.parse().unwrap()),
            &message,
            frame::DEFAULT_MAX_FRAME_BYTES,
        )
        .unwrap()
    }

    #[test]
    fn frame_from_the_certified_node_is_delivered_to_its_advertised_address() {
        let node = NodeName::new("node-a").unwrap();
        let Ok((_, Accepted::Chitchat(Received { from, .. }))) = accept_frame(
            &body("node-a", "127.0.0.2:7000"),
            &node,
            "127.0.0.2".parse().unwrap(),
            Some(&receiver()),
        ) else {
            panic!("a frame of the certified node is accepted")
        };
        assert_eq!(from, "127.0.0.2:7000".parse().unwrap());
    }

    #[test]
    fn a_pulse_is_held_to_the_same_sender_checks() {
        let node = NodeName::new("node-a").unwrap();
        let pulse = |name: &str, addr: &str| {
            frame::encode_pulse(
                &ChitchatId::new(name, 1, addr.parse().unwrap()),
                &[1, 2],
                frame::DEFAULT_MAX_FRAME_BYTES,
            )
            .unwrap()
        };
        let source = "127.0.0.2".parse().unwrap();
        let Ok((_, Accepted::Pulse(from, bytes))) = accept_frame(
            &pulse("node-a", "127.0.0.2:7000"),
            &node,
            source,
            Some(&receiver()),
        ) else {
            panic!("a pulse of the certified node is accepted")
        };
        assert_eq!(
            (from, &bytes[..]),
            ("127.0.0.2:7000".parse().unwrap(), &[1u8, 2][..])
        );
        let refused = |body: Bytes| {
            accept_frame(&body, &node, source, Some(&receiver()))
                .err()
                .unwrap()
                .reason
        };
        assert_eq!(
            refused(pulse("node-b", "127.0.0.2:7000")),
            "identity_mismatch"
        );
        assert_eq!(
            refused(pulse("node-a", "127.0.0.9:7000")),
            "address_mismatch"
        );
    }

    #[test]
    fn a_frame_of_a_newer_version_is_delivered_and_an_unknown_kind_of_it_skipped() {
        let node = NodeName::new("node-a").unwrap();
        let sender = ChitchatId::new("node-a", 1, "127.0.0.2:7000".parse().unwrap());
        let source = "127.0.0.2".parse().unwrap();
        let next = frame::encode_as(
            WireVersion::Next,
            &sender,
            &frame::syn_for_tests("c"),
            frame::DEFAULT_MAX_FRAME_BYTES,
        )
        .unwrap();
        let Ok((version, Accepted::Chitchat(Received { from, message, .. }))) =
            accept_frame(&next, &node, source, Some(&receiver()))
        else {
            panic!("a frame of the next version is delivered")
        };
        assert_eq!(
            (version, from, message),
            (
                WireVersion::Next.version(),
                sender.gossip_advertise_addr,
                frame::syn_for_tests("c")
            )
        );
        let unknown = frame::encode_versioned(
            WireVersion::Next.version(),
            9,
            b"",
            &sender,
            b"what a later kind says",
            frame::DEFAULT_MAX_FRAME_BYTES,
        )
        .unwrap();
        assert!(matches!(
            accept_frame(&unknown, &node, source, Some(&receiver())),
            Ok((_, Accepted::Skipped))
        ));
    }

    #[test]
    fn frame_speaking_for_another_node_is_refused() {
        let node = NodeName::new("node-a").unwrap();
        let err = accept_frame(
            &body("node-b", "127.0.0.2:7000"),
            &node,
            "127.0.0.2".parse().unwrap(),
            Some(&receiver()),
        )
        .err()
        .unwrap();
        assert_eq!(err.reason, "identity_mismatch");
    }

    #[test]
    fn frame_advertising_another_address_is_refused() {
        let node = NodeName::new("node-a").unwrap();
        let err = accept_frame(
            &body("node-a", "127.0.0.9:7000"),
            &node,
            "127.0.0.2".parse().unwrap(),
            Some(&receiver()),
        )
        .err()
        .unwrap();
        assert_eq!(err.reason, "address_mismatch");
    }
}
