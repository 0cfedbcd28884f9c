//! The invariants of a cluster run, as pure functions of a [`ClusterObservation`]:
//! the same invariants as a loopback run's ([`crate::invariants`]), read from the API
//! server and the daemons' `/state` instead of a rack's files. Slots, isolation and
//! agreement are the shared ones of [`crate::sighting`], over a [`Sighting`] filled
//! from the daemons' `/state`.
//!
//! - [`breaches`], on every observation: **isolation** (no daemon's IMEX peer set for
//!   the domain names a node outside the run's nodes, or a node that holds no claim of
//!   the run), **slots** (no node twice in a peer set; no index twice in the status),
//!   **checkpoint** (every pod Running and Ready has its claim prepared on its node's
//!   daemon, across daemon restarts; no daemon still holds a claim the API server
//!   deleted), **status** (no node outside the run's in the status), and the domain's
//!   events (no `CheckpointDamaged` or `StateNotPersisted`: **checkpoint**; no
//!   `PrepareRefused`: **liveness**). The reads of one
//!   observation are not one snapshot, so a breach becomes a violation only once it has
//!   been seen without a break for the grace ([`Persistent`]).
//! - [`unwhole`], where the domain must be whole (formation, after each fault, at the
//!   end): one pod Running and Ready on each node, the status Ready with exactly those
//!   nodes (**status**), every member's daemon sees the domain Ready with the same
//!   members and peers (**agreement**) and its pod's claim prepared, the template there
//!   and a running controller holding its Lease, if it keeps one (**liveness**). Empty
//!   means whole.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use domaind_kube_api::crd::Phase as CrdPhase;
use domaind_node::run::DomainView;

use super::observe::ClusterObservation;
use crate::invariants::{Invariant, Violation};
use crate::sighting::{
    Agreement, Disagreement, DomainSighting, NodeSighting, Sighting, StatusGap, disagreements,
    peer_set_breaches, status_breaches, status_gaps,
};

/// Events of the domain that none of the run's faults may cause: a checkpoint found
/// damaged or not written (no fault of a cluster run touches the disk), a prepare
/// refused (every pod of the run asks for what its domain can give).
const DAMAGE_EVENTS: [(&str, Invariant); 3] = [
    ("CheckpointDamaged", Invariant::Checkpoint),
    ("StateNotPersisted", Invariant::Checkpoint),
    ("PrepareRefused", Invariant::Liveness),
];

/// What the run expects.
#[derive(Debug, Clone)]
pub struct Expected<'a> {
    /// The ComputeDomain's uid.
    pub domain: &'a str,
    /// The run's nodes: one pod on each.
    pub nodes: &'a [String],
    /// Every claim uid of the run seen so far, deleted ones included.
    pub known_claims: &'a BTreeSet<String>,
}

impl Expected<'_> {
    fn domain_in<'v>(&self, domains: &'v [DomainView]) -> Option<&'v DomainView> {
        domains.iter().find(|d| d.uid == self.domain)
    }
}

/// Whether `node` holds a claim of the run: by its own `/state` when it answers (the
/// daemon is the one that joins and leaves), by the run's pods there (deleting ones
/// too: their claims are prepared until the kubelet unprepares them) when not.
fn holds_claims(obs: &ClusterObservation, expected: &Expected<'_>, node: &str) -> bool {
    match obs.view(node) {
        Some(view) => view
            .claims
            .iter()
            .any(|uid| expected.known_claims.contains(uid)),
        None => obs.pods.iter().any(|p| p.node.as_deref() == Some(node)),
    }
}

