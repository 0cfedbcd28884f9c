//! Syns from another gossip cluster (another clique), dropped before chitchat sees
//! them.
//!
//! Chitchat answers a Syn of another cluster id with BadCluster, and each side logs a
//! WARN line for every exchange: a stale or misconfigured seed would then fill both
//! logs for as long as it lasts. Cliques never gossip with each other, so such a Syn
//! carries nothing for us: it is counted, logged once per peer per
//! [`FOREIGN_LOG_PERIOD`], and left unanswered. A BadCluster that still arrives (a peer
//! of another clique running a build without this check) is dropped the same way.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::Duration;

use chitchat::ChitchatMessage;
use tokio::time::Instant;

/// The most log lines about one peer's foreign messages in this period: one.
pub const FOREIGN_LOG_PERIOD: Duration = Duration::from_secs(3600);

/// Peers remembered at most: past it, those logged longest ago are forgotten first
/// (and may be logged again), so that many peers cannot grow the table without bound.
const MAX_PEERS: usize = 1024;

/// What a message of another cluster is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Foreign {
    /// A Syn of this cluster id.
    Syn(String),
    /// A peer's refusal of our Syn.
    BadCluster,
}

impl Foreign {
    /// The metric label.
    pub(crate) fn kind(&self) -> &'static str {
        match self {
            Self::Syn(_) => "syn",
            Self::BadCluster => "bad_cluster",
        }
    }
}

/// Whether `message` belongs to another cluster than `ours`: `None` when chitchat
/// should see it.
pub(crate) fn foreign(ours: &str, message: &ChitchatMessage) -> Option<Foreign> {
    match message {
        ChitchatMessage::Syn { cluster_id, .. } if cluster_id != ours => {
            Some(Foreign::Syn(cluster_id.clone()))
        }
        ChitchatMessage::BadCluster => Some(Foreign::BadCluster),
        _ => None,
    }
}

/// When each peer was last logged about.
#[derive(Debug, Default)]
pub(crate) struct ForeignLog {
    logged: HashMap<SocketAddr, Instant>,
}

impl ForeignLog {
    /// Records a foreign message from `peer` at `now`; true when it is worth a line.
    pub(crate) fn note(&mut self, peer: SocketAddr, now: Instant) -> bool {
        let due = self
            .logged
            .get(&peer)
            .is_none_or(|at| now.saturating_duration_since(*at) >= FOREIGN_LOG_PERIOD);
        if !due {
            return false;
        }
        if !self.logged.contains_key(&peer) && self.logged.len() >= MAX_PEERS {
            self.logged
                .retain(|_, at| now.saturating_duration_since(*at) < FOREIGN_LOG_PERIOD);
            if self.logged.len() >= MAX_PEERS
                && let Some(oldest) = self
                    .logged
                    .iter()
                    .min_by_key(|(_, at)| **at)
                    .map(|(p, _)| *p)
            {
                self.logged.remove(&oldest);
            }
        }
        self.logged.insert(peer, now);
        true
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn peer(last: u8) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, last], 7946))
    }

    #[test]
    fn one_line_per_peer_per_period_however_often_it_sends() {
        let mut log = ForeignLog::default();
        let t0 = Instant::now();
        assert!(log.note(peer(1), t0));
        // Every two minutes for most of an hour: still the one line.
        for minute in (2..60).step_by(2) {
            assert!(!log.note(peer(1), t0 + Duration::from_secs(minute * 60)));
        }
        assert!(log.note(peer(1), t0 + FOREIGN_LOG_PERIOD));
        assert!(log.note(peer(2), t0), "another peer is its own line");
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut log = ForeignLog::default();
        let t0 = Instant::now();
        for i in 0..(MAX_PEERS * 2) {
            let addr = SocketAddr::from(([10, 0, (i / 256) as u8, (i % 256) as u8], 7946));
            assert!(log.note(addr, t0));
        }
        assert!(log.logged.len() <= MAX_PEERS);
    }

    #[test]
    fn only_another_clusters_syn_and_bad_cluster_are_foreign() {
        let syn = crate::transport::frame::syn_for_tests;
        assert_eq!(foreign("a", &syn("a")), None);
        assert_eq!(foreign("a", &syn("b")), Some(Foreign::Syn("b".into())));
        assert_eq!(
            foreign("a", &ChitchatMessage::BadCluster),
            Some(Foreign::BadCluster)
        );
    }
}
