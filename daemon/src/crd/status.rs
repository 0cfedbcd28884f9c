//! `.status` of a ComputeDomain, as the CRD defines it: the anchor's `status` and
//! `nodes[]`, plus standard conditions and the counts the printer columns show.

use domaind_actors::model::Phase;
use domaind_actors::rules::status::{DomainStatus, NodeStatus};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;

/// The type of the one condition we keep: whether every node is ready.
pub const READY_CONDITION: &str = "Ready";

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
#[schemars(transform = super::formats::kubernetes_formats)]
pub struct ComputeDomainStatus {
    /// `Ready` once every node is (and `numNodes` of them, if set).
    #[schemars(schema_with = "phase_schema")]
    pub status: Phase,
    /// Keyed by `name`.
    #[serde(default)]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["name"]))]
    pub nodes: Vec<ComputeDomainNode>,
    #[serde(default)]
    pub ready_nodes: u32,
    #[serde(default)]
    pub total_nodes: u32,
    /// Keyed by `type`, so that server-side apply merges entries: the node daemons own
    /// `Ready` (field manager `domaind-node`), the controller `TemplateReady`
    /// (`domaind-controller`), and neither apply removes the other's.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    #[schemars(extend("x-kubernetes-list-type" = "map", "x-kubernetes-list-map-keys" = ["type"]))]
    pub conditions: Vec<Condition>,
    /// The CD's `metadata.generation` this status was computed for; unknown to the
    /// local backend, which has no generations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ComputeDomainNode {
    pub name: String,
    pub ip_address: String,
    /// `<clusterUUID>.<cliqueId>`, empty for a node without fabric.
    #[serde(rename = "cliqueID")]
    pub clique_id: String,
    /// The IMEX slot; absent until the node holds one (the schema has no nulls).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub index: Option<u16>,
    /// Whether this node's IMEX daemon is ready.
    #[serde(default = "not_ready")]
    #[schemars(schema_with = "phase_schema")]
    pub status: Phase,
}

fn not_ready() -> Phase {
    Phase::NotReady
}

/// `Ready` | `NotReady`, defaulting to `NotReady` as the anchor's CRD does.
fn phase_schema(_: &mut schemars::SchemaGenerator) -> schemars::Schema {
    schemars::json_schema!({
        "type": "string",
        "enum": ["Ready", "NotReady"],
        "default": "NotReady"
    })
}

/// A standard Kubernetes condition (`metav1.Condition`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct Condition {
    #[serde(rename = "type")]
    pub type_: String,
    pub status: ConditionStatus,
    /// RFC 3339, when `status` last changed.
    pub last_transition_time: String,
    pub reason: String,
    pub message: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observed_generation: Option<i64>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub enum ConditionStatus {
    True,
    False,
    Unknown,
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
    let status = if ready {
        ConditionStatus::True
    } else {
        ConditionStatus::False
    };
    let last_transition_time = previous
        .and_then(|p| p.conditions.iter().find(|c| c.type_ == READY_CONDITION))
        .filter(|c| c.status == status)
        .map(|c| c.last_transition_time.clone())
        .unwrap_or_else(|| {
            now.replace_nanosecond(0)
                .unwrap_or(now)
                .format(&Rfc3339)
                .expect("a UTC time always formats as RFC 3339")
        });
    let reason = match (ready, domain.total_nodes) {
        (true, _) => "AllNodesReady",
        (false, 0) => "NoNodes",
        (false, _) => "NodesNotReady",
    };
    ComputeDomainStatus {
        status: domain.status,
        nodes: domain
            .nodes
            .iter()
            .map(|n| ComputeDomainNode {
                name: n.name.clone(),
                ip_address: n.ip_address.clone(),
                clique_id: n.clique_id.clone(),
                index: n.index,
                status: n.status,
            })
            .collect(),
        ready_nodes: domain.ready_nodes,
        total_nodes: domain.total_nodes,
        conditions: vec![Condition {
            type_: READY_CONDITION.into(),
            status,
            last_transition_time,
            reason: reason.into(),
            message: domain.message.clone(),
            observed_generation,
        }],
        observed_generation,
    }
}

/// The reporter's document a written status stands for: what `status_from_domain`
/// wrote, read back (the message is the `Ready` condition's; a status without one
/// has none).
pub fn domain_from_status(status: &ComputeDomainStatus) -> DomainStatus {
    DomainStatus {
        status: status.status,
        ready_nodes: status.ready_nodes,
        total_nodes: status.total_nodes,
        message: status
            .conditions
            .iter()
            .find(|c| c.type_ == READY_CONDITION)
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
                status: n.status,
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
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