/// What the cluster shows of the run's domain, in the shape every run's invariants
/// read: each daemon's `/state` of the domain, whose peer set is the one its IMEX runs
/// with.
fn sighting(obs: &ClusterObservation, expected: &Expected<'_>) -> Sighting {
    let nodes = expected
        .nodes
        .iter()
        .map(|node| {
            let out = !holds_claims(obs, expected, node);
            let Some(view) = obs.view(node) else {
                let unseen = NodeSighting::unseen("its daemon's /state cannot be read");
                return (node.clone(), NodeSighting { out, ..unseen });
            };
            let domain = expected
                .domain_in(&view.domains)
                .map(|d| DomainSighting {
                    members: d.members.clone(),
                    lost: d.lost.clone(),
                    phase: d.phase,
                    ready: d.ready,
                    total: d.total,
                    slots: Vec::new(),
                    peers: d.peers.iter().map(|(s, p)| (*s, p.clone())).collect(),
                })
                .ok_or_else(|| "its daemon does not hold the domain".to_owned());
            let imex = domain
                .as_ref()
                .map(|d| d.peers.clone())
                .map_err(Clone::clone);
            let seen = NodeSighting {
                out,
                domain,
                imex,
                judged: true,
            };
            (node.clone(), seen)
        })
        .collect();
    Sighting {
        nodes,
        status: obs.domain.as_ref().and_then(|d| d.status.clone()),
    }
}

/// Breaches at this observation (see the module doc); [`Persistent`] makes them
/// violations.
pub fn breaches(obs: &ClusterObservation, expected: &Expected<'_>) -> Vec<Violation> {
    let live_claims: BTreeSet<&str> = obs.claims.iter().map(|c| c.uid.as_str()).collect();
    let sighting = sighting(obs, expected);
    let mut found = peer_set_breaches(&sighting);
    found.extend(status_breaches(&sighting));
    for node in expected.nodes {
        let Some(view) = obs.view(node) else { continue };
        let at = Some(node.as_str());
        for uid in &view.claims {
            if expected.known_claims.contains(uid) && !live_claims.contains(uid.as_str()) {
                found.push(Violation::new(
                    Invariant::Checkpoint,
                    at,
                    format!("its daemon still holds claim {uid}, which the API server deleted"),
                ));
            }
        }
    }
    for pod in obs.pods.iter().filter(|p| p.serving()) {
        let (Some(node), Some(claim)) = (pod.node.as_deref(), pod.claim.as_deref()) else {
            continue;
        };
        let (Some(view), Some(uid)) = (obs.view(node), obs.claim_uid(claim)) else {
            continue;
        };
        if !view.prepared.iter().any(|p| p == uid) {
            found.push(Violation::new(
                Invariant::Checkpoint,
                Some(node),
                format!(
                    "pod {} runs with claim {claim} ({uid}), which its node's daemon does not hold as prepared",
                    pod.name
                ),
            ));
        }
    }
    for (reason, invariant) in DAMAGE_EVENTS {
        if obs.events.contains_key(reason) {
            found.push(Violation::new(
                invariant,
                None,
                format!("the domain's events report {reason}"),
            ));
        }
    }
    found
}

