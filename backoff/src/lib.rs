//! The one backoff of domaind: gossip reconnects, the IMEX supervisor's restarts, status
//! and slice writes, API calls and the controller's reconciles all wait with it.
//!
//! Exponential from `min`, doubling per failure in a row, capped at `max`, reset by a
//! success. With [`jittered`](Backoff::jittered) each wait is drawn between half and all
//! of that: after an API server outage every node of a large cluster retries, and
//! jitter keeps them from doing so at the same instant. Without it the waits are exact,
//! which the paused-time tests of gossip and the supervisor rely on.
//!
//! Why our own and not a crate's: the maintained ones (backon, for one) hand out an
//! iterator of waits, rebuilt to reset and blind to how many failures came in a row;
//! every caller here needs the reset, and the IMEX supervisor and gossip log the count.

use std::time::Duration;

use rand::Rng as _;

/// Beyond this many doublings the wait is `max` anyway; the bound keeps the shift safe.
const MAX_DOUBLINGS: u32 = 20;

/// Failures in a row and the wait they earn.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Backoff {
    min: Duration,
    max: Duration,
    jitter: bool,
    failures: u32,
}

impl Backoff {
    /// Exact waits: `min`, `2·min`, `4·min`, … up to `max` (at least `min`).
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            jitter: false,
            failures: 0,
        }
    }

    /// Each wait drawn uniformly between half and all of the exact one.
    pub fn jittered(self) -> Self {
        Self {
            jitter: true,
            ..self
        }
    }

    /// The exact wait after the `failures`-th failure in a row (1 for the first; 0
    /// waits nothing).
    pub fn delay_after(&self, failures: u32) -> Duration {
        if failures == 0 {
            return Duration::ZERO;
        }
        let doublings = (failures - 1).min(MAX_DOUBLINGS);
        self.min.saturating_mul(1 << doublings).min(self.max)
    }

    /// Counts a failure and says how long to wait before the next attempt.
    pub fn fail(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.drawn(self.delay_after(self.failures))
    }

    /// Counts a failure that asking again soon will not mend (a refusal, bad input):
    /// the wait is the cap at once, so a retry does not hammer a server that already
    /// said no, yet a fix by a person is picked up within one cap.
    pub fn fail_at_cap(&mut self) -> Duration {
        self.failures = self.failures.saturating_add(1);
        self.drawn(self.max)
    }

    fn drawn(&self, exact: Duration) -> Duration {
        if self.jitter {
            let half = exact / 2;
            half + half.mul_f64(rand::rng().random::<f64>())
        } else {
            exact
        }
    }

    /// The next attempt waits `min` again.
    pub fn succeed(&mut self) {
        self.failures = 0;
    }

    /// Failures since the last success.
    pub fn failures(&self) -> u32 {
        self.failures
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn doubles_up_to_the_cap_and_a_success_starts_again() {
        let mut backoff = Backoff::new(100 * MS, Duration::from_secs(1));
        let waits: Vec<_> = (0..6).map(|_| backoff.fail().as_millis()).collect();
        assert_eq!(waits, vec![100, 200, 400, 800, 1000, 1000]);
        assert_eq!(backoff.failures(), 6);
        backoff.succeed();
        assert_eq!(backoff.failures(), 0);
        assert_eq!(backoff.fail(), 100 * MS);
    }

    #[test]
    fn a_refusal_waits_the_cap_at_once_and_counts_as_a_failure() {
        let mut backoff = Backoff::new(100 * MS, Duration::from_secs(1));
        assert_eq!(backoff.fail_at_cap(), Duration::from_secs(1));
        assert_eq!(backoff.failures(), 1);
        backoff.succeed();
        assert_eq!(backoff.fail(), 100 * MS);
    }

    #[test]
    fn many_failures_stay_at_the_cap() {
        let mut backoff = Backoff::new(100 * MS, Duration::from_secs(5));
        for _ in 0..10_000 {
            assert!(backoff.fail() <= Duration::from_secs(5));
        }
        assert_eq!(backoff.delay_after(u32::MAX), Duration::from_secs(5));
    }

    #[test]
    fn a_cap_below_the_first_wait_is_raised_to_it() {
        let mut backoff = Backoff::new(Duration::from_secs(2), Duration::from_secs(1));
        assert_eq!(backoff.fail(), Duration::from_secs(2));
        assert_eq!(backoff.fail(), Duration::from_secs(2));
    }

    #[test]
    fn the_exact_wait_of_the_nth_failure() {
        let backoff = Backoff::new(500 * MS, Duration::from_secs(300));
        assert_eq!(backoff.delay_after(0), Duration::ZERO);
        assert_eq!(backoff.delay_after(1), 500 * MS);
        assert_eq!(backoff.delay_after(2), Duration::from_secs(1));
        assert_eq!(backoff.delay_after(10), Duration::from_secs(256));
        assert_eq!(backoff.delay_after(11), Duration::from_secs(300));
    }

    #[test]
    fn jittered_waits_lie_between_half_and_all_of_the_exact_one() {
        let mut backoff = Backoff::new(200 * MS, Duration::from_secs(30)).jittered();
        for failure in 1..=30 {
            let wait = backoff.fail();
            let exact = backoff.delay_after(failure);
            assert!(
                wait >= exact / 2 && wait <= exact,
                "{failure}: {wait:?} of {exact:?}"
            );
        }
        backoff.succeed();
        assert!(backoff.fail() <= 200 * MS);
    }
}
