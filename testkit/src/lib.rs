//! What every test of domaind waits with. A test never sleeps to "let things settle":
//! it polls for what it waits for, failing with what it waited for once a limit has
//! passed. Under tokio's paused time the polls cost nothing and the limit is virtual;
//! under real time the limit bounds the wait.

pub mod percentile;

use std::future::Future;
use std::time::Duration;

use tokio::time::Instant;

/// How often [`poll_until`] looks again.
pub const POLL: Duration = Duration::from_millis(20);

/// Polls `check` every [`POLL`] until it gives a value, failing the test after `limit`
/// with what `what` says was awaited.
pub async fn poll_until<T>(
    what: &str,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Option<T>,
) -> T {
    poll_every(POLL, limit, async || check().await.ok_or(()))
        .await
        .unwrap_or_else(|()| panic!("not within {limit:?}: {what}"))
}

/// [`poll_until`] for a check that says what it saw when it is not done yet
/// (`Err(seen)`): the failure shows the last of it.
pub async fn poll_for<T, S: std::fmt::Debug>(
    what: &str,
    limit: Duration,
    check: impl AsyncFnMut() -> Result<T, S>,
) -> T {
    poll_every(POLL, limit, check)
        .await
        .unwrap_or_else(|seen| panic!("not within {limit:?}: {what}; last seen: {seen:#?}"))
}

/// [`poll_until`] for a condition.
pub async fn poll_until_true(what: &str, limit: Duration, mut check: impl AsyncFnMut() -> bool) {
    poll_until(what, limit, async || check().await.then_some(())).await;
}

/// The loop under every poll here, for a caller whose wait running out is an outcome
/// rather than a failed test (a harness that reports it), or that looks at its own
/// pace: `check` every `interval` until it gives a value (`Ok`), or the last thing it
/// saw (`Err(seen)`) once `limit` has passed. It looks at least once, and once more
/// at or after the limit when the limit falls between looks.
pub async fn poll_every<T, S>(
    interval: Duration,
    limit: Duration,
    mut check: impl AsyncFnMut() -> Result<T, S>,
) -> Result<T, S> {
    let deadline = Instant::now() + limit;
    loop {
        let seen = match check().await {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if Instant::now() >= deadline {
            return Err(seen);
        }
        tokio::time::sleep(interval).await;
    }
}

/// Polls `check` every `interval` until it gives a value, or `None` once `limit` has
/// passed: for a poll that must not look more often than its target bears (a real API
/// server), or whose caller says itself what a timeout means (the demo reports it as an
/// error instead of failing a test).
pub async fn poll_until_every<T, F, Fut>(interval: Duration, limit: Duration, mut f: F) -> Option<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    poll_every(interval, limit, async || f().await.ok_or(()))
        .await
        .ok()
}

/// [`poll_every`] outside a runtime: the thread sleeps between looks.
pub fn poll_every_blocking<T, S>(
    interval: Duration,
    limit: Duration,
    mut check: impl FnMut() -> Result<T, S>,
) -> Result<T, S> {
    let deadline = std::time::Instant::now() + limit;
    loop {
        let seen = match check() {
            Ok(value) => return Ok(value),
            Err(seen) => seen,
        };
        if std::time::Instant::now() >= deadline {
            return Err(seen);
        }
        std::thread::sleep(interval);
    }
}

/// [`poll_until`] outside a runtime, for a synchronous test: the thread sleeps between
/// looks.
pub fn poll_until_blocking<T>(
    what: &str,
    limit: Duration,
    mut check: impl FnMut() -> Option<T>,
) -> T {
    poll_every_blocking(POLL, limit, || check().ok_or(()))
        .unwrap_or_else(|()| panic!("not within {limit:?}: {what}"))
}

