//! The IMEX-failing taint on this node's channel devices: follows the node's
//! [`HealthBoard`](domaind_actors::HealthBoard), runs [the rule](super::taint_rule)
//! with its timers, hands the taint to the [publisher](super::publisher), and tells
//! people on the Node (events `ChannelsTainted`, `ChannelsUntainted`) and in metrics.
//!
//! What a running daemon can honestly say about itself, and so what taints: only its
//! IMEX failing (`HealthView::imex_failing`). Not its own shutdown: almost every stop is
//! a restart or an upgrade, which keeps the slices so that the node stays schedulable,
//! and a tainted pool would outlive a daemon stopped for good (the kubelet removes its
//! slices later). Not a checkpoint it cannot write: it serves prepares from memory and
//! writes them once it can (`StateNotPersisted`), so pods placed there run. Not a fatal
//! fault: the process exits, and the restarted one judges afresh.

use std::sync::Arc;
use std::time::Duration;

use ::kube::Client;
use ::kube::api::{Api, ListParams};
use ::kube::runtime::events::{Event, EventType as KubeEventType, Recorder, Reporter};
use async_trait::async_trait;
use domaind_actors::HealthView;
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use k8s_openapi::jiff::Timestamp;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::events::{EVENTS, NOTE_LIMIT, truncate};
use super::publisher::slice_selector;
use super::stale::node_reference;
use super::taint_rule::{
    TAINT_EFFECT, TaintChange, TaintRule, TaintTiming, short_cause, taint_key,
};
use crate::events::{EventText, EventType, NodeEventReason};
use domaind_kube_api::api::{ApiError, bounded};
use domaind_kube_api::names::NODE_REPORTING_CONTROLLER;

/// Taints put on and taken off this node's channel devices, by `change` (`applied`,
/// `removed`).
pub const IMEX_TAINTS: &str = "domaind_imex_taints_total";
/// 1 while this node's channel devices carry the IMEX-failing taint.
pub const IMEX_TAINTED: &str = "domaind_imex_tainted";

/// Where the taint's events go.
#[async_trait]
pub trait TaintNotices: Send + Sync {
    async fn notify(&self, event: EventText);
}

/// What the taint is about, for its events.
#[derive(Debug, Clone)]
pub struct TaintSubject {
    pub node: String,
    pub driver: String,
    /// Channel devices tainted (all of the node's).
    pub channels: u32,
}

/// Follows the node's health and keeps the taint the publisher writes.
pub struct ImexTaints {
    subject: TaintSubject,
    timing: TaintTiming,
    health: watch::Receiver<Arc<HealthView>>,
    taint: watch::Sender<Option<DeviceTaint>>,
    notices: Arc<dyn TaintNotices>,
    rule: TaintRule,
}

impl std::fmt::Debug for ImexTaints {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImexTaints")
            .field("subject", &self.subject)
            .field("rule", &self.rule)
            .finish_non_exhaustive()
    }
}

impl ImexTaints {
    /// Starts from `inherited`, the taint a process before this one left on the
    /// slices (kept until the daemon has been healthy long enough). The receiver is
    /// the publisher's input.
    pub fn new(
        subject: TaintSubject,
        timing: TaintTiming,
        health: watch::Receiver<Arc<HealthView>>,
        inherited: Option<DeviceTaint>,
        notices: Arc<dyn TaintNotices>,
    ) -> (Self, watch::Receiver<Option<DeviceTaint>>) {
        let rule = match &inherited {
            Some(taint) => {
                info!(
                    key = %taint.key,
                    value = ?taint.value,
                    "this node's channel devices are tainted from before the restart; kept \
                     until its IMEX has been healthy for {:?}",
                    timing.clear_after
                );
                metrics::gauge!(IMEX_TAINTED).set(1.0);
                TaintRule::inherited(
                    timing,
                    taint.value.clone().unwrap_or_default(),
                    Instant::now(),
                )
            }
            None => {
                metrics::gauge!(IMEX_TAINTED).set(0.0);
                TaintRule::new(timing)
            }
        };
        let (taint, receiver) = watch::channel(inherited);
        (
            Self {
                subject,
                timing,
                health,
                taint,
                notices,
                rule,
            },
            receiver,
        )
    }

