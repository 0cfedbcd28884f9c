//! The ImexProcess actor restarting a daemon that keeps failing, in paused time: the
//! waits grow up to the cap whatever failure may pass (a start refused for good waits
//! the cap at once), a daemon that stayed up resets them, and the reason for each
//! restart is kept.
//!
//! The shape of issue 11's loop: every start succeeded (the process spawned), the
//! daemon exited a moment later (its port was taken), and the restart came 200 ms
//! later, forever.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use async_trait::async_trait;
use domaind_actors::NodeConfig;
use domaind_actors::actors::imex_process::{
    ApplyPeers, GetImexLifecycle, ImexProcessActor, ImexReport,
};
use domaind_actors::model::CliqueId;
use domaind_actors::ports::{Imex, ImexStatus, PortError};
use domaind_actors::rules::peers::{Peer, PeerSet};
use domaind_actors::testing::run_paused_actix;
use tokio::time::Instant;

const MIN: Duration = Duration::from_millis(200);
const MAX: Duration = Duration::from_secs(5);
const HEALTHY_AFTER: Duration = Duration::from_secs(10);
const POLL: Duration = Duration::from_millis(250);

/// A fake IMEX daemon whose process starts and then, the next `deaths` times, exits
/// before its first status query, as a daemon that cannot bind its port does; later
/// starts stay up until [`FakeShortLivedImex::crash`]. Starts can also be refused.
#[derive(Debug, Clone, Default)]
struct FakeShortLivedImex(Arc<Mutex<Daemon>>, Arc<tokio::sync::Notify>);

#[derive(Debug, Default)]
struct Daemon {
    deaths: u32,
    refusals: u32,
    /// Starts refused as a daemon without its binary is: permanently.
    missing: u32,
    running: bool,
    exited: Option<String>,
    starts: Vec<Instant>,
}

impl FakeShortLivedImex {
    fn daemon(&self) -> std::sync::MutexGuard<'_, Daemon> {
        self.0.lock().unwrap()
    }

    fn crash(&self) {
        let mut d = self.daemon();
        d.running = false;
        d.exited = Some("exited (signal: 9 (SIGKILL))".into());
        drop(d);
        self.1.notify_waiters();
    }

    fn starts(&self) -> Vec<Instant> {
        self.daemon().starts.clone()
    }
}

#[async_trait]
impl Imex for FakeShortLivedImex {
    async fn start(&self, _: &PeerSet) -> Result<(), PortError> {
        let mut d = self.daemon();
        if d.missing > 0 {
            d.missing -= 1;
            return Err(PortError::permanent(
                "cannot start the IMEX daemon /usr/bin/nvidia-imex: No such file or directory",
            ));
        }
        if d.refusals > 0 {
            d.refusals -= 1;
            return Err(PortError::transient(
                "IMEX cannot listen on 10.0.0.1:50000 (SERVER_PORT): Address already in use",
            ));
        }
        d.starts.push(Instant::now());
        if d.deaths > 0 {
            d.deaths -= 1;
            d.running = false;
            d.exited = Some(
                "exited (exit status: 1); last output: cannot listen on 10.0.0.1:50000: \
                 Address already in use"
                    .into(),
            );
        } else {
            d.running = true;
        }
        drop(d);
        self.1.notify_waiters();
        Ok(())
    }

    async fn apply(&self, _: &PeerSet) -> Result<(), PortError> {
        Ok(())
    }

    async fn reload(&self) -> Result<(), PortError> {
        Ok(())
    }

    async fn status(&self) -> Result<ImexStatus, PortError> {
        let mut d = self.daemon();
        Ok(ImexStatus {
            running: d.running,
            ready: d.running,
            links: Default::default(),
            exited: if d.running { None } else { d.exited.take() },
            kept: None,
            adopted: false,
            catching_up: false,
        })
    }

    async fn stop(&self) -> Result<(), PortError> {
        self.daemon().running = false;
        Ok(())
    }

    async fn exited(&self) {
        loop {
            let notified = self.1.notified();
            tokio::pin!(notified);
            notified.as_mut().enable();
            if self.daemon().exited.is_some() {
                return;
            }
            notified.await;
        }
    }
}

/// Keeps every report, with when it came.
#[derive(Default, Clone)]
struct Owner(Arc<Mutex<Vec<(Instant, ImexReport)>>>);
impl Actor for Owner {
    type Context = Context<Self>;
}
impl Handler<ImexReport> for Owner {
    type Result = ();
    fn handle(&mut self, report: ImexReport, _: &mut Self::Context) {
        self.0.lock().unwrap().push((Instant::now(), report));
    }
}

impl Owner {
    fn reports(&self) -> Vec<(Instant, ImexReport)> {
        self.0.lock().unwrap().clone()
    }

    fn last(&self) -> Option<ImexReport> {
        self.0.lock().unwrap().last().map(|(_, r)| r.clone())
    }
}

