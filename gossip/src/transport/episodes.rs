//! Which refusals start an episode worth a log line.
//!
//! A refused frame closes its connection, and a peer that keeps sending bad frames
//! reconnects each time: logging every refusal would let it fill the node's log. Every
//! refusal is counted; only the first of an episode (one peer, one reason, no quiet gap
//! of [`EPISODE_GAP`] since the last refusal) is logged.

use std::collections::HashMap;
use std::time::Duration;

use tokio::time::Instant;

/// Quiet time after which the next refusal of the same kind is news again.
pub const EPISODE_GAP: Duration = Duration::from_secs(60);

/// Peers remembered at most; past it the oldest episodes are forgotten (and logged
/// again if they go on), so that many peers cannot grow the table without bound.
const MAX_EPISODES: usize = 1024;

#[derive(Debug, Default)]
pub struct Episodes {
    last_seen: HashMap<(String, &'static str), Instant>,
}

impl Episodes {
    /// Records a refusal from `peer` for `reason` at `now`; true when it starts an
    /// episode.
    pub fn note(&mut self, peer: &str, reason: &'static str, now: Instant) -> bool {
        let key = (peer.to_owned(), reason);
        let fresh = self
            .last_seen
            .get(&key)
            .is_none_or(|last| now.saturating_duration_since(*last) >= EPISODE_GAP);
        if fresh && self.last_seen.len() >= MAX_EPISODES {
            self.last_seen
                .retain(|_, last| now.saturating_duration_since(*last) < EPISODE_GAP);
            if self.last_seen.len() >= MAX_EPISODES
                && let Some(oldest) = self
                    .last_seen
                    .iter()
                    .min_by_key(|(_, last)| **last)
                    .map(|(k, _)| k.clone())
            {
                self.last_seen.remove(&oldest);
            }
        }
        self.last_seen.insert(key, now);
        fresh
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn repeats_within_the_gap_are_one_episode() {
        let mut episodes = Episodes::default();
        let t0 = Instant::now();
        assert!(episodes.note("node-a", "malformed", t0));
        assert!(!episodes.note("node-a", "malformed", t0 + Duration::from_secs(30)));
        // The gap counts from the last refusal, so a steady stream stays one episode.
        assert!(!episodes.note("node-a", "malformed", t0 + Duration::from_secs(80)));
        assert!(episodes.note("node-a", "malformed", t0 + Duration::from_secs(141)));
    }

    #[test]
    fn peers_and_reasons_are_separate_episodes() {
        let mut episodes = Episodes::default();
        let t0 = Instant::now();
        assert!(episodes.note("node-a", "malformed", t0));
        assert!(episodes.note("node-b", "malformed", t0));
        assert!(episodes.note("node-a", "version_above_max", t0));
    }

    #[test]
    fn the_table_stays_bounded() {
        let mut episodes = Episodes::default();
        let t0 = Instant::now();
        for i in 0..(MAX_EPISODES * 2) {
            assert!(episodes.note(&format!("node-{i}"), "malformed", t0));
        }
        assert!(episodes.last_seen.len() <= MAX_EPISODES);
    }
}
