//! Keeps the claims prepared on this node saying how their devices are: follows the
//! node's [`HealthBoard`](domaind_actors::HealthBoard) and writes what [`Book`] decides,
//! one claim at a time, through a [`ClaimStatusApi`]: a change a settle ([`SETTLE`])
//! after it, one only in the details (peer counts, message) at most once a [`DETAILS_HOLD`].
//!
//! The Kubernetes adapter applies the `status` subresource (server-side apply, forced,
//! under a field manager of this driver's: only our driver's entries are ours; the
//! other drivers' and the scheduler's fields are someone else's). Since Kubernetes 1.36
//! the API server checks each driver's entries against the synthetic subresource
//! `resourceclaims/driver` (verb `associated-node:patch` for a ServiceAccount token bound
//! to the node the claim is allocated to): the chart grants exactly that.

use std::sync::Arc;
use std::time::Duration;

use ::kube::Client;
use ::kube::api::{Api, Patch, PatchParams};
use async_trait::async_trait;
use domaind_actors::HealthView;
use domaind_actors::model::ClaimRef;
use domaind_actors::ports::PortError;
use domaind_backoff::Backoff;
use domaind_kube_api::api::{ApiError, bounded};
use domaind_kube_api::names::claim_status_field_manager;
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::Value;
use time::OffsetDateTime;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::claim_status::{Book, Seen, Step, seen_in};

/// Claim status writes, by `outcome`: `ok`, `gone` (the claim was deleted or
/// recreated: not retried), `failed` (retried with backoff).
pub const CLAIM_STATUS_WRITES: &str = "domaind_claim_status_writes_total";

/// Failed reads and writes of claims' status, by `op` (`read`, `apply`) and `kind`
/// (`transient`, `conflict`, `permanent`).
pub const CLAIM_STATUS_FAILURES: &str = "domaind_claim_status_failures_total";

/// How long a claim waits after a change for more before it is written.
pub const SETTLE: Duration = Duration::from_millis(100);

/// How long after a claim's last write a change only in its details (the IMEX peer
/// counts, the condition's message) waits. They change one member and one link at a
/// time for seconds as a domain forms or a node comes back, and written at each step
/// they were about 9 writes a claim a formation, most of our API writes. The condition's
/// status and reason, written promptly, say whether the channel works and why; the
/// details are for a person reading the claim, who sees the final ones a few seconds
/// later, while one hold covers most of a climb.
pub const DETAILS_HOLD: Duration = Duration::from_secs(5);

/// Each claim's retries: as the slice publisher's.
pub fn backoff() -> Backoff {
    Backoff::new(Duration::from_millis(200), Duration::from_secs(30)).jittered()
}

/// Where claims are read and written. `Ok(None)`: the claim is gone (deleted, or
/// recreated under its name with another uid).
#[async_trait]
pub trait ClaimStatusApi: Send + Sync {
    async fn read(&self, claim: &ClaimRef) -> Result<Option<Seen>, PortError>;
    async fn apply(&self, claim: &ClaimRef, body: &Value) -> Result<Option<Seen>, PortError>;
}

/// [`ClaimStatusApi`] over the API server.
#[derive(Clone)]
pub struct KubeClaimStatus {
    client: Client,
    driver: String,
    timeout: Duration,
}

// The client has no Debug of its own.
impl std::fmt::Debug for KubeClaimStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeClaimStatus")
            .field("driver", &self.driver)
            .finish_non_exhaustive()
    }
}

impl KubeClaimStatus {
    pub fn new(client: Client, driver: impl Into<String>, timeout: Duration) -> Self {
        Self {
            client,
            driver: driver.into(),
            timeout,
        }
    }

    fn api(&self, claim: &ClaimRef) -> Api<ResourceClaim> {
        Api::namespaced(self.client.clone(), &claim.namespace)
    }

