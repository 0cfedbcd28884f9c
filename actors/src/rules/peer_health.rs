//! When a remote member leaves the IMEX peer set, and when it comes back.
//!
//! Two signals: gossip's failure detector (is the node alive?) and IMEX itself (is
//! our daemon connected to the peer's?). Either going bad makes the peer *suspect*;
//! a suspect that does not recover within its grace period is *dropped* from the peer
//! set. A peer dropped because gossip declared it dead is re-admitted when gossip sees
//! it alive again. A peer dropped because its IMEX link stayed down while gossip still
//! saw it alive is re-admitted when its advertisement changes (it restarted, or its
//! IMEX became ready again): leaving it in would keep our domain waiting on a peer
//! that cannot serve, and only the peer itself can say it recovered.

use std::time::Duration;

use tokio::time::Instant;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PeerHealthConfig {
    /// Grace after the failure detector's verdict before the peer is dropped.
    pub dead_grace: Duration,
    /// Grace for an IMEX link that is down while gossip sees the peer alive.
    pub link_grace: Duration,
}

impl Default for PeerHealthConfig {
    fn default() -> Self {
        Self {
            dead_grace: Duration::from_secs(1),
            link_grace: Duration::from_secs(30),
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
    Suspect { since: Instant, cause: Cause },
    Dropped { cause: Cause },
}

/// A decision that changes the peer set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Drop(Cause),
    Readmit,
}

#[derive(Debug, Clone)]
pub struct PeerHealth {
    config: PeerHealthConfig,
    state: PeerState,
    gossip_alive: bool,
    link_up: bool,
    /// (generation, imex_ready, imex_failing) as last advertised.
    last_ad: Option<(u64, bool, bool)>,
}

impl PeerHealth {
    pub fn new(config: PeerHealthConfig) -> Self {
        Self {
            config,
            state: PeerState::Admitted,
            gossip_alive: true,
            link_up: true,
            last_ad: None,
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
        self.gossip_alive = alive;
        self.reevaluate(now)
    }

    /// Our IMEX daemon reported its link to this peer.
    pub fn imex_link(&mut self, up: bool, now: Instant) -> Option<Verdict> {
        self.link_up = up;
        self.reevaluate(now)
    }

    /// The peer advertised (again). `imex_failing` counts as a change too: a peer whose
    /// daemon was down past the link grace, and then runs again, is not ready until it
    /// is back in our peer set, so its readiness alone would never change.
    pub fn advertisement(
        &mut self,
        generation: u64,
        imex_ready: bool,
        imex_failing: bool,
        now: Instant,
    ) -> Option<Verdict> {
        let ad = (generation, imex_ready, imex_failing);
        let changed = self.last_ad.is_some_and(|last| last != ad);
        self.last_ad = Some(ad);
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
            Cause::GossipDead => self.config.dead_grace,
            Cause::ImexLinkDown => self.config.link_grace,
        }
    }

    fn current_trouble(&self) -> Option<Cause> {
        if !self.gossip_alive {
            Some(Cause::GossipDead)
        } else if !self.link_up {
            Some(Cause::ImexLinkDown)
        } else {
            None
        }
    }

    fn reevaluate(&mut self, now: Instant) -> Option<Verdict> {
        let trouble = self.current_trouble();
        match (self.state, trouble) {
            (PeerState::Admitted, None) => None,
            (PeerState::Admitted, Some(cause)) => {
                self.state = PeerState::Suspect { since: now, cause };
                self.expire(now)
            }
            (PeerState::Suspect { .. }, None) => {
                self.state = PeerState::Admitted;
                None
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
            ) => {
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

    fn expire(&mut self, now: Instant) -> Option<Verdict> {
        if let PeerState::Suspect { since, cause } = self.state
            && now >= since + self.grace(cause)
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
        h.advertisement(1, true, false, t0);
        h.imex_link(false, t0);
        assert_eq!(h.tick(t0 + Duration::from_secs(29)), None);
        assert_eq!(
            h.tick(t0 + Duration::from_secs(30)),
            Some(Verdict::Drop(Cause::ImexLinkDown))
        );
        // The same advertisement again is no news.
        assert_eq!(
            h.advertisement(1, true, false, t0 + Duration::from_secs(31)),
            None
        );
        assert!(!h.admitted());
        // Its IMEX restarted: not ready, then ready.
        assert_eq!(
            h.advertisement(1, false, false, t0 + Duration::from_secs(40)),
            Some(Verdict::Readmit)
        );
        assert!(h.admitted());
    }

    /// A peer whose daemon was down past the grace: dropped while it says it is failing,
    /// re-admitted once its daemon runs again (not ready yet: it needs us to list it).
    #[test]
    fn a_peer_whose_daemon_runs_again_after_a_long_failure_is_readmitted() {
        let (mut h, t0) = health();
        h.advertisement(1, true, false, t0);
        h.imex_link(false, t0);
        h.advertisement(1, false, true, t0 + Duration::from_millis(100));
        assert_eq!(
            h.tick(t0 + Duration::from_secs(30)),
            Some(Verdict::Drop(Cause::ImexLinkDown))
        );
        assert_eq!(
            h.advertisement(1, false, true, t0 + Duration::from_secs(45)),
            None,
            "still failing"
        );
        assert_eq!(
            h.advertisement(1, false, false, t0 + Duration::from_secs(50)),
            Some(Verdict::Readmit)
        );
    }

    #[test]
    fn death_during_a_link_outage_uses_the_shorter_grace() {
        let (mut h, t0) = health();
        h.imex_link(false, t0);
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
}
