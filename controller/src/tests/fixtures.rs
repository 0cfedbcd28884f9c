//! Objects as the API server would hand them to the controller.

use domaind_kube_api::crd::{
    ChannelAllocationMode, ComputeDomain, ComputeDomainChannelSpec, ComputeDomainSpec,
    ResourceClaimTemplateRef,
};

pub const UID: &str = "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11";
pub const NAMESPACE: &str = "team-a";
pub const NAME: &str = "training";
pub const TEMPLATE: &str = "training-channel";

/// A live CD without our finalizer, as just created.
pub fn compute_domain() -> ComputeDomain {
    let mut cd = ComputeDomain::new(
        NAME,
        ComputeDomainSpec {
            num_nodes: 0,
            channel: ComputeDomainChannelSpec {
                resource_claim_template: ResourceClaimTemplateRef {
                    name: TEMPLATE.into(),
                },
                allocation_mode: ChannelAllocationMode::Single,
            },
            isolation: Default::default(),
        },
    );
    cd.metadata.namespace = Some(NAMESPACE.into());
    cd.metadata.uid = Some(UID.into());
    cd.metadata.generation = Some(1);
    cd.metadata.resource_version = Some("100".into());
    cd
}

/// The same CD with our finalizer.
pub fn finalized() -> ComputeDomain {
    let mut cd = compute_domain();
    cd.metadata.finalizers = Some(vec![domaind_kube_api::names::FINALIZER.into()]);
    cd
}

/// The CD after `kubectl delete`: held by our finalizer.
pub fn deleting() -> ComputeDomain {
    let mut cd = finalized();
    cd.metadata.deletion_timestamp = Some(k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        "2026-11-22T10:00:00Z".parse().expect("a valid timestamp"),
    ));
    cd
}