    /// Ours when it is the claim we prepared; None when another took its name.
    fn seen(&self, claim: &ClaimRef, found: &ResourceClaim) -> Option<Seen> {
        (found.metadata.uid.as_deref() == Some(claim.uid.as_str()))
            .then(|| seen_in(found, &self.driver))
    }
}

/// A claim deleted (404), or recreated under its name: the body's uid then no longer
/// matches, which the API server refuses as an update of an immutable field (422).
fn gone(error: &ApiError) -> bool {
    match error {
        ApiError::Status { code: 404, .. } => true,
        ApiError::Status {
            code: 422, message, ..
        } => message.contains("metadata.uid"),
        _ => false,
    }
}

#[async_trait]
impl ClaimStatusApi for KubeClaimStatus {
    async fn read(&self, claim: &ClaimRef) -> Result<Option<Seen>, PortError> {
        match bounded(
            format!("get ResourceClaim {}/{}", claim.namespace, claim.name),
            self.timeout,
            self.api(claim).get(&claim.name),
        )
        .await
        {
            Ok(found) => Ok(self.seen(claim, &found)),
            Err(error) if error.is_not_found() => Ok(None),
            Err(error) => Err(super::port_error(error)),
        }
    }

    async fn apply(&self, claim: &ClaimRef, body: &Value) -> Result<Option<Seen>, PortError> {
        let manager = claim_status_field_manager(&self.driver);
        match bounded(
            format!(
                "apply the device status of ResourceClaim {}/{}",
                claim.namespace, claim.name
            ),
            self.timeout,
            self.api(claim).patch_status(
                &claim.name,
                &PatchParams::apply(&manager).force(),
                &Patch::Apply(body),
            ),
        )
        .await
        {
            Ok(written) => Ok(self.seen(claim, &written)),
            Err(error) if gone(&error) => Ok(None),
            Err(error) => Err(super::port_error(error)),
        }
    }
}

/// Writes what `views` say into the claims, until `stop` or until the board is gone.
pub async fn run(
    api: Arc<dyn ClaimStatusApi>,
    mut book: Book,
    mut views: watch::Receiver<Arc<HealthView>>,
    stop: CancellationToken,
) {
    let first = views.borrow_and_update().clone();
    book.observe(&first, Instant::now());
    loop {
        let next = book.next_due();
        tokio::select! {
            () = stop.cancelled() => return,
            changed = views.changed() => {
                if changed.is_err() {
                    return;
                }
                let view = views.borrow_and_update().clone();
                book.observe(&view, Instant::now());
            }
            () = sleep_until(next) => {
                tokio::select! {
                    () = stop.cancelled() => return,
                    () = write_due(api.as_ref(), &mut book) => {}
                }
            }
        }
    }
}

async fn sleep_until(due: Option<Instant>) {
    match due {
        Some(due) => tokio::time::sleep_until(due).await,
        None => std::future::pending().await,
    }
}

