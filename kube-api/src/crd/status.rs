//! `.status` of a ComputeDomain, as the CRD defines it: NVIDIA's driver's `status` and
//! `nodes[]`, plus standard conditions and the counts the printer columns show; and
//! the one rule of a condition's transition time, which the node daemons' `Ready` and
//! the controller's `TemplateReady` both follow.

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
    /// `isolation: Channel`: the IMEX channel the domain's pods get, unique among the
    /// domains sharing the clique's IMEX domain; set once every node of it agrees.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub channel: Option<u32>,
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

/// A domain's or a node's readiness as the CRD spells it. The node daemons map their
/// own readiness onto it; the contract keeps its own type so that the controller needs
/// none of theirs.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum Phase {
    Ready,
    #[default]
    NotReady,
}

impl std::fmt::Display for Phase {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Ready => "Ready",
            Self::NotReady => "NotReady",
        })
    }
}

/// `Ready` | `NotReady`, defaulting to `NotReady` as NVIDIA's driver's CRD does.
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

impl Condition {
    /// The condition `type_` should now be, given the `previous` one of that type: its
    /// transition time is kept while `status` stays, and is `now` (whole seconds, as
    /// `metav1.Time` has) when it changes, as Kubernetes conventions ask.
    pub fn transition(
        previous: Option<&Condition>,
        type_: &str,
        status: ConditionStatus,
        reason: &str,
        message: String,
        observed_generation: Option<i64>,
        now: OffsetDateTime,
    ) -> Self {
        let last_transition_time = previous
            .filter(|p| p.type_ == type_ && p.status == status)
            .map(|p| p.last_transition_time.clone())
            .unwrap_or_else(|| {
                now.replace_nanosecond(0)
                    .unwrap_or(now)
                    .format(&Rfc3339)
                    .expect("a UTC time always formats as RFC 3339")
            });
        Self {
            type_: type_.into(),
            status,
            last_transition_time,
            reason: reason.into(),
            message,
            observed_generation,
        }
    }
}

impl ComputeDomainStatus {
    /// The condition of `type_`, if the status has one.
    pub fn condition(&self, type_: &str) -> Option<&Condition> {
        self.conditions.iter().find(|c| c.type_ == type_)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use time::macros::datetime;

    fn ready(
        status: ConditionStatus,
        now: OffsetDateTime,
        previous: Option<&Condition>,
    ) -> Condition {
        Condition::transition(
            previous,
            READY_CONDITION,
            status,
            "Why",
            "what".into(),
            Some(2),
            now,
        )
    }

    #[test]
    fn the_transition_time_moves_only_when_the_status_does() {
        let first = ready(
            ConditionStatus::False,
            datetime!(2026-11-22 10:00:00.7 UTC),
            None,
        );
        assert_eq!(first.last_transition_time, "2026-11-22T10:00:00Z");
        let same = ready(
            ConditionStatus::False,
            datetime!(2026-11-22 10:05:00 UTC),
            Some(&first),
        );
        assert_eq!(same.last_transition_time, "2026-11-22T10:00:00Z");
        let flipped = ready(
            ConditionStatus::True,
            datetime!(2026-11-22 10:06:00 UTC),
            Some(&same),
        );
        assert_eq!(flipped.last_transition_time, "2026-11-22T10:06:00Z");
    }

    #[test]
    fn a_condition_of_another_type_is_no_previous() {
        let other = Condition::transition(
            None,
            "TemplateReady",
            ConditionStatus::False,
            "Why",
            "what".into(),
            None,
            datetime!(2026-11-22 09:00:00 UTC),
        );
        let ready = ready(
            ConditionStatus::False,
            datetime!(2026-11-22 10:00:00 UTC),
            Some(&other),
        );
        assert_eq!(ready.last_transition_time, "2026-11-22T10:00:00Z");
    }

    #[test]
    fn the_phase_serialises_as_the_crd_spells_it() {
        assert_eq!(serde_json::to_value(Phase::Ready).unwrap(), "Ready");
        assert_eq!(serde_json::to_value(Phase::NotReady).unwrap(), "NotReady");
        assert_eq!(Phase::default(), Phase::NotReady);
    }
}
