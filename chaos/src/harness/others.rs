//! The other cliques of a rack run with `--cliques K`: rack nodes past the first
//! clique. No fault touches them; each clique forms a ComputeDomain of its own at the
//! start and keeps it, so that its nodes have gossip members and IMEX peers for the
//! cliques invariant to look at on every observation, beside the first clique's
//! faults. A daemon of theirs that dies on its own is a crash like any other.

use domaind_backends::local::ComputeDomainRef;
use domaind_kubelet_plugin::DraVersion;
use domaind_testbed::rack::{PrepareAnswer, prepare_until_ready};
use tokio::task::JoinHandle;

use super::claims::{claim_file, claim_ref};
use super::{Harness, PREPARE_LIMIT, START_LIMIT};
use crate::cliques::{CliqueSighting, crossings};
use crate::invariants::{Invariant, Violation};
use crate::observe;

/// The other cliques' nodes (rack indices) and their prepares under way.
#[derive(Default)]
pub(super) struct Others {
    pub(super) nodes: Vec<usize>,
    prepares: Vec<(usize, String, JoinHandle<anyhow::Result<PrepareAnswer>>)>,
}

impl Others {
    pub(super) fn new(first_clique: usize, rack_nodes: usize) -> Self {
        Self {
            nodes: (first_clique..rack_nodes).collect(),
            prepares: Vec::new(),
        }
    }
}

impl Harness {
    /// The domain of clique `clique` (1 and up): the run's, with the clique's number.
    fn other_domain(&self, clique: usize) -> ComputeDomainRef {
        ComputeDomainRef {
            name: format!("{}-clique-{clique}", self.domain.name),
            uid: format!("{}-clique-{clique}", self.domain.uid),
            ..self.domain.clone()
        }
    }

    /// Waits for the other cliques' daemons, then gives each node a claim of its
    /// clique's domain and prepares it in the background.
    pub(super) fn begin_other_cliques(&mut self) {
        for node in self.others.nodes.clone() {
            if let Err(error) =
                tokio::task::block_in_place(|| self.rack.wait_ready(node, START_LIMIT))
            {
                let name = self.rack.node(node).name().to_owned();
                self.record(Violation::new(
                    Invariant::Liveness,
                    Some(&name),
                    format!("not up within {START_LIMIT:?}: {error:#}"),
                ));
                continue;
            }
            let domain = self.other_domain(self.rack.clique_of(node));
            let uid = format!("claim-{}", self.rack.node(node).name());
            if let Err(error) = self.rack.local().write_claim(&claim_file(&domain, &uid)) {
                self.liveness(None, format!("cannot write claim {uid}: {error}"));
                continue;
            }
            let socket = self.rack.node(node).dra_socket();
            let claim = claim_ref(&uid);
            let call = tokio::spawn(async move {
                prepare_until_ready(&socket, &claim, DraVersion::V1, PREPARE_LIMIT).await
            });
            self.others.prepares.push((node, uid, call));
        }
    }

    /// Waits for the other cliques' prepares: each domain must form.
    pub(super) async fn finish_other_cliques(&mut self) {
        let formed = self.others.prepares.len();
        for (node, uid, call) in std::mem::take(&mut self.others.prepares) {
            let error = match call.await {
                Ok(Ok(Ok(_))) => continue,
                Ok(Ok(Err(error))) => error,
                Ok(Err(error)) => format!("{error:#}"),
                Err(error) => format!("the call panicked or was cancelled: {error}"),
            };
            let name = self.rack.node(node).name().to_owned();
            self.record(Violation::new(
                Invariant::Liveness,
                Some(&name),
                format!("prepare of {uid} did not succeed within {PREPARE_LIMIT:?}: {error}"),
            ));
        }
        if formed > 0 {
            self.say(&format!(
                "the other {} cliques formed their domains ({formed} claims prepared)",
                self.config.cliques - 1
            ));
        }
    }

    /// A daemon of another clique that exited on its own: a crash, started again.
    pub(super) fn reap_other(&mut self, node: usize) {
        let name = self.rack.node(node).name().to_owned();
        let code = self.reap_crashed(node, &name);
        let again = self.rack.start(node).map_err(|e| format!("{e:#}"));
        self.record(Violation::new(
            Invariant::Crash,
            Some(&name),
            format!(
                "domaind of another clique exited on its own ({code:?}); started again: {again:?}"
            ),
        ));
    }

    /// What the other cliques' nodes show of their peers now (`/state`, hosts file).
    pub(super) async fn other_sightings(&self) -> Vec<CliqueSighting> {
        let reads = self.others.nodes.iter().map(|&i| {
            let node = self.rack.node(i);
            let (name, info, hosts) = (
                node.name().to_owned(),
                node.info().cloned(),
                node.imex_dir().join("hosts"),
            );
            async move {
                let view = match info {
                    Some(info) => observe::view(&info).await.ok(),
                    None => None,
                };
                let hosts = observe::read_hosts(&hosts);
                CliqueSighting::new(&name, view.as_ref(), hosts.read())
            }
        });
        futures::future::join_all(reads).await
    }

    /// The cliques invariant over every node of the rack, this observation.
    pub(super) async fn check_cliques(&mut self) {
        if self.config.cliques < 2 {
            return;
        }
        let mut seen = self.other_sightings().await;
        if let Some((world, observation)) = &self.last {
            seen.extend(
                world
                    .nodes
                    .iter()
                    .zip(&observation.nodes)
                    .map(|(record, node)| {
                        CliqueSighting::new(&record.name, node.view.as_ref(), node.hosts.read())
                    }),
            );
        }
        for violation in crossings(&self.cliques, &seen) {
            self.record(violation);
        }
    }
}
