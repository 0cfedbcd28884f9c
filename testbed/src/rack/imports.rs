//! The job a test or the demo runs on a rack, as far as IMEX goes: on each node, an
//! import of memory from every peer, held through imex-sim's command service
//! ([`crate::imex_sim::imports`]). Whether those imports survive a fault is what a
//! running job sees of it.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use super::LocalRack;
use crate::imex_sim::imports::Import;
use crate::imex_sim::run_ctl;

/// How long one question to a node's imex-sim may take.
const ASK_WAIT: Duration = Duration::from_secs(2);
/// How long an import waits for its IMEX to link to every peer, and how often it asks.
/// A domain is Ready before its IMEX has loaded a reload it defers (issue 29).
const IMPORT_LIMIT: Duration = Duration::from_secs(15);
const IMPORT_RETRY: Duration = Duration::from_millis(50);

/// One import a node's job holds: which node, and its id there.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct HeldImport {
    pub node: usize,
    pub id: u64,
}

impl LocalRack {
    async fn ask_imex(&self, index: usize, command: &str) -> anyhow::Result<String> {
        let config = self.nodes[index].imex_dir().join("config.cfg");
        let reply = run_ctl(&config, command, ASK_WAIT)
            .await
            .map_err(anyhow::Error::msg)
            .with_context(|| format!("asking {}'s IMEX {command:?}", self.nodes[index].name()))?;
        Ok(reply.trim().to_owned())
    }

    /// Node `index`'s job imports from every other node of its clique, as soon as its
    /// IMEX is linked to each (within [`IMPORT_LIMIT`]).
    pub async fn import(&self, index: usize) -> anyhow::Result<HeldImport> {
        let peers: Vec<usize> = self
            .clique_members(self.clique_of(index))
            .into_iter()
            .filter(|peer| *peer != index)
            .collect();
        self.import_from(index, &peers).await
    }

    /// Node `index`'s job imports from the nodes `peers` (its domain's other members),
    /// as soon as its IMEX is linked to each (within [`IMPORT_LIMIT`]).
    pub async fn import_from(&self, index: usize, peers: &[usize]) -> anyhow::Result<HeldImport> {
        let peers: Vec<String> = peers
            .iter()
            .map(|peer| self.nodes[*peer].ip().to_string())
            .collect();
        let command = format!("import {}", peers.join(","));
        let deadline = Instant::now() + IMPORT_LIMIT;
        loop {
            let reply = self.ask_imex(index, &command).await?;
            if let Some(id) = reply.strip_prefix("IMPORT ").and_then(|id| id.parse().ok()) {
                return Ok(HeldImport { node: index, id });
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "{}'s IMEX would not import within {IMPORT_LIMIT:?}: {reply}",
                    self.nodes[index].name()
                );
            }
            tokio::time::sleep(IMPORT_RETRY).await;
        }
    }

    /// What became of `held`: each import, or why it is gone altogether (its IMEX was
    /// restarted, or does not answer), as a reason it broke.
    pub async fn check_imports(
        &self,
        held: &[HeldImport],
    ) -> BTreeMap<HeldImport, Result<Import, String>> {
        let mut nodes: Vec<usize> = held.iter().map(|h| h.node).collect();
        nodes.sort_unstable();
        nodes.dedup();
        let mut out = BTreeMap::new();
        for node in nodes {
            let listed = self
                .ask_imex(node, "imports")
                .await
                .and_then(|reply| {
                    serde_json::from_str::<BTreeMap<u64, Import>>(&reply)
                        .with_context(|| format!("unreadable imports: {reply}"))
                })
                .map_err(|e| format!("{e:#}"));
            for import in held.iter().filter(|h| h.node == node) {
                let found = match &listed {
                    Ok(listed) => listed
                        .get(&import.id)
                        .cloned()
                        .ok_or_else(|| "gone: the IMEX holding it was restarted".to_owned()),
                    Err(error) => Err(error.clone()),
                };
                out.insert(*import, found);
            }
        }
        out
    }

    /// The imports of `held` that broke, each with why.
    pub async fn broken_imports(&self, held: &[HeldImport]) -> Vec<(HeldImport, String)> {
        self.check_imports(held)
            .await
            .into_iter()
            .filter_map(|(import, found)| match found {
                Ok(Import { broken: None, .. }) => None,
                Ok(Import {
                    broken: Some(why), ..
                }) => Some((import, why)),
                Err(why) => Some((import, why)),
            })
            .collect()
    }
}
