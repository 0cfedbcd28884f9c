//! What IMEX's answers mean while it re-establishes links we made it drop.
//!
//! SIGUSR1 makes IMEX restart every outgoing connection (NVIDIA's IMEX guide, "Signal
//! handling"), and a new daemon starts with none. Until a link is up again, IMEX lists
//! it down: that says nothing of the peer. Read as evidence, a reload that happened to
//! coincide with a peer's daemon restart dropped that peer at once (the peer-health
//! rule "silent, and our IMEX lists its link down"), and the 5 s coalesced reload that
//! follows a formation flipped a ready node to not ready for the moment its links took
//! to come back. So:
//!
//! - a link listed down that has not been up since the restart is left out of the
//!   links reported (unlisted: no evidence either way);
//! - a node that was ready when we reloaded its IMEX stays ready for a short hold while
//!   the only links down are ones it had up before the reload. Jobs' imports live on
//!   across the reload (IMEX keeps the same instance), so a job sees nothing;
//! - for that same hold, no answer confirms a link: IMEX handles SIGUSR1 when it gets
//!   to it, so an answer asked just after the signal can still describe the links
//!   from before it (READY, then down a moment later). Counted as "up since the
//!   restart", that stale up made the drop that followed look like evidence and ended
//!   the hold (a loaded CI machine showed it).

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use domaind_actors::model::Slot;

#[derive(Debug, Clone, Default)]
pub struct Relinking {
    /// Peers whose link has not been seen up since the links were restarted.
    unconfirmed: BTreeSet<Slot>,
    /// Links that were up when a reload restarted them and are not up again yet.
    were_up: BTreeSet<Slot>,
    /// The node was ready at the reload: it stays ready until then while only
    /// `were_up` links are down.
    hold_until: Option<Instant>,
    /// Until then, answers may predate IMEX handling the reload: they confirm no link.
    settling_until: Option<Instant>,
    /// The last links reported, and whether the node was ready then.
    last: BTreeMap<Slot, bool>,
    last_ready: bool,
}

impl Relinking {
    /// A new daemon: every link is still to be made, and it was never ready.
    pub fn started(&mut self, peers: impl IntoIterator<Item = Slot>) {
        self.unconfirmed = peers.into_iter().collect();
        self.were_up.clear();
        self.hold_until = None;
        self.settling_until = None;
        self.last.clear();
        self.last_ready = false;
    }

    /// We sent a reload at `now`: every outgoing link restarts.
    pub fn reloaded(
        &mut self,
        peers: impl IntoIterator<Item = Slot>,
        now: Instant,
        hold: Duration,
    ) {
        self.unconfirmed = peers.into_iter().collect();
        self.were_up = self
            .last
            .iter()
            .filter(|(_, up)| **up)
            .map(|(slot, _)| *slot)
            .collect();
        self.hold_until = self.last_ready.then_some(now + hold);
        self.settling_until = Some(now + hold);
    }