/// Awaits `future`, failing the test if it takes longer than `limit`.
pub async fn within<T>(what: &str, limit: Duration, future: impl Future<Output = T>) -> T {
    tokio::time::timeout(limit, future)
        .await
        .unwrap_or_else(|_| panic!("not within {limit:?}: {what}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test(start_paused = true)]
    async fn polls_until_the_value_comes() {
        let started = Instant::now();
        let mut looks = 0;
        let found = poll_until("the third look", Duration::from_secs(1), async || {
            looks += 1;
            (looks == 3).then_some(looks)
        })
        .await;
        assert_eq!(found, 3);
        assert_eq!(started.elapsed(), 2 * POLL);
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "not within 100ms: what never comes")]
    async fn fails_naming_what_never_came() {
        poll_until_true("what never comes", Duration::from_millis(100), async || {
            false
        })
        .await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "not within 1s: a future that never ends")]
    async fn within_fails_naming_the_future() {
        within(
            "a future that never ends",
            Duration::from_secs(1),
            std::future::pending::<()>(),
        )
        .await;
    }

    #[tokio::test(start_paused = true)]
    #[should_panic(expected = "last seen: 7")]
    async fn a_failure_shows_what_was_last_seen() {
        poll_for("eight", Duration::from_millis(50), async || Err::<(), _>(7)).await;
    }

    #[tokio::test(start_paused = true)]
    async fn polls_at_the_interval_given() {
        let started = Instant::now();
        let mut looks = 0;
        let interval = Duration::from_millis(250);
        let found = poll_until_every(interval, Duration::from_secs(5), || {
            looks += 1;
            let look = looks;
            async move { (look == 3).then_some(look) }
        })
        .await;
        assert_eq!(found, Some(3));
        assert_eq!(started.elapsed(), 2 * interval);
    }

    #[tokio::test(start_paused = true)]
    async fn gives_none_once_the_limit_has_passed() {
        let started = Instant::now();
        let mut looks = 0;
        let found = poll_until_every(Duration::from_millis(250), Duration::from_secs(1), || {
            looks += 1;
            async { None::<()> }
        })
        .await;
        assert_eq!(found, None);
        // At 0, 250, 500, 750 and 1000 ms: the last look is at the limit, not after it.
        assert_eq!(looks, 5);
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[test]
    fn the_blocking_poll_gives_the_value() {
        let mut looks = 0;
        let found = poll_until_blocking("the second look", Duration::from_secs(5), || {
            looks += 1;
            (looks == 2).then_some("found")
        });
        assert_eq!(found, "found");
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_at_its_own_pace_gives_the_value() {
        let started = Instant::now();
        let mut looks = 0;
        let found = poll_every(
            Duration::from_millis(500),
            Duration::from_secs(10),
            async || {
                looks += 1;
                if looks == 3 { Ok(looks) } else { Err(looks) }
            },
        )
        .await;
        assert_eq!(found, Ok(3));
        assert_eq!(started.elapsed(), Duration::from_secs(1));
    }

    #[tokio::test(start_paused = true)]
    async fn a_poll_that_runs_out_gives_what_it_last_saw_after_the_limit() {
        let started = Instant::now();
        let mut looks = 0;
        let outcome: Result<(), u32> = poll_every(
            Duration::from_millis(300),
            Duration::from_secs(1),
            async || {
                looks += 1;
                Err(looks)
            },
        )
        .await;
        // Looks at 0, 300, 600, 900 and 1200 ms: the last one past the limit.
        assert_eq!(outcome, Err(5));
        assert_eq!(started.elapsed(), Duration::from_millis(1200));
    }

    #[test]
    fn the_blocking_poll_that_runs_out_gives_what_it_last_saw() {
        let started = std::time::Instant::now();
        let mut looks = 0;
        let outcome: Result<(), u32> =
            poll_every_blocking(Duration::from_millis(1), Duration::from_millis(5), || {
                looks += 1;
                Err(looks)
            });
        assert_eq!(outcome, Err(looks));
        assert!(started.elapsed() >= Duration::from_millis(5));
    }
}
