//! `GossipNode`: the one handle the rest of domaind holds on gossip. It hides
//! chitchat's mutex and state types behind set/delete, a membership view and a stream
//! of changes.

use std::collections::{BTreeSet, HashSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chitchat::transport::Transport;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, spawn_chitchat};
use futures::Stream;
use futures::StreamExt;
use tokio::sync::Notify;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_stream::wrappers::WatchStream;
use tracing::{error, info};

use crate::config::GossipConfig;
use crate::eager::{EagerTask, LiveNodes};
use crate::identity::NodeName;
use crate::membership::{GossipEvent, Membership, event_stream, membership_from};
use crate::metrics;
use crate::pulse::{PulseEndpoint, PulseNetwork, PulseTask};
use crate::signed::credentials::CredentialsWatch;
use crate::signed::{SignedTransport, StateCheck, owner};
use crate::tls::NodeTls;
use crate::transport::{TlsTransport, TransportLimits};
use crate::version::WireVersion;

#[derive(Debug, thiserror::Error)]
pub enum GossipError {
    #[error("TLS certificate names node {cert:?} but gossip is configured as {configured:?}")]
    WrongIdentity {
        cert: NodeName,
        configured: NodeName,
    },
    #[error("cannot bind gossip listener on {addr}: {source}")]
    Bind {
        addr: std::net::SocketAddr,
        source: std::io::Error,
    },
    #[error("gossip listen address {0} resolves to no dialable address; set an advertise address")]
    Undialable(std::net::SocketAddr),
    #[error("cannot start gossip: {0:#}")]
    Start(anyhow::Error),
    #[error("gossip stopped with an error: {0:#}")]
    Stopped(anyhow::Error),
}

/// The size of a node's gossip state ([`GossipNode::state_size`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StateSize {
    /// Node states kept, this node's included.
    pub nodes: usize,
    /// Keys over all of them, deleted ones still kept included.
    pub keys: usize,
    /// Bytes of those keys and values.
    pub bytes: usize,
}

/// A running gossip member.
pub struct GossipNode {
    node: NodeName,
    chitchat_id: ChitchatId,
    handle: Arc<ChitchatHandle>,
    /// Refreshed as soon as gossip learns something, not only once per round.
    live: watch::Receiver<LiveNodes>,
    eager: EagerTask,
    /// What this node signs its values with; follows certificate rotations.
    credentials: CredentialsWatch,
    /// Signs everything again when the certificate rotates.
    resigner: JoinHandle<()>,
    /// Counts and exchanges pulses: who is live.
    pulse: PulseTask,
    /// The seeds: from the configuration's addresses, then the newest `set_seeds`;
    /// the pulse task turns to them while no peer is live.
    seeds: watch::Sender<Vec<SocketAddr>>,
    /// Set by `stop`: an end of the gossip task after it is expected, not news.
    stopping: Arc<AtomicBool>,
    /// The version this node's values are signed in.
    wire: WireVersion,
}

impl Drop for GossipNode {
    fn drop(&mut self) {
        self.resigner.abort();
    }
}

impl std::fmt::Debug for GossipNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GossipNode")
            .field("id", &self.chitchat_id)
            .finish_non_exhaustive()
    }
}

impl GossipNode {
    /// Starts gossip over any transport (the simulation's, for instance), with pulses
    /// on `pulses`. The listen address must be concrete: it is this node's address on
    /// both. Every value is signed with `credentials`, and every node's state received
    /// is checked against their CA before chitchat applies it.
    pub async fn start(
        config: GossipConfig,
        transport: &dyn Transport,
        pulses: &dyn PulseNetwork,
        credentials: CredentialsWatch,
    ) -> Result<Self, GossipError> {
        let check = StateCheck::new(config.cluster_id.clone(), credentials.clone());
        let transport = SignedTransport::open(transport, config.listen_addr, check.clone())
            .await
            .map_err(GossipError::Start)?;
        let endpoint = pulses.open(config.effective_advertise_addr());
        Self::start_checked(config, &transport, endpoint, credentials, check).await
    }

