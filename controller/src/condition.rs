//! `TemplateReady`: the one status condition the controller writes, and the server-side
//! apply body that touches nothing else of the status.

use kube::ResourceExt as _;
use serde_json::json;
use time::OffsetDateTime;

use domaind_kube_api::crd::{ComputeDomain, Condition, GROUP, VERSION};
use domaind_kube_api::names::TEMPLATE_READY;
use domaind_kube_api::reasons::TemplateReadyReason;

/// What became of a CD's template.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TemplateOutcome {
    /// The template exists and is ours.
    Ready { template: String },
    /// A template of that name exists and is not ours: we leave it alone.
    NameTaken {
        template: String,
        owner: Option<String>,
    },
    /// The API server refused the template as invalid; `why` is its message.
    Rejected { template: String, why: String },
}

impl TemplateOutcome {
    fn reason_message(&self) -> (TemplateReadyReason, String) {
        match self {
            Self::Ready { template } => (
                TemplateReadyReason::TemplateCreated,
                format!("ResourceClaimTemplate {template} is ready for the domain's pods"),
            ),
            Self::NameTaken { template, owner } => (
                TemplateReadyReason::TemplateNameTaken,
                match owner {
                    Some(owner) => format!(
                        "a ResourceClaimTemplate named {template} already exists, controlled by \
                         {owner}; it is left alone: name another template in a new \
                         ComputeDomain, or delete that template"
                    ),
                    None => format!(
                        "a ResourceClaimTemplate named {template} already exists and was not \
                         created for this ComputeDomain; it is left alone: name another \
                         template in a new ComputeDomain, or delete that template"
                    ),
                },
            ),
            Self::Rejected { template, why } => (
                TemplateReadyReason::TemplateRejected,
                format!(
                    "the API server refused ResourceClaimTemplate {template}: {why}; the spec \
                     cannot change: create a new ComputeDomain with a valid template name"
                ),
            ),
        }
    }
}

/// The condition to write for `outcome`, or `None` when the CD already says so (same
/// status, reason, message and generation). The transition time moves only when the
/// status does, as Kubernetes conventions ask.
pub fn update(
    cd: &ComputeDomain,
    outcome: &TemplateOutcome,
    now: OffsetDateTime,
) -> Option<Condition> {
    let (reason, message) = outcome.reason_message();
    let (status, reason) = (reason.status(), reason.as_str());
    let current = cd.status.as_ref().and_then(|s| s.condition(TEMPLATE_READY));
    let observed_generation = cd.metadata.generation;
    if let Some(current) = current
        && current.status == status
        && current.reason == reason
        && current.message == message
        && current.observed_generation == observed_generation
    {
        return None;
    }
    Some(Condition::transition(
        current,
        TEMPLATE_READY,
        status,
        reason,
        message,
        observed_generation,
        now,
    ))
}

/// The apply configuration for the status subresource: only this condition, so that
/// the field manager `domaind-controller` owns only it and the node daemons' fields
/// (`status`, `nodes`, the counts, the `Ready` condition) stay theirs.
pub fn apply_body(cd: &ComputeDomain, condition: &Condition) -> serde_json::Value {
    json!({
        "apiVersion": format!("{GROUP}/{VERSION}"),
        "kind": "ComputeDomain",
        "metadata": {"name": cd.name_any(), "namespace": cd.namespace()},
        "status": {"conditions": [condition]},
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::fixtures::compute_domain;
    use domaind_kube_api::crd::Phase;
    use domaind_kube_api::crd::{ComputeDomainStatus, ConditionStatus};
    use time::macros::datetime;

    fn taken() -> TemplateOutcome {
        TemplateOutcome::NameTaken {
            template: "training-channel".into(),
            owner: None,
        }
    }

    fn with_condition(mut cd: ComputeDomain, condition: Condition) -> ComputeDomain {
        cd.status = Some(ComputeDomainStatus {
            status: Phase::NotReady,
            nodes: vec![],
            ready_nodes: 0,
            total_nodes: 0,
            conditions: vec![condition],
            observed_generation: None,
            channel: None,
        });
        cd
    }

    #[test]
    fn a_taken_name_is_written_once_then_left() {
        let cd = compute_domain();
        let first = update(&cd, &taken(), datetime!(2026-11-22 10:00:00.7 UTC)).unwrap();
        assert_eq!(first.status, ConditionStatus::False);
        assert_eq!(first.reason, "TemplateNameTaken");
        assert_eq!(first.last_transition_time, "2026-11-22T10:00:00Z");
        assert_eq!(first.observed_generation, Some(1));
        let cd = with_condition(cd, first);
        assert_eq!(
            update(&cd, &taken(), datetime!(2026-11-22 10:05:00 UTC)),
            None
        );
    }

    #[test]
    fn the_transition_time_moves_only_with_the_status() {
        let cd = with_condition(
            compute_domain(),
            update(
                &compute_domain(),
                &taken(),
                datetime!(2026-11-22 10:00:00 UTC),
            )
            .unwrap(),
        );
        let other_owner = TemplateOutcome::NameTaken {
            template: "training-channel".into(),
            owner: Some("ComputeDomain old (uid 1)".into()),
        };
        let same_status = update(&cd, &other_owner, datetime!(2026-11-22 10:01:00 UTC)).unwrap();
        assert_eq!(same_status.last_transition_time, "2026-11-22T10:00:00Z");
        assert!(same_status.message.contains("ComputeDomain old (uid 1)"));
        let ready = TemplateOutcome::Ready {
            template: "training-channel".into(),
        };
        let flipped = update(&cd, &ready, datetime!(2026-11-22 10:02:00 UTC)).unwrap();
        assert_eq!(flipped.status, ConditionStatus::True);
        assert_eq!(flipped.reason, "TemplateCreated");
        assert_eq!(flipped.last_transition_time, "2026-11-22T10:02:00Z");
    }

    #[test]
    fn the_apply_body_holds_only_the_condition() {
        let cd = compute_domain();
        let condition = update(&cd, &taken(), datetime!(2026-11-22 10:00:00 UTC)).unwrap();
        let body = apply_body(&cd, &condition);
        assert_eq!(body["apiVersion"], "resource.nvidia.com/v1beta1");
        assert_eq!(
            body["metadata"],
            serde_json::json!({"name": "training", "namespace": "team-a"})
        );
        assert_eq!(body["status"].as_object().unwrap().len(), 1);
        assert_eq!(body["status"]["conditions"][0]["type"], "TemplateReady");
    }
}
