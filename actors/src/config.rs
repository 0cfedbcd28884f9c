//! A node's configuration, with the defaults a production node runs with.

use std::net::IpAddr;
use std::time::Duration;

use crate::model::{ChannelId, CliqueId, DEFAULT_MAX_SLOTS, NodeId, ReadinessPolicy, Slot};
use crate::rules::imex_poll::ImexPollConfig;
use crate::rules::peer_health::PeerHealthConfig;

#[derive(Debug, Clone, PartialEq)]
pub struct NodeConfig {
    pub node: NodeId,
    /// The address IMEX daemons use to reach this node.
    pub ip: IpAddr,
    /// This node's NVLink clique; empty without fabric (a no-op member).
    pub clique: CliqueId,
    /// IMEX slots per domain: 18 for an NVL72 rack, up to the clique size.
    pub max_slots: Slot,
    /// Channel isolation: the channels sharing domains are given, `0..channels` (the
    /// channel devices a node publishes).
    pub channels: ChannelId,
    /// Channel isolation: how long this node's assignment of a channel must have been
    /// advertised, unchanged, before it is handed to a pod. Longer than gossip takes to
    /// spread a change across the clique, so that two nodes that have not heard of
    /// each other's new domains yet cannot both hand one channel out
    /// (`rules::channels`).
    pub channel_settle: Duration,
    /// For claims whose opaque config does not say.
    pub default_readiness: ReadinessPolicy,
    /// How long a prepare call waits for its readiness policy before answering with a
    /// retryable error (the kubelet calls again).
    pub prepare_deadline: Duration,
    /// A status is written once it has been quiet this long: a burst of changes (a
    /// domain forming) becomes one write...
    pub status_quiet: Duration,
    /// ...unless changes keep coming: then it is written at least this often.
    pub status_max_delay: Duration,
    /// A Ready domain's degradation is held this long before it is written: a dead
    /// node is lost, then dropped from the IMEX peer set, then the survivors' IMEX
    /// daemons are ready again without it; held past them, a node loss is one write.
    pub status_degradation_hold: Duration,
    /// A node that just joined a domain sees few of its members until gossip has run a
    /// few rounds; it does not act as the domain's reporter before this long, so that
    /// every new member does not write "1/1 ready" in turn.
    pub reporter_settle: Duration,
    /// While its view still changes (a rack starting cold), or while it is alone in
    /// gossip, the reporter also waits `reporter_settle` after the last change, but
    /// only up to this long after joining: a domain in a clique of one is reported
    /// after this long.
    pub reporter_settle_max: Duration,
    pub peer_health: PeerHealthConfig,
    /// When the IMEX daemon's status is queried: quickly after a change, then less
    /// and less often, down to `steady` once it is ready (`rules::imex_poll`).
    pub imex_poll: ImexPollConfig,
    /// Restarts of the IMEX daemon wait this long, doubling with each failure in a
    /// row (a start that fails, a daemon that exits) up to the max.
    pub imex_restart_backoff_min: Duration,
    pub imex_restart_backoff_max: Duration,
    /// A daemon that ran this long before it exited was healthy: its restart starts
    /// the backoff afresh. A start alone proves nothing: a daemon that cannot listen
    /// starts fine and exits a moment later.
    pub imex_healthy_after: Duration,
    /// A restarted node daemon whose IMEX outlived it waits this long at most for IMEX
    /// to answer before it advertises its domains again (`actors::domain`).
    pub imex_adoption_wait: Duration,
    /// How long a member that died stays listed (NotReady) before it is forgotten.
    pub lost_retention: Duration,
    /// A member whose daemon restarted has this long to advertise its domains again
    /// (it reads its checkpoint first); one that does not has left
    /// (`rules::roster`). Until then it is lost, not gone: held if its IMEX lives.
    pub rejoin_grace: Duration,
    /// A node taking the reporter role writes nothing that drops a member the written
    /// status lists and it has not seen yet (its gossip view may still be filling
    /// up), for at most this long after it joined the domain; then such members are
    /// listed lost (`rules::takeover`).
    pub status_takeover_grace: Duration,
    /// A node whose last claim of a domain left watches this long for the other
    /// members to leave too: if none remains, it writes the status as vacated.
    pub last_out_watch: Duration,
}

impl NodeConfig {
    pub fn new(node: impl Into<NodeId>, ip: IpAddr, clique: CliqueId) -> Self {
        Self {
            node: node.into(),
            ip,
            clique,
            max_slots: DEFAULT_MAX_SLOTS,
            channels: 8,
            channel_settle: Duration::from_secs(1),
            default_readiness: ReadinessPolicy::Local,
            prepare_deadline: Duration::from_secs(40),
            status_quiet: Duration::from_millis(400),
            status_max_delay: Duration::from_secs(3),
            status_degradation_hold: Duration::from_millis(1500),
            reporter_settle: Duration::from_millis(200),
            reporter_settle_max: Duration::from_secs(2),
            peer_health: PeerHealthConfig::default(),
            imex_poll: ImexPollConfig::default(),
            imex_restart_backoff_min: Duration::from_millis(200),
            imex_restart_backoff_max: Duration::from_secs(30),
            imex_healthy_after: Duration::from_secs(10),
            imex_adoption_wait: Duration::from_secs(5),
            lost_retention: Duration::from_secs(600),
            rejoin_grace: Duration::from_secs(30),
            status_takeover_grace: Duration::from_secs(10),
            last_out_watch: Duration::from_secs(10),
        }
    }
}