fn supervise(imex: &FakeShortLivedImex) -> (Addr<ImexProcessActor>, Owner) {
    let ip = std::net::IpAddr::from([10, 0, 0, 1]);
    let mut config = NodeConfig::new("node-a", ip, CliqueId("c.0".into()));
    config.imex_poll.unready = POLL;
    config.imex_restart_backoff_min = MIN;
    config.imex_restart_backoff_max = MAX;
    config.imex_healthy_after = HEALTHY_AFTER;
    let supervisor = ImexProcessActor::new(Arc::new(imex.clone()), &config).start();
    let owner = Owner::default();
    let address = owner.clone().start();
    // The supervisor holds a weak address: the test's lives in the actor's own loop.
    std::mem::forget(address.clone());
    supervisor.do_send(ApplyPeers {
        owner: address.recipient().downgrade(),
        version: 1,
        peers: PeerSet {
            peers: [(
                0,
                Peer {
                    node: "node-a".into(),
                    ip,
                },
            )]
            .into(),
        },
        claims_in_use: false,
    });
    (supervisor, owner)
}

async fn wait_for_starts(imex: &FakeShortLivedImex, n: usize) {
    domaind_testkit::poll_for(
        &format!("{n} starts"),
        Duration::from_secs(600),
        async || {
            let starts = imex.starts().len();
            if starts >= n { Ok(()) } else { Err(starts) }
        },
    )
    .await;
}

/// The wait before the `n`th restart in a row (0-based): doubling from MIN, capped.
fn backoff(n: u32) -> Duration {
    MIN.saturating_mul(1 << n.min(16)).min(MAX)
}

fn gaps(starts: &[Instant]) -> Vec<Duration> {
    starts.windows(2).map(|w| w[1] - w[0]).collect()
}

#[test]
fn a_daemon_that_dies_after_every_start_is_restarted_ever_more_slowly() {
    run_paused_actix(|| async {
        let imex = FakeShortLivedImex::default();
        imex.daemon().deaths = 8;
        let (supervisor, _owner) = supervise(&imex);
        wait_for_starts(&imex, 9).await;
        for (n, gap) in gaps(&imex.starts()).into_iter().enumerate() {
            let want = backoff(n as u32);
            assert!(
                gap >= want && gap < want + POLL,
                "restart {n} came {gap:?} after the start before, not {want:?}"
            );
        }
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(lifecycle.restarts, 8, "{lifecycle:?}");
        assert!(
            lifecycle
                .last_failure
                .as_deref()
                .is_some_and(|why| why.contains("Address already in use")),
            "the reason is kept: {lifecycle:?}"
        );
        assert!(lifecycle.running, "{lifecycle:?}");
        assert_eq!(lifecycle.restart_delay, None, "nothing waits once it runs");
    });
}

#[test]
fn a_daemon_that_stayed_up_is_restarted_after_the_shortest_wait() {
    run_paused_actix(|| async {
        let imex = FakeShortLivedImex::default();
        imex.daemon().deaths = 4;
        let (supervisor, _owner) = supervise(&imex);
        wait_for_starts(&imex, 5).await;

        // Up for less than the healthy period: the failures still count.
        tokio::time::sleep(HEALTHY_AFTER / 2).await;
        imex.crash();
        wait_for_starts(&imex, 6).await;
        let gap = *gaps(&imex.starts()).last().unwrap() - HEALTHY_AFTER / 2;
        assert!(gap >= backoff(4), "{gap:?}: the backoff was reset too soon");

        // Up for the healthy period: the next failure waits the least.
        tokio::time::sleep(HEALTHY_AFTER).await;
        imex.crash();
        wait_for_starts(&imex, 7).await;
        let gap = *gaps(&imex.starts()).last().unwrap() - HEALTHY_AFTER;
        assert!(gap < MIN + POLL + POLL, "{gap:?} after a healthy run");
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert!(
            lifecycle
                .last_failure
                .as_deref()
                .is_some_and(|why| why.contains("SIGKILL") && why.contains("s up")),
            "{lifecycle:?}"
        );
    });
}

#[test]
fn refused_and_short_lived_starts_share_one_backoff() {
    run_paused_actix(|| async {
        let imex = FakeShortLivedImex::default();
        // Two starts refused (the port check), then one that dies at once, then it runs.
        imex.daemon().refusals = 2;
        imex.daemon().deaths = 1;
        let applied = Instant::now();
        let (supervisor, _owner) = supervise(&imex);
        wait_for_starts(&imex, 2).await;
        let starts = imex.starts();
        assert!(
            starts[0] - applied >= backoff(0) + backoff(1),
            "{:?}",
            starts[0] - applied
        );
        // The start that spawned a process is no success: the death after it is the
        // third failure in a row.
        assert!(
            starts[1] - starts[0] >= backoff(2),
            "{:?} between the short-lived start and the next",
            starts[1] - starts[0]
        );
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(
            (lifecycle.failures, lifecycle.restarts),
            (2, 1),
            "{lifecycle:?}"
        );
        assert!(lifecycle.running);
    });
}

