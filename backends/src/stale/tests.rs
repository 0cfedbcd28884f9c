use std::net::IpAddr;
use std::sync::Mutex;

use actix::Actor as _;
use domaind_actors::model::{AllocationMode, ClaimInfo, CliqueId, ReadinessPolicy};
use domaind_actors::ports::{Checkpoint, PortError, PrepareState};
use domaind_actors::testing::{
    FakeCheckpointStore, FakeClaimSource, FakeClock, FakeEventSink, FakeGossipNet, FakeImexFabric,
    FakeStatusSink, run_paused_actix,
};
use domaind_actors::{GetSnapshot, NodeConfig, Ports};
use metrics_util::debugging::{DebugValue, DebuggingRecorder};

use super::*;
use domaind_prepare::cdi::{CdiWriter, ClaimChannels, ClaimUid};
use domaind_prepare::{ChannelInjection, PrepareService};

const DRIVER: &str = "compute-domain.nvidia.com";

fn domain(uid: &str) -> DomainRef {
    DomainRef {
        uid: DomainUid(uid.into()),
        namespace: "team-a".into(),
        name: format!("cd-{uid}"),
        num_nodes: 0,
    }
}

fn claim(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

fn info(domain_uid: &str) -> ClaimInfo {
    ClaimInfo {
        domain: domain(domain_uid),
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Local),
        devices: Vec::new(),
        isolation: Default::default(),
        admin_access: false,
    }
}

fn record(uid: &str, domain_uid: &str) -> ClaimRecord {
    ClaimRecord {
        claim: claim(uid),
        info: info(domain_uid),
        policy: ReadinessPolicy::Local,
        state: PrepareState::PrepareCompleted,
        devices: Vec::new(),
        channel: None,
    }
}

/// A cluster's objects by namespace and name; while `down`, every lookup fails, as an
/// unreachable API server's would.
#[derive(Default)]
struct FakeCluster {
    claims: Mutex<BTreeMap<(String, String), FoundClaim>>,
    domains: Mutex<BTreeMap<(String, String), String>>,
    down: Mutex<bool>,
    asked: Mutex<Vec<String>>,
}

impl FakeCluster {
    fn add_claim(&self, uid: &str) {
        let c = claim(uid);
        self.claims.lock().unwrap().insert(
            (c.namespace, c.name),
            FoundClaim {
                uid: uid.into(),
                allocated_here: true,
            },
        );
    }

    fn add_domain(&self, uid: &str) {
        let d = domain(uid);
        self.domains
            .lock()
            .unwrap()
            .insert((d.namespace, d.name), uid.into());
    }
}

#[async_trait]
impl ClaimExistence for FakeCluster {
    async fn claim(&self, claim: &ClaimRef) -> Lookup<FoundClaim> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("claim {}", claim.uid));
        if *self.down.lock().unwrap() {
            return Lookup::Failed("the API server is down".into());
        }
        let key = (claim.namespace.clone(), claim.name.clone());
        match self.claims.lock().unwrap().get(&key) {
            Some(found) => Lookup::Found(found.clone()),
            None => Lookup::NotFound,
        }
    }

    async fn domain(&self, domain: &DomainRef) -> Lookup<FoundDomain> {
        self.asked
            .lock()
            .unwrap()
            .push(format!("domain {}", domain.uid));
        if *self.down.lock().unwrap() {
            return Lookup::Failed("the API server is down".into());
        }
        let key = (domain.namespace.clone(), domain.name.clone());
        match self.domains.lock().unwrap().get(&key) {
            Some(uid) => Lookup::Found(uid.clone()),
            None => Lookup::NotFound,
        }
    }
}

/// A node's claims in memory: a release forgets the claim, and a claim already gone
/// succeeds, as the node actor's unprepare does.
#[derive(Default)]
struct FakeNode {
    claims: Mutex<BTreeMap<String, ClaimRecord>>,
    failures: Mutex<u32>,
}

#[async_trait]
impl PreparedClaims for FakeNode {
    async fn claims(&self) -> Result<Vec<ClaimRecord>, PortError> {
        Ok(self.claims.lock().unwrap().values().cloned().collect())
    }

    async fn release(&self, claim: &ClaimRef) -> Result<(), PortError> {
        let mut failures = self.failures.lock().unwrap();
        if *failures > 0 {
            *failures -= 1;
            return Err(PortError::transient(
                "cannot record the unprepared claim: disk full",
            ));
        }
        self.claims.lock().unwrap().remove(&claim.uid);
        Ok(())
    }
}

#[derive(Default)]
struct FakeNotices(Mutex<Vec<StaleClaim>>);

