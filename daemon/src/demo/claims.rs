//! The demo's claims: one per node of each domain, written as the local backend's
//! allocated ResourceClaims.

use super::*;

pub(super) fn claim_file(node: &str, domain: &DemoDomain, nodes: usize) -> ClaimFile {
    ClaimFile {
        namespace: domain.namespace.clone(),
        name: format!("{}-{node}", domain.name),
        uid: claim_uid(node),
        compute_domain: ComputeDomainRef {
            namespace: domain.namespace.clone(),
            name: domain.name.clone(),
            uid: domain.uid.clone(),
            num_nodes: nodes as u32,
            isolation: Default::default(),
        },
        allocation_mode: AllocationMode::Single,
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
        admin_access: false,
    }
}

pub(super) fn claim_uid(node: &str) -> String {
    format!("claim-{node}")
}

pub(super) fn claim_ref(node: &str, domain: &DemoDomain) -> ClaimRef {
    ClaimRef {
        uid: claim_uid(node),
        namespace: domain.namespace.clone(),
        name: format!("{}-{node}", domain.name),
    }
}

/// A random version-4 UUID: a restarted demo is a new domain.
pub(super) fn demo_uid() -> String {
    let mut bytes: [u8; 16] = rand::random();
    bytes[6] = (bytes[6] & 0x0f) | 0x40;
    bytes[8] = (bytes[8] & 0x3f) | 0x80;
    let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-{}-{}-{}",
        &hex[0..8],
        &hex[8..12],
        &hex[12..16],
        &hex[16..20],
        &hex[20..32]
    )
}

/// `demo-domain` for a rack of one clique, as always; `demo-domain-<n>` from 1 with
/// several.
pub(super) fn domain_name(clique: usize, cliques: usize) -> String {
    if cliques == 1 {
        "demo-domain".into()
    } else {
        format!("demo-domain-{}", clique + 1)
    }
}
