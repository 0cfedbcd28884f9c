//! Which checkpointed claims are stale, given what the API server (or the local
//! backend's files) said about them. Pure.
//!
//! A claim is stale when the answer is definite: its ResourceClaim is gone (404), was
//! recreated under the same name (another uid: a different claim), is no longer
//! allocated to this node, or its ComputeDomain is gone or recreated. A failed lookup
//! (timeout, 5xx, RBAC, throttling) decides nothing: releasing a claim whose pod still
//! runs would take the node out of its domain under a live workload, while keeping a
//! stale one a little longer only delays the next domain.

use std::collections::BTreeMap;
use std::fmt;

use domaind_actors::model::{ClaimRef, DomainRef, DomainUid};
use domaind_actors::ports::ClaimRecord;

/// What a lookup by namespace and name found.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Lookup<T> {
    Found(T),
    /// A definite "no such object".
    NotFound,
    /// No definite answer; why, for the log.
    Failed(String),
}

impl<T> Lookup<T> {
    fn failure(&self) -> Option<&str> {
        match self {
            Self::Failed(why) => Some(why),
            _ => None,
        }
    }
}

const NOT_LOOKED_UP: &str = "not looked up";

/// A ResourceClaim found under the checkpointed claim's namespace and name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FoundClaim {
    pub uid: String,
    /// Whether its allocation still places our driver's devices on this node.
    pub allocated_here: bool,
}

/// A ComputeDomain found under the checkpointed domain's namespace and name: its uid.
pub type FoundDomain = String;

/// Why a checkpointed claim is stale.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StaleReason {
    ClaimDeleted,
    ClaimRecreated { uid: String },
    ClaimNotAllocatedHere,
    DomainDeleted,
    DomainRecreated { uid: String },
}

impl StaleReason {
    /// The metric label.
    pub fn label(&self) -> &'static str {
        match self {
            Self::ClaimDeleted => "claim_deleted",
            Self::ClaimRecreated { .. } => "claim_recreated",
            Self::ClaimNotAllocatedHere => "claim_not_allocated_here",
            Self::DomainDeleted => "domain_deleted",
            Self::DomainRecreated { .. } => "domain_recreated",
        }
    }
}

impl fmt::Display for StaleReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::ClaimDeleted => write!(f, "the ResourceClaim no longer exists"),
            Self::ClaimRecreated { uid } => write!(
                f,
                "the ResourceClaim of that name is another claim now (uid {uid})"
            ),
            Self::ClaimNotAllocatedHere => {
                write!(f, "the ResourceClaim is no longer allocated to this node")
            }
            Self::DomainDeleted => write!(f, "its ComputeDomain no longer exists"),
            Self::DomainRecreated { uid } => write!(
                f,
                "the ComputeDomain of that name is another domain now (uid {uid})"
            ),
        }
    }
}

/// A checkpointed claim to release, and why.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct StaleClaim {
    pub claim: ClaimRef,
    pub domain: DomainRef,
    pub reason: StaleReason,
}

impl fmt::Display for StaleClaim {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (claim, domain) = (&self.claim, &self.domain);
        write!(
            f,
            "claim {}/{} ({}) of ComputeDomain {}/{} ({}): {}",
            claim.namespace,
            claim.name,
            claim.uid,
            domain.namespace,
            domain.name,
            domain.uid,
            self.reason
        )
    }
}

/// The verdict on every checkpointed claim.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Verdicts {
    pub stale: Vec<StaleClaim>,
    /// Claims no definite answer was had for: `(claim uid, why)`.
    pub undecided: Vec<(String, String)>,
}

/// Judges `records` on the lookups: `claims` by claim uid, `domains` by the domain uid
/// the record names. A record with no lookup is undecided.
pub fn stale_claims(
    records: &[ClaimRecord],
    claims: &BTreeMap<String, Lookup<FoundClaim>>,
    domains: &BTreeMap<DomainUid, Lookup<FoundDomain>>,
) -> Verdicts {
    let mut verdicts = Verdicts::default();
    let (claim_not_asked, domain_not_asked) = (
        Lookup::Failed(NOT_LOOKED_UP.into()),
        Lookup::Failed(NOT_LOOKED_UP.into()),
    );
    for record in records {
        let claim = claims.get(&record.claim.uid).unwrap_or(&claim_not_asked);
        let domain = domains
            .get(&record.info.domain.uid)
            .unwrap_or(&domain_not_asked);
        // Any definite sign wins over a failed lookup of the other object.
        let reason = match claim {
            Lookup::NotFound => Some(StaleReason::ClaimDeleted),
            Lookup::Found(found) if found.uid != record.claim.uid => {
                Some(StaleReason::ClaimRecreated {
                    uid: found.uid.clone(),
                })
            }
            Lookup::Found(found) if !found.allocated_here => {
                Some(StaleReason::ClaimNotAllocatedHere)
            }
            Lookup::Found(_) | Lookup::Failed(_) => None,
        }
        .or_else(|| match domain {
            Lookup::NotFound => Some(StaleReason::DomainDeleted),
            Lookup::Found(uid) if *uid != record.info.domain.uid.0 => {
                Some(StaleReason::DomainRecreated { uid: uid.clone() })
            }
            Lookup::Found(_) | Lookup::Failed(_) => None,
        });
        if let Some(reason) = reason {
            verdicts.stale.push(StaleClaim {
                claim: record.claim.clone(),
                domain: record.info.domain.clone(),
                reason,
            });
            continue;
        }
        let failures: Vec<&str> = [claim.failure(), domain.failure()]
            .into_iter()
            .flatten()
            .collect();
        if !failures.is_empty() {
            verdicts
                .undecided
                .push((record.claim.uid.clone(), failures.join("; ")));
        }
    }
    verdicts
}