    /// Runs until `stop`. A board that goes away leaves the taint as it is.
    pub async fn run(mut self, stop: CancellationToken) {
        let mut open = true;
        loop {
            let failing = self.health.borrow_and_update().imex_failing.clone();
            if let Some(change) = self.rule.observe(failing.as_deref(), Instant::now()) {
                self.apply(change);
            }
            let deadline = self.rule.deadline();
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                changed = self.health.changed(), if open => open = changed.is_ok(),
                () = tokio::time::sleep_until(deadline.unwrap_or_else(Instant::now)), if deadline.is_some() => {}
            }
            if !open && deadline.is_none() {
                stop.cancelled().await;
                return;
            }
        }
    }

    fn apply(&mut self, change: TaintChange) {
        let key = taint_key(&self.subject.driver);
        let (event, change_label) = match change {
            TaintChange::Taint {
                reason,
                failing_for,
            } => {
                let value = short_cause(&reason);
                warn!(
                    key = %key,
                    value = %value,
                    reason = %reason,
                    "this node's IMEX keeps failing: its channel devices are tainted NoSchedule"
                );
                let event = tainted_event(
                    &self.subject,
                    &key,
                    &value,
                    &reason,
                    failing_for,
                    self.timing,
                );
                self.taint.send_replace(Some(DeviceTaint {
                    key,
                    value: Some(value),
                    effect: TAINT_EFFECT.into(),
                    time_added: Some(Time(Timestamp::now())),
                }));
                metrics::gauge!(IMEX_TAINTED).set(1.0);
                (event, "applied")
            }
            TaintChange::Untaint { tainted_for } => {
                info!(key = %key, "this node's IMEX is healthy again: the taint is removed");
                self.taint.send_replace(None);
                metrics::gauge!(IMEX_TAINTED).set(0.0);
                (
                    untainted_event(&self.subject, &key, tainted_for, self.timing),
                    "removed",
                )
            }
        };
        metrics::counter!(IMEX_TAINTS, "change" => change_label).increment(1);
        // The rule's timers do not wait on the API server.
        let notices = self.notices.clone();
        tokio::spawn(async move { notices.notify(event).await });
    }
}

fn tainted_event(
    subject: &TaintSubject,
    key: &str,
    value: &str,
    reason: &str,
    failing_for: Duration,
    timing: TaintTiming,
) -> EventText {
    let event = NodeEventReason::ChannelsTainted;
    EventText::new(
        event.status(),
        event.as_str(),
        format!(
            "the IMEX daemon of node {node} has been failing for {failing:.0?} ({reason}): its \
             {channels} channel devices are tainted {key}={value}:{TAINT_EFFECT}, so no new \
             claim is allocated here until it has been healthy for {clear:?}; running pods \
             keep theirs",
            node = subject.node,
            failing = failing_for,
            channels = subject.channels,
            clear = timing.clear_after,
        ),
    )
}

fn untainted_event(
    subject: &TaintSubject,
    key: &str,
    tainted_for: Duration,
    timing: TaintTiming,
) -> EventText {
    let event = NodeEventReason::ChannelsUntainted;
    EventText::new(
        event.status(),
        event.as_str(),
        format!(
            "the IMEX daemon of node {node} has been healthy for {clear:?}: the taint {key} \
             is removed from its channel devices (on for {on:.0?})",
            node = subject.node,
            clear = timing.clear_after,
            on = tainted_for,
        ),
    )
}

/// The IMEX-failing taint on `node`'s slices of `driver`, as a process before this one
/// left it; none when there is none or the API server does not answer (the taint then
/// goes with the first write, and comes back if IMEX is still failing).
pub async fn inherited_taint(
    client: Client,
    node: &str,
    driver: &str,
    timeout: Duration,
) -> Option<DeviceTaint> {
    let api = Api::<ResourceSlice>::all(client);
    let listed = bounded(
        format!("list ResourceSlices of {node}"),
        timeout,
        api.list(&ListParams::default().fields(&slice_selector(node, driver))),
    )
    .await;
    match listed {
        Ok(list) => our_taint(&list.items, driver),
        Err(error) => {
            warn!(%error, "cannot read this node's ResourceSlices: any IMEX-failing taint on them is not kept");
            None
        }
    }
}

