//! When a remote member leaves the IMEX peer set, and when it comes back.
//!
//! Two signals: gossip's failure detector (is the node's daemon alive?) and IMEX itself
//! (is our daemon connected to the peer's?). Either going bad makes the peer *suspect*;
//! a suspect that does not recover within its grace period is *dropped* from the peer
//! set. A peer dropped because gossip declared it dead is re-admitted when gossip sees
//! it alive again. A peer dropped because its IMEX link stayed down while gossip still
//! saw it alive is re-admitted when its advertisement changes (it restarted, or its
//! IMEX became ready again): leaving it in would keep our domain waiting on a peer
//! that cannot serve, and only the peer itself can say it recovered.
//!
//! **Held.** A peer whose IMEX outlives its daemon (it advertises so: an IMEX runner or
//! a host service keeps IMEX) is not gone when its gossip goes silent: a crash or an
//! upgrade of the daemon leaves its IMEX, and the job's imports, running. Dropping it
//! would reconfigure every survivor's IMEX for nothing. So silence alone is no
//! evidence: the peer is dropped only if our IMEX, asked *after* the silence began,
//! finds its link down too (the node itself is gone). While that answer says the link
//! is up the peer is *held*: admitted, a member as it last advertised. No answer within
//! the answer wait (5 s: a loaded node's status tool can be slow) is no evidence of
//! life either, and the peer is dropped. An answer vouches only if asked a moment
//! (`vouch_after`) after the silence began: when the whole node dies, our IMEX sees its
//! link close a little after gossip sees the daemon's, and an answer asked in between
//! still says up (at 4 nodes, 2 heals in 20 took the 1 s grace for it).
//!
//! **Failing by its own word.** A peer whose link is down while it advertises that its
//! IMEX is failing (exited or not starting, not running again yet) waits out only the
//! failing grace (5 s, as long as the taint waits), not the link grace: two signals
//! agree, and every moment it stays in keeps our IMEX, and every pod about to start
//! here, waiting on a peer that cannot serve. A crash its supervisor mends within the
//! grace changes nothing.
//!
//! **Lost for sure.** Silent in gossip *and* its link down in an answer asked after the
//! silence began, before any answer vouched for it: two independent signals agree the
//! node is gone, and the peer is dropped at once, without waiting out the dead grace.
//! A held peer whose link then goes down waits out the grace instead: its restarted
//! daemon reloading its IMEX can drop the link for a moment. That is how a node loss leaves
//! every survivor's IMEX within a fraction of a second when its processes die (gossip
//! learns of it from the refused connection, `domaind_gossip::pulse`).

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHealthConfig {
    /// Grace after the failure detector's verdict before the peer is dropped (for a
    /// peer whose IMEX outlives its daemon: the time our IMEX has to vouch for it).
    pub dead_grace: Duration,
    /// Grace for an IMEX link that is down while gossip sees the peer alive.
    pub link_grace: Duration,
    /// The same, while the peer advertises that its IMEX is failing.
    pub failing_grace: Duration,
    /// For a silent peer whose IMEX outlives its daemon, how long our IMEX has to
    /// answer at all: a status tool slow on a loaded node must not drop a peer whose
    /// job runs on. An answer ends the wait: up holds the peer, down drops it.
    pub answer_wait: Duration,
    /// How long after the silence began an answer must be asked to vouch for the peer
    /// (a link down condemns it however early).
    pub vouch_after: Duration,
}

