//! The events and conditions page, from the reason catalogues of the code that writes
//! them.

use std::fmt::Debug;

use domaind_actors::rules::channel_health::HealthReason;
use domaind_backends::events::{DomainEventReason, NodeEventReason};
use domaind_backends::kube::claim_status;
use domaind_docs_gen::markdown::{cell, code, table};
use domaind_kube_api::crd::READY_CONDITION;
use domaind_kube_api::names::TEMPLATE_READY;
use domaind_kube_api::reasons::{
    ControllerEventReason, CsrReason, DomainReadyReason, TemplateReadyReason,
};

/// A table of `reasons`: each with its status (or type) and meaning.
fn reasons<R: Copy, S: Debug>(
    headers: [&str; 3],
    reasons: &[R],
    name: impl Fn(R) -> &'static str,
    status: impl Fn(R) -> S,
    meaning: impl Fn(R) -> &'static str,
) -> String {
    let rows: Vec<Vec<String>> = reasons
        .iter()
        .map(|&r| {
            vec![
                code(name(r)),
                format!("{:?}", status(r)).trim_matches('"').to_owned(),
                cell(meaning(r)),
            ]
        })
        .collect();
    table(&headers, &rows)
}

const EVENT: [&str; 3] = ["reason", "type", "when"];
const CONDITION: [&str; 3] = ["reason", "status", "meaning"];

pub fn page() -> String {
    let health: Vec<HealthReason> = HealthReason::ALL.to_vec();
    let health_rows: Vec<Vec<String>> = health
        .iter()
        .map(|r| vec![code(r.as_str()), cell(r.meaning())])
        .collect();
    format!(
        "# Events and conditions\n\n\
         What the node daemons and the controller tell users through Kubernetes: the Events \
         they record (`kubectl describe`, `kubectl get events`) and the conditions they set. \
         Tools may match on the reasons; the notes and messages are for people.\n\n\
         ## Events\n\n\
         ### On a ComputeDomain, from the node daemons\n\n\
         The related object, where there is one, is the Node or the ResourceClaim concerned. \
         The local backend writes the same events to its events file.\n\n{}\n\
         ### On a Node, from the node daemons\n\n{}\n\
         ### On a ComputeDomain, from the controller\n\n{}\n\
         ### On a CertificateSigningRequest, from the controller\n\n\
         A Warning event for each request the signer denies or refuses after someone else \
         approved it, with the rule's reason (see the request's conditions below).\n\n\
         ## Conditions\n\n\
         ### ComputeDomain `{READY_CONDITION}`, from the node daemons\n\n\
         Written with the domain's status by its reporter node.\n\n{}\n\
         ### ComputeDomain `{TEMPLATE_READY}`, from the controller\n\n{}\n\
         ### ResourceClaim `status.devices[].conditions`: `{}`, from the node daemons\n\n\
         One entry per device of a claim prepared on the node; its status is `True` when \
         healthy, `False` when unhealthy, `Unknown` when not known. The kubelet's device \
         health (`DRAResourceHealth`) says the same.\n\n{}\n\
         ### CertificateSigningRequest, from the controller\n\n\
         Node certificate requests under `tls.mode: csr`: the condition's type and its \
         reason.\n\n{}",
        reasons(
            EVENT,
            DomainEventReason::ALL,
            |r| r.as_str(),
            |r| r.status(),
            |r| r.meaning()
        ),
        reasons(
            EVENT,
            NodeEventReason::ALL,
            |r| r.as_str(),
            |r| r.status(),
            |r| r.meaning()
        ),
        reasons(
            EVENT,
            ControllerEventReason::ALL,
            |r| r.as_str(),
            |r| r.status(),
            |r| r.meaning()
        ),
        reasons(
            CONDITION,
            DomainReadyReason::ALL,
            |r| r.as_str(),
            |r| r.status(),
            |r| r.meaning()
        ),
        reasons(
            CONDITION,
            TemplateReadyReason::ALL,
            |r| r.as_str(),
            |r| r.status(),
            |r| r.meaning()
        ),
        claim_status::READY_CONDITION,
        table(&["reason", "meaning"], &health_rows),
        reasons(
            ["reason", "condition", "meaning"],
            CsrReason::ALL,
            |r| r.as_str(),
            |r| r.status(),
            |r| r.meaning()
        ),
    )
}
