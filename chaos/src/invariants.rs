//! The invariants of `domaind-chaos run`, as pure functions of what the harness did
//! (the [`World`]: which daemons run, which claims it prepared and unprepared) and what
//! it saw (an [`Observation`]). Pure, so that each can be shown to fail on a bad
//! observation.
//!
//! Slots, the peer-set half of isolation and agreement are the invariants every run
//! shares ([`crate::sighting`]), over a [`Sighting`] filled here from the world and the
//! observation; the rest is what only a loopback run sees.
//!
//! Checked on every observation:
//! - **isolation**: a node that has held no claim for the grace period is in no peer
//!   set (the hosts block of any node whose IMEX daemon runs, or its `/state`'s peer
//!   set of the domain), and runs no IMEX daemon
//!   itself; no peer set names an address outside the rack; the nodes config lists
//!   slot names only (in DNS-names mode the hosts block is the whole peer set).
//! - **slots**: no peer set gives one node two slots.
//! - **checkpoint**: every claim whose prepare was answered, and not since unprepared,
//!   is in the node's checkpoint and in its `/state`, across kills and restarts; a
//!   claim whose unprepare was answered is not in the checkpoint. While the harness
//!   keeps a node's state directory full, and for the grace after it frees it, the
//!   checkpoint file may lag behind what was answered (the daemon may serve from memory
//!   and write once it can); `/state` may not.
//! - **crash** (with the daemons' exits, which the harness reaps itself): no IMEX
//!   daemon exited that the harness did not crash.
//! - **cliques** (a rack of several cliques, [`crate::cliques`]): no gossip member and
//!   no IMEX peer of any node is a node of another clique.
//! - **channels** (several domains with `isolation: Channel`, [`crate::channels`]): no
//!   pod holds a channel of a domain it does not belong to, and two live domains never
//!   have the same channel.
//!
//! - **imports** (checked after every fault heals and at the end, [`import_break`]): an
//!   import the workload stand-in holds breaks only through a fault that may break
//!   imports ([`may_break_imports`]) on its importer or on the peer it broke on.
//!
//! Checked once faults stop ([`unsettled`]): **agreement** (every member has the same
//! peer set and slots, and sees the same members) and **status** (the status file lists
//! exactly the members, Ready, with their slots).
//!
//! The grace: a node that unprepared its last claim deletes its gossip key at once;
//! peers hear of the tombstone within a few gossip rounds (150 ms each) and rewrite
//! their hosts block on the next snapshot. On a busy 2-core machine with packet loss
//! that is well under a second or two; the default grace of 5 s leaves room and is
//! still far below anything a job would notice. The same grace applies to an observer
//! that just started or resumed: its hosts file is as old as its last write.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::net::IpAddr;
use std::time::{Duration, Instant};

use domaind_kube_api::crd::{ComputeDomainStatus, Phase as CrdPhase, READY_CONDITION};
use serde::Serialize;

use crate::observe::{FileRead, Observation};
use crate::schedule::FaultKind;
use crate::sighting::{
    Agreement, DomainSighting, NodeSighting, Sighting, disagreements, peer_set_breaches,
    status_breaches, status_gaps,
};

/// Where a daemon is, as the harness made it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Life {
    /// Started; run.json not written yet.
    Starting,
    Up,
    /// SIGSTOPped with its IMEX daemon.
    Paused,
    /// Sent SIGTERM; not exited yet.
    Stopping,
    /// Killed, stopped, or never started.
    Down,
}

/// A claim's state, as the harness (the kubelet) knows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum ClaimPhase {
    /// Prepare called; no success yet.
    Preparing,
    /// Prepare answered with success.
    Prepared,
    /// Unprepare called; no success yet.
    Unpreparing,
    /// Unprepare answered with success.
    Released,
}

#[derive(Debug, Clone)]
pub struct NodeRecord {
    pub name: String,
    pub ip: IpAddr,
    pub life: Life,
    pub life_since: Instant,
    pub claims: BTreeMap<String, ClaimPhase>,
    /// When it last came to hold no claim (the start, for a node that never held one).
    pub released_at: Instant,
    /// IMEX daemon crashes the harness caused since the daemon last started.
    pub imex_crashes: u32,
    /// Whether the harness keeps the node's state directory full (`disk-full`).
    pub state_dir_full: bool,
    /// When the harness last freed the node's state directory.
    pub state_dir_freed_at: Option<Instant>,
}

