//! The check on every incoming message, as a transport around any other (mutual TLS
//! for real nodes, chitchat's in-memory one in simulations): a SynAck or Ack reaches
//! chitchat without the node parts that fail `verify`. The rest of the message, its
//! digest included, goes through: a peer that relays one bad part still gets its
//! honest news applied and its exchange answered. A Syn of another cluster (another
//! clique) goes nowhere: see [`foreign`](super::foreign).

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context as _;
use async_trait::async_trait;
use chitchat::transport::{Socket, Transport};
use chitchat::{Chitchat, ChitchatId, ChitchatMessage, Deserializable, Serializable};
use rustls_pki_types::UnixTime;
use tokio::time::Instant;
use tracing::{debug, warn};

use super::credentials::{CredentialsWatch, StateCredentials};
use super::envelope;
use super::foreign::{Foreign, ForeignLog, foreign};
use super::verify::{CertCache, Checker, Held, Refusal};
use crate::metrics;
use crate::transport::episodes::Episodes;
use crate::transport::wire;
use crate::version::NewerVersions;

/// The checks one node runs on what it receives.
pub(crate) struct StateCheck {
    cluster: String,
    credentials: CredentialsWatch,
    /// Set once chitchat runs: what this node already holds of each node.
    chitchat: OnceLock<Arc<tokio::sync::Mutex<Chitchat>>>,
    certs: Mutex<Certs>,
    episodes: Mutex<Episodes>,
    foreign_log: Mutex<ForeignLog>,
    /// Owners met signing in a newer envelope version.
    newer: NewerVersions,
}

/// What the receive-side check makes of one message.
#[derive(Debug)]
pub(crate) enum Verdict {
    /// To chitchat as it is.
    Pass,
    /// To chitchat without the node parts that failed the checks.
    Filtered(ChitchatMessage),
    /// Not for chitchat at all: another cluster's.
    Drop,
}

impl Verdict {
    fn from_filter(filtered: Option<ChitchatMessage>) -> Self {
        filtered.map_or(Self::Pass, Self::Filtered)
    }
}

impl std::fmt::Debug for StateCheck {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateCheck")
            .field("cluster", &self.cluster)
            .finish_non_exhaustive()
    }
}

struct Certs {
    cache: CertCache,
    /// The credentials the cache was filled under: new trust anchors empty it.
    under: Option<Arc<StateCredentials>>,
}

impl StateCheck {
    pub(crate) fn new(cluster: String, credentials: CredentialsWatch) -> Arc<Self> {
        Arc::new(Self {
            cluster,
            credentials,
            chitchat: OnceLock::new(),
            certs: Mutex::new(Certs {
                cache: CertCache::default(),
                under: None,
            }),
            episodes: Mutex::new(Episodes::default()),
            foreign_log: Mutex::new(ForeignLog::default()),
            newer: NewerVersions::default(),
        })
    }

    /// The whole check of a message built by chitchat itself (the in-memory
    /// transport); see [`StateCheck::filter`].
    pub(crate) async fn check(&self, from: SocketAddr, message: &ChitchatMessage) -> Verdict {
        if self.refuse_foreign(from, message) {
            return Verdict::Drop;
        }
        Verdict::from_filter(self.filter(from, message).await)
    }

    /// The whole check of a message received as `wire`; see [`StateCheck::filter_wire`].
    pub(crate) async fn check_wire(
        &self,
        from: SocketAddr,
        message: &ChitchatMessage,
        wire: &[u8],
    ) -> Verdict {
        if self.refuse_foreign(from, message) {
            return Verdict::Drop;
        }
        Verdict::from_filter(self.filter_wire(from, wire).await)
    }

    /// True when `message` is another cluster's: counted, logged once per peer per
    /// period, and not to be answered.
    fn refuse_foreign(&self, from: SocketAddr, message: &ChitchatMessage) -> bool {
        let Some(foreign) = foreign(&self.cluster, message) else {
            return false;
        };
        metrics::foreign_cluster(foreign.kind());
        let news = self
            .foreign_log
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(from, Instant::now());
        match (&foreign, news) {
            (Foreign::Syn(theirs), true) => warn!(
                peer = %from,
                cluster = %theirs,
                ours = %self.cluster,
                "gossip Syn from another cluster (another clique) dropped unanswered: a stale or misconfigured seed? (further ones from this peer are counted in domaind_gossip_foreign_cluster_total, logged at most once an hour)"
            ),
            (Foreign::BadCluster, true) => warn!(
                peer = %from,
                ours = %self.cluster,
                "a gossip peer of another cluster (another clique) refused our Syn: a stale or misconfigured seed? (further refusals from this peer are counted in domaind_gossip_foreign_cluster_total, logged at most once an hour)"
            ),
            (_, false) => {
                debug!(peer = %from, kind = foreign.kind(), "gossip message of another cluster dropped")
            }
        }
        true
    }

    pub(crate) fn attach(&self, chitchat: Arc<tokio::sync::Mutex<Chitchat>>) {
        let _ = self.chitchat.set(chitchat);
    }