#[async_trait]
impl StaleClaimNotices for FakeNotices {
    async fn released(&self, stale: &StaleClaim) -> Result<(), PortError> {
        self.0.lock().unwrap().push(stale.clone());
        Ok(())
    }
}

struct Setup {
    cluster: Arc<FakeCluster>,
    node: Arc<FakeNode>,
    notices: Arc<FakeNotices>,
    checker: StaleClaimChecker,
}

fn setup(records: &[ClaimRecord]) -> Setup {
    let cluster = Arc::new(FakeCluster::default());
    let node = Arc::new(FakeNode::default());
    node.claims
        .lock()
        .unwrap()
        .extend(records.iter().map(|r| (r.claim.uid.clone(), r.clone())));
    let notices = Arc::new(FakeNotices::default());
    let checker = StaleClaimChecker::new(cluster.clone(), node.clone(), notices.clone());
    Setup {
        cluster,
        node,
        notices,
        checker,
    }
}

fn counters(
    snapshot: Vec<(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )>,
) -> BTreeMap<String, u64> {
    snapshot
        .into_iter()
        .filter_map(|(key, _, _, value)| {
            let DebugValue::Counter(n) = value else {
                return None;
            };
            let labels: Vec<String> = key
                .key()
                .labels()
                .map(|l| format!("{}={}", l.key(), l.value()))
                .collect();
            Some((format!("{}{{{}}}", key.key().name(), labels.join(",")), n))
        })
        .collect()
}

#[tokio::test]
async fn claims_whose_objects_are_gone_are_released_with_an_event_and_a_metric() {
    let recorder = DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    let _local = metrics::set_default_local_recorder(&recorder);
    let s = setup(&[
        record("alive", "d1"),
        record("deleted", "d1"),
        record("orphan", "gone"),
    ]);
    s.cluster.add_claim("alive");
    s.cluster.add_claim("orphan");
    s.cluster.add_domain("d1");

    let report = s.checker.check().await;
    let released: Vec<(&str, &str)> = report
        .released
        .iter()
        .map(|r| (r.claim.uid.as_str(), r.reason.label()))
        .collect();
    assert_eq!(
        released,
        [("deleted", "claim_deleted"), ("orphan", "domain_deleted")]
    );
    assert!(report.undecided.is_empty() && report.failed.is_empty());
    let kept: Vec<String> = s.node.claims.lock().unwrap().keys().cloned().collect();
    assert_eq!(kept, ["alive"]);
    assert_eq!(*s.notices.0.lock().unwrap(), report.released);
    // Each claim once, each domain once.
    assert_eq!(
        *s.cluster.asked.lock().unwrap(),
        [
            "claim alive",
            "claim deleted",
            "claim orphan",
            "domain d1",
            "domain gone"
        ]
    );
    let counted = counters(snapshotter.snapshot().into_vec());
    assert_eq!(
        counted.get("domaind_stale_claims_released_total{reason=claim_deleted}"),
        Some(&1)
    );
    assert_eq!(
        counted.get("domaind_stale_claims_released_total{reason=domain_deleted}"),
        Some(&1)
    );
    assert_eq!(
        counted.get("domaind_stale_claim_checks_total{outcome=clean}"),
        Some(&1)
    );
}