impl Default for PeerHealthConfig {
    fn default() -> Self {
        Self {
            dead_grace: Duration::from_secs(1),
            link_grace: Duration::from_secs(30),
            failing_grace: Duration::from_secs(5),
            answer_wait: Duration::from_secs(5),
            vouch_after: Duration::from_millis(200),
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Cause {
    GossipDead,
    ImexLinkDown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerState {
    Admitted,
    /// Gossip is silent, but our IMEX, asked since, is connected to the peer's.
    Held {
        since: Instant,
    },
    Suspect {
        since: Instant,
        cause: Cause,
    },
    Dropped {
        cause: Cause,
    },
}

/// A decision that changes the peer set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Drop(Cause),
    Readmit,
}

/// What a peer last advertised, as far as its health goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Advertised {
    pub generation: u64,
    pub imex_ready: bool,
    pub imex_failing: bool,
    /// Its IMEX keeps running when its daemon stops.
    pub imex_outlives_daemon: bool,
}

/// One answer of our IMEX about its link to the peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LinkAnswer {
    pub up: bool,
    /// The answer listed the link. A link it does not list (a peer not configured
    /// yet) is not up, but it is no evidence that the peer is gone either.
    pub listed: bool,
    /// When the status question was asked: an answer vouches for a silent peer only
    /// if it was asked after the silence began.
    pub asked_at: Instant,
}

#[derive(Debug, Clone)]
pub struct PeerHealth {
    config: PeerHealthConfig,
    state: PeerState,
    gossip_alive: bool,
    /// When gossip last went silent about the peer.
    silent_since: Option<Instant>,
    link_up: bool,
    /// When the newest link answer was asked.
    link_asked_at: Option<Instant>,
    /// Whether the newest answer listed the link.
    link_listed: bool,
    /// An answer vouched for the peer since its silence began.
    vouched_in_silence: bool,
    /// (generation, imex_ready, imex_failing) as last advertised.
    last_ad: Option<(u64, bool, bool)>,
    outlives_daemon: bool,
}

impl PeerHealth {
    pub fn new(config: PeerHealthConfig) -> Self {
        Self {
            config,
            state: PeerState::Admitted,
            gossip_alive: true,
            silent_since: None,
            link_up: true,
            link_asked_at: None,
            link_listed: false,
            vouched_in_silence: false,
            last_ad: None,
            outlives_daemon: false,
        }
    }

    pub fn state(&self) -> PeerState {
        self.state
    }

    pub fn admitted(&self) -> bool {
        !matches!(self.state, PeerState::Dropped { .. })
    }

    /// The failure detector's view changed.
    pub fn gossip(&mut self, alive: bool, now: Instant) -> Option<Verdict> {
        if alive {
            self.silent_since = None;
        } else if self.gossip_alive || self.silent_since.is_none() {
            self.silent_since = Some(now);
            self.vouched_in_silence = false;
        }
        self.gossip_alive = alive;
        self.reevaluate(now)
    }

    /// Our IMEX daemon reported its link to this peer.
    pub fn imex_link(&mut self, answer: LinkAnswer, now: Instant) -> Option<Verdict> {
        if self.link_asked_at.is_some_and(|at| at > answer.asked_at) {
            // Overtaken by a newer answer.
            return None;
        }
        self.link_up = answer.up;
        self.link_listed = answer.listed;
        self.link_asked_at = Some(answer.asked_at);
        self.reevaluate(now)
    }

    /// The peer advertised (again). `imex_failing` counts as a change too: a peer whose
    /// daemon was down past the link grace, and then runs again, is not ready until it
    /// is back in our peer set, so its readiness alone would never change.
    pub fn advertisement(&mut self, ad: Advertised, now: Instant) -> Option<Verdict> {
        self.outlives_daemon = ad.imex_outlives_daemon;
        let seen = (ad.generation, ad.imex_ready, ad.imex_failing);
        let changed = self.last_ad.is_some_and(|last| last != seen);
        self.last_ad = Some(seen);
        if changed
            && self.state
                == (PeerState::Dropped {
                    cause: Cause::ImexLinkDown,
                })
        {
            // The peer did something; give its link a fresh chance.
            self.link_up = true;
            self.state = PeerState::Admitted;
            return Some(Verdict::Readmit);
        }
        self.reevaluate(now)
    }

    /// Time passed; drops a suspect whose grace ran out.
    pub fn tick(&mut self, now: Instant) -> Option<Verdict> {
        self.reevaluate(now)
    }

    /// When `tick` next needs to run, if a grace period is running.
    pub fn deadline(&self) -> Option<Instant> {
        match self.state {
            PeerState::Suspect { since, cause } => Some(since + self.grace(cause)),
            _ => None,
        }
    }

    fn grace(&self, cause: Cause) -> Duration {
        match cause {
            Cause::GossipDead if self.outlives_daemon && !self.answered_to_vouch() => {
                self.config.answer_wait
            }
            Cause::GossipDead => self.config.dead_grace,
            Cause::ImexLinkDown if self.says_failing() => {
                self.config.failing_grace.min(self.config.link_grace)
            }
            Cause::ImexLinkDown => self.config.link_grace,
        }
    }