/// What keeps the domain from being whole (empty: whole). See the module doc.
pub fn unwhole(obs: &ClusterObservation, expected: &Expected<'_>) -> Vec<Violation> {
    let mut found = Vec::new();
    let serving: BTreeMap<&str, &str> = obs
        .pods
        .iter()
        .filter(|p| p.serving())
        .filter_map(|p| Some((p.node.as_deref()?, p.claim.as_deref()?)))
        .collect();
    let serving_count = obs.pods.iter().filter(|p| p.serving()).count();
    if serving_count != expected.nodes.len() || serving.len() != serving_count {
        found.push(Violation::new(
            Invariant::Liveness,
            None,
            format!(
                "not one pod Running and Ready on each of the {} nodes",
                expected.nodes.len()
            ),
        ));
    }
    let members: BTreeSet<&str> = serving.keys().copied().collect();
    match obs.domain.as_ref() {
        None => found.push(Violation::new(
            Invariant::Liveness,
            None,
            "no ComputeDomain",
        )),
        Some(domain) => match &domain.status {
            None => found.push(Violation::new(Invariant::Status, None, "no status")),
            Some(status) => {
                let members: Vec<String> = members.iter().map(|m| (*m).to_owned()).collect();
                // The counts are the reporter's to keep; a cluster run judges the list.
                let short = status_gaps(status, &members)
                    .into_iter()
                    .any(|gap| !matches!(gap, StatusGap::Counts { .. }));
                if short {
                    found.push(Violation::new(
                        Invariant::Status,
                        None,
                        format!(
                            "the status is not Ready with exactly the pods' nodes Ready \
                             (pods on {members:?})"
                        ),
                    ));
                }
            }
        },
    }
    let member_names: Vec<String> = members.iter().map(|m| (*m).to_owned()).collect();
    let asked = Agreement {
        members: &member_names,
        peer_holders: &member_names,
        ready: true,
        exact_peers: false,
        imex_as_domain: false,
    };
    for (node, why) in disagreements(&sighting(obs, expected), &asked) {
        // Coarse words, that name what and never how: a breach is one breach for as
        // long as it lasts, whatever it shows on the way ([`Persistent`]).
        let (at, detail) = match why {
            Disagreement::Members { .. }
            | Disagreement::Lost(_)
            | Disagreement::NotReady { .. } => (
                Some(node.as_str()),
                "its daemon does not see the domain Ready with exactly the pods' nodes".to_owned(),
            ),
            Disagreement::PeersDiffer { .. } => (
                None,
                "the members' daemons applied different IMEX peer sets".to_owned(),
            ),
            other => (Some(node.as_str()), other.to_string()),
        };
        let violation = Violation::new(Invariant::Agreement, at, detail);
        if !found.contains(&violation) {
            found.push(violation);
        }
    }
    for (node, claim) in &serving {
        let Some(view) = obs.view(node) else { continue };
        if expected.domain_in(&view.domains).is_some()
            && let Some(uid) = obs.claim_uid(claim)
            && !view.prepared.iter().any(|p| p == uid)
        {
            found.push(Violation::new(
                Invariant::Checkpoint,
                Some(node),
                format!("its daemon does not hold its pod's claim {claim} as prepared"),
            ));
        }
    }
    if !obs.template_exists {
        found.push(Violation::new(
            Invariant::Liveness,
            None,
            "the domain's ResourceClaimTemplate is missing",
        ));
    }
    match &obs.controllers {
        Ok(running) if running.is_empty() => found.push(Violation::new(
            Invariant::Liveness,
            None,
            "no controller runs",
        )),
        Ok(running) => {
            if !obs
                .lease_holder
                .as_ref()
                .is_some_and(|h| running.contains(h))
            {
                found.push(Violation::new(
                    Invariant::Liveness,
                    None,
                    "no running controller holds the leader Lease",
                ));
            }
        }
        Err(error) => found.push(Violation::new(
            Invariant::Liveness,
            None,
            format!("the controllers cannot be listed: {error}"),
        )),
    }
    found
}

/// Whether the status lists `node` Ready.
pub fn ready_in_status(obs: &ClusterObservation, node: &str) -> bool {
    obs.domain
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .is_some_and(|s| {
            s.nodes
                .iter()
                .any(|n| n.name == node && n.status == CrdPhase::Ready)
        })
}

/// Whether a member counts another: as a live member only, or held too (silent, its
/// IMEX vouched for).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counting {
    LiveOnly,
    LiveOrHeld,
}

/// Whether each other member's daemon (that answers) still counts `node`, and not
/// lost.
pub fn counted_by_others<'a>(
    obs: &'a ClusterObservation,
    domain: &'a str,
    node: &'a str,
    nodes: &'a [String],
    counting: Counting,
) -> impl Iterator<Item = bool> + 'a {
    nodes
        .iter()
        .filter(move |o| *o != node)
        .filter_map(move |other| {
            let seen = obs.view(other)?.domains.iter().find(|d| d.uid == domain)?;
            let held = match counting {
                Counting::LiveOnly => &[][..],
                Counting::LiveOrHeld => &seen.held[..],
            };
            let counted = seen.members.iter().chain(held).any(|m| m == node);
            Some(counted && !seen.lost.iter().any(|m| m == node))
        })
}

