//! What users read about a domain: the type, reason and message of an event, the same
//! whichever sink shows it (Kubernetes Events, or the local backend's event files).

use domaind_actors::ports::DomainEvent;
use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum EventType {
    Normal,
    Warning,
}

/// An event as Kubernetes shows it: `kubectl describe` prints type, reason, message.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EventText {
    #[serde(rename = "type")]
    pub type_: EventType,
    /// CamelCase, machine-matchable.
    pub reason: String,
    pub message: String,
}

impl EventText {
    pub fn of(event: &DomainEvent) -> Self {
        let (type_, reason, message) = match event {
            DomainEvent::NodeJoined { node } => (
                EventType::Normal,
                "NodeJoined",
                format!("node {node} joined the domain"),
            ),
            DomainEvent::NodeLost { node } => (
                EventType::Warning,
                "NodeLost",
                format!("node {node} stopped responding and was dropped from the IMEX domain"),
            ),
            DomainEvent::Ready { message } => (EventType::Normal, "DomainReady", message.clone()),
            DomainEvent::NotReady { message } => {
                (EventType::Warning, "DomainNotReady", message.clone())
            }
            DomainEvent::PrepareRefused { claim, reason } => (
                EventType::Warning,
                "PrepareRefused",
                format!("claim {claim} refused: {reason}"),
            ),
            DomainEvent::CheckpointDamaged {
                node,
                records,
                lost_claims,
            } => (
                EventType::Warning,
                "CheckpointDamaged",
                if lost_claims.is_empty() {
                    format!(
                        "node {node} found {records} damaged record(s) in its checkpoint and set \
                         them aside; no claim's state depended on them"
                    )
                } else {
                    format!(
                        "node {node} found {records} damaged record(s) in its checkpoint and set \
                         them aside; claims whose state was lost with them (rebuilt from the API \
                         server where there is one): {}",
                        lost_claims.join(", ")
                    )
                },
            ),
            DomainEvent::StateNotPersisted { node, error } => (
                EventType::Warning,
                "StateNotPersisted",
                format!(
                    "node {node} cannot write its state directory ({error}); it serves prepares \
                     from memory and writes them once it can; a restart before then forgets them"
                ),
            ),
            DomainEvent::StatePersisted { node } => (
                EventType::Normal,
                "StatePersisted",
                format!(
                    "node {node} writes its state directory again; nothing held in memory was lost"
                ),
            ),
            DomainEvent::ImexKept { node, reason } => (
                EventType::Warning,
                "ImexKept",
                format!(
                    "the IMEX daemon of node {node} was left running although it serves \
                     another config ({reason}): prepared claims use it, and replacing it would \
                     clean up their jobs' imports; it is replaced once none does"
                ),
            ),
            DomainEvent::ImexFailing { node, reason } => (
                EventType::Warning,
                "ImexFailing",
                format!(
                    "the IMEX daemon of node {node} is failing and is restarted with backoff: \
                     {reason}"
                ),
            ),
            DomainEvent::SharedImexFault {
                node,
                fault,
                clique,
            } => (
                EventType::Warning,
                "SharedImexFault",
                format!(
                    "node {node} of the shared IMEX domain of clique {clique} is {fault}: the \
                     IMEX daemons of every ComputeDomain sharing it reconfigure, this one's too"
                ),
            ),
            DomainEvent::CliqueMoved { node, from, to } => (
                EventType::Warning,
                "CliqueMoved",
                format!(
                    "the NVLink fabric of node {node} registered again in another clique: it \
                     left the domain in clique {from} and rejoins it in clique {to} (its IMEX \
                     daemon kept running, with the new clique's peers)"
                ),
            ),
        };
        Self {
            type_,
            reason: reason.into(),
            message,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn losses_and_refusals_are_warnings() {
        let lost = EventText::of(&DomainEvent::NodeLost {
            node: "node-3".into(),
        });
        assert_eq!(
            (lost.type_, lost.reason.as_str()),
            (EventType::Warning, "NodeLost")
        );
        assert!(lost.message.contains("node-3"));
        let joined = EventText::of(&DomainEvent::NodeJoined {
            node: "node-3".into(),
        });
        assert_eq!(joined.type_, EventType::Normal);
        let refused = EventText::of(&DomainEvent::PrepareRefused {
            claim: "c1".into(),
            reason: "busy".into(),
        });
        assert_eq!(
            (refused.type_, refused.message.as_str()),
            (EventType::Warning, "claim c1 refused: busy")
        );
        let failing = EventText::of(&DomainEvent::ImexFailing {
            node: "node-3".into(),
            reason: "IMEX cannot listen on 10.0.0.3:50000 (SERVER_PORT)".into(),
        });
        assert_eq!(
            (failing.type_, failing.reason.as_str()),
            (EventType::Warning, "ImexFailing")
        );
        assert!(
            failing.message.contains("node node-3")
                && failing.message.contains("cannot listen on 10.0.0.3:50000"),
            "{}",
            failing.message
        );
    }

    #[test]
    fn a_clique_move_is_a_warning_naming_both_cliques() {
        let moved = EventText::of(&DomainEvent::CliqueMoved {
            node: "node-3".into(),
            from: "u.1".into(),
            to: "v.2".into(),
        });
        assert_eq!(
            (moved.type_, moved.reason.as_str()),
            (EventType::Warning, "CliqueMoved")
        );
        assert!(
            moved.message.contains("node node-3")
                && moved.message.contains("clique u.1")
                && moved.message.contains("clique v.2"),
            "{}",
            moved.message
        );
    }
}
