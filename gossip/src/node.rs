//! `GossipNode`: the one handle the rest of domaind holds on gossip. It hides
//! chitchat's mutex and state types behind set/delete, a membership view and a stream
//! of changes.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use chitchat::transport::Transport;
use chitchat::{ChitchatConfig, ChitchatHandle, ChitchatId, spawn_chitchat};
use futures::Stream;
use futures::StreamExt;
use tokio::sync::watch;
use tokio_stream::wrappers::WatchStream;
use tracing::info;

use crate::config::GossipConfig;
use crate::eager::{EagerTask, LiveNodes};
use crate::identity::NodeName;
use crate::membership::{GossipEvent, Membership, event_stream, membership_from};
use crate::tls::NodeTls;
use crate::transport::{TlsTransport, TransportLimits};

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

/// A running gossip member.
pub struct GossipNode {
    node: NodeName,
    chitchat_id: ChitchatId,
    handle: Arc<ChitchatHandle>,
    /// Refreshed as soon as gossip learns something, not only once per round.
    live: watch::Receiver<LiveNodes>,
    eager: EagerTask,
    /// Set by `stop`: an end of the gossip task after it is expected, not news.
    stopping: Arc<AtomicBool>,
}

impl std::fmt::Debug for GossipNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GossipNode")
            .field("id", &self.chitchat_id)
            .finish_non_exhaustive()
    }
}

impl GossipNode {
    /// Starts gossip over any transport (the simulation's, for instance). The listen
    /// address must be concrete: it is this node's address on that transport.
    pub async fn start(
        config: GossipConfig,
        transport: &dyn Transport,
    ) -> Result<Self, GossipError> {
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
        let handle = spawn_chitchat(chitchat_config, config.initial_keys.clone(), transport)
            .await
            .map_err(GossipError::Start)?;
        let handle = Arc::new(handle);
        let (eager, live) = EagerTask::spawn(handle.clone(), config.timing.eager).await;
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
            stopping: Arc::new(AtomicBool::new(false)),
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
        let mut transport = TlsTransport::new(tls, config.generation, limits);
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
        Self::start(config, &transport).await
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

    /// Publishes a key of this node and passes it on at once (eager gossip); the
    /// regular rounds repeat it to everyone.
    pub async fn set(&self, key: impl Into<String>, value: impl Into<String>) {
        let (key, value) = (key.into(), value.into());
        self.handle
            .with_chitchat(move |chitchat| {
                chitchat.self_node_state().set(key.clone(), value.clone());
            })
            .await;
        self.eager.own_news.notify_one();
    }

    /// Deletes a key of this node; peers see the deletion, not a timeout.
    pub async fn delete(&self, key: &str) {
        self.handle
            .with_chitchat(|chitchat| chitchat.self_node_state().delete(key))
            .await;
        self.eager.own_news.notify_one();
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
        // An error means the loop already ended, which is what we want.
        let _ = self.handle.initiate_shutdown();
        self.handle
            .termination_watcher()
            .await
            .map_err(GossipError::Stopped)
    }

    /// Resolves, with the reason, when the gossip task ends without `stop` having been
    /// asked for: it panicked, failed or was aborted. Chitchat catches nothing, and the
    /// rest of the process goes on without noticing, so the owner watches this.
    /// Resolves as the task ends (a channel closes or is written), no polling.
    pub fn ended(&self) -> impl Future<Output = String> + Send + 'static + use<> {
        let termination = self.handle.termination_watcher();
        let stopping = self.stopping.clone();
        async move {
            let reason = match termination.await {
                Ok(()) => "gossip stopped on its own".to_string(),
                Err(error) => format!("gossip stopped: {error:#}"),
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
        self.handle.abort();
    }

    /// Stops gossiping and closes the listener. Peers notice through their failure
    /// detectors.
    pub async fn shutdown(self) -> Result<(), GossipError> {
        self.stop().await
    }
}