fn our_taint(slices: &[ResourceSlice], driver: &str) -> Option<DeviceTaint> {
    let key = taint_key(driver);
    slices
        .iter()
        .filter(|slice| slice.spec.driver == driver)
        .flat_map(|slice| slice.spec.devices.iter().flatten())
        .flat_map(|device| device.taints.iter().flatten())
        .find(|taint| taint.key == key)
        .cloned()
}

/// [`TaintNotices`] as Events on this node's Node.
#[derive(Clone)]
pub struct KubeTaintNotices {
    client: Client,
    reporter: Reporter,
    node: String,
    timeout: Duration,
}

impl std::fmt::Debug for KubeTaintNotices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeTaintNotices")
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl KubeTaintNotices {
    pub fn new(client: Client, node: impl Into<String>, timeout: Duration) -> Self {
        let node = node.into();
        Self {
            client,
            reporter: Reporter {
                controller: NODE_REPORTING_CONTROLLER.into(),
                instance: Some(node.clone()),
            },
            node,
            timeout,
        }
    }
}

/// What Kubernetes is told.
pub fn taint_kube_event(text: EventText) -> Event {
    Event {
        type_: match text.type_ {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        },
        reason: text.reason,
        note: Some(truncate(text.message, NOTE_LIMIT)),
        action: "TaintChannels".into(),
        secondary: None,
    }
}

#[async_trait]
impl TaintNotices for KubeTaintNotices {
    async fn notify(&self, text: EventText) {
        let event = taint_kube_event(text);
        // A recorder of its own: a series would keep the first note, and each taint's
        // reason and times are its own.
        let recorder = Recorder::new(self.client.clone(), self.reporter.clone());
        let published: Result<(), ApiError> = bounded(
            format!("record event {} on Node {}", event.reason, self.node),
            self.timeout,
            recorder.publish(&event, &node_reference(&self.node)),
        )
        .await;
        let outcome = if published.is_ok() { "ok" } else { "failed" };
        metrics::counter!(EVENTS, "outcome" => outcome).increment(1);
        if let Err(error) = published {
            warn!(%error, reason = %event.reason, "event not recorded");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domaind_actors::HealthBoard;
    use std::sync::Mutex;

    #[derive(Default)]
    struct Recorded(Mutex<Vec<EventText>>);

    #[async_trait]
    impl TaintNotices for Recorded {
        async fn notify(&self, event: EventText) {
            self.0.lock().unwrap().push(event);
        }
    }

    impl Recorded {
        fn reasons(&self) -> Vec<String> {
            self.0
                .lock()
                .unwrap()
                .iter()
                .map(|e| e.reason.clone())
                .collect()
        }
    }

    fn subject() -> TaintSubject {
        TaintSubject {
            node: "node-1".into(),
            driver: "compute-domain.nvidia.com".into(),
            channels: 8,
        }
    }

    fn failing(reason: Option<&str>) -> HealthView {
        HealthView {
            imex_failing: reason.map(str::to_owned),
            ..HealthView::default()
        }
    }

    /// Lets the follower run and its timers fire up to `by` of paused time.
    async fn advance(by: Duration) {
        tokio::time::sleep(by).await;
        tokio::task::yield_now().await;
    }

    #[tokio::test(start_paused = true)]
    async fn a_failing_imex_taints_every_channel_after_five_seconds_and_untaints_after_thirty_healthy()
     {
        let board = HealthBoard::default();
        let notices = Arc::new(Recorded::default());
        let (taints, mut taint) = ImexTaints::new(
            subject(),
            TaintTiming::default(),
            board.subscribe(),
            None,
            notices.clone(),
        );
        let stop = CancellationToken::new();
        let task = tokio::spawn(taints.run(stop.clone()));

        board.publish(failing(Some("exited with status 1, after 0.2 s up")));
        advance(Duration::from_millis(4900)).await;
        assert_eq!(*taint.borrow_and_update(), None);
        advance(Duration::from_millis(200)).await;
        let put = taint.borrow_and_update().clone().expect("tainted at 5 s");
        assert_eq!(
            (put.key.as_str(), put.value.as_deref(), put.effect.as_str()),
            (
                "compute-domain.nvidia.com/imex-failing",
                Some("exited-with-status-1"),
                "NoSchedule"
            )
        );
        assert!(put.time_added.is_some());
        let events = notices.0.lock().unwrap().clone();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].type_, EventType::Warning);
        assert!(
            events[0]
                .message
                .contains("exited with status 1, after 0.2 s up")
                && events[0].message.contains("8 channel devices")
                && events[0]
                    .message
                    .contains("=exited-with-status-1:NoSchedule"),
            "{}",
            events[0].message
        );

        // Healthy, failing again for a moment, healthy: the taint stays 30 s from the last.
        board.publish(failing(None));
        advance(Duration::from_secs(20)).await;
        board.publish(failing(Some("exited")));
        advance(Duration::from_secs(1)).await;
        board.publish(failing(None));
        advance(Duration::from_secs(29)).await;
        assert!(taint.borrow_and_update().is_some());
        advance(Duration::from_millis(1100)).await;
        assert_eq!(*taint.borrow_and_update(), None);
        assert_eq!(notices.reasons(), ["ChannelsTainted", "ChannelsUntainted"]);

        stop.cancel();
        task.await.unwrap();
    }