impl NodeRecord {
    /// Whether the node holds a claim of the domain, or is being given one.
    pub fn holds_claims(&self) -> bool {
        self.claims.values().any(|p| *p != ClaimPhase::Released)
    }

    fn claims_in(&self, phase: ClaimPhase) -> BTreeSet<&str> {
        self.claims
            .iter()
            .filter(|(_, p)| **p == phase)
            .map(|(uid, _)| uid.as_str())
            .collect()
    }

    /// Whether its checkpoint file may lag behind what it answered: its state directory
    /// is full, or was freed less than `grace` ago.
    fn checkpoint_may_lag(&self, now: Instant, grace: Duration) -> bool {
        self.state_dir_full
            || self
                .state_dir_freed_at
                .is_some_and(|at| now.saturating_duration_since(at) < grace)
    }

    /// Up, and for at least `grace`.
    fn settled_up(&self, now: Instant, grace: Duration) -> bool {
        self.life == Life::Up && now.saturating_duration_since(self.life_since) >= grace
    }
}

/// What the harness did to the rack, as far as the invariants care.
#[derive(Debug, Clone)]
pub struct World {
    /// The run's first domain: the one faults are healed against (agreement, status).
    pub domain_uid: String,
    pub grace: Duration,
    pub nodes: Vec<NodeRecord>,
    /// With `--domains`: the domain of every claim of another domain than the first,
    /// by claim uid. A claim not listed is the first domain's.
    pub claim_domains: BTreeMap<String, String>,
    /// Every domain runs with `isolation: Channel` (`--domains`): the nodes holding a
    /// claim of any of them form one IMEX domain, and the channel invariant applies.
    pub sharing: bool,
}

impl World {
    /// Nodes `(name, ip)`, all down and holding nothing, as of `now`.
    pub fn new(
        domain_uid: impl Into<String>,
        grace: Duration,
        nodes: impl IntoIterator<Item = (String, IpAddr)>,
        now: Instant,
    ) -> Self {
        Self {
            domain_uid: domain_uid.into(),
            grace,
            nodes: nodes
                .into_iter()
                .map(|(name, ip)| NodeRecord {
                    name,
                    ip,
                    life: Life::Down,
                    life_since: now,
                    claims: BTreeMap::new(),
                    released_at: now,
                    imex_crashes: 0,
                    state_dir_full: false,
                    state_dir_freed_at: None,
                })
                .collect(),
            claim_domains: BTreeMap::new(),
            sharing: false,
        }
    }

    /// The domain `claim` belongs to.
    pub fn domain_of<'a>(&'a self, claim: &str) -> &'a str {
        self.claim_domains
            .get(claim)
            .map_or(self.domain_uid.as_str(), String::as_str)
    }

    pub fn set_life(&mut self, node: usize, life: Life, now: Instant) {
        let record = &mut self.nodes[node];
        if life == Life::Starting {
            // A new process: its IMEX daemon's counters start again.
            record.imex_crashes = 0;
        }
        record.life = life;
        record.life_since = now;
    }

    /// The harness filled node `node`'s state directory (`full`), or freed it.
    pub fn set_state_dir_full(&mut self, node: usize, full: bool, now: Instant) {
        let record = &mut self.nodes[node];
        if record.state_dir_full && !full {
            record.state_dir_freed_at = Some(now);
        }
        record.state_dir_full = full;
    }

    pub fn set_claim(&mut self, node: usize, uid: &str, phase: ClaimPhase, now: Instant) {
        let record = &mut self.nodes[node];
        let held = record.holds_claims();
        record.claims.insert(uid.to_owned(), phase);
        if held && !record.holds_claims() {
            record.released_at = now;
        }
    }

    pub fn index_of_ip(&self, ip: IpAddr) -> Option<usize> {
        self.nodes.iter().position(|n| n.ip == ip)
    }

    /// The nodes that hold claims of the run's first domain: its members once things
    /// settle.
    pub fn members(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| {
                self.nodes[*i].claims.iter().any(|(uid, phase)| {
                    *phase != ClaimPhase::Released && self.domain_of(uid) == self.domain_uid
                })
            })
            .collect()
    }

    /// The nodes that hold claims of any domain: the IMEX peer set once things settle
    /// (with `--domains`, the shared IMEX domain's members; otherwise [`Self::members`]).
    pub fn imex_members(&self) -> Vec<usize> {
        (0..self.nodes.len())
            .filter(|i| self.nodes[*i].holds_claims())
            .collect()
    }
}

