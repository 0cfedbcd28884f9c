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

domaind_kube_api::reasons! {
    /// The events the node daemons record on a ComputeDomain (the local backend writes
    /// them to its events file), with their type.
    pub enum DomainEventReason: EventType {
        /// A node joined the domain (its pod's claim was prepared there).
        NodeJoined => EventType::Normal,
        /// A member stopped responding and was dropped from the IMEX domain.
        NodeLost => EventType::Warning,
        /// The domain became Ready; the note says what that took.
        DomainReady => EventType::Normal,
        /// The domain lost Ready; the note says which nodes and why.
        DomainNotReady => EventType::Warning,
        /// A claim of the domain was refused at prepare; the note says why.
        PrepareRefused => EventType::Warning,
        /// A node found damaged records in its checkpoint and set them aside; the note
        /// names any claim whose state was lost with them.
        CheckpointDamaged => EventType::Warning,
        /// A node cannot write its state directory: it serves prepares from memory, and a
        /// restart before it can write again forgets them.
        StateNotPersisted => EventType::Warning,
        /// A node writes its state directory again; nothing held in memory was lost.
        StatePersisted => EventType::Normal,
        /// A node's IMEX daemon serves another config but was left running, because
        /// prepared claims use it; it is replaced once none does.
        ImexKept => EventType::Warning,
        /// A node's IMEX daemon is failing and is restarted with backoff (once per
        /// failure episode).
        ImexFailing => EventType::Warning,
        /// A node of the clique's shared IMEX domain (`isolation: Channel`) failed or
        /// left: the IMEX daemons of every ComputeDomain sharing it reconfigure.
        SharedImexFault => EventType::Warning,
        /// A node's NVLink fabric registered again in another clique: it left the domain
        /// in the old clique and rejoins it in the new one.
        CliqueMoved => EventType::Warning,
    }
}

domaind_kube_api::reasons! {
    /// The events the node daemons record on their Node, with their type.
    pub enum NodeEventReason: EventType {
        /// The node's IMEX daemon has been failing for a while: its channel devices are
        /// tainted so that no new claim is allocated there until it has been healthy for
        /// a while; running pods keep theirs.
        ChannelsTainted => EventType::Warning,
        /// The node's IMEX daemon has been healthy again long enough: the taint is removed
        /// from its channel devices.
        ChannelsUntainted => EventType::Normal,
        /// A claim prepared on the node and never unprepared (the daemon was down when it
        /// went, or it was force-deleted) was released; the note says which and why.
        StaleClaimReleased => EventType::Warning,
    }
}

impl EventText {
    pub fn new(type_: EventType, reason: &str, message: String) -> Self {
        Self {
            type_,
            reason: reason.into(),
            message,
        }
    }

    pub fn of(event: &DomainEvent) -> Self {
        let (reason, message) = match event {
            DomainEvent::NodeJoined { node } => (
                DomainEventReason::NodeJoined,
                format!("node {node} joined the domain"),
            ),
            DomainEvent::NodeLost { node } => (
                DomainEventReason::NodeLost,
                format!("node {node} stopped responding and was dropped from the IMEX domain"),
            ),
            DomainEvent::Ready { message } => (DomainEventReason::DomainReady, message.clone()),
            DomainEvent::NotReady { message } => {
                (DomainEventReason::DomainNotReady, message.clone())
            }
            DomainEvent::PrepareRefused { claim, reason } => (
                DomainEventReason::PrepareRefused,
                format!("claim {claim} refused: {reason}"),
            ),
            DomainEvent::CheckpointDamaged {
                node,
                records,
                lost_claims,
            } => (
                DomainEventReason::CheckpointDamaged,
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
                DomainEventReason::StateNotPersisted,
                format!(
                    "node {node} cannot write its state directory ({error}); it serves prepares \
                     from memory and writes them once it can; a restart before then forgets them"
                ),
            ),
            DomainEvent::StatePersisted { node } => (
                DomainEventReason::StatePersisted,
                format!(
                    "node {node} writes its state directory again; nothing held in memory was lost"
                ),
            ),
            DomainEvent::ImexKept { node, reason } => (
                DomainEventReason::ImexKept,
                format!(
                    "the IMEX daemon of node {node} was left running although it serves \
                     another config ({reason}): prepared claims use it, and replacing it would \
                     clean up their jobs' imports; it is replaced once none does"
                ),
            ),
            DomainEvent::ImexFailing { node, reason } => (
                DomainEventReason::ImexFailing,
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
                DomainEventReason::SharedImexFault,
                format!(
                    "node {node} of the shared IMEX domain of clique {clique} is {fault}: the \
                     IMEX daemons of every ComputeDomain sharing it reconfigure, this one's too"
                ),
            ),
            DomainEvent::CliqueMoved { node, from, to } => (
                DomainEventReason::CliqueMoved,
                format!(
                    "the NVLink fabric of node {node} registered again in another clique: it \
                     left the domain in clique {from} and rejoins it in clique {to} (its IMEX \
                     daemon kept running, with the new clique's peers)"
                ),
            ),
        };
        Self::new(reason.status(), reason.as_str(), message)
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
