//! The ImexProcess actor's status polls, in paused time: quick after a start or a
//! new peer set, every 5 s once IMEX is ready and nothing changes, quick again when
//! an answer changes (a link lost), and a crash seen at once, not at the next poll.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use domaind_actors::NodeConfig;
use domaind_actors::actors::imex_process::{
    ApplyPeers, GetImexLifecycle, ImexProcessActor, ImexReport, ReleaseImex,
};
use domaind_actors::model::CliqueId;
use domaind_actors::ports::Imex;
use domaind_actors::rules::imex_poll::ImexPollConfig;
use domaind_actors::rules::peers::{Peer, PeerSet};
use domaind_actors::testing::{FakeImex, FakeImexFabric, ImexCall, run_paused_actix};
use tokio::time::{Instant, sleep};

const STEADY: Duration = Duration::from_secs(5);
const UNREADY: Duration = Duration::from_millis(250);
const QUICK: Duration = Duration::from_millis(30);
const BACKOFF_MIN: Duration = Duration::from_millis(200);
/// Timers in paused time fire on the millisecond they are due.
const SLACK: Duration = Duration::from_millis(2);

/// Every report the supervisor sends, with when it came.
#[derive(Debug, Clone, Default)]
struct Reports(Arc<Mutex<Vec<(Instant, ImexReport)>>>);

impl Reports {
    fn since(&self, at: Instant) -> Vec<(Instant, ImexReport)> {
        let reports = self.0.lock().unwrap();
        reports.iter().filter(|(t, _)| *t >= at).cloned().collect()
    }

    fn times_since(&self, at: Instant) -> Vec<Instant> {
        self.since(at).into_iter().map(|(t, _)| t).collect()
    }
}

struct Owner(Reports);
impl Actor for Owner {
    type Context = Context<Self>;
}
impl Handler<ImexReport> for Owner {
    type Result = ();
    fn handle(&mut self, report: ImexReport, _: &mut Self::Context) {
        self.0.0.lock().unwrap().push((Instant::now(), report));
    }
}

fn ip(n: u8) -> std::net::IpAddr {
    std::net::IpAddr::from([10, 0, 0, n])
}

fn peers(nodes: &[(&str, u8)]) -> PeerSet {
    PeerSet {
        peers: nodes
            .iter()
            .enumerate()
            .map(|(slot, (node, n))| {
                (
                    slot as _,
                    Peer {
                        node: (*node).into(),
                        ip: ip(*n),
                    },
                )
            })
            .collect(),
    }
}

struct Supervised {
    addr: Addr<ImexProcessActor>,
    owner: Addr<Owner>,
    reports: Reports,
    imex: FakeImex,
}

impl Supervised {
    fn apply(&self, version: u64, set: PeerSet) {
        self.addr.do_send(ApplyPeers {
            owner: self.owner.clone().recipient().downgrade(),
            version,
            peers: set,
            claims_in_use: false,
        });
    }
}

fn supervise(fabric: &FakeImexFabric, set: PeerSet) -> Supervised {
    let mut config = NodeConfig::new("node-a", ip(1), CliqueId("c.0".into()));
    config.imex_poll = ImexPollConfig {
        quick: QUICK,
        unready: UNREADY,
        steady: STEADY,
    };
    config.imex_restart_backoff_min = BACKOFF_MIN;
    let imex = fabric.daemon("node-a");
    let addr = ImexProcessActor::new(Arc::new(imex.clone()), &config).start();
    let reports = Reports::default();
    let owner = Owner(reports.clone()).start();
    let supervised = Supervised {
        addr,
        owner,
        reports,
        imex,
    };
    supervised.apply(1, set);
    supervised
}

fn gaps(times: &[Instant]) -> Vec<Duration> {
    times.windows(2).map(|w| w[1] - w[0]).collect()
}

fn near(got: Duration, want: Duration) -> bool {
    got >= want && got <= want + SLACK
}

#[test]
fn an_idle_ready_daemon_is_asked_quickly_after_its_start_then_every_5_s() {
    run_paused_actix(|| async {
        let fabric = FakeImexFabric::default();
        let start = Instant::now();
        let node = supervise(&fabric, peers(&[("node-a", 1)]));
        sleep(Duration::from_secs(60)).await;

        let times = node.reports.times_since(start);
        assert!(times[0] - start <= SLACK, "asked at once after the start");
        let want = [30, 60, 120, 240, 480, 960, 1920, 3840, 5000, 5000];
        for (n, (got, want)) in gaps(&times).iter().zip(want).enumerate() {
            assert!(
                near(*got, Duration::from_millis(want)),
                "gap {n}: {got:?}, not {want} ms"
            );
        }
        // 12.6 s of ramp, then one question per 5 s.
        let asked = node.imex.count(|c| *c == ImexCall::Status);
        assert!((17..=19).contains(&asked), "{asked} questions in 60 s");
        assert!(
            gaps(&times[times.len() - 5..])
                .iter()
                .all(|gap| near(*gap, STEADY)),
            "{:?}",
            gaps(&times)
        );
        assert!(node.reports.since(start).iter().all(|(_, r)| r.ready));
    });
}