    /// IMEX's answer (`ready`, and the links it listed) as the node reports it.
    pub fn judge(
        &mut self,
        ready: bool,
        links: BTreeMap<Slot, bool>,
        now: Instant,
    ) -> (bool, BTreeMap<Slot, bool>) {
        let settled = self.settling_until.is_none_or(|until| now >= until);
        for (slot, up) in &links {
            if *up && settled {
                self.unconfirmed.remove(slot);
                self.were_up.remove(slot);
            }
        }
        let down: Vec<Slot> = links
            .iter()
            .filter(|(_, up)| !**up)
            .map(|(slot, _)| *slot)
            .collect();
        let held = !ready
            && !links.is_empty()
            && self.hold_until.is_some_and(|until| now < until)
            && down.iter().all(|slot| self.were_up.contains(slot));
        let hold_over = if ready { settled } else { !held };
        if hold_over {
            self.hold_until = None;
        }
        let reported: BTreeMap<Slot, bool> = links
            .iter()
            .filter(|(slot, up)| **up || !self.unconfirmed.contains(slot))
            .map(|(slot, up)| (*slot, *up))
            .collect();
        let ready = ready || held;
        self.last = links;
        self.last_ready = ready;
        (ready, reported)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const HOLD: Duration = Duration::from_secs(2);

    fn links(up: &[Slot], down: &[Slot]) -> BTreeMap<Slot, bool> {
        up.iter()
            .map(|s| (*s, true))
            .chain(down.iter().map(|s| (*s, false)))
            .collect()
    }

    #[test]
    fn a_link_down_since_our_reload_is_no_evidence_until_it_was_up_again() {
        let now = Instant::now();
        let mut r = Relinking::default();
        r.started([1, 2]);
        assert_eq!(
            r.judge(true, links(&[1, 2], &[]), now).1,
            links(&[1, 2], &[])
        );
        r.reloaded([1, 2], now, HOLD);
        // Both restarting: neither is listed down.
        assert_eq!(r.judge(false, links(&[], &[1, 2]), now).1, links(&[], &[]));
        // 1 came back, then went down: that is evidence again.
        let settled = now + HOLD;
        r.judge(false, links(&[1], &[2]), settled);
        assert_eq!(
            r.judge(false, links(&[], &[1, 2]), settled).1,
            links(&[], &[1])
        );
    }

    #[test]
    fn an_answer_from_before_imex_handled_the_reload_confirms_nothing() {
        let now = Instant::now();
        let mut r = Relinking::default();
        r.started([1, 2]);
        r.judge(true, links(&[1, 2], &[]), now);
        r.reloaded([1, 2], now, HOLD);
        // Asked just after the signal: IMEX still describes its links from before.
        assert!(r.judge(true, links(&[1, 2], &[]), now).0);
        // Then it restarts them; peer 2 is slow to come back.
        let (ready, reported) = r.judge(false, links(&[1], &[2]), now + HOLD / 2);
        assert!(ready, "held: 2 has not been up since the reload");
        assert_eq!(reported, links(&[1], &[]));
        let (ready, reported) = r.judge(false, links(&[1], &[2]), now + HOLD);
        assert!(!ready, "the hold is over");
        assert_eq!(reported, links(&[1], &[]), "2 never seen up since");
    }

    #[test]
    fn a_new_daemon_lists_no_link_down_before_it_had_it_up() {
        let now = Instant::now();
        let mut r = Relinking::default();
        r.started([1, 2]);
        let (ready, reported) = r.judge(false, links(&[1], &[2]), now);
        assert!(!ready, "a new daemon has no hold");
        assert_eq!(reported, links(&[1], &[]));
    }

    #[test]
    fn a_ready_node_stays_ready_through_our_reload_for_the_hold_only() {
        let now = Instant::now();
        let mut r = Relinking::default();
        r.started([1, 2]);
        r.judge(true, links(&[1, 2], &[]), now);
        r.reloaded([1, 2], now, HOLD);
        assert!(r.judge(false, links(&[1], &[2]), now + HOLD / 2).0);
        assert!(
            !r.judge(false, links(&[1], &[2]), now + HOLD).0,
            "the hold is over"
        );
    }

    #[test]
    fn the_hold_covers_only_links_that_were_up_before_the_reload() {
        let now = Instant::now();
        let mut r = Relinking::default();
        r.started([1]);
        r.judge(true, links(&[1], &[]), now);
        // The reload adds peer 2: its link was never up, so it being down is honest.
        r.reloaded([1, 2], now, HOLD);
        assert!(!r.judge(false, links(&[1], &[2]), now).0);
    }

    #[test]
    fn a_node_not_ready_at_the_reload_gets_no_hold_and_a_lapsed_hold_stays_lapsed() {
        let now = Instant::now();
        let mut r = Relinking::default();
        r.started([1, 2]);
        r.judge(false, links(&[1], &[2]), now);
        r.reloaded([1, 2], now, HOLD);
        assert!(!r.judge(false, links(&[], &[1, 2]), now).0);

        let mut r = Relinking::default();
        r.started([1, 2]);
        r.judge(true, links(&[1, 2], &[]), now);
        r.reloaded([1, 2], now, HOLD);
        // A failed listing says nothing: no hold on it, and none after.
        assert!(!r.judge(false, BTreeMap::new(), now).0);
        assert!(!r.judge(false, links(&[1], &[2]), now).0);
    }
}