/// Which invariant a violation breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Invariant {
    Isolation,
    Slots,
    Agreement,
    Checkpoint,
    Status,
    /// A daemon (domaind or IMEX) died that the harness did not kill.
    Crash,
    /// Something that must happen did not within its limit: a dead node never dropped,
    /// a crashed IMEX daemon never restarted, a fault never healed.
    Liveness,
    /// A gossip member or IMEX peer of another NVLink clique ([`crate::cliques`]).
    Cliques,
    /// A pod holding a channel of another domain than its own, or two live domains on
    /// one channel ([`crate::channels`]).
    Channels,
    /// A job's memory import broken by a fault that must leave it alone
    /// ([`import_break`]).
    Imports,
}

impl fmt::Display for Invariant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Invariant::Isolation => "isolation",
            Invariant::Slots => "slots",
            Invariant::Agreement => "agreement",
            Invariant::Checkpoint => "checkpoint",
            Invariant::Status => "status",
            Invariant::Crash => "crash",
            Invariant::Liveness => "liveness",
            Invariant::Cliques => "cliques",
            Invariant::Channels => "channels",
            Invariant::Imports => "imports",
        })
    }
}

/// One broken invariant. `detail` names what, never when, so that the same breach
/// seen on many observations is one violation.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize)]
pub struct Violation {
    pub invariant: Invariant,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub node: Option<String>,
    pub detail: String,
}

impl Violation {
    pub fn new(invariant: Invariant, node: Option<&str>, detail: impl Into<String>) -> Self {
        Self {
            invariant,
            node: node.map(str::to_owned),
            detail: detail.into(),
        }
    }
}

/// The invariants that hold at every moment.
pub fn check(world: &World, obs: &Observation, now: Instant) -> Vec<Violation> {
    let mut found = Vec::new();
    for (i, node) in world.nodes.iter().enumerate() {
        let seen = &obs.nodes[i];
        let name = Some(node.name.as_str());
        let violation = |invariant, detail: String| Violation::new(invariant, name, detail);

        if let FileRead::Bad(reason) = &seen.nodes_config {
            found.push(violation(
                Invariant::Isolation,
                format!("nodes config: {reason}"),
            ));
        }
        if node.life == Life::Up
            && let FileRead::Bad(reason) = &seen.hosts
        {
            found.push(violation(
                Invariant::Isolation,
                format!("hosts file: {reason}"),
            ));
        }

        // A node out of the domain must not take part in IMEX at all.
        let out_since = node.released_at.max(node.life_since);
        if !node.holds_claims()
            && node.life == Life::Up
            && now.saturating_duration_since(out_since) >= world.grace
            && seen.imex_running()
        {
            found.push(violation(
                Invariant::Isolation,
                format!(
                    "holds no claim but runs an IMEX daemon (pid {:?})",
                    seen.imex_pids
                ),
            ));
        }

        let prepared = node.claims_in(ClaimPhase::Prepared);
        let released = node.claims_in(ClaimPhase::Released);
        match &seen.checkpoint {
            // A full state directory: the daemon may answer from memory, and the file
            // catches up once there is room.
            _ if node.checkpoint_may_lag(now, world.grace) => {}
            FileRead::Missing if !prepared.is_empty() => found.push(violation(
                Invariant::Checkpoint,
                format!("no checkpoint file, but prepared claims {prepared:?}"),
            )),
            FileRead::Missing => {}
            FileRead::Bad(reason) => found.push(violation(Invariant::Checkpoint, reason.clone())),
            FileRead::Read(claims) => {
                let lost: Vec<&str> = prepared
                    .iter()
                    .filter(|c| !claims.contains(**c))
                    .copied()
                    .collect();
                if !lost.is_empty() {
                    found.push(violation(
                        Invariant::Checkpoint,
                        format!("the checkpoint lost prepared claims {lost:?}"),
                    ));
                }
                let kept: Vec<&str> = released
                    .iter()
                    .filter(|c| claims.contains(**c))
                    .copied()
                    .collect();
                if !kept.is_empty() {
                    found.push(violation(
                        Invariant::Checkpoint,
                        format!("the checkpoint still holds unprepared claims {kept:?}"),
                    ));
                }
            }
        }
        if let Some(view) = &seen.view {
            let lost: Vec<&str> = prepared
                .iter()
                .filter(|c| !view.claims.iter().any(|v| v == **c))
                .copied()
                .collect();
            if !lost.is_empty() {
                found.push(violation(
                    Invariant::Checkpoint,
                    format!("/state lost prepared claims {lost:?}"),
                ));
            }
            if view.imex.restarts > node.imex_crashes {
                found.push(violation(
                    Invariant::Crash,
                    format!(
                        "its IMEX daemon was restarted {} times, the harness crashed it {} times",
                        view.imex.restarts, node.imex_crashes
                    ),
                ));
            }
        }
    }
    let sighting = sighting(world, obs, now);
    found.extend(peer_set_breaches(&sighting));
    found.extend(status_breaches(&sighting));
    found
}

