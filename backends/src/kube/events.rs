//! [`EventSink`] for a cluster: Kubernetes Events on the ComputeDomain, through
//! kube-runtime's event [`Recorder`] (reporting controller `domaind`, instance = the
//! node), so that `kubectl describe computedomain` shows joins, losses, readiness and
//! refusals.
//!
//! The recorder folds a repeat of an event into a series (one object, a count) when
//! type, action, reason and related object are the same, keeping the first message.
//! So every event says what it is about through its related object where one exists
//! (the Node that joined or was lost, the ResourceClaim that was refused): a kubelet
//! retrying a refused claim becomes one event "x12", while two different nodes lost
//! are two events. Readiness changes have no such object and their message changes
//! ("3/4 nodes ready, lost: node-2"), so each is its own event, never a series with a
//! stale message; they happen only when the domain's phase flips. An IMEX daemon
//! failing is told once per failure episode, each a new event (its reason may differ),
//! related to the Node.

use std::time::Duration;

use ::kube::Client;
use ::kube::runtime::events::{Event, EventType as KubeEventType, Recorder, Reporter};
use async_trait::async_trait;
use domaind_actors::model::{DomainRef, NodeId};
use domaind_actors::ports::{DomainEvent, EventSink, PortError};
use k8s_openapi::api::core::v1::ObjectReference;

use crate::events::{EventText, EventType};
use domaind_kube_api::api::bounded;
use domaind_kube_api::crd::{GROUP, VERSION};
use domaind_kube_api::names::NODE_REPORTING_CONTROLLER;

/// Counts events recorded, by outcome (`ok`, `failed`).
pub const EVENTS: &str = "domaind_kube_events_total";

/// The Events API caps a note at 1 kB.
pub(super) const NOTE_LIMIT: usize = 1024;

#[derive(Clone)]
pub struct KubeEventSink {
    client: Client,
    reporter: Reporter,
    recorder: Recorder,
    timeout: Duration,
}

impl std::fmt::Debug for KubeEventSink {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeEventSink")
            .field("reporter", &self.reporter)
            .finish_non_exhaustive()
    }
}

impl KubeEventSink {
    pub fn new(client: Client, node: impl Into<NodeId>, timeout: Duration) -> Self {
        let reporter = Reporter {
            controller: NODE_REPORTING_CONTROLLER.into(),
            instance: Some(node.into()),
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            timeout,
        }
    }
}

/// The ComputeDomain as an event's subject.
pub fn domain_reference(domain: &DomainRef) -> ObjectReference {
    ObjectReference {
        api_version: Some(format!("{GROUP}/{VERSION}")),
        kind: Some("ComputeDomain".into()),
        name: Some(domain.name.clone()),
        namespace: Some(domain.namespace.clone()),
        uid: Some(domain.uid.0.clone()),
        ..ObjectReference::default()
    }
}

/// What Kubernetes is told: the event, and whether it may join a series.
pub fn kube_event(event: &DomainEvent) -> (Event, bool) {
    let text = EventText::of(event);
    let node = |name: &NodeId| ObjectReference {
        api_version: Some("v1".into()),
        kind: Some("Node".into()),
        name: Some(name.clone()),
        ..ObjectReference::default()
    };
    let (action, related, series) = match event {
        DomainEvent::NodeJoined { node: name } | DomainEvent::NodeLost { node: name } => {
            ("Membership", Some(node(name)), true)
        }
        DomainEvent::Ready { .. } | DomainEvent::NotReady { .. } => ("Readiness", None, false),
        // One per failure episode, each with its own reason: never folded into an
        // earlier episode's series, whose note would be kept.
        DomainEvent::ImexFailing { node: name, .. } | DomainEvent::ImexKept { node: name, .. } => {
            ("ImexDaemon", Some(node(name)), false)
        }
        DomainEvent::SharedImexFault { node: name, .. } => {
            ("SharedImexDomain", Some(node(name)), false)
        }
        DomainEvent::CliqueMoved { node: name, .. } => ("NvlinkClique", Some(node(name)), false),
        DomainEvent::PrepareRefused { claim, .. } => (
            "PrepareResources",
            Some(ObjectReference {
                api_version: Some("resource.k8s.io/v1".into()),
                kind: Some("ResourceClaim".into()),
                uid: Some(claim.clone()),
                ..ObjectReference::default()
            }),
            true,
        ),
        DomainEvent::CheckpointDamaged { node: name, .. } => {
            ("Checkpoint", Some(node(name)), false)
        }
        DomainEvent::StateNotPersisted { node: name, .. }
        | DomainEvent::StatePersisted { node: name } => ("Checkpoint", Some(node(name)), false),
    };
    let event = Event {
        type_: match text.type_ {
            EventType::Normal => KubeEventType::Normal,
            EventType::Warning => KubeEventType::Warning,
        },
        reason: text.reason,
        note: Some(truncate(text.message, NOTE_LIMIT)),
        action: action.into(),
        secondary: related,
    };
    (event, series)
}

pub(super) fn truncate(mut text: String, limit: usize) -> String {
    if text.len() > limit {
        let mut end = limit - '…'.len_utf8();
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        text.truncate(end);
        text.push('…');
    }
    text
}

#[async_trait]
impl EventSink for KubeEventSink {
    async fn emit(&self, domain: &DomainRef, event: DomainEvent) -> Result<(), PortError> {
        let (kube_event, series) = kube_event(&event);
        let reference = domain_reference(domain);
        // A recorder of its own has no earlier event to fold this one into.
        let recorder = if series {
            self.recorder.clone()
        } else {
            Recorder::new(self.client.clone(), self.reporter.clone())
        };
        let published = bounded(
            format!(
                "record event {} on ComputeDomain {domain}",
                kube_event.reason
            ),
            self.timeout,
            recorder.publish(&kube_event, &reference),
        )
        .await;
        let outcome = if published.is_ok() { "ok" } else { "failed" };
        metrics::counter!(EVENTS, "outcome" => outcome).increment(1);
        published.map_err(super::port_error)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn node_events_are_about_the_node_and_readiness_never_folds() {
        let (lost, series) = kube_event(&DomainEvent::NodeLost {
            node: "node-3".into(),
        });
        assert!(series);
        assert_eq!(lost.type_, KubeEventType::Warning);
        assert_eq!(lost.reason, "NodeLost");
        let related = lost.secondary.unwrap();
        assert_eq!(
            (related.kind.as_deref(), related.name.as_deref()),
            (Some("Node"), Some("node-3"))
        );
        let (ready, series) = kube_event(&DomainEvent::Ready {
            message: "3/3 nodes ready".into(),
        });
        assert!(!series);
        assert_eq!(ready.note.as_deref(), Some("3/3 nodes ready"));
        let (refused, _) = kube_event(&DomainEvent::PrepareRefused {
            claim: "uid-1".into(),
            reason: "busy".into(),
        });
        assert_eq!(refused.secondary.unwrap().uid.as_deref(), Some("uid-1"));
    }

    #[test]
    fn long_messages_are_cut_to_the_apis_limit_on_a_character() {
        let long = "é".repeat(700);
        let cut = truncate(long, NOTE_LIMIT);
        assert!(cut.len() <= NOTE_LIMIT);
        assert!(cut.ends_with('…'));
        assert_eq!(truncate("short".into(), NOTE_LIMIT), "short");
    }
}
