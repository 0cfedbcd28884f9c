//! The kubelet's part, played by the harness: claim files written as the scheduler
//! would, prepares called in the background until they succeed, unprepares, and the
//! world told of each claim's phase as the answers come.

use std::time::Instant;

use anyhow::Context as _;
use domaind_actors::model::{AllocationMode, ClaimRef, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_kubelet_plugin::DraVersion;
use domaind_kubelet_plugin::client::KubeletClient;
use domaind_testbed::rack::{PrepareAnswer, prepare_until_ready};
use tokio::task::JoinHandle;

use super::{Harness, NAMESPACE, PREPARE_LIMIT, UNPREPARE_LIMIT};
use crate::invariants::ClaimPhase;

/// Prepare calls under way.
#[derive(Default)]
pub(super) struct Prepares(Vec<Prepare>);

struct Prepare {
    node: usize,
    claim: String,
    call: JoinHandle<anyhow::Result<PrepareAnswer>>,
}

impl Prepares {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// The claims whose prepares have not answered.
    pub(super) fn claims(&self) -> Vec<String> {
        self.0.iter().map(|p| p.claim.clone()).collect()
    }

    /// Takes out the calls that finished: node, claim, and success or why not.
    async fn take_finished(&mut self) -> Vec<(usize, String, Result<(), String>)> {
        let mut finished = Vec::new();
        let mut pending = Vec::new();
        for prepare in std::mem::take(&mut self.0) {
            if !prepare.call.is_finished() {
                pending.push(prepare);
                continue;
            }
            let answer = match prepare.call.await {
                Ok(Ok(Ok(_))) => Ok(()),
                Ok(Ok(Err(error))) => Err(error),
                Ok(Err(error)) => Err(format!("{error:#}")),
                Err(error) => Err(format!("the call panicked or was cancelled: {error}")),
            };
            finished.push((prepare.node, prepare.claim, answer));
        }
        self.0 = pending;
        finished
    }
}

/// The claim file of `uid`: a claim of the run's domain, one device.
pub(super) fn claim_file(domain: &ComputeDomainRef, uid: &str) -> ClaimFile {
    ClaimFile {
        namespace: NAMESPACE.into(),
        name: uid.into(),
        uid: uid.into(),
        compute_domain: domain.clone(),
        allocation_mode: AllocationMode::Single,
        // The barrier: a prepare answers once every member is ready.
        readiness: Some(ReadinessPolicy::Domain),
        driver: None,
        device: None,
        admin_access: false,
    }
}

pub(super) fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: NAMESPACE.into(),
        name: uid.into(),
    }
}

impl Harness {
    /// The claim that makes `node` a member from formation on.
    pub(super) fn own_claim(&self, node: usize) -> String {
        format!("claim-{}", self.world.nodes[node].name)
    }

    /// The claims `node` holds or is being given.
    pub(super) fn held_claims(&self, node: usize) -> Vec<String> {
        self.world.nodes[node]
            .claims
            .iter()
            .filter(|(_, p)| **p != ClaimPhase::Released)
            .map(|(uid, _)| uid.clone())
            .collect()
    }

    /// Allocates `uid` to `node` (the claim file, of the domain the world says `uid`
    /// is of) and calls prepare in the background, as the kubelet does, until it
    /// succeeds.
    pub(super) fn begin_prepare(&mut self, node: usize, uid: &str) {
        let domain = self
            .sharing
            .get(self.world.domain_of(uid))
            .unwrap_or(&self.domain);
        if let Err(error) = self.rack.local().write_claim(&claim_file(domain, uid)) {
            self.liveness(Some(node), format!("cannot write claim {uid}: {error}"));
            return;
        }
        self.world
            .set_claim(node, uid, ClaimPhase::Preparing, Instant::now());
        let socket = self.rack.node(node).dra_socket();
        let claim = claim_ref(uid);
        let call = tokio::spawn(async move {
            prepare_until_ready(&socket, &claim, DraVersion::V1, PREPARE_LIMIT).await
        });
        self.prepares.0.push(Prepare {
            node,
            claim: uid.to_owned(),
            call,
        });
    }

    /// Prepare calls that finished: their claims are prepared, or the failure is a
    /// violation (the kubelet would retry forever; we had a minute).
    pub(super) async fn collect_prepares(&mut self) {
        for (node, claim, answer) in self.prepares.take_finished().await {
            match answer {
                Ok(()) => {
                    self.world
                        .set_claim(node, &claim, ClaimPhase::Prepared, Instant::now());
                }
                Err(error) => self.liveness(
                    Some(node),
                    format!("prepare of {claim} did not succeed within {PREPARE_LIMIT:?}: {error}"),
                ),
            }
        }
    }