/// The name of the node at `ip`, or the address where no node of the rack has it.
fn who(world: &World, ip: IpAddr) -> String {
    world
        .index_of_ip(ip)
        .map_or_else(|| ip.to_string(), |t| world.nodes[t].name.clone())
}

/// What a loopback run shows of its first domain, in the shape every run's invariants
/// read: each node's `/state` of the domain and the hosts block of its running IMEX
/// daemon, judged for isolation once it has held claims and run for the grace. A node
/// is out once it has held no claim for the grace.
fn sighting(world: &World, obs: &Observation, now: Instant) -> Sighting {
    let nodes = world.nodes.iter().zip(&obs.nodes).map(|(node, seen)| {
        let out =
            !node.holds_claims() && now.saturating_duration_since(node.released_at) >= world.grace;
        let domain = match &seen.view {
            _ if node.life != Life::Up => Err(format!("is {:?}", node.life)),
            None => Err(format!(
                "no /state: {}",
                seen.view_error.as_deref().unwrap_or("not asked")
            )),
            Some(view) => {
                let domains: Vec<_> = view
                    .domains
                    .iter()
                    .filter(|d| d.uid == world.domain_uid)
                    .collect();
                match domains.as_slice() {
                    [d] => Ok(DomainSighting {
                        members: d.members.clone(),
                        lost: d.lost.clone(),
                        phase: d.phase,
                        ready: d.ready,
                        total: d.total,
                        slots: Vec::new(),
                        peers: d.peers.iter().map(|(s, p)| (*s, p.clone())).collect(),
                    }),
                    _ => Err(format!("serves {} instances of the domain", domains.len())),
                }
            }
        };
        let imex = match &seen.hosts {
            _ if node.life != Life::Up => Err(format!("is {:?}", node.life)),
            _ if !seen.imex_running() => Err("runs no IMEX daemon".to_owned()),
            FileRead::Read(block) => Ok(block
                .slots
                .iter()
                .map(|(slot, ip)| (*slot, who(world, *ip)))
                .collect()),
            unread => Err(format!("hosts file: {unread:?}")),
        };
        let judged = node.holds_claims() && node.settled_up(now, world.grace);
        let sighted = NodeSighting {
            out,
            domain,
            imex,
            judged,
        };
        (node.name.clone(), sighted)
    });
    Sighting {
        nodes: nodes.collect(),
        status: obs.status.read().cloned(),
    }
}

/// Whether the status file says `node`'s IMEX daemon is failing, as the reporter
/// writes it: the domain NotReady, `node` NotReady, and named in the Ready condition's
/// message (`..., IMEX failing on: a, b`).
pub fn names_imex_failing(status: &FileRead<ComputeDomainStatus>, node: &str) -> bool {
    let Some(status) = status.read() else {
        return false;
    };
    let named = status
        .condition(READY_CONDITION)
        .and_then(|c| c.message.rsplit_once(IMEX_FAILING_ON))
        .is_some_and(|(_, nodes)| nodes.split(", ").any(|n| n == node));
    named
        && status.status == CrdPhase::NotReady
        && status
            .nodes
            .iter()
            .any(|n| n.name == node && n.status == CrdPhase::NotReady)
}

