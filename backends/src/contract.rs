//! The node's model mapped onto the Kubernetes contract (`domaind-kube-api`): the
//! reporter's status document as the CRD's status and back, and the channel config's
//! values as the actors' policies. The contract crate knows none of our actors' types,
//! so that the controller needs none of them; the mapping lives here, at the node's
//! edge.

use domaind_actors::model::{AllocationMode, Isolation, Phase, ReadinessPolicy};
use domaind_actors::rules::status::{DomainStatus, NodeStatus};
use domaind_kube_api::channel_config::Readiness;
use domaind_kube_api::crd::{
    self, ChannelAllocationMode, ComputeDomainNode, ComputeDomainStatus, Condition, READY_CONDITION,
};
use domaind_kube_api::reasons::DomainReadyReason;
use time::OffsetDateTime;

pub fn phase(phase: crd::Phase) -> Phase {
    match phase {
        crd::Phase::Ready => Phase::Ready,
        crd::Phase::NotReady => Phase::NotReady,
    }
}

pub fn crd_phase(phase: Phase) -> crd::Phase {
    match phase {
        Phase::Ready => crd::Phase::Ready,
        Phase::NotReady => crd::Phase::NotReady,
    }
}

pub fn allocation_mode(mode: ChannelAllocationMode) -> AllocationMode {
    match mode {
        ChannelAllocationMode::All => AllocationMode::All,
        ChannelAllocationMode::Single => AllocationMode::Single,
    }
}

pub fn isolation(isolation: crd::ComputeDomainIsolation) -> Isolation {
    match isolation {
        crd::ComputeDomainIsolation::ImexDomain => Isolation::ImexDomain,
        crd::ComputeDomainIsolation::Channel => Isolation::Channel,
    }
}

pub fn readiness_policy(readiness: Readiness) -> ReadinessPolicy {
    match readiness {
        Readiness::Local => ReadinessPolicy::Local,
        Readiness::Domain => ReadinessPolicy::Domain,
    }
}

/// The CRD's status for a reporter's document. `previous` is the status as last
/// written: a condition whose status did not change keeps its transition time, as
/// Kubernetes conventions ask.
pub fn status_from_domain(
    domain: &DomainStatus,
    previous: Option<&ComputeDomainStatus>,
    observed_generation: Option<i64>,
    now: OffsetDateTime,
) -> ComputeDomainStatus {
    let ready = domain.status == Phase::Ready;
    let reason = match (ready, domain.total_nodes) {
        (true, _) => DomainReadyReason::AllNodesReady,
        (false, 0) => DomainReadyReason::NoNodes,
        (false, _) => DomainReadyReason::NodesNotReady,
    };
    ComputeDomainStatus {
        status: crd_phase(domain.status),
        nodes: domain
            .nodes
            .iter()
            .map(|n| ComputeDomainNode {
                name: n.name.clone(),
                ip_address: n.ip_address.clone(),
                clique_id: n.clique_id.clone(),
                index: n.index,
                status: crd_phase(n.status),
            })
            .collect(),
        ready_nodes: domain.ready_nodes,
        total_nodes: domain.total_nodes,
        conditions: vec![Condition::transition(
            previous.and_then(|p| p.condition(READY_CONDITION)),
            READY_CONDITION,
            reason.status(),
            reason.as_str(),
            domain.message.clone(),
            observed_generation,
            now,
        )],
        observed_generation,
        channel: domain.channel,
    }
}

/// The reporter's document a written status stands for: what `status_from_domain`
/// wrote, read back (the message is the `Ready` condition's; a status without one
/// has none).
pub fn domain_from_status(status: &ComputeDomainStatus) -> DomainStatus {
    DomainStatus {
        status: phase(status.status),
        ready_nodes: status.ready_nodes,
        total_nodes: status.total_nodes,
        message: status
            .condition(READY_CONDITION)
            .map(|c| c.message.clone())
            .unwrap_or_default(),
        nodes: status
            .nodes
            .iter()
            .map(|n| NodeStatus {
                name: n.name.clone(),
                ip_address: n.ip_address.clone(),
                clique_id: n.clique_id.clone(),
                index: n.index,
                status: phase(n.status),
            })
            .collect(),
        channel: status.channel,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use domaind_kube_api::crd::ConditionStatus;
    use time::macros::datetime;

    fn domain(phase: Phase, ready: u32) -> DomainStatus {
        DomainStatus {
            status: phase,
            ready_nodes: ready,
            total_nodes: 2,
            message: format!("{ready}/2 nodes ready"),
            nodes: vec![NodeStatus {
                name: "node-a".into(),
                ip_address: "10.0.0.1".into(),
                clique_id: "c.0".into(),
                index: None,
                status: phase,
            }],
            channel: None,
        }
    }

    #[test]
    fn serialises_with_the_crd_field_names() {
        let status = status_from_domain(
            &domain(Phase::NotReady, 1),
            None,
            Some(3),
            datetime!(2026-11-22 10:00:00.5 UTC),
        );
        let json = serde_json::to_value(&status).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "status": "NotReady",
                "nodes": [{"name": "node-a", "ipAddress": "10.0.0.1", "cliqueID": "c.0", "status": "NotReady"}],
                "readyNodes": 1,
                "totalNodes": 2,
                "conditions": [{
                    "type": "Ready", "status": "False", "reason": "NodesNotReady",
                    "message": "1/2 nodes ready",
                    "lastTransitionTime": "2026-11-22T10:00:00Z",
                    "observedGeneration": 3
                }],
                "observedGeneration": 3
            })
        );
        let back: ComputeDomainStatus = serde_json::from_value(json).unwrap();
        assert_eq!(back, status);
    }

    #[test]
    fn the_transition_time_moves_only_when_the_condition_changes() {
        let first = status_from_domain(
            &domain(Phase::NotReady, 1),
            None,
            None,
            datetime!(2026-11-22 10:00:00 UTC),
        );
        let same = status_from_domain(
            &domain(Phase::NotReady, 0),
            Some(&first),
            None,
            datetime!(2026-11-22 10:05:00 UTC),
        );
        assert_eq!(
            same.conditions[0].last_transition_time,
            "2026-11-22T10:00:00Z"
        );
        let flipped = status_from_domain(
            &domain(Phase::Ready, 2),
            Some(&same),
            None,
            datetime!(2026-11-22 10:06:00 UTC),
        );
        assert_eq!(flipped.conditions[0].status, ConditionStatus::True);
        assert_eq!(flipped.conditions[0].reason, "AllNodesReady");
        assert_eq!(
            flipped.conditions[0].last_transition_time,
            "2026-11-22T10:06:00Z"
        );
    }

    #[test]
    fn a_written_status_reads_back_as_the_document() {
        let document = domain(Phase::NotReady, 1);
        let written =
            status_from_domain(&document, None, Some(2), datetime!(2026-11-22 10:00:00 UTC));
        assert_eq!(domain_from_status(&written), document);
        let bare = ComputeDomainStatus {
            conditions: Vec::new(),
            ..written
        };
        assert_eq!(domain_from_status(&bare).message, "");
    }
}