    /// Unprepares `uid` on `node` and removes its claim file; whether it succeeded.
    /// The kubelet unprepares a claim once its pod is gone: if it was the node's last
    /// claim of its domain, the job there ended first, its imports with it.
    pub(super) async fn unprepare(&mut self, node: usize, uid: &str) -> bool {
        let domain = self.world.domain_of(uid).to_owned();
        let stays = self.world.nodes[node].claims.iter().any(|(other, phase)| {
            other != uid && *phase != ClaimPhase::Released && self.world.domain_of(other) == domain
        });
        if !stays {
            self.end_imports(node, &domain);
        }
        self.world
            .set_claim(node, uid, ClaimPhase::Unpreparing, Instant::now());
        let socket = self.rack.node(node).dra_socket();
        let claim = claim_ref(uid);
        let call = async {
            let client = KubeletClient::connect(socket).await?;
            let mut answers = client.unprepare(&[claim], DraVersion::V1).await?;
            anyhow::Ok(answers.pop().context("no answer for the claim")?.result)
        };
        let error = match tokio::time::timeout(UNPREPARE_LIMIT, call).await {
            Ok(Ok(Ok(()))) => None,
            Ok(Ok(Err(error))) => Some(error),
            Ok(Err(error)) => Some(format!("{error:#}")),
            Err(_) => Some(format!("no answer within {UNPREPARE_LIMIT:?}")),
        };
        match error {
            None => {
                self.world
                    .set_claim(node, uid, ClaimPhase::Released, Instant::now());
                let _ = self.rack.local().remove_claim(uid);
                true
            }
            Some(error) => {
                self.liveness(Some(node), format!("unprepare of {uid} failed: {error}"));
                false
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_claim_waits_for_the_whole_domain() {
        let domain = ComputeDomainRef {
            namespace: NAMESPACE.into(),
            name: "d".into(),
            uid: "chaos-0000000000000001".into(),
            num_nodes: 0,
            isolation: Default::default(),
        };
        let file = claim_file(&domain, "claim-node-01");
        // Domain readiness: a prepare that answers means every member was Ready,
        // which formation and each heal rely on.
        assert_eq!(file.readiness, Some(ReadinessPolicy::Domain));
        assert_eq!(file.compute_domain.uid, domain.uid);
        assert_eq!(
            (file.uid.as_str(), file.name.as_str()),
            ("claim-node-01", "claim-node-01")
        );
        let claim = claim_ref("claim-node-01");
        assert_eq!(
            (claim.uid.as_str(), claim.namespace.as_str()),
            (file.uid.as_str(), file.namespace.as_str())
        );
    }

    #[tokio::test]
    async fn finished_prepares_are_taken_out_and_the_rest_stay() {
        let mut prepares = Prepares::default();
        let (release, released) = tokio::sync::oneshot::channel::<()>();
        let calls: [(&str, JoinHandle<anyhow::Result<PrepareAnswer>>); 4] = [
            ("ok", tokio::spawn(async { Ok(Ok(Vec::new())) })),
            (
                "refused",
                tokio::spawn(async { Ok(Err("no device".into())) }),
            ),
            (
                "unreachable",
                tokio::spawn(async { Err(anyhow::anyhow!("no socket")) }),
            ),
            (
                "waiting",
                tokio::spawn(async move {
                    let _ = released.await;
                    Ok(Ok(Vec::new()))
                }),
            ),
        ];
        for (node, (claim, call)) in calls.into_iter().enumerate() {
            prepares.0.push(Prepare {
                node,
                claim: claim.into(),
                call,
            });
        }
        // Let the three that need nothing finish; the fourth waits for `release`.
        while !prepares.0[..3].iter().all(|p| p.call.is_finished()) {
            tokio::task::yield_now().await;
        }
        let finished = prepares.take_finished().await;
        assert_eq!(
            finished,
            vec![
                (0, "ok".to_owned(), Ok(())),
                (1, "refused".to_owned(), Err("no device".to_owned())),
                (2, "unreachable".to_owned(), Err("no socket".to_owned())),
            ]
        );
        assert_eq!(prepares.claims(), vec!["waiting".to_owned()]);
        release.send(()).unwrap();
        while !prepares.0[0].call.is_finished() {
            tokio::task::yield_now().await;
        }
        assert_eq!(
            prepares.take_finished().await,
            vec![(3, "waiting".to_owned(), Ok(()))]
        );
        assert!(prepares.is_empty());
    }
}
