use domaind_actors::model::{
    AllocationMode, ClaimInfo, ClaimRef, DomainRef, DomainUid, ReadinessPolicy,
};
use domaind_actors::ports::{ClaimRecord, PrepareState};

pub(crate) fn record(uid: &str, state: PrepareState, mode: AllocationMode) -> ClaimRecord {
    ClaimRecord {
        claim: ClaimRef {
            uid: uid.into(),
            namespace: "team-a".into(),
            name: format!("claim-{uid}"),
        },
        info: ClaimInfo {
            domain: DomainRef {
                uid: DomainUid("cd-uid-1".into()),
                namespace: "team-a".into(),
                name: "training".into(),
                num_nodes: 4,
            },
            allocation_mode: mode,
            readiness: Some(ReadinessPolicy::Domain),
            devices: Vec::new(),
        },
        policy: ReadinessPolicy::Domain,
        state,
        devices: vec![format!(
            "k8s.compute-domain.nvidia.com/claim={uid}-channel-0"
        )],
    }
}