    /// The message without the node parts that fail the checks; `None` when it goes
    /// as it is. For messages built by chitchat itself (the in-memory transport):
    /// re-encoding a delta decoded from the wire can trip chitchat's length assertion,
    /// so the TLS transport checks the bytes it received instead
    /// ([`StateCheck::filter_wire`]).
    pub(crate) async fn filter(
        &self,
        from: SocketAddr,
        message: &ChitchatMessage,
    ) -> Option<ChitchatMessage> {
        let carries_delta = match message {
            ChitchatMessage::SynAck { delta, .. } | ChitchatMessage::Ack { delta } => {
                delta.serialized_len() > 1
            }
            ChitchatMessage::Syn { .. } | ChitchatMessage::BadCluster => false,
        };
        if !carries_delta {
            return None;
        }
        let mut bytes = Vec::with_capacity(message.serialized_len());
        message.serialize(&mut bytes);
        self.filter_wire(from, &bytes).await
    }

    /// Checks a message in its wire form; `None` when it goes to chitchat as it is,
    /// otherwise the message without the refused node parts.
    pub(crate) async fn filter_wire(
        &self,
        from: SocketAddr,
        message: &[u8],
    ) -> Option<ChitchatMessage> {
        let split = wire::split(message).ok()?;
        let parts = wire::parse_delta(split.delta?).ok()?;
        if parts.is_empty() {
            return None;
        }
        let (held, me): (Vec<Option<Held>>, Option<ChitchatId>) = match self.chitchat.get() {
            Some(chitchat) => {
                let chitchat = chitchat.lock().await;
                let held = parts
                    .iter()
                    .map(|part| chitchat.node_state(&part.id).map(Held::of))
                    .collect();
                (held, Some(chitchat.self_chitchat_id().clone()))
            }
            None => (vec![None; parts.len()], None),
        };
        let credentials = self.credentials.borrow().clone();
        let mut kept = Vec::with_capacity(parts.len());
        let mut refused = 0;
        {
            let mut certs = self.certs.lock().unwrap_or_else(|p| p.into_inner());
            if !certs
                .under
                .as_ref()
                .is_some_and(|under| Arc::ptr_eq(under, &credentials))
            {
                certs.cache.clear();
                certs.under = Some(credentials.clone());
            }
            let mut checker = Checker {
                cluster: &self.cluster,
                credentials: &credentials,
                certs: &mut certs.cache,
                now: UnixTime::now(),
            };
            for (part, held) in parts.into_iter().zip(&held) {
                // This node's own state relayed back to it: a peer answered a digest
                // older than what it heard from others since. Honest, and never to be
                // applied (chitchat would let it set our versions); dropped quietly.
                if me.as_ref() == Some(&part.id) {
                    refused += 1;
                    metrics::state_refused("own_state", 1);
                    continue;
                }
                match checker.check(&part, held.as_ref()) {
                    Ok(passed) => {
                        if passed.stale > 0 {
                            metrics::state_refused("stale", passed.stale);
                        }
                        if passed.newer > 0 {
                            self.newer.note(
                                "envelope",
                                &part.id.node_id,
                                u64::from(passed.newest),
                                u64::from(envelope::ENVELOPE_VERSION),
                                passed.newer,
                            );
                        }
                        kept.push(part);
                    }
                    Err(refusal) => {
                        refused += 1;
                        self.report(from, &part, &refusal);
                    }
                }
            }
        }
        if refused == 0 {
            return None;
        }
        let mut rebuilt = split.head.to_vec();
        rebuilt.extend(wire::encode_delta(&kept));
        // Chitchat decoded these parts a moment ago, and `encode_delta` writes them in
        // the form it reads; should that ever fail, nothing of the delta goes through.
        let filtered = ChitchatMessage::deserialize(&mut &rebuilt[..])
            .inspect_err(
                |error| warn!(%error, "cannot rebuild a checked delta; dropping all of it"),
            )
            .or_else(|_| {
                let mut bare = split.head.to_vec();
                bare.extend(wire::encode_delta(&[]));
                ChitchatMessage::deserialize(&mut &bare[..])
            })
            .unwrap_or(ChitchatMessage::BadCluster);
        Some(filtered)
    }

    fn report(&self, from: SocketAddr, part: &wire::NodePart, refusal: &Refusal) {
        metrics::state_refused(refusal.reason(), 1);
        let fresh = self
            .episodes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .note(&from.to_string(), refusal.reason(), Instant::now());
        if fresh {
            warn!(
                peer = %from,
                owner = %part.id.node_id,
                generation = part.id.generation_id,
                reason = refusal.reason(),
                "gossip state refused (further refusals from this peer for this reason are counted, not logged, until it stops for a minute): {refusal}"
            );
        }
    }
}

/// A socket of any transport, opened already, with [`StateCheck`] on what it
/// receives; chitchat opens it once.
pub(crate) struct SignedTransport {
    socket: Mutex<Option<Box<dyn Socket>>>,
    check: Arc<StateCheck>,
}

