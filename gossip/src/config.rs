//! Gossip configuration and its defaults.

use std::net::SocketAddr;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use chitchat::FailureDetectorConfig;

use crate::eager::EagerGossip;
use crate::identity::NodeName;
use crate::pulse::PulseTiming;
use crate::version::WireVersion;

/// How often gossip runs and how quickly a silent node is declared dead.
///
/// Who is live is the pulses' business (`pulse`): a count per node exchanged every
/// 150 ms, a node silent for 2 s is dead. Chitchat's own rounds, which send every
/// node's full digest, are a slow anti-entropy backstop (every 10 s): news travels at
/// once by eager push. Chitchat's failure detector only steers its own choice of peers
/// and when it forgets a dead node's state; its settings are for heartbeats heard a few
/// times per round.
#[derive(Debug, Clone, PartialEq)]
pub struct GossipTiming {
    /// Chitchat's rounds: anti-entropy, and the only digests sent while nothing changes.
    pub gossip_interval: Duration,
    /// Liveness: how often pulses go and how long a silent node stays live.
    pub pulse: PulseTiming,
    /// Phi accrual threshold above which chitchat's detector declares a node dead.
    pub phi_threshold: f64,
    /// How many heartbeat intervals the failure detector averages over.
    pub sampling_window: usize,
    /// Heartbeat gaps longer than this are not sampled (they are outages, not jitter).
    pub max_heartbeat_interval: Duration,
    /// The interval assumed before enough heartbeats have been seen.
    pub initial_heartbeat_interval: Duration,
    /// How long a dead node's state is kept before it is forgotten.
    pub dead_node_grace_period: Duration,
    /// How long a deleted key's tombstone is kept so that lagging peers learn of it.
    pub tombstone_grace_period: Duration,
    /// How news is passed on between rounds.
    pub eager: EagerGossip,
}

impl Default for GossipTiming {
    fn default() -> Self {
        Self {
            gossip_interval: Duration::from_secs(10),
            pulse: PulseTiming::default(),
            phi_threshold: 8.0,
            sampling_window: 100,
            max_heartbeat_interval: Duration::from_secs(60),
            initial_heartbeat_interval: Duration::from_secs(10),
            dead_node_grace_period: Duration::from_secs(3600),
            tombstone_grace_period: Duration::from_secs(3600),
            eager: EagerGossip::default(),
        }
    }
}

impl GossipTiming {
    pub(crate) fn failure_detector(&self) -> FailureDetectorConfig {
        FailureDetectorConfig::new(
            self.phi_threshold,
            self.sampling_window,
            self.max_heartbeat_interval,
            self.initial_heartbeat_interval,
            self.dead_node_grace_period,
        )
    }
}

/// Everything one gossip member needs to start.
#[derive(Debug, Clone)]
pub struct GossipConfig {
    /// This node's name: its chitchat node id, and the name its certificate carries.
    pub node: NodeName,
    /// Must be higher than any earlier run of this node; see [`default_generation`].
    pub generation: u64,
    /// Where to listen. Port 0 picks a free port (TLS transport only).
    pub listen_addr: SocketAddr,
    /// The address peers dial; defaults to the bound listen address.
    pub advertise_addr: Option<SocketAddr>,
    /// `host:port` or `ip:port` of nodes to contact first; any one live seed is enough.
    pub seeds: Vec<String>,
    /// Nodes only gossip with nodes of the same cluster id; see [`cluster_id_for_clique`].
    pub cluster_id: String,
    /// Keys this node publishes from its first gossip round.
    pub initial_keys: Vec<(String, String)>,
    pub timing: GossipTiming,
    /// The version of what this node writes; only tests write another than the
    /// current one, to play a node of the next release.
    pub wire_version: WireVersion,
}

impl GossipConfig {
    pub fn new(node: NodeName, listen_addr: SocketAddr, cluster_id: impl Into<String>) -> Self {
        Self {
            node,
            generation: default_generation(),
            listen_addr,
            advertise_addr: None,
            seeds: Vec::new(),
            cluster_id: cluster_id.into(),
            initial_keys: Vec::new(),
            timing: GossipTiming::default(),
            wire_version: WireVersion::Current,
        }
    }

    pub(crate) fn effective_advertise_addr(&self) -> SocketAddr {
        self.advertise_addr.unwrap_or(self.listen_addr)
    }
}

/// Milliseconds since the Unix epoch: a restarted node gets a higher generation than
/// its previous run without any state on disk, as long as the clock does not go back.
pub fn default_generation() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// One gossip cluster per NVLink clique: only nodes of one clique can share memory,
/// and per-clique clusters keep messages small (18 nodes per NVL72, 144 per NVL576)
/// however large the Kubernetes cluster is. Nodes without fabric get the empty clique.
pub fn cluster_id_for_clique(clique_id: &str) -> String {
    format!("domaind/clique/{clique_id}")
}
