//! Retries after a failed reconcile: exponential per ComputeDomain, reset by a success,
//! so that one CD the API server keeps refusing neither spins nor delays the others.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use domaind_backoff::Backoff;

/// The first retry comes after 500 ms, then each waits twice as long, up to 5 minutes.
pub fn reconcile_backoff() -> Backoff {
    Backoff::new(Duration::from_millis(500), Duration::from_secs(300))
}

/// Consecutive failures per object key, each with its own backoff.
#[derive(Debug, Default)]
pub struct Failures {
    backoffs: Mutex<HashMap<String, Backoff>>,
}

impl Failures {
    /// Counts a failure and says how long to wait before the retry.
    pub fn failed(&self, key: &str) -> Duration {
        self.backoffs
            .lock()
            .expect("the failure counts are never poisoned")
            .entry(key.to_string())
            .or_insert_with(reconcile_backoff)
            .fail()
    }

    pub fn succeeded(&self, key: &str) {
        self.backoffs
            .lock()
            .expect("the failure counts are never poisoned")
            .remove(key);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn doubles_per_key_and_a_success_starts_again() {
        let failures = Failures::default();
        let ms = Duration::from_millis;
        assert_eq!(failures.failed("a"), ms(500));
        assert_eq!(failures.failed("a"), ms(1000));
        assert_eq!(failures.failed("b"), ms(500));
        failures.succeeded("a");
        assert_eq!(failures.failed("a"), ms(500));
        for _ in 0..30 {
            failures.failed("b");
        }
        assert_eq!(failures.failed("b"), Duration::from_secs(300));
    }
}