impl SignedTransport {
    pub(crate) async fn open(
        inner: &dyn Transport,
        listen_addr: SocketAddr,
        check: Arc<StateCheck>,
    ) -> anyhow::Result<Self> {
        let socket = inner
            .open(listen_addr)
            .await
            .context("opening the gossip transport")?;
        Ok(Self {
            socket: Mutex::new(Some(socket)),
            check,
        })
    }
}

#[async_trait]
impl Transport for SignedTransport {
    async fn open(&self, _listen_addr: SocketAddr) -> anyhow::Result<Box<dyn Socket>> {
        let inner = self
            .socket
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .take()
            .context("the gossip socket is open already")?;
        Ok(Box::new(SignedSocket {
            inner,
            check: self.check.clone(),
            checking: None,
        }))
    }
}

struct SignedSocket {
    inner: Box<dyn Socket>,
    check: Arc<StateCheck>,
    /// A message received whose check has not finished: chitchat races `recv`
    /// against its gossip tick and its commands and drops the losing future, so the
    /// message waits here; a check cut short starts again at the next `recv`.
    checking: Option<(SocketAddr, ChitchatMessage)>,
}

#[async_trait]
impl Socket for SignedSocket {
    async fn send(&mut self, to: SocketAddr, message: ChitchatMessage) -> anyhow::Result<()> {
        self.inner.send(to, message).await
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        loop {
            if self.checking.is_none() {
                self.checking = Some(self.inner.recv().await?);
            }
            let (from, message) = self.checking.as_ref().expect("a message to check");
            let verdict = self.check.check(*from, message).await;
            let (from, message) = self.checking.take().expect("a message to check");
            match verdict {
                Verdict::Pass => return Ok((from, message)),
                Verdict::Filtered(filtered) => return Ok((from, filtered)),
                Verdict::Drop => {}
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::collections::VecDeque;
    use std::time::Duration;

    use chitchat::ChitchatId;

    use super::*;
    use crate::identity::NodeName;
    use crate::pki::{DevCa, NodeCertRequest};
    use crate::transport::wire::testing::ack_as_chitchat_writes;
    use crate::transport::wire::{KeyValue, NodeOp, NodePart, STATUS_SET};

    /// A socket that hands out the messages it was given, then waits forever.
    struct Queued(VecDeque<(SocketAddr, ChitchatMessage)>);

    #[async_trait]
    impl Socket for Queued {
        async fn send(&mut self, _: SocketAddr, _: ChitchatMessage) -> anyhow::Result<()> {
            Ok(())
        }
        async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
            match self.0.pop_front() {
                Some(message) => Ok(message),
                None => std::future::pending().await,
            }
        }
    }

    // Paused: the receive that must not finish while the lock is held is given its 20 ms
    // at once, and the in-memory transport has nothing to do with the wall clock.
    #[tokio::test(start_paused = true)]
    async fn a_receive_cut_short_while_checking_loses_no_message() {
        let node = NodeName::new("node-a").unwrap();
        let credentials = DevCa::generate("test CA", time::Duration::hours(1))
            .unwrap()
            .issue(&NodeCertRequest::new(
                node.clone(),
                time::Duration::hours(1),
            ))
            .unwrap()
            .credentials(&node)
            .unwrap();
        let addr: SocketAddr = "127.0.0.1:7000".parse().unwrap();
        let handle = crate::lone_chitchat_for_tests("node-a", addr).await;
        let check = StateCheck::new("c".into(), credentials.fixed());
        check.attach(handle.chitchat());

        let part = NodePart {
            id: ChitchatId::new("node-b", 1, "127.0.0.2:7000".parse().unwrap()),
            last_gc_version: 0,
            from_version_excluded: 0,
            ops: vec![NodeOp::KeyValue(KeyValue {
                key: "k".into(),
                value: "unsigned".into(),
                version: 1,
                status: STATUS_SET,
            })],
        };
        let message =
            ChitchatMessage::deserialize(&mut &ack_as_chitchat_writes(&[part])[..]).unwrap();
        let mut socket = SignedSocket {
            inner: Box::new(Queued(VecDeque::from([(addr, message)]))),
            check,
            checking: None,
        };

        // Chitchat's lock is taken (a gossip round, the eager task): the check waits,
        // and chitchat's select drops the receive for its tick.
        let chitchat = handle.chitchat();
        let held = chitchat.lock().await;
        let cut_short = tokio::time::timeout(Duration::from_millis(20), socket.recv()).await;
        assert!(cut_short.is_err(), "the check waits for the lock");
        drop(held);

        let (from, filtered) = tokio::time::timeout(Duration::from_secs(5), socket.recv())
            .await
            .expect("the message was kept for the next receive")
            .unwrap();
        assert_eq!(from, addr);
        // Its unsigned part is gone, the message itself is there.
        let ChitchatMessage::Ack { delta } = filtered else {
            panic!("an Ack");
        };
        assert_eq!(delta.serialized_len(), 1, "{delta:?}");
    }
}
