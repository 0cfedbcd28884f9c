//! Leader election over a `coordination.k8s.io/v1` Lease, so that two controller
//! replicas are safe: only the leader reconciles, and it stops when it can no longer
//! renew. The rules are in `rules` (pure, tested in paused time); this is the loop that
//! reads and writes the Lease.
//!
//! No crate was taken for this: the maintained one for kube 5 judges expiry by
//! comparing the Lease's `renewTime` with the local wall clock (so clock skew between
//! machines matters), cannot be driven in paused time, and brings a second `rand`.

mod rules;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use kube::api::PostParams;
use kube::{Api, ResourceExt as _};
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

pub use rules::{Decision, LeaseView, Observation, Timing, decide, leader_until, observe};

use super::metrics;

/// Which Lease, and who we are.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LeaseSettings {
    pub name: String,
    pub namespace: String,
    /// Unique among the candidates: the pod name.
    pub identity: String,
    pub timing: Timing,
}

/// Whether this replica may act, and until when. Cheap to clone; every clone sees the
/// same election.
#[derive(Debug, Clone)]
pub struct Leadership {
    until: watch::Receiver<Option<Instant>>,
    // Keeps an unconditional leadership's channel open.
    _sender: Option<Arc<watch::Sender<Option<Instant>>>>,
}

impl Leadership {
    /// Leader for good: a single replica run with `--leader-elect=false`.
    pub fn unconditional() -> Self {
        // Thirty years is "for good" for a process.
        let forever = Instant::now() + Duration::from_secs(30 * 365 * 24 * 3600);
        let (sender, until) = watch::channel(Some(forever));
        Self {
            until,
            _sender: Some(Arc::new(sender)),
        }
    }

    pub fn is_leader(&self) -> bool {
        self.until
            .borrow()
            .is_some_and(|until| Instant::now() < until)
    }

    /// Returns once this replica leads.
    pub async fn acquired(&mut self) {
        loop {
            if self
                .until
                .borrow_and_update()
                .is_some_and(|until| Instant::now() < until)
            {
                return;
            }
            if self.until.changed().await.is_err() {
                // The elector is gone: this replica never leads again.
                std::future::pending::<()>().await;
            }
        }
    }

    /// Returns once this replica no longer leads: when it is told so, or when its last
    /// renewal's deadline passes without news (a stuck elector cannot extend it).
    pub async fn lost(&mut self) {
        loop {
            let until = *self.until.borrow_and_update();
            let Some(until) = until.filter(|until| Instant::now() < *until) else {
                return;
            };
            tokio::select! {
                _ = tokio::time::sleep_until(until) => {}
                changed = self.until.changed() => {
                    if changed.is_err() {
                        return;
                    }
                }
            }
        }
    }
}

/// Signs of life of the elector: `/healthz` asks whether its loop still turns, and
/// `/readyz` whether the API server has answered it once.
#[derive(Debug)]
pub struct Heartbeat {
    base: Instant,
    last_round_ms: AtomicU64,
    answered: AtomicBool,
}

impl Default for Heartbeat {
    fn default() -> Self {
        Self {
            base: Instant::now(),
            last_round_ms: AtomicU64::new(0),
            answered: AtomicBool::new(false),
        }
    }
}

impl Heartbeat {
    /// A round ended, whatever its outcome.
    pub fn beat(&self) {
        let ms = Instant::now().duration_since(self.base).as_millis();
        self.last_round_ms
            .store(u64::try_from(ms).unwrap_or(u64::MAX), Ordering::Release);
    }

    /// The API server answered.
    pub fn answered(&self) {
        self.answered.store(true, Ordering::Release);
    }

    pub fn ever_answered(&self) -> bool {
        self.answered.load(Ordering::Acquire)
    }

    /// How long since the last round ended (since start, if none has).
    pub fn since_last_round(&self) -> Duration {
        let last = Duration::from_millis(self.last_round_ms.load(Ordering::Acquire));
        Instant::now()
            .duration_since(self.base)
            .saturating_sub(last)
    }
}

