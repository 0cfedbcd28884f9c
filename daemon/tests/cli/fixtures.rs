//! What several subcommand tests build alike.

use domaind_actors::model::{AllocationMode, ClaimRef, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};

/// A claim file of namespace `team-a` (`name`, `uid`) for the ComputeDomain `domain`
/// (`domain_uid`) of `num_nodes`, one channel, and its reference.
pub(crate) fn claim_of(
    name: &str,
    uid: &str,
    (domain, domain_uid, num_nodes): (&str, &str, u32),
    readiness: ReadinessPolicy,
) -> (ClaimFile, ClaimRef) {
    let file = ClaimFile {
        namespace: "team-a".into(),
        name: name.into(),
        uid: uid.into(),
        compute_domain: ComputeDomainRef {
            namespace: "team-a".into(),
            name: domain.into(),
            uid: domain_uid.into(),
            num_nodes,
            isolation: Default::default(),
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(readiness),
        driver: None,
        device: None,
        admin_access: false,
    };
    let claim = ClaimRef {
        uid: file.uid.clone(),
        namespace: file.namespace.clone(),
        name: file.name.clone(),
    };
    (file, claim)
}
