//! Retries after a failed reconcile: exponential per ComputeDomain, reset by a success,
//! so that one CD the API server keeps refusing neither spins nor delays the others.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

/// The first retry comes after `FIRST`, then each waits twice as long, up to `MAX`.
pub const FIRST: Duration = Duration::from_millis(500);
pub const MAX: Duration = Duration::from_secs(300);

/// The wait before retrying after the `failures`-th consecutive failure (1 for the first).
pub fn delay(failures: u32) -> Duration {
    let doublings = failures.saturating_sub(1).min(20);
    FIRST.saturating_mul(1 << doublings).min(MAX)
}

/// Consecutive failures per object key.
#[derive(Debug, Default)]
pub struct Failures {
    counts: Mutex<HashMap<String, u32>>,
}

impl Failures {
    /// Counts a failure and says how long to wait before the retry.
    pub fn failed(&self, key: &str) -> Duration {
        let mut counts = self
            .counts
            .lock()
            .expect("the failure counts are never poisoned");
        let count = counts.entry(key.to_string()).or_default();
        *count = count.saturating_add(1);
        delay(*count)
    }

    pub fn succeeded(&self, key: &str) {
        self.counts
            .lock()
            .expect("the failure counts are never poisoned")
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_up_to_the_cap() {
        assert_eq!(delay(1), Duration::from_millis(500));
        assert_eq!(delay(2), Duration::from_secs(1));
        assert_eq!(delay(4), Duration::from_secs(4));
        assert_eq!(delay(10), Duration::from_secs(256));
        assert_eq!(delay(11), MAX);
        assert_eq!(delay(u32::MAX), MAX);
    }

    #[test]
    fn a_success_starts_again_from_the_first_delay() {
        let failures = Failures::default();
        assert_eq!(failures.failed("a"), delay(1));
        assert_eq!(failures.failed("a"), delay(2));
        assert_eq!(failures.failed("b"), delay(1));
        failures.succeeded("a");
        assert_eq!(failures.failed("a"), delay(1));
    }
}