/// A start that cannot succeed until a person acts (no binary) waits the cap at once,
/// each time; a busy port, which may pass, climbs from the shortest wait.
#[test]
fn a_start_refused_for_good_waits_the_cap_not_the_shortest_wait() {
    run_paused_actix(|| async {
        let imex = FakeShortLivedImex::default();
        imex.daemon().missing = 2;
        let applied = Instant::now();
        let (supervisor, _owner) = supervise(&imex);
        wait_for_starts(&imex, 1).await;
        let waited = imex.starts()[0] - applied;
        assert!(
            waited >= MAX + MAX && waited < MAX + MAX + POLL,
            "{waited:?} before the first start, not two caps"
        );
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(lifecycle.failures, 2, "{lifecycle:?}");
        assert!(
            lifecycle
                .last_failure
                .as_deref()
                .is_some_and(|why| why.contains("No such file")),
            "{lifecycle:?}"
        );
    });
}

/// The failures in a row are one episode: every report while it lasts carries it
/// (and the newest reason), starts refused included, which no poll follows; it ends
/// only once a daemon has stayed up the healthy period, told by a report without it;
/// the next failure begins episode 2.
#[test]
fn a_failure_episode_lasts_until_a_daemon_stays_up() {
    run_paused_actix(|| async {
        let imex = FakeShortLivedImex::default();
        imex.daemon().refusals = 2;
        imex.daemon().deaths = 3;
        let (supervisor, owner) = supervise(&imex);
        wait_for_starts(&imex, 4).await;
        let first_start = imex.starts()[0];
        let failing: Vec<_> = owner
            .reports()
            .into_iter()
            .filter(|(at, _)| *at < first_start)
            .map(|(_, r)| r)
            .collect();
        assert_eq!(
            failing.len(),
            2,
            "one report per refused start: {failing:?}"
        );
        for report in &failing {
            let failure = report.failure.as_ref().expect("failing");
            assert_eq!(failure.episode, 1);
            assert!(failure.reason.contains("cannot listen"), "{failure:?}");
            assert!(!report.running);
        }
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(lifecycle.failures_in_a_row, 5, "{lifecycle:?}");
        assert!(lifecycle.failing.is_some());

        // Running now, and ready, but not yet for the healthy period: still failing.
        tokio::time::sleep(HEALTHY_AFTER / 2).await;
        let last = owner.last().unwrap();
        assert!(last.running && last.ready, "{last:?}");
        assert_eq!(last.failure.as_ref().map(|f| f.episode), Some(1));
        assert!(
            last.failure
                .unwrap()
                .reason
                .contains("Address already in use")
        );

        // Up for the healthy period: the episode ends, and the domain is told at once.
        tokio::time::sleep(HEALTHY_AFTER / 2 + POLL).await;
        let last = owner.last().unwrap();
        assert_eq!(last.failure, None, "{last:?}");
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(
            (lifecycle.failing.clone(), lifecycle.failures_in_a_row),
            (None, 0),
            "{lifecycle:?}"
        );

        imex.crash();
        wait_for_starts(&imex, 5).await;
        let episodes: Vec<u64> = owner
            .reports()
            .iter()
            .filter_map(|(_, r)| r.failure.as_ref().map(|f| f.episode))
            .collect();
        assert_eq!(episodes.last(), Some(&2), "{episodes:?}");
        assert!(episodes.windows(2).all(|w| w[0] <= w[1]), "{episodes:?}");
    });
}

/// Delays grow to the cap and stay there, however long the daemon keeps failing.
#[test]
fn a_daemon_that_never_comes_up_is_tried_at_the_cap() {
    run_paused_actix(|| async {
        let imex = FakeShortLivedImex::default();
        imex.daemon().refusals = 40;
        let (supervisor, owner) = supervise(&imex);
        domaind_testkit::poll_until_true("20 failures", Duration::from_secs(600), async || {
            supervisor.send(GetImexLifecycle).await.unwrap().failures >= 20
        })
        .await;
        let refusals: Vec<Instant> = owner
            .reports()
            .iter()
            .filter(|(_, r)| r.failure.is_some())
            .map(|(at, _)| *at)
            .collect();
        let waits = gaps(&refusals);
        for (n, gap) in waits.iter().enumerate() {
            let want = backoff(n as u32);
            assert!(
                *gap >= want && *gap < want + POLL,
                "refusal {} came {gap:?} after the one before, not {want:?}",
                n + 1
            );
        }
        assert_eq!(*waits.last().unwrap(), MAX, "{waits:?}");
        let lifecycle = supervisor.send(GetImexLifecycle).await.unwrap();
        assert_eq!(lifecycle.restart_delay, Some(MAX));
        assert_eq!(lifecycle.failing.map(|f| f.episode), Some(1));
    });
}
