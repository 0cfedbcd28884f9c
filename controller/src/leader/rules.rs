//! The rules of leader election through a `coordination.k8s.io/v1` Lease, as
//! client-go's leader election keeps them, so that a domaind controller and tools that
//! read Leases agree on what a Lease means.
//!
//! - A candidate never compares the Lease's `renewTime` with its own clock: clocks of
//!   two machines disagree. It notes, on its own monotonic clock, when it first saw the
//!   Lease's current version; the holder is presumed alive until `leaseDurationSeconds`
//!   after that. Only a Lease that has not changed for that long is taken over.
//! - Every write is conditional on the version read (optimistic concurrency), so of two
//!   candidates taking over at once, one fails and goes back to watching.
//! - The leader counts itself leader until `renew_deadline` after it *sent* its last
//!   successful write. With `renew_deadline` < lease duration, it stops before anyone
//!   else may start: others wait a full duration from when they saw that write, which
//!   was made after it was sent.

use std::time::Duration;

use tokio::time::Instant;

/// What a Lease says, as far as the rules care.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseView {
    /// `spec.holderIdentity`; `None` once released.
    pub holder: Option<String>,
    /// `spec.leaseDurationSeconds`, or our own duration if the Lease has none.
    pub duration: Duration,
    /// `spec.leaseTransitions`.
    pub transitions: i32,
    /// `metadata.resourceVersion`: changes with every write.
    pub version: String,
}

/// A Lease as we saw it, and since when (our clock) it has not changed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Observation {
    pub lease: LeaseView,
    pub unchanged_since: Instant,
}

/// Notes a fresh read of the Lease: the time moves only when its version changed.
pub fn observe(previous: Option<Observation>, lease: LeaseView, now: Instant) -> Observation {
    match previous {
        Some(previous) if previous.lease.version == lease.version => previous,
        _ => Observation {
            lease,
            unchanged_since: now,
        },
    }
}

/// The next step of a candidate.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decision {
    /// There is no Lease: create it, held by us.
    Create,
    /// We hold it: write a new `renewTime`.
    Renew,
    /// It is released, or its holder stopped renewing: write ourselves as holder,
    /// counting a transition.
    Acquire { transitions: i32 },
    /// Someone else holds it: look again later; it may be taken over at `expires`.
    Follow { holder: String, expires: Instant },
}

pub fn decide(me: &str, observed: Option<&Observation>, now: Instant) -> Decision {
    let Some(observed) = observed else {
        return Decision::Create;
    };
    let lease = &observed.lease;
    match &lease.holder {
        Some(holder) if holder == me => Decision::Renew,
        Some(holder) => {
            let expires = observed.unchanged_since + lease.duration;
            if now >= expires {
                Decision::Acquire {
                    transitions: lease.transitions.saturating_add(1),
                }
            } else {
                Decision::Follow {
                    holder: holder.clone(),
                    expires,
                }
            }
        }
        None => Decision::Acquire {
            transitions: lease.transitions.saturating_add(1),
        },
    }
}

/// Until when a leader whose last successful write was sent at `sent` may act.
pub fn leader_until(sent: Instant, renew_deadline: Duration) -> Instant {
    sent + renew_deadline
}

/// The timing of an election. Valid when `retry_period < renew_deadline < duration`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Timing {
    /// How long a Lease is honoured after it last changed.
    pub duration: Duration,
    /// How long a leader goes on after its last successful renewal.
    pub renew_deadline: Duration,
    /// How often candidates look and the leader renews.
    pub retry_period: Duration,
}

impl Default for Timing {
    /// client-go's defaults.
    fn default() -> Self {
        Self {
            duration: Duration::from_secs(15),
            renew_deadline: Duration::from_secs(10),
            retry_period: Duration::from_secs(2),
        }
    }
}

