//! The ComputeDomain API as users see it: `resource.nvidia.com/v1beta1`. Field names
//! and values are the compatibility contract with existing manifests and tools.

mod status;

pub use status::{
    ComputeDomainNode, ComputeDomainStatus, Condition, ConditionStatus, READY_CONDITION,
    status_from_domain,
};