/// Reads (once, before a claim's first write) and writes every claim that is due.
async fn write_due(api: &dyn ClaimStatusApi, book: &mut Book) {
    for uid in book.due(Instant::now()) {
        if let Step::Read(claim) = book.step(&uid, OffsetDateTime::now_utc()) {
            let answer = api.read(&claim).await;
            if let Some(error) = record(book, &uid, &claim, Op::Read, answer) {
                warn!(namespace = %claim.namespace, claim = %claim.name, failures = book.failures(&uid), %error, "cannot read the claim to write its device status; retrying");
                continue;
            }
        }
        if let Step::Apply(claim, body) = book.step(&uid, OffsetDateTime::now_utc()) {
            let answer = api.apply(&claim, &body).await;
            if let Some(error) = record(book, &uid, &claim, Op::Apply, answer) {
                warn!(namespace = %claim.namespace, claim = %claim.name, failures = book.failures(&uid), %error, "device status not written; retrying");
            }
        }
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Op {
    Read,
    Apply,
}

impl Op {
    fn as_str(self) -> &'static str {
        match self {
            Op::Read => "read",
            Op::Apply => "apply",
        }
    }
}

/// Records `answer` in the book, counts it, and returns the failure to log.
fn record(
    book: &mut Book,
    uid: &str,
    claim: &ClaimRef,
    op: Op,
    answer: Result<Option<Seen>, PortError>,
) -> Option<PortError> {
    let now = Instant::now();
    let note = |book: &mut Book, answer| match op {
        Op::Read => book.read(uid, answer, now),
        Op::Apply => book.written(uid, answer, now),
    };
    match answer {
        Ok(Some(seen)) => {
            if op == Op::Apply {
                count_write("ok");
                debug!(namespace = %claim.namespace, claim = %claim.name, "device status written");
            }
            note(book, Ok(Some(seen)));
            None
        }
        Ok(None) => {
            count_write("gone");
            info!(namespace = %claim.namespace, claim = %claim.name, uid = %claim.uid, "claim deleted or recreated; its device status is not written");
            note(book, Ok(None));
            None
        }
        Err(error) => {
            if op == Op::Apply {
                count_write("failed");
            }
            metrics::counter!(CLAIM_STATUS_FAILURES, "op" => op.as_str(), "kind" => error.kind().to_string())
                .increment(1);
            note(book, Err(error.kind()));
            Some(error)
        }
    }
}

fn count_write(outcome: &'static str) {
    metrics::counter!(CLAIM_STATUS_WRITES, "outcome" => outcome).increment(1);
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;
    use std::sync::Mutex;

    use domaind_actors::HealthBoard;
    use domaind_actors::PreparedDevice;
    use domaind_actors::model::{AllocatedDevice, CliqueId, DomainRef, DomainUid};
    use domaind_actors::ports::ErrorKind;
    use domaind_actors::rules::channel_health::{ChannelHealth, DomainHealth, HealthReason};
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use serde_json::json;

    use super::*;

    const DRIVER: &str = "compute-domain.nvidia.com";

    /// A fake API server's claims, honouring the contract the writer relies on: a read
    /// or write of a claim it does not hold (or holds under another uid) is `None`;
    /// an apply replaces our driver's entries with the body's and answers the claim.
    /// Told to, it fails the next calls with the given kinds.
    #[derive(Default)]
    struct FakeClaims {
        claims: Mutex<BTreeMap<String, Value>>,
        /// The next calls' answers: a failure of this kind, or None for a normal one.
        failures: Mutex<Vec<Option<ErrorKind>>>,
        calls: Mutex<Vec<(Instant, &'static str, String)>>,
    }

    impl FakeClaims {
        fn with_claims(uids: &[&str]) -> Arc<Self> {
            let fake = Self::default();
            for uid in uids {
                fake.claims.lock().unwrap().insert(
                    (*uid).to_owned(),
                    json!({
                        "apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaim",
                        "metadata": {"name": format!("{uid}-name"), "namespace": "team-a",
                                     "uid": uid, "generation": 1},
                        "spec": {}, "status": {},
                    }),
                );
            }
            Arc::new(fake)
        }

        fn fail_next(&self, kinds: &[Option<ErrorKind>]) {
            self.failures.lock().unwrap().extend(kinds);
        }

        fn calls(&self) -> Vec<(Instant, &'static str, String)> {
            self.calls.lock().unwrap().clone()
        }

        fn ops(&self) -> Vec<(&'static str, String)> {
            self.calls()
                .into_iter()
                .map(|(_, op, uid)| (op, uid))
                .collect()
        }

        fn held(&self, uid: &str) -> Value {
            self.claims.lock().unwrap()[uid].clone()
        }

        fn call(&self, op: &'static str, claim: &ClaimRef) -> Result<(), PortError> {
            self.calls
                .lock()
                .unwrap()
                .push((Instant::now(), op, claim.uid.clone()));
            let mut failures = self.failures.lock().unwrap();
            match (!failures.is_empty()).then(|| failures.remove(0)).flatten() {
                None => Ok(()),
                Some(kind) => Err(PortError::new(kind, "told to fail")),
            }
        }

        fn seen(&self, claim: &ClaimRef) -> Option<Seen> {
            let claims = self.claims.lock().unwrap();
            let held = claims.get(&claim.uid)?;
            Some(seen_in(
                &serde_json::from_value(held.clone()).unwrap(),
                DRIVER,
            ))
        }
    }

    #[async_trait]
    impl ClaimStatusApi for FakeClaims {
        async fn read(&self, claim: &ClaimRef) -> Result<Option<Seen>, PortError> {
            self.call("read", claim)?;
            Ok(self.seen(claim))
        }

        async fn apply(&self, claim: &ClaimRef, body: &Value) -> Result<Option<Seen>, PortError> {
            self.call("apply", claim)?;
            assert_eq!(body["metadata"]["uid"], claim.uid.as_str());
            {
                let mut claims = self.claims.lock().unwrap();
                let Some(held) = claims.get_mut(&claim.uid) else {
                    return Ok(None);
                };
                let mut devices: Vec<Value> = held["status"]["devices"]
                    .as_array()
                    .cloned()
                    .unwrap_or_default()
                    .into_iter()
                    .filter(|d| d["driver"] != DRIVER)
                    .collect();
                devices.extend(body["status"]["devices"].as_array().unwrap().clone());
                held["status"]["devices"] = Value::Array(devices);
            }
            Ok(self.seen(claim))
        }
    }

    fn healthy(linked: usize) -> DomainHealth {
        DomainHealth {
            health: ChannelHealth::Healthy,
            reason: HealthReason::ImexReady,
            clique: CliqueId("c.1".into()),
            index: Some(1),
            channel: None,
            linked_peers: linked,
            peers: 3,
            imex_failing: None,
        }
    }

    fn view(claims: &[&str], status: Option<DomainHealth>) -> HealthView {
        HealthView {
            devices: claims
                .iter()
                .map(|uid| PreparedDevice {
                    claim: ClaimRef {
                        uid: (*uid).to_owned(),
                        namespace: "team-a".into(),
                        name: format!("{uid}-name"),
                    },
                    device: AllocatedDevice {
                        request: "channel".into(),
                        pool: "node-1".into(),
                        device: "channel-0".into(),
                    },
                    domain: DomainRef {
                        uid: DomainUid("cd-uid".into()),
                        namespace: "team-a".into(),
                        name: "training".into(),
                        num_nodes: 0,
                    },
                    status: status.clone(),
                })
                .collect(),
            imex_failing: None,
        }
    }

    struct Running {
        board: HealthBoard,
        stop: CancellationToken,
        task: tokio::task::JoinHandle<()>,
    }

    fn start(api: Arc<FakeClaims>) -> Running {
        let board = HealthBoard::default();
        let stop = CancellationToken::new();
        let book = Book::new(
            DRIVER,
            SETTLE,
            DETAILS_HOLD,
            Backoff::new(Duration::from_millis(200), Duration::from_secs(30)),
        );
        let task = tokio::spawn(run(api, book, board.subscribe(), stop.clone()));
        Running { board, stop, task }
    }

    async fn until_idle(api: &FakeClaims, calls: usize) {
        while api.calls().len() < calls {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        // Long past every settle and backoff that could still be due.
        tokio::time::sleep(Duration::from_secs(60)).await;
    }

    fn ready_of(held: &Value) -> Value {
        held["status"]["devices"][0]["conditions"][0].clone()
    }

    #[tokio::test(start_paused = true)]
    async fn a_burst_of_views_is_one_read_and_one_write_per_claim() {
        let api = FakeClaims::with_claims(&["a", "b"]);
        let running = start(api.clone());
        let t0 = Instant::now();
        running.board.publish(view(&["a", "b"], None));
        for linked in 0..=3 {
            tokio::time::sleep(Duration::from_millis(20)).await;
            running
                .board
                .publish(view(&["a", "b"], Some(healthy(linked))));
        }
        until_idle(&api, 4).await;
        let calls = api.calls();
        assert_eq!(
            api.ops(),
            vec![
                ("read", "a".to_owned()),
                ("apply", "a".to_owned()),
                ("read", "b".to_owned()),
                ("apply", "b".to_owned())
            ]
        );
        assert_eq!(calls[0].0, t0 + SETTLE, "a settle after the first view");
        let held = api.held("a");
        assert_eq!(ready_of(&held)["status"], "True");
        assert_eq!(
            held["status"]["devices"][0]["data"]["imexPeers"]["linked"],
            3
        );

        // Another change: one write more, no read.
        running.board.publish(view(&["a", "b"], Some(healthy(2))));
        until_idle(&api, 6).await;
        assert_eq!(
            &api.ops()[4..],
            &[("apply", "a".to_owned()), ("apply", "b".to_owned())]
        );
        running.stop.cancel();
        running.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_formation_is_three_writes_per_claim_the_last_with_the_final_count() {
        let api = FakeClaims::with_claims(&["a", "b"]);
        let running = start(api.clone());
        let formed = |linked| DomainHealth {
            peers: 17,
            ..healthy(linked)
        };
        let t0 = Instant::now();
        running.board.publish(view(&["a", "b"], None));
        tokio::time::sleep(Duration::from_millis(200)).await;
        let judged = Instant::now();
        running.board.publish(view(&["a", "b"], Some(formed(1))));
        for linked in 2..=17 {
            tokio::time::sleep(Duration::from_millis(187)).await;
            running
                .board
                .publish(view(&["a", "b"], Some(formed(linked))));
        }
        until_idle(&api, 8).await;
        let applies: Vec<(Instant, String)> = api
            .calls()
            .into_iter()
            .filter(|(_, op, _)| *op == "apply")
            .map(|(at, _, uid)| (at, uid))
            .collect();
        let held_until = judged + SETTLE + DETAILS_HOLD;
        assert_eq!(
            applies,
            [
                (t0 + SETTLE, "a".to_owned()),
                (t0 + SETTLE, "b".to_owned()),
                (judged + SETTLE, "a".to_owned()),
                (judged + SETTLE, "b".to_owned()),
                (held_until, "a".to_owned()),
                (held_until, "b".to_owned()),
            ]
        );
        for uid in ["a", "b"] {
            let held = api.held(uid);
            assert_eq!(
                held["status"]["devices"][0]["data"]["imexPeers"],
                json!({"linked": 17, "total": 17})
            );
            assert_eq!(
                ready_of(&held)["message"],
                "IMEX ready on this node, 17 of 17 IMEX peers linked"
            );
        }
        running.stop.cancel();
        running.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn failures_are_retried_with_backoff_and_the_latest_view_is_written() {
        let recorder = DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let _local = metrics::set_default_local_recorder(&recorder);
        let api = FakeClaims::with_claims(&["a"]);
        api.fail_next(&[
            Some(ErrorKind::Transient),
            Some(ErrorKind::Transient),
            None,
            Some(ErrorKind::Permanent),
        ]);
        let running = start(api.clone());
        running.board.publish(view(&["a"], Some(healthy(3))));
        // Read fails, read fails, apply fails (permanent), apply.
        tokio::time::sleep(Duration::from_secs(1)).await;
        running.board.publish(view(&["a"], Some(healthy(1))));
        until_idle(&api, 5).await;
        let calls = api.calls();
        let ops: Vec<&str> = calls.iter().map(|(_, op, _)| *op).collect();
        assert_eq!(ops, ["read", "read", "read", "apply", "apply"]);
        let gaps: Vec<Duration> = calls.windows(2).map(|w| w[1].0 - w[0].0).collect();
        assert_eq!(
            gaps,
            [
                Duration::from_millis(200),
                Duration::from_millis(400),
                Duration::ZERO,
                Duration::from_secs(30)
            ]
        );
        assert_eq!(
            api.held("a")["status"]["devices"][0]["data"]["imexPeers"]["linked"],
            1,
            "the view of the retry's time"
        );
        // One snapshot: taking one drains the counters.
        let snapshot = snapshotter.snapshot().into_vec();
        let counted = |name: &str, labels: &[(&str, &str)]| -> u64 {
            snapshot
                .iter()
                .filter(|(key, ..)| key.key().name() == name)
                .filter(|(key, ..)| {
                    labels
                        .iter()
                        .all(|(k, v)| key.key().labels().any(|l| l.key() == *k && l.value() == *v))
                })
                .map(|(.., value)| match value {
                    DebugValue::Counter(n) => *n,
                    _ => 0,
                })
                .sum()
        };
        assert_eq!(counted(CLAIM_STATUS_WRITES, &[("outcome", "ok")]), 1);
        assert_eq!(counted(CLAIM_STATUS_WRITES, &[("outcome", "failed")]), 1);
        assert_eq!(
            counted(
                CLAIM_STATUS_FAILURES,
                &[("op", "read"), ("kind", "transient")]
            ),
            2
        );
        assert_eq!(
            counted(
                CLAIM_STATUS_FAILURES,
                &[("op", "apply"), ("kind", "permanent")]
            ),
            1
        );
        running.stop.cancel();
        running.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_claim_gone_is_not_asked_about_again_and_one_unprepared_is_dropped() {
        let api = FakeClaims::with_claims(&["b"]);
        api.fail_next(&[Some(ErrorKind::Transient)]);
        let running = start(api.clone());
        running.board.publish(view(&["a", "b"], Some(healthy(3))));
        until_idle(&api, 4).await;
        // a: its read fails; b is read and written; a's retry finds it gone.
        let ops = |from: usize| -> Vec<String> {
            api.ops()[from..]
                .iter()
                .map(|(op, uid)| format!("{op} {uid}"))
                .collect()
        };
        assert_eq!(ops(0), ["read a", "read b", "apply b", "read a"]);
        running.board.publish(view(&["a", "b"], Some(healthy(1))));
        until_idle(&api, 5).await;
        assert_eq!(ops(4), ["apply b"], "not a again");

        // b unprepared while its retry waits: never written again.
        api.fail_next(&[Some(ErrorKind::Transient)]);
        running.board.publish(view(&["a", "b"], Some(healthy(2))));
        while api.calls().len() < 6 {
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        running.board.publish(view(&["a"], Some(healthy(2))));
        tokio::time::sleep(Duration::from_secs(120)).await;
        assert_eq!(ops(5), ["apply b"]);
        running.stop.cancel();
        running.task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_finds_its_entries_written_and_writes_nothing() {
        let api = FakeClaims::with_claims(&["a"]);
        let first = start(api.clone());
        first.board.publish(view(&["a"], Some(healthy(3))));
        until_idle(&api, 2).await;
        let written = api.held("a");
        first.stop.cancel();
        first.task.await.unwrap();

        let second = start(api.clone());
        second.board.publish(view(&["a"], Some(healthy(3))));
        until_idle(&api, 3).await;
        assert_eq!(api.ops().len(), 3, "{:?}", api.ops());
        assert_eq!(api.ops()[2].0, "read");
        assert_eq!(api.held("a"), written);

        // A change keeps the Ready condition's transition time the first run wrote.
        second.board.publish(view(&["a"], Some(healthy(1))));
        until_idle(&api, 4).await;
        assert_eq!(
            ready_of(&api.held("a"))["lastTransitionTime"],
            ready_of(&written)["lastTransitionTime"]
        );
        second.stop.cancel();
        second.task.await.unwrap();
    }
}