/// Where the reporter's message lists the nodes whose IMEX daemon is failing.
const IMEX_FAILING_ON: &str = "IMEX failing on: ";

/// Whether `target` is out of the peer set of every other member whose IMEX daemon
/// runs: the survivors noticed it went (at least one survivor must be looking).
pub fn dropped_by_all(world: &World, obs: &Observation, target: usize) -> bool {
    let ip = world.nodes[target].ip;
    let mut observers = 0;
    for (i, node) in world.nodes.iter().enumerate() {
        if i == target || !node.holds_claims() || node.life != Life::Up {
            continue;
        }
        let seen = &obs.nodes[i];
        let Some(block) = seen.hosts.read().filter(|_| seen.imex_running()) else {
            continue;
        };
        observers += 1;
        if block.slots.values().any(|a| *a == ip) {
            return false;
        }
    }
    observers > 0
}

/// Whether every other running member that answers `/state` holds `target`: lists it
/// among the members whose daemon is silent while their IMEX lives on (at least one
/// must answer). What peers show of a daemon gone while its IMEX runs.
pub fn held_by_all(world: &World, obs: &Observation, target: usize) -> bool {
    let name = &world.nodes[target].name;
    let mut observers = 0;
    for (i, node) in world.nodes.iter().enumerate() {
        if i == target || !node.holds_claims() || node.life != Life::Up {
            continue;
        }
        let Some(view) = &obs.nodes[i].view else {
            continue;
        };
        observers += 1;
        if !view.domains.iter().any(|d| d.held.contains(name)) {
            return false;
        }
    }
    observers > 0
}

/// Whether a fault of `kind` may break the imports held on the nodes it hits and the
/// imports of their memory. Only a node's IMEX going away does that: a new instance
/// (its memory cleaned up, NVIDIA's IMEX guide says) or the node dropped from its
/// peers' configs. `node-kill` takes IMEX with the daemon; `imex-crash` and `imex-port`
/// kill IMEX itself; a `partition` cuts IMEX off, and its peers must drop it as a dead
/// node. Everything else must leave every import alone: a daemon killed, paused,
/// restarted or upgraded (IMEX outlives it), a certificate rotation, packet loss (no
/// false removal), claim churn (the stand-in itself ends the imports of a job whose
/// claim it unprepares), a full state directory, another domain's churn.
pub fn may_break_imports(kind: FaultKind) -> bool {
    matches!(
        kind,
        FaultKind::NodeKill | FaultKind::ImexCrash | FaultKind::ImexPort | FaultKind::Partition
    )
}

/// A fault as the imports invariant remembers it: its kind, step and the nodes it hit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Hit {
    pub kind: FaultKind,
    pub step: usize,
    pub targets: Vec<usize>,
}

/// Which fault may have broken an import held on `importer`, whose break imex-sim
/// blames on `culprit` (the importer itself when its IMEX lost the import, a peer when
/// that peer's instance changed or it left the config; none when it names no node),
/// given the faults injected since the import was taken (`since`): the first that may
/// break imports and hit the culprit, or else the first such fault on the importer (a
/// node cut off drops every peer from its config). None: no fault did, so the break is
/// a violation.
pub fn import_break(importer: usize, culprit: Option<usize>, since: &[Hit]) -> Option<&Hit> {
    let on = |node: Option<usize>| {
        since.iter().find(move |hit| {
            may_break_imports(hit.kind) && node.is_some_and(|n| hit.targets.contains(&n))
        })
    };
    on(culprit).or_else(|| on(Some(importer)))
}

/// Members missing from another member's peer set: `(observer, missing)`. Under
/// message loss alone there should be none (no false removal).
pub fn missing_members(world: &World, obs: &Observation) -> Vec<(String, String)> {
    let members: Vec<usize> = world
        .imex_members()
        .into_iter()
        .filter(|m| world.nodes[*m].life == Life::Up)
        .collect();
    let mut missing = Vec::new();
    for o in &members {
        let seen = &obs.nodes[*o];
        let Some(block) = seen.hosts.read().filter(|_| seen.imex_running()) else {
            continue;
        };
        for m in &members {
            if !block.slots.values().any(|a| *a == world.nodes[*m].ip) {
                missing.push((world.nodes[*o].name.clone(), world.nodes[*m].name.clone()));
            }
        }
    }
    missing
}