/// Whether another member holds `node`: its daemon is silent and its IMEX vouched for.
pub fn held_by_another(obs: &ClusterObservation, domain: &str, node: &str) -> bool {
    obs.daemons.keys().filter(|o| *o != node).any(|other| {
        obs.view(other)
            .and_then(|v| v.domains.iter().find(|d| d.uid == domain))
            .is_some_and(|d| d.held.iter().any(|m| m == node))
    })
}

/// Why the domain no longer keeps `node`, a member whose daemon alone went (its IMEX
/// lives on): the status lists it not Ready, or another member dropped it.
pub fn not_kept(
    obs: &ClusterObservation,
    domain: &str,
    node: &str,
    nodes: &[String],
) -> Vec<Violation> {
    let mut found = Vec::new();
    if !ready_in_status(obs, node) {
        found.push(Violation::new(
            Invariant::Status,
            Some(node),
            "only its daemon went (its IMEX lives on), yet the status lists it not Ready",
        ));
    }
    if counted_by_others(obs, domain, node, nodes, Counting::LiveOrHeld).any(|kept| !kept) {
        found.push(Violation::new(
            Invariant::Agreement,
            Some(node),
            "only its daemon went (its IMEX lives on), yet another member dropped it",
        ));
    }
    found
}

/// Breaches seen without a break since when: a breach is a violation once it has
/// lasted the grace.
#[derive(Debug, Default)]
pub struct Persistent {
    since: HashMap<Violation, Instant>,
}

