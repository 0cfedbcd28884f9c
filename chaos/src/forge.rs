//! `domaind-chaos forge`: a certified outsider tries to forge a running rack's gossip.
//!
//! The rack is one `domaind demo --keep` (or `LocalRack`) leaves: its root holds the
//! rack's CA and each node's `run.json`. The forger gets a certificate of that CA for a
//! node outside the rack, harvests every node's signed state by gossiping like a
//! member, sends every other node each forgery of `domaind_gossip::forge` against
//! it, and names ghosts in digests. Then it checks, from outside, what the issue asks:
//! every node still sees the same domains with the same phase, slots and IMEX peers,
//! every node's gossip is alive (`/healthz`), and every forgery was refused and counted
//! under its reason (`domaind_gossip_state_refused_total`).

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use chitchat::ChitchatId;
use domaind_gossip::NodeName;
use domaind_gossip::forge::{Forger, forgeries};
use domaind_gossip::metrics::STATE_REFUSED;
use domaind_gossip::pki::{DevCa, NodeCertRequest};
use domaind_gossip::transport::wire::NodePart;
use domaind_node::run::{DomainView, RunInfo};
use domaind_testbed::rack::{http_get, node_view};
use domaind_testkit::poll_every;
use serde::Serialize;

/// The forger's name: a node the rack's CA certifies, outside the rack.
pub const FORGER: &str = "node-forger";
const HARVEST_LIMIT: Duration = Duration::from_secs(10);
/// How long after every forgery was counted the rack is looked at again: several
/// gossip rounds, so that anything a forgery changed would have spread.
const SETTLE: Duration = Duration::from_secs(2);
/// How long the rack may take to count every forgery it was sent.
const COUNT_LIMIT: Duration = Duration::from_secs(30);
const COUNT_POLL: Duration = Duration::from_millis(100);

/// What one forgery did across the rack.
#[derive(Debug, Clone, Serialize)]
pub struct ForgeryRow {
    pub forgery: &'static str,
    pub reason: &'static str,
    /// Deltas sent with it (one per victim and receiving node).
    pub sent: u64,
}

#[derive(Debug, Clone, Serialize)]
pub struct ForgeReport {
    pub rows: Vec<ForgeryRow>,
    /// Refusals counted by the rack, by reason, during the run.
    pub refused: BTreeMap<String, u64>,
    /// What went wrong: a view that changed, a node whose gossip stopped, a forgery
    /// not counted. Empty when the rack held.
    pub problems: Vec<String>,
}

impl ForgeReport {
    pub fn ok(&self) -> bool {
        self.problems.is_empty()
    }

    pub fn table(&self) -> String {
        let mut out = String::from(
            "| forgery | refused as | sent | counted (all forgeries of this reason) |\n|---|---|---:|---:|\n",
        );
        for row in &self.rows {
            out.push_str(&format!(
                "| {} | {} | {} | {} |\n",
                row.forgery,
                row.reason,
                row.sent,
                self.refused.get(row.reason).copied().unwrap_or(0)
            ));
        }
        out
    }
}

/// The nodes of the rack under `root`, from their `run.json` files.
pub fn rack_nodes(root: &Path) -> anyhow::Result<Vec<RunInfo>> {
    let mut nodes = Vec::new();
    for entry in
        std::fs::read_dir(root).with_context(|| format!("cannot read {}", root.display()))?
    {
        let path: PathBuf = entry?.path().join("state").join("run.json");
        if path.is_file() {
            let text = std::fs::read_to_string(&path)?;
            nodes.push(
                serde_json::from_str::<RunInfo>(&text)
                    .with_context(|| path.display().to_string())?,
            );
        }
    }
    if nodes.len() < 2 {
        bail!(
            "{} holds {} running node(s); a forgery needs a rack of two or more",
            root.display(),
            nodes.len()
        );
    }
    nodes.sort_by(|a, b| a.node.cmp(&b.node));
    Ok(nodes)
}

