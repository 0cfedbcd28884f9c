//! Invariants, checked from outside: from each live node's snapshot, each IMEX
//! daemon's configuration, and the status writes. Agreement, slots and isolation are
//! the [`crate::sighting`] invariants every run checks, over a [`Sighting`] filled from
//! the simulation's [`ClusterView`].

use domaind_actors::actors::domain::DomainSnapshot;
use domaind_actors::model::Phase;
use domaind_actors::rules::peers::PeerSet;

use crate::invariants::Invariant;
use crate::script::Check;
use crate::sighting::{
    Agreement, DomainSighting, NodeSighting, PeerPairs, Sighting, disagreements, peer_set_breaches,
};
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
) -> Result<&'a DomainSnapshot, String> {
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

fn pairs(peer_set: &PeerSet) -> PeerPairs {
    peer_set
        .peers
        .iter()
        .map(|(slot, peer)| (*slot, peer.node.clone()))
        .collect()
}

/// What the simulation shows of domain `uid`: each live node's snapshot of it and,
/// with `daemons`, its fake IMEX daemon's peer set. The nodes in `named`, and every
/// peer a live node names, are the run's nodes, seen or not: a dead node lingers in
/// peer sets until it is dropped, and is no stranger.
fn sighting(view: &ClusterView, uid: &str, named: &[String], daemons: bool) -> Sighting {
    let mut nodes = std::collections::BTreeMap::new();
    for (name, snapshot) in &view.nodes {
        let domain = snapshot.domains.iter().find(|d| d.domain.uid.0 == uid);
        let domain = domain.ok_or_else(|| format!("has no domain {uid}"));
        let domain = domain.map(|d| DomainSighting {
            members: d.members.clone(),
            lost: d.lost.clone(),
            phase: d.phase,
            ready: d.ready,
            total: d.total,
            slots: d
                .slots
                .iter()
                .map(|(node, slot)| (*slot, node.clone()))
                .collect(),
            peers: pairs(&d.peer_set),
        });
        let holds = snapshot
            .domains
            .iter()
            .any(|d| d.domain.uid.0 == uid && !d.claims.is_empty());
        let imex = match view.daemons.get(name) {
            _ if !daemons => Err("its IMEX daemon is not looked at".to_owned()),
            None => Err("has no IMEX daemon".to_owned()),
            Some(daemon) if !daemon.running => Err("its IMEX daemon is not running".to_owned()),
            Some(daemon) => Ok(pairs(&daemon.peers)),
        };
        let node = NodeSighting {
            out: !holds,
            domain,
            imex,
            judged: true,
        };
        nodes.insert(name.clone(), node);
    }
    let peers: Vec<String> = nodes
        .values()
        .filter_map(|n: &NodeSighting| n.domain.as_ref().ok())
        .flat_map(|d| d.peers.iter().map(|(_, peer)| peer.clone()))
        .collect();
    for name in named.iter().chain(&peers) {
        nodes
            .entry(name.clone())
            .or_insert_with(|| NodeSighting::unseen("is not running"));
    }
    Sighting {
        nodes,
        status: None,
    }
}

/// Agreement among `nodes` on domain `uid`, the first breach of it as a script's
/// check reports it.
fn agreement(view: &ClusterView, uid: &str, nodes: &[usize], ready: bool) -> Result<(), String> {
    let expected = names(nodes);
    let sighting = sighting(view, uid, &expected, true);
    let doubled = peer_set_breaches(&sighting).into_iter().find(|v| {
        v.invariant == Invariant::Slots && v.node.as_ref().is_some_and(|n| expected.contains(n))
    });
    if let Some(violation) = doubled {
        let node = violation.node.unwrap_or_default();
        return Err(format!("{node}: {}", violation.detail));
    }
    let asked = Agreement {
        members: &expected,
        peer_holders: &expected,
        ready,
        exact_peers: false,
        imex_as_domain: true,
    };
    match disagreements(&sighting, &asked).into_iter().next() {
        Some((node, why)) => Err(format!("{node}: {why}")),
        None => Ok(()),
    }
}

/// Every one of `nodes` sees exactly `nodes` as the members of `uid`, none lost, with
/// one peer set and unique slots, and its IMEX daemon runs with that peer set.
pub fn agree(uid: &str, nodes: &[usize]) -> Check {
    let (uid, nodes) = (uid.to_owned(), nodes.to_vec());
    Box::new(move |view| agreement(view, &uid, &nodes, false))
}

/// `agree`, and every one of `nodes` says the domain is Ready.
pub fn ready(uid: &str, nodes: &[usize]) -> Check {
    let (uid, nodes) = (uid.to_owned(), nodes.to_vec());
    Box::new(move |view| agreement(view, &uid, &nodes, true))
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

/// Isolation: no live node's peer set for a domain lists a live node that holds no
/// claim for that domain.
pub fn isolated() -> Check {
    Box::new(|view| {
        let uids: std::collections::BTreeSet<&str> = view
            .nodes
            .values()
            .flat_map(|snapshot| snapshot.domains.iter().map(|d| d.domain.uid.0.as_str()))
            .collect();
        for uid in uids {
            let breach = peer_set_breaches(&sighting(view, uid, &[], false))
                .into_iter()
                .find(|v| v.invariant == Invariant::Isolation);
            if let Some(violation) = breach {
                let node = violation.node.unwrap_or_default();
                return Err(format!("{node}, for {uid}: {}", violation.detail));
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