#[tokio::test]
async fn an_unreachable_cluster_releases_nothing() {
    let s = setup(&[record("c1", "d1")]);
    *s.cluster.down.lock().unwrap() = true;
    let report = s.checker.check().await;
    assert!(report.released.is_empty());
    assert_eq!(report.undecided.len(), 1);
    assert!(
        report.undecided[0].1.contains("down"),
        "{:?}",
        report.undecided
    );
    assert_eq!(s.node.claims.lock().unwrap().len(), 1);
    assert!(s.notices.0.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_failed_release_is_tried_again_at_the_next_check() {
    let s = setup(&[record("c1", "d1")]);
    s.cluster.add_domain("d1");
    *s.node.failures.lock().unwrap() = 1;
    let report = s.checker.check().await;
    assert!(report.released.is_empty());
    assert_eq!(report.failed.len(), 1);
    assert!(
        s.notices.0.lock().unwrap().is_empty(),
        "no event for a release that failed"
    );
    let report = s.checker.check().await;
    assert_eq!(report.released.len(), 1);
    assert!(s.node.claims.lock().unwrap().is_empty());
}

#[tokio::test]
async fn a_node_without_claims_asks_nothing() {
    let s = setup(&[]);
    assert_eq!(s.checker.check().await, CheckReport::default());
    assert!(s.cluster.asked.lock().unwrap().is_empty());
}

#[tokio::test(start_paused = true)]
async fn the_check_runs_at_start_then_every_interval_until_stopped() {
    let s = setup(&[record("c1", "d1")]);
    s.cluster.add_claim("c1");
    s.cluster.add_domain("d1");
    let stop = CancellationToken::new();
    let interval = Duration::from_secs(300);
    let task = tokio::spawn(s.checker.clone().run(interval, stop.clone()));
    let asked = |s: &Setup| s.cluster.asked.lock().unwrap().len();
    // Every fake answers at once: yielding lets the task run to its sleep.
    for _ in 0..10 {
        tokio::task::yield_now().await;
    }
    assert_eq!(asked(&s), 2, "checked at start");
    tokio::time::sleep(interval - Duration::from_secs(1)).await;
    assert_eq!(asked(&s), 2, "not before the interval");
    // The claim is deleted meanwhile: the next check releases it.
    s.cluster.claims.lock().unwrap().clear();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_eq!(asked(&s), 4);
    assert!(s.node.claims.lock().unwrap().is_empty());
    assert_eq!(s.notices.0.lock().unwrap().len(), 1);
    stop.cancel();
    task.await.unwrap();
}

/// The hostage: a node restarted with a checkpointed claim of a domain that is gone
/// refuses the next domain's claim until the check releases the leftover through the
/// real unprepare path (node actor, checkpoint, domain, CDI spec).
#[test]
fn a_released_claim_frees_the_node_for_another_domain() {
    run_paused_actix(|| async {
        let tmp = tempfile::tempdir().unwrap();
        let cdi = CdiWriter::new(tmp.path(), DRIVER).unwrap();
        let old = ClaimUid::new("old-claim").unwrap();
        cdi.write_claim(&old, 511, &ClaimChannels::Single(0))
            .unwrap();
        let mut leftover = Checkpoint::default();
        leftover
            .claims
            .insert("old-claim".into(), record("old-claim", "old-cd"));
        let checkpoint = FakeCheckpointStore::holding(leftover);

        let claims = FakeClaimSource::default();
        claims.insert("new-claim", Ok(info("new-cd")));
        let (net, fabric) = (FakeGossipNet::default(), FakeImexFabric::default());
        let node = "node-1";
        let ports = Ports {
            gossip: Arc::new(net.join(node, 1)),
            imex: Arc::new(fabric.daemon(node)),
            status: Arc::new(FakeStatusSink::default().for_node(node)),
            events: Arc::new(FakeEventSink::default()),
            claims: Arc::new(claims),
            checkpoint: Arc::new(checkpoint.clone()),
            clock: Arc::new(FakeClock::new(1_700_000_000_000)),
            health: domaind_actors::HealthBoard::default(),
        };
        let config = NodeConfig::new(
            node,
            IpAddr::from([127, 0, 104, 1]),
            CliqueId("cluster-1.0".into()),
        );
        let actor = NodeActor::new(config, ports).start();
        let plugin = Arc::new(PrepareService::new(
            actor.clone(),
            node,
            cdi.clone(),
            ChannelInjection {
                major: 511,
                nodes: None,
                all_channels: 4,
            },
        ));
        let refused = plugin.prepare(claim("new-claim")).await.unwrap_err();
        assert!(
            refused.message.contains("already serves ComputeDomain"),
            "{}",
            refused.message
        );

        let cluster = Arc::new(FakeCluster::default());
        cluster.add_claim("new-claim");
        cluster.add_domain("new-cd");
        let notices = Arc::new(FakeNotices::default());
        let checker = StaleClaimChecker::new(
            cluster,
            Arc::new(NodeClaims::new(actor.clone(), plugin.clone())),
            notices.clone(),
        );
        let report = checker.check().await;
        assert_eq!(report.released.len(), 1, "{report:?}");
        assert_eq!(report.released[0].reason, StaleReason::ClaimDeleted);
        assert!(
            !cdi.list_claims().unwrap().contains(&old),
            "CDI spec removed"
        );
        assert!(
            !checkpoint.saved().unwrap().claims.contains_key("old-claim"),
            "checkpoint entry removed"
        );
        let snapshot = actor.send(GetSnapshot).await.unwrap();
        assert!(snapshot.domains.is_empty(), "the old domain was left");

        let prepared = plugin.prepare(claim("new-claim")).await;
        assert!(prepared.is_ok(), "{prepared:?}");
        let snapshot = actor.send(GetSnapshot).await.unwrap();
        assert_eq!(snapshot.claims, ["new-claim"]);
    });
}