    /// Starts gossip over a transport that runs `check` on what it receives.
    async fn start_checked(
        config: GossipConfig,
        transport: &dyn Transport,
        pulse_endpoint: PulseEndpoint,
        credentials: CredentialsWatch,
        check: Arc<StateCheck>,
    ) -> Result<Self, GossipError> {
        let signer = credentials.borrow().node().clone();
        if signer != config.node {
            return Err(GossipError::WrongIdentity {
                cert: signer,
                configured: config.node,
            });
        }
        let chitchat_id = ChitchatId::new(
            config.node.as_str(),
            config.generation,
            config.effective_advertise_addr(),
        );
        let chitchat_config = ChitchatConfig {
            chitchat_id: chitchat_id.clone(),
            cluster_id: config.cluster_id.clone(),
            gossip_interval: config.timing.gossip_interval,
            listen_addr: config.listen_addr,
            seed_nodes: config.seeds.clone(),
            failure_detector_config: config.timing.failure_detector(),
            marked_for_deletion_grace_period: config.timing.tombstone_grace_period,
            catchup_callback: None,
            extra_liveness_predicate: None,
        };
        // No initial keys for chitchat: they are signed below, after the certificate,
        // which must be this node's oldest value.
        let handle = spawn_chitchat(chitchat_config, Vec::new(), transport)
            .await
            .map_err(GossipError::Start)?;
        check.attach(handle.chitchat());
        let current = credentials.borrow().clone();
        let initial_keys = config.initial_keys.clone();
        let wire = config.wire_version;
        handle
            .with_chitchat(move |chitchat| {
                let mut written = owner::publish_certificate(chitchat, &current, wire)?;
                for (key, value) in &initial_keys {
                    written += usize::from(owner::publish(chitchat, &current, key, value, wire)?);
                }
                metrics::state_signed(written);
                Ok::<_, owner::WriteError>(())
            })
            .await
            .map_err(|e| GossipError::Start(anyhow::anyhow!("signing this node's state: {e}")))?;
        let handle = Arc::new(handle);
        let (seeds, seeds_rx) = watch::channel(literal_seeds(&config.seeds));
        // Every seed at once, not one per round as chitchat's rounds would: nodes that
        // start together (a rack powering up) then know each other as soon as the
        // last one is up, rather than after rounds of relays.
        for seed in seeds_rx.borrow().iter() {
            let _ = handle.gossip(*seed);
        }
        let (pulse, liveness) = PulseTask::spawn(
            handle.clone(),
            pulse_endpoint,
            config.timing.pulse,
            seeds_rx,
            wire,
        );
        let (eager, live) = EagerTask::spawn(handle.clone(), config.timing.eager, liveness).await;
        let resigner = tokio::spawn(resign_on_rotation(
            handle.clone(),
            credentials.clone(),
            eager.own_news.clone(),
            wire,
        ));
        info!(
            node = %config.node,
            generation = config.generation,
            cluster = %config.cluster_id,
            advertise = %chitchat_id.gossip_advertise_addr,
            seeds = ?config.seeds,
            "gossip started"
        );
        Ok(Self {
            node: config.node,
            chitchat_id,
            handle,
            live,
            eager,
            credentials,
            resigner,
            pulse,
            seeds,
            stopping: Arc::new(AtomicBool::new(false)),
            wire,
        })
    }

    /// Starts gossip over mutual TLS. A listen port of 0 picks a free port; the chosen
    /// address is [`GossipNode::gossip_addr`].
    pub async fn start_tls(
        mut config: GossipConfig,
        tls: Arc<NodeTls>,
        limits: TransportLimits,
    ) -> Result<Self, GossipError> {
        if tls.node() != &config.node {
            return Err(GossipError::WrongIdentity {
                cert: tls.node().clone(),
                configured: config.node,
            });
        }
        let credentials = tls.credentials();
        let check = StateCheck::new(config.cluster_id.clone(), credentials.clone());
        let mut transport = TlsTransport::new(tls, config.generation, limits)
            .with_state_check(check.clone())
            .with_wire_version(config.wire_version);
        if let Some(advertise) = config.advertise_addr {
            transport = transport.with_advertise_addr(advertise);
        }
        let bound =
            transport
                .bind(config.listen_addr)
                .await
                .map_err(|source| GossipError::Bind {
                    addr: config.listen_addr,
                    source,
                })?;
        config.listen_addr = bound;
        let advertise = config.effective_advertise_addr();
        if advertise.ip().is_unspecified() || advertise.port() == 0 {
            return Err(GossipError::Undialable(advertise));
        }
        let pulses = transport
            .pulse_endpoint()
            .expect("a new transport's pulse endpoint is there to take");
        Self::start_checked(config, &transport, pulses, credentials, check).await
    }

