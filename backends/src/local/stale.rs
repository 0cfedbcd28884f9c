//! The stale-claim check over the local backend: a claim is gone when its file is (as
//! `LocalDir::remove_claim` deletes a claim); a file that cannot be read or parsed
//! proves nothing. The local backend has no ComputeDomain objects (a domain is what
//! its claims' files name), so a domain is never gone by itself. A release is told in
//! the domain's event file.

use async_trait::async_trait;
use domaind_actors::model::{ClaimRef, DomainRef, NodeId};
use domaind_actors::ports::PortError;

use super::{CLAIM_FILE_LIMIT, ClaimFile, LocalDir, LocalEventSink, count_bad_file, read_json};
use crate::stale::{
    ClaimExistence, FoundClaim, FoundDomain, Lookup, StaleClaim, StaleClaimNotices, released_event,
};

/// [`ClaimExistence`] over the claim files.
#[derive(Debug, Clone)]
pub struct LocalClaimExistence {
    dir: LocalDir,
}

impl LocalClaimExistence {
    pub fn new(dir: LocalDir) -> Self {
        Self { dir }
    }
}

#[async_trait]
impl ClaimExistence for LocalClaimExistence {
    async fn claim(&self, claim: &ClaimRef) -> Lookup<FoundClaim> {
        let path = match self.dir.claim_path(&claim.uid) {
            Ok(path) => path,
            Err(error) => return Lookup::Failed(error.to_string()),
        };
        let read =
            tokio::task::spawn_blocking(move || read_json::<ClaimFile>(&path, CLAIM_FILE_LIMIT))
                .await;
        match read {
            Ok(Ok(None)) => Lookup::NotFound,
            // Files are named by uid: one of that name is this claim, allocated here
            // (claim files do not say where; the daemon that prepared it is here).
            Ok(Ok(Some(file))) => Lookup::Found(FoundClaim {
                uid: file.uid,
                allocated_here: true,
            }),
            Ok(Err(error)) => {
                if error.is_bad_file() {
                    count_bad_file("claim", error.reason());
                }
                Lookup::Failed(error.to_string())
            }
            Err(error) => Lookup::Failed(format!("reading the claim file failed: {error}")),
        }
    }

    async fn domain(&self, domain: &DomainRef) -> Lookup<FoundDomain> {
        Lookup::Found(domain.uid.0.clone())
    }
}

/// [`StaleClaimNotices`]: a line in the domain's event file.
#[derive(Debug, Clone)]
pub struct LocalStaleClaimNotices {
    events: LocalEventSink,
    node: NodeId,
}

impl LocalStaleClaimNotices {
    pub fn new(dir: LocalDir, node: impl Into<NodeId>) -> Self {
        let node = node.into();
        Self {
            events: LocalEventSink::new(dir, node.clone()),
            node,
        }
    }
}

#[async_trait]
impl StaleClaimNotices for LocalStaleClaimNotices {
    async fn released(&self, stale: &StaleClaim) -> Result<(), PortError> {
        let (events, domain) = (self.events.clone(), stale.domain.clone());
        let text = released_event(stale, &self.node);
        tokio::task::spawn_blocking(move || events.append_text(&domain, text))
            .await
            .map_err(|e| PortError::transient("event not recorded").with_source(e))?
            .map_err(PortError::from)
    }
}

#[cfg(test)]
mod tests {
    use domaind_actors::model::DomainUid;

    use super::*;
    use crate::local::ComputeDomainRef;
    use crate::stale::StaleReason;

    fn claim(uid: &str) -> ClaimRef {
        ClaimRef {
            uid: uid.into(),
            namespace: "team-a".into(),
            name: format!("claim-{uid}"),
        }
    }

    fn file(uid: &str) -> ClaimFile {
        ClaimFile {
            namespace: "team-a".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
            compute_domain: ComputeDomainRef {
                namespace: "team-a".into(),
                name: "training".into(),
                uid: "cd-1".into(),
                num_nodes: 0,
                isolation: Default::default(),
            },
            allocation_mode: Default::default(),
            readiness: None,
            driver: None,
            device: None,
            admin_access: false,
        }
    }

    #[tokio::test]
    async fn only_a_missing_file_is_a_missing_claim() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LocalDir::new(tmp.path());
        let existence = LocalClaimExistence::new(dir.clone());
        dir.write_claim(&file("here")).unwrap();
        std::fs::write(dir.claim_path("torn").unwrap(), b"{\"uid\": ").unwrap();
        assert_eq!(
            existence.claim(&claim("here")).await,
            Lookup::Found(FoundClaim {
                uid: "here".into(),
                allocated_here: true
            })
        );
        assert_eq!(existence.claim(&claim("gone")).await, Lookup::NotFound);
        assert!(matches!(
            existence.claim(&claim("torn")).await,
            Lookup::Failed(_)
        ));
        assert!(matches!(
            existence.claim(&claim("../escape")).await,
            Lookup::Failed(_)
        ));
    }

    #[tokio::test]
    async fn a_release_is_a_line_in_the_domains_event_file() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = LocalDir::new(tmp.path());
        let stale = StaleClaim {
            claim: claim("gone"),
            domain: DomainRef {
                uid: DomainUid("cd-1".into()),
                namespace: "team-a".into(),
                name: "training".into(),
                num_nodes: 0,
            },
            reason: StaleReason::ClaimDeleted,
        };
        LocalStaleClaimNotices::new(dir.clone(), "node-1")
            .released(&stale)
            .await
            .unwrap();
        let events = dir.read_events("cd-1").unwrap();
        assert_eq!(events.len(), 1);
        assert_eq!(events[0].reason, "StaleClaimReleased");
        assert_eq!(events[0].node, "node-1");
        assert!(events[0].message.contains("claim team-a/claim-gone (gone)"));
    }
}