    /// The peer's last advertisement says its IMEX is failing.
    fn says_failing(&self) -> bool {
        self.last_ad.is_some_and(|(_, _, failing)| failing)
    }

    /// Our IMEX, asked since the peer went silent, is connected to the peer's, and
    /// the peer's IMEX does not depend on its daemon.
    fn vouched_for(&self) -> bool {
        self.outlives_daemon && self.link_up && self.answered_to_vouch()
    }

    fn current_trouble(&mut self) -> Option<Cause> {
        if !self.gossip_alive {
            if self.vouched_for() {
                self.vouched_in_silence = true;
            }
            (!self.vouched_for()).then_some(Cause::GossipDead)
        } else if !self.link_up {
            Some(Cause::ImexLinkDown)
        } else {
            None
        }
    }

    /// Admitted, or held while gossip is silent: where a peer without trouble is.
    fn untroubled(&self, now: Instant) -> PeerState {
        match (self.gossip_alive, self.state) {
            (true, _) => PeerState::Admitted,
            (false, PeerState::Held { since }) => PeerState::Held { since },
            (false, _) => PeerState::Held { since: now },
        }
    }

    fn reevaluate(&mut self, now: Instant) -> Option<Verdict> {
        let trouble = self.current_trouble();
        match (self.state, trouble) {
            (PeerState::Admitted | PeerState::Held { .. } | PeerState::Suspect { .. }, None) => {
                self.state = self.untroubled(now);
                None
            }
            (PeerState::Admitted | PeerState::Held { .. }, Some(cause)) => {
                self.state = PeerState::Suspect { since: now, cause };
                self.expire(now)
            }
            (PeerState::Suspect { since, cause }, Some(now_cause)) => {
                if cause != now_cause {
                    // Death trumps a link problem: restart the grace with its cause.
                    self.state = PeerState::Suspect {
                        since: now,
                        cause: now_cause,
                    };
                } else {
                    self.state = PeerState::Suspect { since, cause };
                }
                self.expire(now)
            }
            (
                PeerState::Dropped {
                    cause: Cause::GossipDead,
                },
                None,
            ) if self.gossip_alive => {
                self.state = PeerState::Admitted;
                Some(Verdict::Readmit)
            }
            (
                PeerState::Dropped {
                    cause: Cause::GossipDead,
                },
                Some(Cause::ImexLinkDown),
            ) => {
                // Alive again: re-admit, and judge its link afresh.
                self.state = PeerState::Suspect {
                    since: now,
                    cause: Cause::ImexLinkDown,
                };
                Some(Verdict::Readmit)
            }
            (PeerState::Dropped { .. }, _) => None,
        }
    }

    /// Our IMEX answered a question asked since the silence began.
    fn answered_in_silence(&self) -> bool {
        self.silent_since
            .zip(self.link_asked_at)
            .is_some_and(|(silent, asked)| asked >= silent)
    }

    /// Our IMEX answered a question asked late enough after the silence began that its
    /// link would show the node's death.
    fn answered_to_vouch(&self) -> bool {
        self.silent_since
            .zip(self.link_asked_at)
            .is_some_and(|(silent, asked)| asked >= silent + self.config.vouch_after)
    }

    /// Gossip is silent and our IMEX, asked since, lists its link down too.
    fn lost_for_sure(&self) -> bool {
        !self.gossip_alive
            && !self.vouched_in_silence
            && !self.link_up
            && self.link_listed
            && self.answered_in_silence()
    }