    pub fn node(&self) -> &NodeName {
        &self.node
    }

    pub fn generation(&self) -> u64 {
        self.chitchat_id.generation_id
    }

    /// The address peers dial to reach this node.
    pub fn gossip_addr(&self) -> std::net::SocketAddr {
        self.chitchat_id.gossip_advertise_addr
    }

    /// Seeds found after start (the Kubernetes backend's clique-mates, say), passed
    /// to chitchat as exchanges rather than as its seed list, which cannot change once
    /// it runs. Keeps them (see [`GossipNode::seeds`]) and starts one exchange at once
    /// with each that is not the advertised address of a live member (this node's own
    /// included); returns how many it started. While no peer is live, the pulse task
    /// asks one of them every round; once one exchange succeeds, gossip keeps the peer.
    pub fn set_seeds(&self, seeds: Vec<SocketAddr>) -> usize {
        let seeds: BTreeSet<SocketAddr> = seeds.into_iter().collect();
        self.seeds.send_replace(seeds.iter().copied().collect());
        let live: HashSet<SocketAddr> = self
            .live
            .borrow()
            .keys()
            .map(|id| id.gossip_advertise_addr)
            .chain([self.gossip_addr()])
            .collect();
        let mut started = 0;
        for seed in seeds {
            if live.contains(&seed) {
                continue;
            }
            // Fails only once the gossip task has ended, which `ended` reports.
            if self.handle.gossip(seed).is_ok() {
                started += 1;
            }
        }
        started
    }

    /// The seeds of the newest `set_seeds` in address order (before any, those the
    /// configuration gave as addresses).
    pub fn seeds(&self) -> Vec<SocketAddr> {
        self.seeds.borrow().clone()
    }

    /// Publishes a key of this node and passes it on at once (eager gossip); the
    /// regular rounds repeat it to everyone.
    pub async fn set(&self, key: impl Into<String>, value: impl Into<String>) {
        let (key, value) = (key.into(), value.into());
        let credentials = self.credentials.borrow().clone();
        let written = self
            .handle
            .with_chitchat(|chitchat| {
                owner::publish(chitchat, &credentials, &key, &value, self.wire)
            })
            .await;
        self.wrote(&key, written);
    }

    /// Deletes a key of this node; peers see the deletion, not a timeout.
    pub async fn delete(&self, key: &str) {
        let credentials = self.credentials.borrow().clone();
        let written = self
            .handle
            .with_chitchat(|chitchat| owner::retract(chitchat, &credentials, key, self.wire))
            .await;
        self.wrote(key, written);
    }

    fn wrote(&self, key: &str, written: Result<bool, owner::WriteError>) {
        match written {
            Ok(true) => {
                metrics::state_signed(1);
                self.eager.own_news.notify_one();
            }
            Ok(false) => {}
            // A key that cannot sign is refused when the TLS files are loaded; this is
            // a bug, and peers would refuse an unsigned value anyway.
            Err(error) => {
                error!(node = %self.node, key, %error, "cannot sign a gossip value; not published")
            }
        }
    }

    /// How much state this node's chitchat holds: every node state it keeps (dead
    /// members' too, until chitchat forgets them) and every key, deleted ones included
    /// until their grace passes. What a soak watches for growth.
    pub async fn state_size(&self) -> StateSize {
        self.handle
            .with_chitchat(|chitchat| {
                let mut size = StateSize::default();
                for state in chitchat.node_states().values() {
                    size.nodes += 1;
                    for (key, value) in state.key_values_including_deleted() {
                        size.keys += 1;
                        size.bytes += key.len() + value.value.len();
                    }
                }
                size
            })
            .await
    }

