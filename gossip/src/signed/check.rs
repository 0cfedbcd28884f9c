//! The check on every incoming message, as a transport around any other (mutual TLS
//! for real nodes, chitchat's in-memory one in simulations): a SynAck or Ack reaches
//! chitchat without the node parts that fail `verify`. The rest of the message, its
//! digest included, goes through: a peer that relays one bad part still gets its
//! honest news applied and its exchange answered.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use anyhow::Context as _;
use async_trait::async_trait;
use chitchat::transport::{Socket, Transport};
use chitchat::{Chitchat, ChitchatMessage, Deserializable, Serializable};
use rustls_pki_types::UnixTime;
use tokio::time::Instant;
use tracing::warn;

use super::credentials::{CredentialsWatch, StateCredentials};
use super::verify::{CertCache, Checker, Held, Refusal};
use crate::metrics;
use crate::transport::episodes::Episodes;
use crate::transport::wire;

/// The checks one node runs on what it receives.
pub(crate) struct StateCheck {
    cluster: String,
    credentials: CredentialsWatch,
    /// Set once chitchat runs: what this node already holds of each node.
    chitchat: OnceLock<Arc<tokio::sync::Mutex<Chitchat>>>,
    certs: Mutex<Certs>,
    episodes: Mutex<Episodes>,
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
        })
    }

    pub(crate) fn attach(&self, chitchat: Arc<tokio::sync::Mutex<Chitchat>>) {
        let _ = self.chitchat.set(chitchat);
    }

    /// The message without the node parts that fail the checks. For messages built by
    /// chitchat itself (the in-memory transport): re-encoding a delta decoded from
    /// the wire can trip chitchat's length assertion, so the TLS transport checks the
    /// bytes it received instead ([`StateCheck::filter_wire`]).
    pub(crate) async fn filter(
        &self,
        from: SocketAddr,
        message: ChitchatMessage,
    ) -> ChitchatMessage {
        let carries_delta = match &message {
            ChitchatMessage::SynAck { delta, .. } | ChitchatMessage::Ack { delta } => {
                delta.serialized_len() > 1
            }
            ChitchatMessage::Syn { .. } | ChitchatMessage::BadCluster => false,
        };
        if !carries_delta {
            return message;
        }
        let mut bytes = Vec::with_capacity(message.serialized_len());
        message.serialize(&mut bytes);
        match self.filter_wire(from, &bytes).await {
            None => message,
            Some(filtered) => filtered,
        }
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
        let held: Vec<Option<Held>> = match self.chitchat.get() {
            Some(chitchat) => {
                let chitchat = chitchat.lock().await;
                parts
                    .iter()
                    .map(|part| chitchat.node_state(&part.id).map(Held::of))
                    .collect()
            }
            None => vec![None; parts.len()],
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
                match checker.check(&part, held.as_ref()) {
                    Ok(passed) => {
                        if passed.stale > 0 {
                            metrics::state_refused("stale", passed.stale);
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
        }))
    }
}

struct SignedSocket {
    inner: Box<dyn Socket>,
    check: Arc<StateCheck>,
}

#[async_trait]
impl Socket for SignedSocket {
    async fn send(&mut self, to: SocketAddr, message: ChitchatMessage) -> anyhow::Result<()> {
        self.inner.send(to, message).await
    }

    async fn recv(&mut self) -> anyhow::Result<(SocketAddr, ChitchatMessage)> {
        let (from, message) = self.inner.recv().await?;
        Ok((from, self.check.filter(from, message).await))
    }
}