/// One candidate: reads the Lease, decides, writes, tells `Leadership`.
pub struct Elector {
    api: Api<Lease>,
    settings: LeaseSettings,
    observed: Option<Observation>,
    /// The Lease as last read or written, to write the next version from.
    lease: Option<Lease>,
    leading_until: Option<Instant>,
    sender: watch::Sender<Option<Instant>>,
    heartbeat: Arc<Heartbeat>,
}

impl std::fmt::Debug for Elector {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Elector")
            .field("settings", &self.settings)
            .field("observed", &self.observed)
            .field("leading_until", &self.leading_until)
            .finish_non_exhaustive()
    }
}

impl Elector {
    pub fn new(
        api: Api<Lease>,
        settings: LeaseSettings,
        heartbeat: Arc<Heartbeat>,
    ) -> (Self, Leadership) {
        let (sender, until) = watch::channel(None);
        let elector = Self {
            api,
            settings,
            observed: None,
            lease: None,
            leading_until: None,
            sender,
            heartbeat,
        };
        (
            elector,
            Leadership {
                until,
                _sender: None,
            },
        )
    }

    /// Rounds every retry period until `stop`; then returns itself, still holding the
    /// Lease if it led, so that the caller can stop its work before `release`.
    pub async fn run(mut self, stop: CancellationToken) -> Self {
        loop {
            self.round().await;
            self.heartbeat.beat();
            tokio::select! {
                _ = tokio::time::sleep(self.settings.timing.retry_period) => {}
                _ = stop.cancelled() => return self,
            }
        }
    }

    /// One round: read the Lease, decide, write if the rules say so.
    pub async fn round(&mut self) {
        let timing = self.settings.timing;
        let now = Instant::now();
        let read =
            tokio::time::timeout(timing.retry_period, self.api.get_opt(&self.settings.name)).await;
        let lease = match read {
            Ok(Ok(lease)) => lease,
            Ok(Err(error)) => return self.failed("read", error.to_string()),
            Err(_) => return self.failed("read", "timed out".into()),
        };
        self.heartbeat.answered();
        self.observed = lease
            .as_ref()
            .map(|lease| observe(self.observed.take(), self.view(lease), now));
        self.lease = lease;
        let decision = decide(&self.settings.identity, self.observed.as_ref(), now);
        let sent = Instant::now();
        let write = match &decision {
            Decision::Follow { holder, expires } => {
                debug!(holder = %holder, expires_in = ?expires.saturating_duration_since(now), "following");
                if self.leading_until.take().is_some() {
                    warn!(holder = %holder, "another replica holds the lease: no longer leading");
                }
                return self.publish();
            }
            Decision::Create => {
                let lease = self.lease_object(None, 0, true);
                tokio::time::timeout(
                    timing.retry_period,
                    self.api.create(&PostParams::default(), &lease),
                )
                .await
            }
            Decision::Renew | Decision::Acquire { .. } => {
                let previous = self.lease.clone().unwrap_or_default();
                let lease = match decision {
                    Decision::Acquire { transitions } => {
                        self.lease_object(Some(&previous), transitions, true)
                    }
                    _ => self.lease_object(
                        Some(&previous),
                        previous
                            .spec
                            .as_ref()
                            .and_then(|s| s.lease_transitions)
                            .unwrap_or(0),
                        false,
                    ),
                };
                tokio::time::timeout(
                    timing.retry_period,
                    self.api
                        .replace(&self.settings.name, &PostParams::default(), &lease),
                )
                .await
            }
        };
        match write {
            Ok(Ok(written)) => {
                let was_leading = self.is_leading();
                self.observed = Some(observe(None, self.view(&written), Instant::now()));
                self.lease = Some(written);
                self.leading_until = Some(leader_until(sent, timing.renew_deadline));
                if !was_leading {
                    ::metrics::counter!(metrics::LEADERSHIP_ACQUIRED).increment(1);
                    info!(lease = %self.settings.name, identity = %self.settings.identity, "leading");
                }
            }
            // Someone else wrote first: read again next round.
            Ok(Err(kube::Error::Api(status))) if status.code == 409 => {
                debug!("lost a race for the lease");
                self.observed = None;
            }
            Ok(Err(error)) => self.failed("write", error.to_string()),
            Err(_) => self.failed("write", "timed out".into()),
        }
        self.publish();
    }