    /// The live members (this node included), as of the newest news.
    pub fn live_nodes(&self) -> Membership {
        membership_from(&self.live.borrow())
    }

    /// Snapshots of the live members, one per gossip round that changed something. A
    /// slow reader skips to the newest snapshot: nothing piles up.
    pub fn membership_updates(&self) -> impl Stream<Item = Membership> + Send + 'static + use<> {
        WatchStream::new(self.live.clone()).map(|live| membership_from(&live))
    }

    /// Changes to the membership and to the keys of live members. The stream starts with
    /// the current view (a join and its keys for every live node, this one included),
    /// then follows changes, observed once per gossip round.
    pub fn events(&self) -> impl Stream<Item = GossipEvent> + Send + 'static + use<> {
        event_stream(self.membership_updates())
    }

    /// Stops gossiping and waits until the listener is closed, for a node shared
    /// behind an `Arc`. Peers notice through their failure detectors.
    pub async fn stop(&self) -> Result<(), GossipError> {
        info!(node = %self.node, "gossip stopping");
        self.stopping.store(true, Ordering::Release);
        self.pulse.abort();
        // An error means the loop already ended, which is what we want.
        let _ = self.handle.initiate_shutdown();
        self.handle
            .termination_watcher()
            .await
            .map_err(GossipError::Stopped)
    }

    /// Resolves, with the reason, when the gossip task or the pulse task ends without
    /// `stop` having been asked for: it panicked, failed or was aborted. Chitchat catches nothing, and the
    /// rest of the process goes on without noticing, so the owner watches this.
    /// Resolves as the task ends (a channel closes or is written), no polling.
    pub fn ended(&self) -> impl Future<Output = String> + Send + 'static + use<> {
        let termination = self.handle.termination_watcher();
        let pulses = self.pulse.ended();
        let stopping = self.stopping.clone();
        async move {
            // Pulses are liveness: without them peers declare this node dead while
            // chitchat runs on, so their end is the gossip plane's end too.
            let reason = tokio::select! {
                ended = termination => match ended {
                    Ok(()) => "gossip stopped on its own".to_string(),
                    Err(error) => format!("gossip stopped: {error:#}"),
                },
                reason = pulses => reason,
            };
            if stopping.load(Ordering::Acquire) {
                // Asked for: nothing to report, ever.
                std::future::pending::<()>().await;
            }
            reason
        }
    }

    /// Ends the gossip task at once, without telling peers, as a crash would: for
    /// chaos tests and for checking that the owner notices.
    pub fn abort(&self) {
        self.pulse.abort();
        self.handle.abort();
    }

    /// Stops gossiping and closes the listener. Peers notice through their failure
    /// detectors.
    pub async fn shutdown(self) -> Result<(), GossipError> {
        self.stop().await
    }
}

/// The seeds given as addresses; names are chitchat's to resolve in its rounds.
fn literal_seeds(seeds: &[String]) -> Vec<SocketAddr> {
    seeds.iter().filter_map(|seed| seed.parse().ok()).collect()
}

/// Publishes the new certificate and signs every value again with it, each time the
/// credentials change, until they can no longer change.
async fn resign_on_rotation(
    handle: Arc<ChitchatHandle>,
    mut credentials: CredentialsWatch,
    own_news: Arc<Notify>,
    wire: WireVersion,
) {
    while credentials.changed().await.is_ok() {
        let current = credentials.borrow_and_update().clone();
        let node = current.node().clone();
        let written = handle
            .with_chitchat(move |chitchat| owner::publish_certificate(chitchat, &current, wire))
            .await;
        match written {
            Ok(0) => {}
            Ok(count) => {
                metrics::state_signed(count);
                info!(%node, values = count, "gossip state signed again with the rotated certificate");
                own_news.notify_one();
            }
            Err(error) => {
                error!(%node, %error, "cannot sign gossip state with the rotated certificate")
            }
        }
    }
}