#[cfg(test)]
mod tests {
    use domaind_actors::model::{AllocationMode, ClaimInfo, ReadinessPolicy};
    use domaind_actors::ports::PrepareState;

    use super::*;

    fn record(claim: &str, domain: &str) -> ClaimRecord {
        ClaimRecord {
            claim: ClaimRef {
                uid: claim.into(),
                namespace: "team-a".into(),
                name: format!("claim-{claim}"),
            },
            info: ClaimInfo {
                domain: DomainRef {
                    uid: DomainUid(domain.into()),
                    namespace: "team-a".into(),
                    name: format!("cd-{domain}"),
                    num_nodes: 0,
                },
                allocation_mode: AllocationMode::Single,
                readiness: None,
                devices: Vec::new(),
                isolation: Default::default(),
                admin_access: false,
            },
            policy: ReadinessPolicy::Local,
            state: PrepareState::PrepareCompleted,
            devices: Vec::new(),
            channel: None,
        }
    }

    fn here(uid: &str) -> Lookup<FoundClaim> {
        Lookup::Found(FoundClaim {
            uid: uid.into(),
            allocated_here: true,
        })
    }

    fn failed() -> Lookup<FoundClaim> {
        Lookup::Failed("get ResourceClaim: 503".into())
    }

    fn judge(
        claim: Lookup<FoundClaim>,
        domain: Lookup<FoundDomain>,
    ) -> (Option<StaleReason>, bool) {
        let records = [record("c1", "d1")];
        let claims = BTreeMap::from([("c1".to_owned(), claim)]);
        let domains = BTreeMap::from([(DomainUid("d1".into()), domain)]);
        let verdicts = stale_claims(&records, &claims, &domains);
        (
            verdicts.stale.first().map(|s| s.reason.clone()),
            !verdicts.undecided.is_empty(),
        )
    }

    fn found(uid: &str) -> Lookup<FoundDomain> {
        Lookup::Found(uid.into())
    }

    #[test]
    fn a_claim_and_domain_that_exist_are_kept() {
        assert_eq!(judge(here("c1"), found("d1")), (None, false));
    }

    #[test]
    fn a_deleted_or_recreated_claim_is_stale() {
        assert_eq!(
            judge(Lookup::NotFound, found("d1")),
            (Some(StaleReason::ClaimDeleted), false)
        );
        assert_eq!(
            judge(here("c2"), found("d1")),
            (
                Some(StaleReason::ClaimRecreated { uid: "c2".into() }),
                false
            )
        );
        let moved = Lookup::Found(FoundClaim {
            uid: "c1".into(),
            allocated_here: false,
        });
        assert_eq!(
            judge(moved, found("d1")),
            (Some(StaleReason::ClaimNotAllocatedHere), false)
        );
    }

    #[test]
    fn a_deleted_or_recreated_domain_makes_its_claims_stale() {
        assert_eq!(
            judge(here("c1"), Lookup::NotFound),
            (Some(StaleReason::DomainDeleted), false)
        );
        assert_eq!(
            judge(here("c1"), found("d2")),
            (
                Some(StaleReason::DomainRecreated { uid: "d2".into() }),
                false
            )
        );
    }

    #[test]
    fn a_failed_lookup_never_releases_but_a_definite_one_still_does() {
        assert_eq!(judge(failed(), found("d1")), (None, true));
        assert_eq!(
            judge(here("c1"), Lookup::Failed("timeout".into())),
            (None, true)
        );
        assert_eq!(
            judge(failed(), Lookup::Failed("timeout".into())),
            (None, true)
        );
        // The claim's ComputeDomain is definitely gone, whatever the claim lookup said.
        assert_eq!(
            judge(failed(), Lookup::NotFound),
            (Some(StaleReason::DomainDeleted), false)
        );
        assert_eq!(
            judge(Lookup::NotFound, Lookup::Failed("timeout".into())),
            (Some(StaleReason::ClaimDeleted), false)
        );
    }

    #[test]
    fn a_claim_not_looked_up_is_undecided() {
        let records = [record("c1", "d1"), record("c2", "d1")];
        let claims = BTreeMap::from([("c1".to_owned(), Lookup::NotFound)]);
        let domains = BTreeMap::from([(DomainUid("d1".into()), found("d1"))]);
        let verdicts = stale_claims(&records, &claims, &domains);
        assert_eq!(verdicts.stale.len(), 1);
        assert_eq!(verdicts.stale[0].claim.uid, "c1");
        assert_eq!(
            verdicts.undecided,
            [("c2".to_owned(), "not looked up".to_owned())]
        );
        assert_eq!(
            verdicts.stale[0].to_string(),
            "claim team-a/claim-c1 (c1) of ComputeDomain team-a/cd-d1 (d1): the ResourceClaim \
             no longer exists"
        );
    }
}