#[test]
fn a_peer_joining_or_leaving_brings_the_quick_polls_back() {
    run_paused_actix(|| async {
        let fabric = FakeImexFabric::default();
        let node = supervise(&fabric, peers(&[("node-a", 1)]));
        sleep(Duration::from_secs(60)).await;

        for (version, set) in [
            (2, peers(&[("node-a", 1), ("node-b", 2)])),
            (3, peers(&[("node-a", 1)])),
        ] {
            let changed = Instant::now();
            node.apply(version, set);
            sleep(Duration::from_secs(1)).await;
            let times = node.reports.times_since(changed);
            assert!(times[0] - changed <= SLACK, "asked at once after the apply");
            assert!(
                near(times[1] - times[0], QUICK),
                "then soon: {:?}",
                gaps(&times)
            );
            assert!(
                node.reports
                    .since(changed)
                    .iter()
                    .all(|(_, r)| r.version == Some(version))
            );
            sleep(Duration::from_secs(60)).await;
        }
        assert_eq!(node.imex.count(|c| matches!(c, ImexCall::Apply(_))), 2);
    });
}

#[test]
fn a_lost_link_is_seen_within_the_steady_interval_then_watched_closely() {
    run_paused_actix(|| async {
        let fabric = FakeImexFabric::default();
        let set = peers(&[("node-a", 1), ("node-b", 2)]);
        fabric.daemon("node-b").start(&set).await.unwrap();
        let node = supervise(&fabric, set);
        // Settled, and then some way between two steady polls.
        sleep(Duration::from_secs(60) + Duration::from_millis(1700)).await;
        assert!(node.reports.since(Instant::now() - STEADY)[0].1.ready);

        let cut = Instant::now();
        fabric.cut("node-a", "node-b");
        sleep(Duration::from_secs(10)).await;
        let after = node.reports.since(cut);
        let (seen, report) = &after[0];
        assert!(
            *seen - cut <= STEADY,
            "seen {:?} after the cut",
            *seen - cut
        );
        assert_eq!((report.ready, report.links.get(&1)), (false, Some(&false)));
        let down: Vec<Instant> = after.iter().map(|(t, _)| *t).collect();
        assert!(
            gaps(&down).iter().all(|gap| *gap <= UNREADY + SLACK),
            "not ready: asked every {UNREADY:?} at least: {:?}",
            gaps(&down)
        );

        let healed = Instant::now();
        fabric.heal();
        sleep(Duration::from_secs(1)).await;
        let (back, report) = node
            .reports
            .since(healed)
            .into_iter()
            .find(|(_, r)| r.ready)
            .expect("ready again");
        assert!(back - healed <= UNREADY + SLACK, "{:?}", back - healed);
        assert_eq!(report.links.get(&1), Some(&true));
    });
}

#[test]
fn a_crash_is_seen_at_once_not_at_the_next_poll() {
    run_paused_actix(|| async {
        let fabric = FakeImexFabric::default();
        let node = supervise(&fabric, peers(&[("node-a", 1)]));
        sleep(Duration::from_secs(60) + Duration::from_millis(1700)).await;

        let crashed = Instant::now();
        fabric.crash("node-a");
        sleep(Duration::from_millis(1)).await;
        let (seen, report) = node.reports.since(crashed)[0].clone();
        assert!(seen - crashed <= SLACK, "{:?}", seen - crashed);
        assert!(!report.running);

        sleep(BACKOFF_MIN + SLACK).await;
        let lifecycle = node.addr.send(GetImexLifecycle).await.unwrap();
        assert_eq!((lifecycle.restarts, lifecycle.running), (1, true));
        assert!(
            lifecycle
                .last_failure
                .is_some_and(|why| why.contains("FakeImexFabric::crash"))
        );

        // The restarted daemon's exit is watched as the first one's was.
        sleep(Duration::from_secs(60)).await;
        let again = Instant::now();
        fabric.crash("node-a");
        sleep(Duration::from_millis(1)).await;
        assert!(!node.reports.since(again)[0].1.running);
    });
}

#[test]
fn a_released_daemon_is_asked_nothing() {
    run_paused_actix(|| async {
        let fabric = FakeImexFabric::default();
        let node = supervise(&fabric, peers(&[("node-a", 1)]));
        sleep(Duration::from_secs(10)).await;
        node.addr.do_send(ReleaseImex);
        sleep(Duration::from_secs(1)).await;
        let asked = node.imex.count(|c| *c == ImexCall::Status);
        sleep(Duration::from_secs(600)).await;
        assert_eq!(node.imex.count(|c| *c == ImexCall::Status), asked);
        assert_eq!(node.imex.count(|c| *c == ImexCall::Stop), 1);
    });
}
