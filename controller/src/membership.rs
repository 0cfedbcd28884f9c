//! Whether any node is still a member of a ComputeDomain, judged from the API.
//!
//! A node is a member while a pod there may hold one of the domain's channels, and that
//! is while a ResourceClaim whose allocation carries our opaque config with this
//! domain's uid stays allocated: the scheduler allocated it to a node, the kubelet
//! prepared it there, and only once every pod using it is gone is it deallocated (or
//! deleted). Claims name the domain only by uid, and the node daemons refuse a claim in
//! another namespace than the domain's, so the domain's namespace holds every claim
//! that counts. An admin claim (`adminAccess`: a monitoring pod's) joins no domain on
//! its node and does not count, wherever it is.
//!
//! The CD's `status.nodes` is not the answer: it is written by the nodes themselves, so
//! a node that died keeps its entry until a survivor notices, and a domain whose nodes
//! all died keeps them for good. An allocated claim is released by Kubernetes (pod
//! garbage collection, then the claim controller) whether or not the node comes back.

use k8s_openapi::api::resource::v1::ResourceClaim;
use kube::ResourceExt as _;

use domaind_kube_api::ChannelConfig;

/// The names of the claims in `claims` that are allocated with `driver`'s channel config
/// for the domain `domain_uid`, sorted.
pub fn allocated_claims(claims: &[ResourceClaim], driver: &str, domain_uid: &str) -> Vec<String> {
    let mut members: Vec<String> = claims
        .iter()
        .filter(|claim| allocated_for(claim, driver, domain_uid))
        .map(|claim| claim.name_any())
        .collect();
    members.sort();
    members
}

fn allocated_for(claim: &ResourceClaim, driver: &str, domain_uid: &str) -> bool {
    // The allocation's config is what the node daemon reads (the claim's own, copied at
    // allocation, and any from the device class).
    let Some(allocation) = claim.status.as_ref().and_then(|s| s.allocation.as_ref()) else {
        return false;
    };
    let results = allocation
        .devices
        .as_ref()
        .and_then(|devices| devices.results.as_ref());
    let ours = || results.into_iter().flatten().filter(|r| r.driver == driver);
    if ours().next().is_some() && ours().all(|r| r.admin_access == Some(true)) {
        return false;
    }
    let configs = allocation
        .devices
        .as_ref()
        .and_then(|devices| devices.config.as_ref());
    configs.into_iter().flatten().any(|config| {
        config.opaque.as_ref().is_some_and(|opaque| {
            opaque.driver == driver
                && ChannelConfig::domain_of(&opaque.parameters.0) == Some(domain_uid)
        })
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    const DRIVER: &str = "compute-domain.nvidia.com";
    const DOMAIN: &str = "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11";

    fn reference_claim() -> ResourceClaim {
        serde_json::from_str(
            &std::fs::read_to_string(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../kube-api/fixtures/resourceclaim-allocated.json"
            ))
            .unwrap(),
        )
        .unwrap()
    }

    #[test]
    fn a_claim_the_scheduler_allocated_is_a_member() {
        let claims = [reference_claim()];
        assert_eq!(
            allocated_claims(&claims, DRIVER, DOMAIN),
            vec!["worker-0-cd-0-2csgh".to_string()]
        );
        assert!(allocated_claims(&claims, DRIVER, "another-domain").is_empty());
        assert!(allocated_claims(&claims, "another.driver", DOMAIN).is_empty());
    }

    #[test]
    fn a_deallocated_or_foreign_claim_is_not() {
        let mut deallocated = reference_claim();
        deallocated.status.as_mut().unwrap().allocation = None;
        let mut unallocated = reference_claim();
        unallocated.status = None;
        // The spec names the domain, but only the allocation counts.
        assert!(allocated_claims(&[deallocated, unallocated], DRIVER, DOMAIN).is_empty());

        let mut other_kind = reference_claim();
        let allocation = other_kind
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap();
        let config = &mut allocation
            .devices
            .as_mut()
            .unwrap()
            .config
            .as_mut()
            .unwrap()[0];
        config.opaque.as_mut().unwrap().parameters.0["kind"] = "ComputeDomainDaemonConfig".into();
        assert!(allocated_claims(&[other_kind], DRIVER, DOMAIN).is_empty());
    }

    #[test]
    fn an_admin_claim_is_no_member() {
        let mut admin = reference_claim();
        let results = admin
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap();
        results[0].admin_access = Some(true);
        let mut foreign = results[0].clone();
        foreign.driver = "gpu.nvidia.com".into();
        foreign.admin_access = None;
        results.push(foreign);
        assert!(allocated_claims(&[admin.clone()], DRIVER, DOMAIN).is_empty());

        // One of our results without adminAccess: the node daemon refuses such a claim,
        // but while it is allocated it may yet be a member.
        let results = admin
            .status
            .as_mut()
            .unwrap()
            .allocation
            .as_mut()
            .unwrap()
            .devices
            .as_mut()
            .unwrap()
            .results
            .as_mut()
            .unwrap();
        let mut member = results[0].clone();
        member.admin_access = Some(false);
        results.push(member);
        assert_eq!(allocated_claims(&[admin], DRIVER, DOMAIN).len(), 1);
    }

    #[test]
    fn a_claim_being_deleted_is_still_a_member_while_allocated() {
        let mut deleting = reference_claim();
        deleting.metadata.deletion_timestamp =
            Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                "2026-11-22T05:00:00Z".parse().unwrap(),
            ));
        deleting.metadata.name = Some("b".into());
        let mut other = reference_claim();
        other.metadata.name = Some("a".into());
        assert_eq!(
            allocated_claims(&[deleting, other], DRIVER, DOMAIN),
            vec!["a", "b"]
        );
    }
}
