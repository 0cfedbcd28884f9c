//! The demo's daemon kill (issue 28): node-04's daemon alone SIGKILLed while its IMEX
//! runner keeps IMEX, started again, and what the domain's jobs saw of it.

use std::time::{Duration, Instant};

use domaind_actors::model::Phase;
use domaind_kube_api::crd;
use domaind_testbed::rack::{HeldImport, LocalRack};
use serde::Serialize;

use super::table::{Observer, Snapshot};
use super::{DemoDomain, STEP_LIMIT, since};

/// A daemon killed where a runner keeps IMEX, as a crash or an upgrade would: what
/// the domain's jobs saw of it.
#[derive(Debug, Clone, Serialize)]
pub struct DaemonKill {
    /// The status and every survivor's view stayed Ready in every look, and the Ready
    /// condition never changed.
    pub ready_throughout: bool,
    /// Otherwise, the first look that was not, or the condition before and after.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub not_ready_seen: Option<String>,
    /// Imports held by the jobs (one per node, from every peer), and how many broke.
    pub imports: usize,
    pub imports_broken: usize,
    /// The node's IMEX is the same process afterwards.
    pub same_imex: bool,
    /// Restart → the restarted node's view and the status Ready with every node.
    pub back_ms: u64,
}

/// How long a killed daemon stays down before it is started again: past gossip's
/// verdict (its pulse silent 2 s) and the survivors' dead grace (1 s), so that the
/// demo shows them keeping the node.
const DAEMON_DOWN: Duration = Duration::from_secs(4);

/// Kills each victim's daemon alone, leaves it down for [`DAEMON_DOWN`], starts it
/// again, and says what the jobs saw, per clique.
pub(super) async fn daemon_kill(
    rack: &mut LocalRack,
    observer: &mut Observer,
    domains: &[DemoDomain],
    cliques: &[Vec<usize>],
    victims: &[usize],
    imports: &[HeldImport],
) -> anyhow::Result<Vec<DaemonKill>> {
    let names: Vec<String> = victims
        .iter()
        .map(|v| rack.node(*v).name().to_owned())
        .collect();
    observer.say(&format!(
        "Killing the daemon of {} with SIGKILL: its IMEX runner keeps IMEX running",
        names.join(", ")
    ));
    let ready_condition = |rack: &LocalRack| -> Vec<Option<(crd::Phase, crd::Condition)>> {
        domains
            .iter()
            .map(|domain| {
                let status = rack.local().read_status(&domain.uid).ok().flatten()?;
                let ready = status.condition(crd::READY_CONDITION)?.clone();
                Some((status.status, ready))
            })
            .collect()
    };
    let condition = ready_condition(rack);
    let imex = tokio::task::block_in_place(|| rack.imex_daemons())?;
    tokio::task::block_in_place(|| victims.iter().try_for_each(|v| rack.kill(*v)))?;
    let stays_ready =
        |snapshot: &Snapshot, c: usize| snapshot.stays_ready(c, &cliques[c], victims[c]);
    let down = observer
        .watch_keeping(
            rack,
            tokio::time::sleep(DAEMON_DOWN),
            cliques.len(),
            |_, _| true,
            stays_ready,
        )
        .await?;
    let started = Instant::now();
    tokio::task::block_in_place(|| -> anyhow::Result<()> {
        for victim in victims {
            rack.start(*victim)?;
        }
        for victim in victims {
            rack.wait_ready(*victim, STEP_LIMIT)?;
        }
        Ok(())
    })?;
    let back = observer
        .watch_keeping(
            rack,
            std::future::ready(()),
            cliques.len(),
            |snapshot, c| snapshot.ready(c, &cliques[c]),
            stays_ready,
        )
        .await?;
    let after_condition = ready_condition(rack);
    let changed: Vec<Option<String>> = after_condition
        .iter()
        .zip(&condition)
        .map(|(now, before)| {
            (now.is_none() || now != before)
                .then(|| format!("the Ready condition was {before:?}, then {now:?}"))
        })
        .collect();
    let after = tokio::task::block_in_place(|| rack.imex_daemons())?;
    let broken = rack.broken_imports(imports).await;
    let back_ms = since(started, &back.done_at);
    Ok((0..cliques.len())
        .map(|c| {
            let in_clique = |node: usize| cliques[c].contains(&node);
            let not_ready_seen = down.broken[c]
                .clone()
                .or_else(|| back.broken[c].clone())
                .or_else(|| changed[c].clone());
            DaemonKill {
                ready_throughout: not_ready_seen.is_none(),
                not_ready_seen,
                imports: imports.iter().filter(|i| in_clique(i.node)).count(),
                imports_broken: broken.iter().filter(|(i, _)| in_clique(i.node)).count(),
                same_imex: !imex[victims[c]].is_empty() && after[victims[c]] == imex[victims[c]],
                back_ms: back_ms[c],
            }
        })
        .collect())
}

impl Snapshot {
    /// Clique `clique`'s status Ready with all of `members`, and every one of them but
    /// `restarting` sees it Ready with all of them; or what was not. The restarting
    /// node's own view is its daemon catching up (gossip filling in), not what its jobs
    /// see: their IMEX and the status are.
    fn stays_ready(
        &self,
        clique: usize,
        members: &[usize],
        restarting: usize,
    ) -> Result<(), String> {
        let nodes = members.len();
        match self.statuses.get(clique).and_then(Option::as_ref) {
            Some(s) if s.status == crd::Phase::Ready && s.ready_nodes as usize == nodes => {}
            Some(s) => {
                return Err(format!(
                    "the status says {:?} with {} of {nodes} ready",
                    s.status, s.ready_nodes
                ));
            }
            None => return Err("no status".into()),
        }
        for i in members.iter().filter(|i| **i != restarting) {
            let (name, view) = &self.views[*i];
            match view.as_ref().and_then(|v| v.domains.first()) {
                Some(d) if d.phase == Phase::Ready && d.ready == nodes => {}
                Some(d) => {
                    return Err(format!(
                        "{name} sees the domain {:?} with {} of {} ready (held: {:?}, lost: {:?})",
                        d.phase, d.ready, d.total, d.held, d.lost
                    ));
                }
                None => return Err(format!("{name} did not answer /state, or has no domain")),
            }
        }
        Ok(())
    }
}