fn sorted_names<'a>(world: &'a World, nodes: &[usize]) -> Vec<&'a str> {
    let mut names: Vec<&str> = nodes
        .iter()
        .map(|m| world.nodes[*m].name.as_str())
        .collect();
    names.sort_unstable();
    names
}

/// Why the rack is not settled, if it is not: every member runs, sees exactly the
/// members and the domain Ready, has the same peer set as every other (exactly the
/// members, one slot each), and the status file says Ready with exactly the members,
/// each Ready with its slot. Empty when settled.
pub fn unsettled(world: &World, obs: &Observation) -> Vec<Violation> {
    let mut reasons = Vec::new();
    let members = world.members();
    let names = sorted_names(world, &members);
    // Who must be in every peer set: with `--domains`, the holders of any sharing
    // domain's claim (one shared IMEX domain); otherwise the domain's members.
    let imex_members = world.imex_members();
    let imex_names = sorted_names(world, &imex_members);
    for m in &imex_members {
        let node = &world.nodes[*m];
        if node.life != Life::Up {
            reasons.push(Violation::new(
                Invariant::Liveness,
                Some(&node.name),
                format!("holds claims but is {:?}", node.life),
            ));
        }
    }
    let sighting = sighting(world, obs, obs.at);
    let owned = |names: &[&str]| names.iter().map(|n| (*n).to_owned()).collect::<Vec<_>>();
    let (member_names, holder_names) = (owned(&names), owned(&imex_names));
    let asked = Agreement {
        members: &member_names,
        peer_holders: &holder_names,
        ready: true,
        exact_peers: true,
        imex_as_domain: false,
    };
    let up = |name: &str| {
        world
            .nodes
            .iter()
            .any(|n| n.name == name && n.life == Life::Up)
    };
    for (node, why) in disagreements(&sighting, &asked) {
        if up(&node) {
            reasons.push(Violation::new(
                Invariant::Agreement,
                Some(&node),
                why.to_string(),
            ));
        }
    }
    // The peer set every member agrees on, if they do: the status's slots are its.
    let agreed: Option<BTreeMap<u16, String>> = imex_names
        .iter()
        .filter(|name| up(name))
        .find_map(|name| sighting.nodes[*name].imex.as_ref().ok())
        .map(|pairs| pairs.iter().cloned().collect());
    for (i, node) in world.nodes.iter().enumerate() {
        if !node.holds_claims() && node.life == Life::Up && obs.nodes[i].imex_running() {
            reasons.push(Violation::new(
                Invariant::Agreement,
                Some(&node.name),
                "holds no claim but runs an IMEX daemon",
            ));
        }
    }

    let status_reason = |detail: String| Violation::new(Invariant::Status, None, detail);
    match &obs.status {
        FileRead::Read(status) if !members.is_empty() => {
            for gap in status_gaps(status, &member_names) {
                reasons.push(status_reason(gap.to_string()));
            }
            for entry in &status.nodes {
                let Some(t) = world.nodes.iter().position(|n| n.name == entry.name) else {
                    continue;
                };
                if entry.ip_address != world.nodes[t].ip.to_string() {
                    reasons.push(status_reason(format!(
                        "{} has address {}",
                        entry.name, entry.ip_address
                    )));
                }
                // With `--domains` the peer set is the shared IMEX domain's, and the
                // status lists each member at its slot in the domain itself, as the
                // member's `/state` tells it.
                let expected = if world.sharing {
                    obs.nodes[t].view.as_ref().map(|v| {
                        v.domains
                            .iter()
                            .find(|d| d.uid == world.domain_uid)
                            .and_then(|d| d.slot)
                    })
                } else {
                    agreed.as_ref().map(|peers| {
                        peers
                            .iter()
                            .find(|(_, who)| **who == entry.name)
                            .map(|(slot, _)| *slot)
                    })
                };
                if let Some(slot) = expected
                    && entry.index != slot
                {
                    reasons.push(status_reason(format!(
                        "{} has index {:?}, its slot is {slot:?}",
                        entry.name, entry.index
                    )));
                }
            }
        }
        FileRead::Read(_) => {}
        FileRead::Missing if members.is_empty() => {}
        FileRead::Missing => reasons.push(status_reason("no status file".into())),
        FileRead::Bad(reason) => reasons.push(status_reason(reason.clone())),
    }
    reasons
}