    fn expire(&mut self, now: Instant) -> Option<Verdict> {
        if let PeerState::Suspect { since, cause } = self.state
            && (now >= since + self.grace(cause)
                || (cause == Cause::GossipDead && self.lost_for_sure()))
        {
            self.state = PeerState::Dropped { cause };
            return Some(Verdict::Drop(cause));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn health() -> (PeerHealth, Instant) {
        (PeerHealth::new(PeerHealthConfig::default()), Instant::now())
    }

    fn ad(generation: u64, imex_ready: bool, imex_failing: bool) -> Advertised {
        Advertised {
            generation,
            imex_ready,
            imex_failing,
            imex_outlives_daemon: false,
        }
    }

    /// A peer whose IMEX is kept by a runner.
    fn outliving(generation: u64) -> Advertised {
        Advertised {
            imex_outlives_daemon: true,
            ..ad(generation, true, false)
        }
    }

    fn link(up: bool, asked_at: Instant) -> LinkAnswer {
        LinkAnswer {
            up,
            listed: true,
            asked_at,
        }
    }

    #[test]
    fn dead_peer_is_dropped_after_grace_and_readmitted_when_alive() {
        let (mut h, t0) = health();
        assert_eq!(h.gossip(false, t0), None);
        assert!(h.admitted(), "still admitted during grace");
        assert_eq!(h.deadline(), Some(t0 + Duration::from_secs(1)));
        assert_eq!(h.tick(t0 + Duration::from_millis(999)), None);
        assert_eq!(
            h.tick(t0 + Duration::from_secs(1)),
            Some(Verdict::Drop(Cause::GossipDead))
        );
        assert!(!h.admitted());
        assert_eq!(
            h.gossip(true, t0 + Duration::from_secs(5)),
            Some(Verdict::Readmit)
        );
        assert!(h.admitted());
    }

    #[test]
    fn a_peer_back_within_grace_is_never_dropped() {
        let (mut h, t0) = health();
        h.gossip(false, t0);
        assert_eq!(h.gossip(true, t0 + Duration::from_millis(500)), None);
        assert_eq!(h.tick(t0 + Duration::from_secs(10)), None);
        assert_eq!(h.state(), PeerState::Admitted);
    }

    #[test]
    fn a_long_imex_link_outage_drops_until_the_peer_changes() {
        let (mut h, t0) = health();
        h.advertisement(ad(1, true, false), t0);
        h.imex_link(link(false, t0), t0);
        assert_eq!(h.tick(t0 + Duration::from_secs(29)), None);
        assert_eq!(
            h.tick(t0 + Duration::from_secs(30)),
            Some(Verdict::Drop(Cause::ImexLinkDown))
        );
        // The same advertisement again is no news.
        assert_eq!(
            h.advertisement(ad(1, true, false), t0 + Duration::from_secs(31)),
            None
        );
        assert!(!h.admitted());
        // Its IMEX restarted: not ready, then ready.
        assert_eq!(
            h.advertisement(ad(1, false, false), t0 + Duration::from_secs(40)),
            Some(Verdict::Readmit)
        );
        assert!(h.admitted());
    }

    /// A peer whose IMEX daemon was down past the failing grace: dropped while it says
    /// it is failing, re-admitted once its daemon runs again (not ready yet: it needs
    /// us to list it).
    #[test]
    fn a_peer_whose_daemon_runs_again_after_a_long_failure_is_readmitted() {
        let (mut h, t0) = health();
        h.advertisement(ad(1, true, false), t0);
        h.imex_link(link(false, t0), t0);
        h.advertisement(ad(1, false, true), t0 + Duration::from_millis(100));
        assert_eq!(h.deadline(), Some(t0 + Duration::from_secs(5)));
        assert_eq!(h.tick(t0 + Duration::from_millis(4999)), None);
        assert_eq!(
            h.tick(t0 + Duration::from_secs(5)),
            Some(Verdict::Drop(Cause::ImexLinkDown))
        );
        assert_eq!(
            h.advertisement(ad(1, false, true), t0 + Duration::from_secs(45)),
            None,
            "still failing"
        );
        assert_eq!(
            h.advertisement(ad(1, false, false), t0 + Duration::from_secs(50)),
            Some(Verdict::Readmit)
        );
    }

    /// A crash its supervisor mends within the failing grace: the link grace again, and
    /// nothing dropped.
    #[test]
    fn a_peer_failing_for_a_moment_keeps_the_link_grace() {
        let (mut h, t0) = health();
        h.advertisement(ad(1, true, false), t0);
        h.imex_link(link(false, t0), t0);
        h.advertisement(ad(1, false, true), t0 + Duration::from_millis(200));
        h.advertisement(ad(1, false, false), t0 + Duration::from_secs(2));
        assert_eq!(h.deadline(), Some(t0 + Duration::from_secs(30)));
        assert_eq!(h.tick(t0 + Duration::from_secs(5)), None);
        assert_eq!(
            h.imex_link(
                link(true, t0 + Duration::from_secs(6)),
                t0 + Duration::from_secs(6)
            ),
            None
        );
        assert_eq!(h.state(), PeerState::Admitted);
    }

    #[test]
    fn death_during_a_link_outage_uses_the_shorter_grace() {
        let (mut h, t0) = health();
        h.imex_link(link(false, t0), t0);
        h.gossip(false, t0 + Duration::from_secs(10));
        assert_eq!(
            h.tick(t0 + Duration::from_secs(11)),
            Some(Verdict::Drop(Cause::GossipDead))
        );
        // Back alive but its link still down: readmitted, judged afresh.
        assert_eq!(
            h.gossip(true, t0 + Duration::from_secs(20)),
            Some(Verdict::Readmit)
        );
        assert_eq!(h.deadline(), Some(t0 + Duration::from_secs(50)));
    }

    const MS: Duration = Duration::from_millis(1);

    /// A daemon crash on a node whose IMEX a runner keeps: our IMEX, asked after the
    /// silence, still reaches the peer's, so it is held, never dropped, and never
    /// re-admitted either (it was never out) when its daemon speaks again.
    #[test]
    fn a_silent_peer_whose_imex_answers_is_held_not_dropped() {
        let (mut h, t0) = health();
        h.advertisement(outliving(1), t0);
        assert_eq!(h.gossip(false, t0), None);
        assert!(matches!(h.state(), PeerState::Suspect { .. }));
        let vouch = t0 + PeerHealthConfig::default().vouch_after;
        assert_eq!(h.imex_link(link(true, vouch), vouch + MS), None);
        assert_eq!(h.state(), PeerState::Held { since: vouch + MS });
        assert!(h.admitted());
        assert_eq!(h.deadline(), None, "held as long as IMEX says so");
        assert_eq!(h.tick(t0 + Duration::from_secs(600)), None);
        assert_eq!(h.gossip(true, t0 + Duration::from_secs(601)), None);
        assert_eq!(h.state(), PeerState::Admitted);
    }

    /// An answer asked before the silence began says nothing about the node since: a
    /// node that died whole in the meantime must not be held on it.
    #[test]
    fn an_answer_asked_before_the_silence_does_not_vouch() {
        let (mut h, t0) = health();
        h.advertisement(outliving(1), t0);
        h.gossip(false, t0 + 10 * MS);
        assert_eq!(h.imex_link(link(true, t0), t0 + 11 * MS), None);
        assert!(matches!(
            h.state(),
            PeerState::Suspect {
                cause: Cause::GossipDead,
                ..
            }
        ));
        assert_eq!(h.tick(t0 + 10 * MS + Duration::from_secs(1)), None);
        assert_eq!(
            h.tick(t0 + 10 * MS + Duration::from_secs(5)),
            Some(Verdict::Drop(Cause::GossipDead)),
            "no fresh answer within the answer wait"
        );
    }

    /// The node itself died: its gossip and its IMEX link go together, and together
    /// they are enough: dropped at once, not a dead grace later.
    #[test]
    fn a_silent_peer_whose_link_is_down_is_dropped_at_once() {
        for advertised in [outliving(1), ad(1, true, false)] {
            let (mut h, t0) = health();
            h.advertisement(advertised, t0);
            h.gossip(false, t0);
            assert_eq!(
                h.imex_link(link(false, t0 + MS), t0 + 2 * MS),
                Some(Verdict::Drop(Cause::GossipDead)),
                "{advertised:?}"
            );
        }
    }

    /// The whole node died, and our IMEX, asked at once, has not seen its link close
    /// yet: that answer does not vouch, and the next, listing the link down, drops the
    /// peer at once (not a dead grace later, as when the first had held it).
    #[test]
    fn an_answer_asked_at_once_after_the_silence_does_not_vouch() {
        let (mut h, t0) = health();
        h.advertisement(outliving(1), t0);
        h.gossip(false, t0);
        assert_eq!(h.imex_link(link(true, t0 + MS), t0 + 2 * MS), None);
        assert!(matches!(h.state(), PeerState::Suspect { .. }));
        assert_eq!(
            h.deadline(),
            Some(t0 + Duration::from_secs(5)),
            "still the answer wait"
        );
        assert_eq!(
            h.imex_link(link(false, t0 + 30 * MS), t0 + 31 * MS),
            Some(Verdict::Drop(Cause::GossipDead))
        );
    }

    /// Our IMEX slow to answer (a loaded node) does not drop a peer whose IMEX outlives
    /// its daemon at the dead grace; the first answer decides.
    #[test]
    fn a_slow_answer_does_not_drop_a_peer_whose_imex_outlives_its_daemon() {
        let (mut h, t0) = health();
        h.advertisement(outliving(1), t0);
        h.gossip(false, t0);
        assert_eq!(h.deadline(), Some(t0 + Duration::from_secs(5)));
        let late = t0 + Duration::from_secs(3);
        assert_eq!(h.tick(late), None);
        let vouch = t0 + PeerHealthConfig::default().vouch_after;
        assert_eq!(h.imex_link(link(true, vouch), late), None);
        assert!(matches!(h.state(), PeerState::Held { .. }));
    }

    /// A link our IMEX does not list (not configured yet) is no evidence of a loss:
    /// the silent peer waits out the dead grace.
    #[test]
    fn an_unlisted_link_is_no_evidence_of_a_loss() {
        let (mut h, t0) = health();
        h.gossip(false, t0);
        let unlisted = LinkAnswer {
            up: false,
            listed: false,
            asked_at: t0 + MS,
        };
        assert_eq!(h.imex_link(unlisted, t0 + MS), None);
        assert_eq!(
            h.tick(t0 + Duration::from_secs(1)),
            Some(Verdict::Drop(Cause::GossipDead))
        );
    }

    /// Either signal alone is not enough to drop at once: a link down while gossip
    /// hears the peer waits out the link grace, and a silence the link was seen down
    /// only before waits out the dead grace.
    #[test]
    fn one_signal_alone_waits_out_its_grace() {
        let (mut h, t0) = health();
        assert_eq!(h.imex_link(link(false, t0), t0), None);
        assert_eq!(h.deadline(), Some(t0 + Duration::from_secs(30)));
        let (mut h, t0) = health();
        h.imex_link(link(false, t0), t0);
        assert_eq!(h.gossip(false, t0 + MS), None);
        assert_eq!(h.deadline(), Some(t0 + MS + Duration::from_secs(1)));
    }

    /// Held, then the node dies: its link goes down and it is dropped a dead grace
    /// later (a link that comes back within it keeps it held: a restarted daemon
    /// reloading its IMEX drops the link for a moment); its link coming back does not
    /// re-admit it while gossip is silent.
    #[test]
    fn a_held_peer_whose_link_goes_down_is_dropped() {
        let (mut h, t0) = health();
        h.advertisement(outliving(1), t0);
        h.gossip(false, t0);
        let vouch = t0 + PeerHealthConfig::default().vouch_after;
        h.imex_link(link(true, vouch), vouch);
        let t1 = t0 + Duration::from_secs(60);
        // A late answer, asked before one that saw the link up, changes nothing.
        assert_eq!(h.imex_link(link(false, t0), t1), None);
        assert!(matches!(h.state(), PeerState::Held { .. }));
        // A flap.
        assert_eq!(h.imex_link(link(false, t1), t1), None);
        assert_eq!(h.deadline(), Some(t1 + Duration::from_secs(1)));
        assert_eq!(h.imex_link(link(true, t1 + MS), t1 + MS), None);
        assert!(matches!(h.state(), PeerState::Held { .. }));
        // Down for good.
        let t2 = t1 + Duration::from_secs(10);
        assert_eq!(h.imex_link(link(false, t2), t2), None);
        assert_eq!(
            h.tick(t2 + Duration::from_secs(1)),
            Some(Verdict::Drop(Cause::GossipDead))
        );
        let t3 = t2 + Duration::from_secs(2);
        assert_eq!(h.imex_link(link(true, t3), t3), None);
        assert!(
            !h.admitted(),
            "only gossip re-admits a node dropped as dead"
        );
        assert_eq!(h.gossip(true, t3), Some(Verdict::Readmit));
    }

    /// A peer whose IMEX dies with its daemon is dropped on silence, whatever a link
    /// answer says: a restart of that daemon starts a new IMEX instance anyway.
    #[test]
    fn a_silent_peer_whose_imex_dies_with_its_daemon_is_dropped_as_before() {
        let (mut h, t0) = health();
        h.advertisement(ad(1, true, false), t0);
        h.gossip(false, t0);
        h.imex_link(link(true, t0 + MS), t0 + MS);
        assert_eq!(
            h.tick(t0 + Duration::from_secs(1)),
            Some(Verdict::Drop(Cause::GossipDead))
        );
    }
}