    #[tokio::test(start_paused = true)]
    async fn a_restart_keeps_the_taint_it_finds_until_imex_is_healthy_long_enough() {
        let board = HealthBoard::default();
        let notices = Arc::new(Recorded::default());
        let left = DeviceTaint {
            key: "compute-domain.nvidia.com/imex-failing".into(),
            value: Some("exited".into()),
            effect: "NoSchedule".into(),
            time_added: Some(Time(Timestamp::UNIX_EPOCH)),
        };
        let (taints, mut taint) = ImexTaints::new(
            subject(),
            TaintTiming::default(),
            board.subscribe(),
            Some(left.clone()),
            notices.clone(),
        );
        assert_eq!(taint.borrow_and_update().as_ref(), Some(&left));
        let stop = CancellationToken::new();
        let task = tokio::spawn(taints.run(stop.clone()));
        advance(Duration::from_secs(29)).await;
        assert!(!taint.has_changed().unwrap(), "kept, its time too");
        advance(Duration::from_secs(2)).await;
        assert_eq!(*taint.borrow_and_update(), None);
        assert_eq!(notices.reasons(), ["ChannelsUntainted"]);
        stop.cancel();
        task.await.unwrap();
    }

    #[test]
    fn the_inherited_taint_is_ours_only() {
        let driver = "compute-domain.nvidia.com";
        let mut slice = super::super::slices::tainted_slices(
            &super::super::slices::PoolSpec {
                node: "node-1".into(),
                driver: driver.into(),
                clique: String::new(),
                channels: 2,
                gossip_addr: None,
            },
            &[DeviceTaint {
                key: "example.com/other".into(),
                effect: "NoSchedule".into(),
                ..DeviceTaint::default()
            }],
            1,
            None,
        );
        assert_eq!(our_taint(&slice, driver), None);
        let ours = DeviceTaint {
            key: taint_key(driver),
            value: Some("exited".into()),
            effect: "NoSchedule".into(),
            time_added: None,
        };
        slice[0].spec.devices.as_mut().unwrap()[1]
            .taints
            .as_mut()
            .unwrap()
            .push(ours.clone());
        assert_eq!(our_taint(&slice, driver), Some(ours));
    }

    #[test]
    fn events_are_cut_to_the_apis_limit() {
        let event = taint_kube_event(tainted_event(
            &subject(),
            "k",
            "v",
            &"x".repeat(2000),
            Duration::from_secs(5),
            TaintTiming::default(),
        ));
        assert!(event.note.unwrap().len() <= NOTE_LIMIT);
        assert_eq!(event.type_, KubeEventType::Warning);
    }
}