impl Persistent {
    /// This observation's breaches at `now`; those that have lasted `grace`.
    pub fn confirm(
        &mut self,
        breaches: Vec<Violation>,
        now: Instant,
        grace: Duration,
    ) -> Vec<Violation> {
        let current: std::collections::HashSet<&Violation> = breaches.iter().collect();
        self.since.retain(|v, _| current.contains(v));
        let mut confirmed = Vec::new();
        for breach in breaches {
            let since = *self.since.entry(breach.clone()).or_insert(now);
            if now.saturating_duration_since(since) >= grace {
                confirmed.push(breach);
            }
        }
        confirmed
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use serde_json::json;

    use super::*;
    use crate::cluster::access::DaemonInstance;
    use crate::cluster::observe::{ClaimSeen, DaemonSeen, DomainSeen, PodSeen};
    use crate::sighting::ready_status;

    const DOMAIN: &str = "cd-uid";

    fn nodes() -> Vec<String> {
        ["n1", "n2", "n3"].map(str::to_owned).to_vec()
    }

    /// A node's `/state`: holding `claims` (all prepared), the domain Ready with
    /// `members` and `peers`.
    fn view(node: &str, claims: &[&str], members: &[&str], peers: &[(u16, &str)]) -> DaemonSeen {
        let peers: BTreeMap<String, &str> =
            peers.iter().map(|(s, n)| (s.to_string(), *n)).collect();
        let view = json!({
            "node": node,
            "claims": claims,
            "prepared": claims,
            "imex": {"running": true, "starts": 1, "restarts": 0},
            "domains": [{
                "uid": DOMAIN, "namespace": "ns", "name": "chaos-domain", "phase": "Ready",
                "ready": members.len(), "total": members.len(), "slot": 0, "local_ready": true,
                "members": members, "lost": [], "peers": peers, "reporter": "n1",
            }],
        });
        DaemonSeen {
            instance: Some(DaemonInstance {
                id: format!("pod-{node}"),
                restarts: 0,
            }),
            view: Ok(serde_json::from_value(view).unwrap()),
        }
    }

    fn pod(node: &str) -> PodSeen {
        PodSeen {
            name: format!("pod-{node}"),
            uid: format!("pod-uid-{node}"),
            node: Some(node.into()),
            phase: "Running".into(),
            ready: true,
            deleting: false,
            claim: Some(format!("claim-{node}")),
        }
    }

    #[test]
    fn a_node_whose_daemon_alone_went_is_kept_while_held_or_live() {
        let nodes = nodes();
        let mut obs = whole_world();
        assert!(not_kept(&obs, DOMAIN, "n3", &nodes).is_empty());
        assert!(!held_by_another(&obs, DOMAIN, "n3"));
        // n3's daemon is gone: n1 and n2 hold it; the status still lists it Ready.
        obs.daemons.remove("n3");
        for other in ["n1", "n2"] {
            let seen = obs.daemons.get_mut(other).unwrap();
            let domain = &mut seen.view.as_mut().unwrap().domains[0];
            domain.members.retain(|m| m != "n3");
            domain.held.push("n3".into());
        }
        assert!(not_kept(&obs, DOMAIN, "n3", &nodes).is_empty());
        assert!(held_by_another(&obs, DOMAIN, "n3"));
        // n2 drops it: a disagreement; the status lists it NotReady: a status breach.
        let n2 = obs.daemons.get_mut("n2").unwrap();
        let domain = &mut n2.view.as_mut().unwrap().domains[0];
        domain.held.clear();
        domain.lost.push("n3".into());
        let status = obs.domain.as_mut().unwrap().status.as_mut().unwrap();
        status.nodes[2].status = CrdPhase::NotReady;
        let found: Vec<Invariant> = not_kept(&obs, DOMAIN, "n3", &nodes)
            .into_iter()
            .map(|v| v.invariant)
            .collect();
        assert_eq!(found, vec![Invariant::Status, Invariant::Agreement]);
    }

    /// Three nodes, a pod and a prepared claim each, everyone agreeing: whole.
    fn whole_world() -> ClusterObservation {
        let all = ["n1", "n2", "n3"];
        let peers = [(0, "n1"), (1, "n2"), (2, "n3")];
        ClusterObservation {
            at: Instant::now(),
            domain: Some(DomainSeen {
                uid: DOMAIN.into(),
                status: Some(ready_status(&[("n1", 0), ("n2", 1), ("n3", 2)])),
                deleting: false,
            }),
            template_exists: true,
            pods: all.iter().map(|n| pod(n)).collect(),
            claims: all
                .iter()
                .map(|n| ClaimSeen {
                    name: format!("claim-{n}"),
                    uid: format!("uid-{n}"),
                    allocated: true,
                })
                .collect(),
            daemons: all
                .iter()
                .map(|n| {
                    (
                        (*n).to_owned(),
                        view(n, &[&format!("uid-{n}")], &all, &peers),
                    )
                })
                .collect(),
            controllers: Ok(vec!["controller-a".into()]),
            lease_exists: true,
            lease_holder: Some("controller-a".into()),
            cordoned: BTreeSet::new(),
            events: BTreeMap::new(),
            errors: Vec::new(),
        }
    }

    fn known(obs: &ClusterObservation) -> BTreeSet<String> {
        obs.claims.iter().map(|c| c.uid.clone()).collect()
    }

    fn check(obs: &ClusterObservation) -> (Vec<Violation>, Vec<Violation>) {
        let nodes = nodes();
        let known = known(obs);
        let expected = Expected {
            domain: DOMAIN,
            nodes: &nodes,
            known_claims: &known,
        };
        (breaches(obs, &expected), unwhole(obs, &expected))
    }

    fn invariants(found: &[Violation]) -> Vec<Invariant> {
        found.iter().map(|v| v.invariant).collect()
    }

    #[test]
    fn a_whole_domain_breaks_nothing() {
        let (breaches, unwhole) = check(&whole_world());
        assert!(breaches.is_empty(), "{breaches:?}");
        assert!(unwhole.is_empty(), "{unwhole:?}");
    }

    #[test]
    fn a_peer_holding_no_claim_or_outside_the_run_breaks_isolation() {
        let mut obs = whole_world();
        // n3 released its claim (drained), and n1 still peers with it and an outsider.
        let all = ["n1", "n2", "n3"];
        obs.daemons.insert(
            "n3".into(),
            view("n3", &[], &all, &[(0, "n1"), (1, "n2"), (2, "n3")]),
        );
        obs.daemons.insert(
            "n1".into(),
            view(
                "n1",
                &["uid-n1"],
                &all,
                &[(0, "n1"), (1, "n2"), (2, "n3"), (3, "elsewhere")],
            ),
        );
        let (breaches, _) = check(&obs);
        let isolation: Vec<&Violation> = breaches
            .iter()
            .filter(|v| v.invariant == Invariant::Isolation)
            .collect();
        assert!(
            isolation.iter().any(|v| v.node.as_deref() == Some("n1")
                && v.detail.contains("n3, which holds no claim")),
            "{breaches:?}"
        );
        assert!(
            isolation
                .iter()
                .any(|v| v.detail.contains("elsewhere, not one of the run's nodes")),
            "{breaches:?}"
        );
        // A node whose /state cannot be read is judged by its pods: n2 has one.
        obs.daemons.get_mut("n2").unwrap().view = Err("port-forward refused".into());
        assert!(!check(&obs).0.iter().any(|v| v.detail.contains("to n2,")));
    }

    #[test]
    fn a_node_twice_in_a_peer_set_or_an_index_twice_in_the_status_breaks_slots() {
        let mut obs = whole_world();
        let all = ["n1", "n2", "n3"];
        obs.daemons.insert(
            "n2".into(),
            view("n2", &["uid-n2"], &all, &[(0, "n1"), (1, "n2"), (2, "n2")]),
        );
        obs.domain.as_mut().unwrap().status =
            Some(ready_status(&[("n1", 0), ("n2", 0), ("n3", 2)]));
        let (breaches, unwhole) = check(&obs);
        assert!(
            breaches
                .iter()
                .any(|v| v.invariant == Invariant::Slots && v.detail.contains("n2 slots [1, 2]")),
            "{breaches:?}"
        );
        assert!(
            breaches
                .iter()
                .any(|v| v.invariant == Invariant::Slots && v.detail.contains("index 0")),
            "{breaches:?}"
        );
        // The members applied different peer sets: not whole either.
        assert!(
            invariants(&unwhole).contains(&Invariant::Agreement),
            "{unwhole:?}"
        );
    }

    #[test]
    fn a_running_pod_whose_claim_its_daemon_lost_breaks_the_checkpoint() {
        let mut obs = whole_world();
        // n2's daemon came back from a restart without its claim.
        let all = ["n1", "n2", "n3"];
        obs.daemons.insert(
            "n2".into(),
            view("n2", &[], &all, &[(0, "n1"), (1, "n2"), (2, "n3")]),
        );
        let (breaches, unwhole) = check(&obs);
        assert!(
            breaches.iter().any(|v| v.invariant == Invariant::Checkpoint
                && v.node.as_deref() == Some("n2")
                && v.detail.contains("does not hold as prepared")),
            "{breaches:?}"
        );
        assert!(
            invariants(&unwhole).contains(&Invariant::Checkpoint),
            "{unwhole:?}"
        );
    }

    #[test]
    fn a_claim_held_after_the_api_server_deleted_it_breaks_the_checkpoint() {
        let mut obs = whole_world();
        let nodes = nodes();
        let mut known = known(&obs);
        known.insert("uid-gone".into());
        let all = ["n1", "n2", "n3"];
        obs.daemons.insert(
            "n3".into(),
            view(
                "n3",
                &["uid-n3", "uid-gone"],
                &all,
                &[(0, "n1"), (1, "n2"), (2, "n3")],
            ),
        );
        let expected = Expected {
            domain: DOMAIN,
            nodes: &nodes,
            known_claims: &known,
        };
        let found = breaches(&obs, &expected);
        assert!(
            found.iter().any(|v| v.invariant == Invariant::Checkpoint
                && v.detail.contains("uid-gone, which the API server deleted")),
            "{found:?}"
        );
        // A claim the run never had (another tenant's) is none of its business.
        obs.daemons.insert(
            "n3".into(),
            view(
                "n3",
                &["uid-n3", "someone-else"],
                &all,
                &[(0, "n1"), (1, "n2"), (2, "n3")],
            ),
        );
        assert!(breaches(&obs, &expected).is_empty());
    }

    #[test]
    fn a_status_naming_other_nodes_or_missing_one_is_not_whole() {
        let mut obs = whole_world();
        obs.domain.as_mut().unwrap().status =
            Some(ready_status(&[("n1", 0), ("n2", 1), ("stranger", 2)]));
        let (breaches, unwhole) = check(&obs);
        assert!(
            breaches
                .iter()
                .any(|v| v.invariant == Invariant::Status && v.node.as_deref() == Some("stranger")),
            "{breaches:?}"
        );
        assert!(
            invariants(&unwhole).contains(&Invariant::Status),
            "{unwhole:?}"
        );
    }

    #[test]
    fn a_missing_pod_template_or_controller_is_not_whole() {
        let mut obs = whole_world();
        obs.pods[1].ready = false;
        obs.template_exists = false;
        obs.lease_holder = Some("controller-gone".into());
        let (_, unwhole) = check(&obs);
        let details: Vec<&str> = unwhole.iter().map(|v| v.detail.as_str()).collect();
        assert!(
            details
                .iter()
                .any(|d| d.contains("not one pod Running and Ready")),
            "{details:?}"
        );
        assert!(
            details
                .iter()
                .any(|d| d.contains("ResourceClaimTemplate is missing")),
            "{details:?}"
        );
        assert!(
            details.iter().any(|d| d.contains("holds the leader Lease")),
            "{details:?}"
        );
        obs.controllers = Ok(Vec::new());
        assert!(
            check(&obs)
                .1
                .iter()
                .any(|v| v.detail == "no controller runs")
        );
    }

    #[test]
    fn events_of_damage_or_refusal_are_breaches() {
        let mut obs = whole_world();
        obs.events = BTreeMap::from([("NodeLost".to_owned(), 1), ("DomainReady".to_owned(), 2)]);
        assert!(check(&obs).0.is_empty());
        obs.events.insert("CheckpointDamaged".into(), 1);
        obs.events.insert("PrepareRefused".into(), 3);
        let found = check(&obs).0;
        assert!(
            found
                .iter()
                .any(|v| v.invariant == Invariant::Checkpoint
                    && v.detail.contains("CheckpointDamaged")),
            "{found:?}"
        );
        assert!(
            found
                .iter()
                .any(|v| v.invariant == Invariant::Liveness && v.detail.contains("PrepareRefused")),
            "{found:?}"
        );
    }

    #[test]
    fn a_breach_is_a_violation_only_once_it_lasted_the_grace() {
        let grace = Duration::from_secs(5);
        let t0 = Instant::now();
        let at = |ms: u64| t0 + Duration::from_millis(ms);
        let breach = Violation::new(Invariant::Isolation, Some("n1"), "x");
        let mut persistent = Persistent::default();
        assert!(
            persistent
                .confirm(vec![breach.clone()], at(0), grace)
                .is_empty()
        );
        assert!(
            persistent
                .confirm(vec![breach.clone()], at(4_900), grace)
                .is_empty()
        );
        // A break restarts the count.
        assert!(persistent.confirm(Vec::new(), at(5_000), grace).is_empty());
        assert!(
            persistent
                .confirm(vec![breach.clone()], at(5_500), grace)
                .is_empty()
        );
        assert_eq!(
            persistent.confirm(vec![breach.clone()], at(10_500), grace),
            vec![breach]
        );
    }
}