    /// Gives the Lease up, if held, so that another replica takes over at once instead
    /// of after a lease duration. Call it once this replica has stopped acting.
    pub async fn release(mut self) {
        let leading = self.is_leading();
        self.leading_until = None;
        self.publish();
        let Some(mut lease) = self.lease.take().filter(|_| leading) else {
            return;
        };
        if let Some(spec) = lease.spec.as_mut() {
            spec.holder_identity = None;
        }
        let timing = self.settings.timing;
        match tokio::time::timeout(
            timing.retry_period,
            self.api
                .replace(&self.settings.name, &PostParams::default(), &lease),
        )
        .await
        {
            Ok(Ok(_)) => info!(lease = %self.settings.name, "lease released"),
            Ok(Err(error)) => warn!(%error, "cannot release the lease; it expires by itself"),
            Err(_) => warn!("releasing the lease timed out; it expires by itself"),
        }
    }

    fn is_leading(&self) -> bool {
        self.leading_until
            .is_some_and(|until| Instant::now() < until)
    }

    fn failed(&mut self, what: &'static str, error: String) {
        ::metrics::counter!(metrics::LEASE_ERRORS, "op" => what).increment(1);
        warn!(lease = %self.settings.name, op = what, %error, "lease request failed");
        self.publish();
    }

    fn publish(&mut self) {
        if !self.is_leading() {
            self.leading_until = None;
        }
        let until = self.leading_until;
        self.sender.send_if_modified(|current| {
            let changed = *current != until;
            *current = until;
            changed
        });
    }

    fn view(&self, lease: &Lease) -> LeaseView {
        let spec = lease.spec.as_ref();
        LeaseView {
            holder: spec
                .and_then(|s| s.holder_identity.clone())
                .filter(|holder| !holder.is_empty()),
            duration: spec
                .and_then(|s| s.lease_duration_seconds)
                .and_then(|seconds| u64::try_from(seconds).ok())
                .filter(|seconds| *seconds > 0)
                .map(Duration::from_secs)
                .unwrap_or(self.settings.timing.duration),
            transitions: spec.and_then(|s| s.lease_transitions).unwrap_or(0),
            version: lease.resource_version().unwrap_or_default(),
        }
    }

    /// The Lease held by us: a new `renewTime`, and on acquisition a new `acquireTime`.
    /// Built on `previous` so that its version makes the write conditional.
    fn lease_object(&self, previous: Option<&Lease>, transitions: i32, acquire: bool) -> Lease {
        let now = MicroTime(Timestamp::now());
        let previous_spec = previous.and_then(|p| p.spec.clone()).unwrap_or_default();
        let seconds = i32::try_from(self.settings.timing.duration.as_secs()).unwrap_or(i32::MAX);
        Lease {
            metadata: ObjectMeta {
                name: Some(self.settings.name.clone()),
                namespace: Some(self.settings.namespace.clone()),
                ..previous.map(|p| p.metadata.clone()).unwrap_or_default()
            },
            spec: Some(LeaseSpec {
                holder_identity: Some(self.settings.identity.clone()),
                lease_duration_seconds: Some(seconds),
                acquire_time: if acquire {
                    Some(now.clone())
                } else {
                    previous_spec.acquire_time.clone()
                },
                renew_time: Some(now),
                lease_transitions: Some(transitions),
                ..previous_spec
            }),
        }
    }
}

#[cfg(test)]
mod tests;
