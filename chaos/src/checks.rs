//! Invariants, checked from outside: from each live node's snapshot, each IMEX
//! daemon's configuration, and the status writes.

use std::collections::BTreeSet;

use domaind_actors::model::Phase;

use crate::script::Check;
use crate::sim::{ClusterView, node_name};

fn names(nodes: &[usize]) -> Vec<String> {
    let mut names: Vec<String> = nodes.iter().map(|i| node_name(*i)).collect();
    names.sort();
    names
}

fn domain_of<'a>(
    view: &'a ClusterView,
    node: &str,
    uid: &str,
) -> Result<&'a domaind_actors::actors::domain::DomainSnapshot, String> {
    let snapshot = view
        .nodes
        .get(node)
        .ok_or_else(|| format!("{node} is not running"))?;
    snapshot
        .domains
        .iter()
        .find(|d| d.domain.uid.0 == uid)
        .ok_or_else(|| format!("{node} has no domain {uid}"))
}

/// Every one of `nodes` sees exactly `nodes` as the members of `uid`, none lost, with
/// one peer set and unique slots, and its IMEX daemon runs with that peer set.
pub fn agree(uid: &str, nodes: &[usize]) -> Check {
    let (uid, expected) = (uid.to_owned(), names(nodes));
    Box::new(move |view| {
        let mut peer_set = None;
        for node in &expected {
            let d = domain_of(view, node, &uid)?;
            if d.members != expected {
                return Err(format!("{node} sees members {:?}", d.members));
            }
            if !d.lost.is_empty() {
                return Err(format!("{node} still lists {:?} as lost", d.lost));
            }
            let slots: BTreeSet<_> = d.slots.values().collect();
            if slots.len() != d.slots.len() {
                return Err(format!("{node} has duplicate slots {:?}", d.slots));
            }
            match &peer_set {
                None => peer_set = Some(d.peer_set.clone()),
                Some(first) if first != &d.peer_set => {
                    return Err(format!(
                        "{node}'s peer set differs: {:?} vs {:?}",
                        d.peer_set, first
                    ));
                }
                Some(_) => {}
            }
            let daemon = view
                .daemons
                .get(node)
                .ok_or_else(|| format!("{node} has no IMEX daemon"))?;
            if !daemon.running || daemon.peers != d.peer_set {
                return Err(format!(
                    "{node}'s IMEX daemon is not running with the domain's peer set"
                ));
            }
        }
        Ok(())
    })
}

/// `agree`, and every one of `nodes` says the domain is Ready.
pub fn ready(uid: &str, nodes: &[usize]) -> Check {
    let agreement = agree(uid, nodes);
    let (uid, expected) = (uid.to_owned(), names(nodes));
    Box::new(move |view| {
        agreement(view)?;
        for node in &expected {
            let d = domain_of(view, node, &uid)?;
            if d.phase != Phase::Ready {
                return Err(format!("{node}: {}/{} ready", d.ready, d.total));
            }
        }
        Ok(())
    })
}

/// `gone` is in no observer's peer set, neither in its view nor in its IMEX daemon.
pub fn dropped(uid: &str, gone: usize, observers: &[usize]) -> Check {
    let (uid, gone, observers) = (uid.to_owned(), node_name(gone), names(observers));
    Box::new(move |view| {
        for node in &observers {
            let d = domain_of(view, node, &uid)?;
            if d.peer_set.contains(&gone) {
                return Err(format!("{node} still has {gone} in its peer set"));
            }
            if view
                .daemons
                .get(node)
                .is_some_and(|daemon| daemon.peers.contains(&gone))
            {
                return Err(format!("{node}'s IMEX daemon still has {gone}"));
            }
        }
        Ok(())
    })
}

/// Isolation: no running IMEX daemon of a live node lists a live node that holds no
/// claim for that daemon's domain.
pub fn isolated() -> Check {
    Box::new(|view| {
        for (node, snapshot) in &view.nodes {
            for d in &snapshot.domains {
                for peer in d.peer_set.nodes() {
                    let Some(peer_snapshot) = view.nodes.get(peer) else {
                        continue;
                    };
                    let holds = peer_snapshot
                        .domains
                        .iter()
                        .any(|pd| pd.domain.uid == d.domain.uid && !pd.claims.is_empty());
                    if !holds {
                        return Err(format!(
                            "{node}'s peer set for {} lists {peer}, which holds no claim for it",
                            d.domain.uid
                        ));
                    }
                }
            }
        }
        Ok(())
    })
}

/// The last status written for `uid` has this phase and these counts, and its message
/// contains `message`.
pub fn status(uid: &str, phase: Phase, ready: u32, total: u32, message: &str) -> Check {
    let (uid, message) = (uid.to_owned(), message.to_owned());
    Box::new(move |view| {
        let last = view
            .writes
            .iter()
            .rev()
            .find(|w| w.domain.uid.0 == uid)
            .ok_or_else(|| format!("no status written for {uid}"))?;
        let s = &last.status;
        if s.status != phase
            || s.ready_nodes != ready
            || s.total_nodes != total
            || !s.message.contains(&message)
        {
            return Err(format!(
                "last status by {}: {} {:?}",
                last.writer, s.message, s.status
            ));
        }
        Ok(())
    })
}

/// The prepare call for `claim` was answered with success.
pub fn prepared(claim: &str) -> Check {
    let claim = claim.to_owned();
    Box::new(move |view| match view.prepared.get(&claim) {
        Some(Ok(_)) => Ok(()),
        Some(Err(e)) => Err(format!("{claim}: {e}")),
        None => Err(format!("{claim}: no answer yet")),
    })
}

/// The prepare call for `claim` was refused for good, with `text` in the error.
pub fn refused(claim: &str, text: &str) -> Check {
    let (claim, text) = (claim.to_owned(), text.to_owned());
    Box::new(move |view| match view.prepared.get(&claim) {
        Some(Err(e)) if !e.retryable() && e.to_string().contains(&text) => Ok(()),
        other => Err(format!("{claim}: {other:?}")),
    })
}

/// Both checks.
pub fn all(checks: Vec<Check>) -> Check {
    Box::new(move |view| checks.iter().try_for_each(|c| c(view)))
}