/// Forges the gossip of the rack under `root` (gossip cluster `cluster`) from `ip`.
pub async fn forge_rack(root: &Path, cluster: &str, ip: IpAddr) -> anyhow::Result<ForgeReport> {
    let nodes = rack_nodes(root)?;
    let ca = DevCa::load(&root.join("ca"))
        .context("the rack's CA (a rack made by `domaind demo --keep`)")?;
    let forger_name = NodeName::new(FORGER)?;
    let cert = ca.issue(&NodeCertRequest::new(
        forger_name.clone(),
        time::Duration::hours(1),
    ))?;
    let tls_dir = tempfile::tempdir()?;
    let forger = Forger::new(cluster, &forger_name, &cert, tls_dir.path(), ip)?;
    let other_ca = DevCa::generate("not the rack's CA", time::Duration::hours(1))?;

    let views_before = views(&nodes).await?;
    let refused_before = refusals(&nodes).await?;

    // Every node's state, as its neighbour relays it.
    let mut states: BTreeMap<String, NodePart> = BTreeMap::new();
    for (i, relay) in nodes.iter().enumerate() {
        let harvested = forger.harvest(relay.gossip_addr, HARVEST_LIMIT).await?;
        let victim = &nodes[(i + 1) % nodes.len()].node;
        if let Some(part) = harvested.into_iter().find(|p| *p.id.node_id == **victim) {
            states.insert(victim.clone(), part);
        }
    }
    let mut rows: Vec<ForgeryRow> = Vec::new();
    for (victim, state) in &states {
        let name = NodeName::new(victim)?;
        let foreign = other_ca
            .issue(&NodeCertRequest::new(
                name.clone(),
                time::Duration::hours(1),
            ))?
            .credentials(&name)?;
        for forgery in forgeries(&forger, state, None, &foreign) {
            let mut sent = 0;
            for receiver in nodes.iter().filter(|n| &n.node != victim) {
                forger
                    .send_parts(receiver.gossip_addr, &receiver.node, &forgery.parts)
                    .await
                    .with_context(|| format!("sending {} to {}", forgery.name, receiver.node))?;
                sent += 1;
            }
            match rows.iter_mut().find(|r| r.forgery == forgery.name) {
                Some(row) => row.sent += sent,
                None => rows.push(ForgeryRow {
                    forgery: forgery.name,
                    reason: forgery.reason,
                    sent,
                }),
            }
        }
    }
    let ghost = ChitchatId::new("node-ghost", 1, SocketAddr::new(ip, 7946));
    for receiver in &nodes {
        forger
            .send_digest_naming(
                receiver.gossip_addr,
                &receiver.node,
                std::slice::from_ref(&ghost),
            )
            .await?;
    }
    let mut expected: BTreeMap<&str, u64> = BTreeMap::new();
    for row in &rows {
        *expected.entry(row.reason).or_default() += row.sent;
    }
    // Each node checks a forgery when its gossip loop takes the frame up, after the
    // forger's connection has closed: the count is waited for, not assumed.
    // A count that never comes is reported below, with the counts as they stand.
    let refused = poll_every(COUNT_POLL, COUNT_LIMIT, async || {
        let refused = match refused_since(&nodes, &refused_before).await {
            Ok(refused) => refused,
            Err(error) => return Ok(Err(error)),
        };
        let all_counted = expected
            .iter()
            .all(|(reason, sent)| refused.get(*reason).copied().unwrap_or(0) >= *sent);
        if all_counted {
            Ok(Ok(refused))
        } else {
            Err(refused)
        }
    })
    .await
    .unwrap_or_else(Ok)?;
    tokio::time::sleep(SETTLE).await;

    let mut problems = Vec::new();
    let views_after = views(&nodes).await?;
    for (node, before) in &views_before {
        let after = views_after.get(node);
        if after != Some(before) {
            problems.push(format!(
                "{node}'s view changed: {before:?} became {after:?}"
            ));
        }
    }
    for node in &nodes {
        match http_get(node.http_addr, "/healthz").await {
            Ok((200, _)) => {}
            Ok((status, body)) => {
                problems.push(format!("{} is unhealthy ({status}): {body}", node.node))
            }
            Err(error) => {
                problems.push(format!("{} does not answer /healthz: {error:#}", node.node))
            }
        }
    }
    for (reason, sent) in expected {
        let counted = refused.get(reason).copied().unwrap_or(0);
        if counted < sent {
            problems.push(format!(
                "{sent} forgeries sent to be refused as {reason}, {counted} counted within {COUNT_LIMIT:?}"
            ));
        }
    }
    if states.len() < nodes.len() {
        problems.push(format!(
            "harvested the state of {} node(s) of {}",
            states.len(),
            nodes.len()
        ));
    }
    Ok(ForgeReport {
        rows,
        refused,
        problems,
    })
}

/// What each node says of its domains, without what moves on its own (counters).
async fn views(nodes: &[RunInfo]) -> anyhow::Result<BTreeMap<String, Vec<DomainView>>> {
    let mut views = BTreeMap::new();
    for node in nodes {
        let view = node_view(node).await?;
        views.insert(node.node.clone(), view.domains);
    }
    Ok(views)
}

/// The refusals counted since `before`, by reason; reasons with none left out.
async fn refused_since(
    nodes: &[RunInfo],
    before: &BTreeMap<String, u64>,
) -> anyhow::Result<BTreeMap<String, u64>> {
    Ok(refusals(nodes)
        .await?
        .into_iter()
        .map(|(reason, after)| {
            let since = after - before.get(&reason).copied().unwrap_or(0);
            (reason, since)
        })
        .filter(|(_, n)| *n > 0)
        .collect())
}

/// `domaind_gossip_state_refused_total` of the whole rack, by reason.
async fn refusals(nodes: &[RunInfo]) -> anyhow::Result<BTreeMap<String, u64>> {
    let mut total: BTreeMap<String, u64> = BTreeMap::new();
    for node in nodes {
        let (_, metrics) = http_get(node.http_addr, "/metrics").await?;
        for line in metrics.lines().filter(|l| l.starts_with(STATE_REFUSED)) {
            let Some((labels, value)) = line.rsplit_once(' ') else {
                continue;
            };
            let Some(reason) = labels
                .split("reason=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
            else {
                continue;
            };
            *total.entry(reason.to_owned()).or_default() +=
                value.parse::<f64>().unwrap_or(0.0) as u64;
        }
    }
    Ok(total)
}