impl Timing {
    pub fn validate(&self) -> Result<(), String> {
        if self.duration.as_secs() < 1 || self.duration.subsec_nanos() != 0 {
            return Err(format!(
                "the lease duration must be whole seconds, at least 1 (got {:?})",
                self.duration
            ));
        }
        if self.renew_deadline >= self.duration {
            return Err(format!(
                "the renew deadline ({:?}) must be shorter than the lease duration ({:?}), or \
                 two replicas could both act as leader",
                self.renew_deadline, self.duration
            ));
        }
        if self.retry_period >= self.renew_deadline || self.retry_period.is_zero() {
            return Err(format!(
                "the retry period ({:?}) must be above zero and shorter than the renew \
                 deadline ({:?}), or the leader loses its lease between two renewals",
                self.retry_period, self.renew_deadline
            ));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lease(holder: Option<&str>, version: &str) -> LeaseView {
        LeaseView {
            holder: holder.map(str::to_string),
            duration: Duration::from_secs(15),
            transitions: 3,
            version: version.into(),
        }
    }

    #[tokio::test(start_paused = true)]
    async fn no_lease_is_created() {
        assert_eq!(decide("me", None, Instant::now()), Decision::Create);
    }

    #[tokio::test(start_paused = true)]
    async fn the_holder_renews() {
        let now = Instant::now();
        let seen = observe(None, lease(Some("me"), "1"), now);
        assert_eq!(decide("me", Some(&seen), now), Decision::Renew);
        // Even long after: our own lease is ours until someone takes it.
        tokio::time::advance(Duration::from_secs(60)).await;
        assert_eq!(decide("me", Some(&seen), Instant::now()), Decision::Renew);
    }

    #[tokio::test(start_paused = true)]
    async fn a_live_holder_is_followed_and_an_expired_one_taken_over() {
        let start = Instant::now();
        let seen = observe(None, lease(Some("other"), "1"), start);
        assert_eq!(
            decide("me", Some(&seen), start),
            Decision::Follow {
                holder: "other".into(),
                expires: start + Duration::from_secs(15)
            }
        );
        tokio::time::advance(Duration::from_secs(14)).await;
        let seen = observe(Some(seen), lease(Some("other"), "1"), Instant::now());
        assert!(matches!(
            decide("me", Some(&seen), Instant::now()),
            Decision::Follow { .. }
        ));
        tokio::time::advance(Duration::from_secs(1)).await;
        let seen = observe(Some(seen), lease(Some("other"), "1"), Instant::now());
        assert_eq!(
            decide("me", Some(&seen), Instant::now()),
            Decision::Acquire { transitions: 4 }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn a_renewal_restarts_the_wait_whatever_the_clocks_say() {
        let start = Instant::now();
        let seen = observe(None, lease(Some("other"), "1"), start);
        tokio::time::advance(Duration::from_secs(10)).await;
        // A new version: the holder renewed. Its renewTime is not read at all.
        let seen = observe(Some(seen), lease(Some("other"), "2"), Instant::now());
        assert_eq!(seen.unchanged_since, start + Duration::from_secs(10));
        tokio::time::advance(Duration::from_secs(10)).await;
        assert!(matches!(
            decide("me", Some(&seen), Instant::now()),
            Decision::Follow { .. }
        ));
        tokio::time::advance(Duration::from_secs(5)).await;
        assert!(matches!(
            decide("me", Some(&seen), Instant::now()),
            Decision::Acquire { .. }
        ));
    }

    #[tokio::test(start_paused = true)]
    async fn a_released_lease_is_taken_at_once() {
        let now = Instant::now();
        let seen = observe(None, lease(None, "7"), now);
        assert_eq!(
            decide("me", Some(&seen), now),
            Decision::Acquire { transitions: 4 }
        );
    }

    #[tokio::test(start_paused = true)]
    async fn the_leader_stops_before_anyone_may_take_over() {
        let timing = Timing::default();
        timing.validate().unwrap();
        let sent = Instant::now();
        // The earliest another candidate can see the write is when it was sent.
        let earliest_takeover = sent + timing.duration;
        assert!(leader_until(sent, timing.renew_deadline) < earliest_takeover);
    }

    #[test]
    fn timings_that_allow_two_leaders_are_refused() {
        let bad = Timing {
            renew_deadline: Duration::from_secs(15),
            ..Timing::default()
        };
        assert!(bad.validate().unwrap_err().contains("two replicas"));
        let slow_retry = Timing {
            retry_period: Duration::from_secs(10),
            ..Timing::default()
        };
        assert!(slow_retry.validate().is_err());
        let fractional = Timing {
            duration: Duration::from_millis(15_500),
            ..Timing::default()
        };
        assert!(fractional.validate().is_err());
    }
}
