//! The **channels** invariant of a run of several ComputeDomains with `isolation:
//! Channel` on the same nodes (`--domains`): no pod holds a channel of a domain it does
//! not belong to, and two live domains never have the same channel.
//!
//! **What is read.** From every node whose `/state` was read (running, not paused):
//! the channels handed to its prepared claims (`channels`: claim, domain, channel), each
//! domain's confirmed channel (`domains[].channel`), and the shared IMEX domain's
//! assignment (`shared_imex.channels`). From the world: which domain the harness wrote
//! each claim for (its claim file), and each claim's phase.
//!
//! **Live.** A domain is live while the harness holds any claim of it on any node in a
//! phase other than Released: preparing (the daemon may have answered and handed the
//! channel before the harness collected the answer), prepared, or unpreparing (the pod
//! may still hold the channel until the unprepare is answered). The world is cloned
//! before any `/state` is read, and no claim becomes Released while an observation is
//! read (unprepares are awaited between ticks), so a domain live in the world was live
//! for the whole observation: a sighting of it is never from before its birth or after
//! its end. A domain deleted (every claim's unprepare answered) is not live: a node may
//! still show it for a moment, and its channel may already be another domain's, which is
//! the point of releasing it.
//!
//! **Why no sighting of a live domain may disagree.** A channel is handed out only once
//! confirmed, and a confirmed channel never moves while the domain lives (the slot rule,
//! `actors/src/rules/channels.rs`). So every handed channel and every confirmed channel
//! of one live domain, on whichever node and at whichever moment of an observation it
//! was read, is one channel; two live domains never share one. What is *not* a
//! sighting: an assignment not yet confirmed (`shared_imex.channels` of a domain no
//! claim was handed on that node), since views differ while gossip spreads and two new
//! domains may both be assigned a channel for a moment; that is what confirmation is
//! for. A node's assignment of a domain whose claim it handed a channel must be that
//! channel: the node would otherwise confirm another.
//!
//! The violations, each naming what showed it:
//! - a handed claim whose domain is not the one the harness wrote its claim for (a pod
//!   given another domain's channel outright), or that the harness unprepared;
//! - a live domain seen with two channels (its pods, or its pods and a node's confirmed
//!   channel, disagree: a pod of it could not share with the others, or a new pod would
//!   get another channel than the running ones);
//! - a channel seen for two live domains (a pod of one can import the other's memory);
//! - a node assigning a domain another channel than the one it handed that domain's
//!   claim.
//!
//! A gossip partition is outside: each side confirms with its own live nodes
//! (ARCHITECTURE, "Several ComputeDomains on one node"), and the harness creates no
//! domain during one (one fault at a time).

use std::collections::{BTreeMap, BTreeSet};

use domaind_actors::model::{ChannelId, Isolation};

use crate::invariants::{ClaimPhase, Invariant, Life, Violation, World};
use crate::observe::Observation;

/// Who showed a domain on a channel, for the violation's detail.
type Sightings<'a> = BTreeMap<&'a str, BTreeMap<ChannelId, BTreeSet<String>>>;

/// The domains of which the harness holds a claim, in any phase but Released.
pub fn live_domains(world: &World) -> BTreeSet<&str> {
    world
        .nodes
        .iter()
        .flat_map(|n| n.claims.iter())
        .filter(|(_, phase)| **phase != ClaimPhase::Released)
        .map(|(uid, _)| world.domain_of(uid))
        .collect()
}

/// The channels invariant on one observation.
pub fn check(world: &World, obs: &Observation) -> Vec<Violation> {
    let live = live_domains(world);
    let mut found = Vec::new();
    let mut seen: Sightings = BTreeMap::new();
    for (record, node) in world.nodes.iter().zip(&obs.nodes) {
        let Some(view) = node.view.as_ref().filter(|_| record.life == Life::Up) else {
            continue;
        };
        let name = record.name.as_str();
        let violation = |detail: String| Violation::new(Invariant::Channels, Some(name), detail);
        for handed in &view.channels {
            let wrote = world.domain_of(&handed.claim);
            if handed.domain != wrote {
                found.push(violation(format!(
                    "claim {} of domain {wrote} holds channel {} as domain {}'s",
                    handed.claim, handed.channel, handed.domain
                )));
            }
            if record.claims.get(&handed.claim) == Some(&ClaimPhase::Released) {
                found.push(violation(format!(
                    "claim {} was unprepared but still holds channel {}",
                    handed.claim, handed.channel
                )));
            }
            if let Some(assigned) = view
                .shared_imex
                .as_ref()
                .and_then(|s| s.channels.get(&handed.domain))
                && *assigned != handed.channel
            {
                found.push(violation(format!(
                    "assigns domain {} channel {assigned}, but handed its claim {} channel {}",
                    handed.domain, handed.claim, handed.channel
                )));
            }
            if let Some(domain) = live.get(handed.domain.as_str()) {
                seen.entry(domain)
                    .or_default()
                    .entry(handed.channel)
                    .or_default()
                    .insert(format!("{name}'s claim {}", handed.claim));
            }
        }
        for domain in &view.domains {
            let Some(channel) = domain.channel else {
                continue;
            };
            if domain.isolation != Isolation::Channel {
                found.push(violation(format!(
                    "domain {} has channel {channel} but isolation {:?}",
                    domain.uid, domain.isolation
                )));
            }
            if let Some(uid) = live.get(domain.uid.as_str()) {
                seen.entry(uid)
                    .or_default()
                    .entry(channel)
                    .or_default()
                    .insert(format!("{name} (confirmed)"));
            }
        }
    }
    found.extend(conflicts(&seen));
    found
}

/// A live domain on two channels, and a channel of two live domains.
fn conflicts(seen: &Sightings) -> Vec<Violation> {
    let mut found = Vec::new();
    let mut holders: BTreeMap<ChannelId, Vec<(&str, &BTreeSet<String>)>> = BTreeMap::new();
    for (domain, channels) in seen {
        if channels.len() > 1 {
            found.push(Violation::new(
                Invariant::Channels,
                None,
                format!("live domain {domain} is seen on channels {channels:?}"),
            ));
        }
        for (channel, who) in channels {
            holders.entry(*channel).or_default().push((domain, who));
        }
    }
    for (channel, domains) in holders {
        if domains.len() > 1 {
            found.push(Violation::new(
                Invariant::Channels,
                None,
                format!("channel {channel} is held by live domains {domains:?}"),
            ));
        }
    }
    found
}

#[cfg(test)]
mod tests {
    use std::net::IpAddr;
    use std::time::{Duration, Instant};

    use domaind_actors::model::Phase;
    use domaind_node::run::{DomainView, HandedChannel, NodeView, SharedImexView};

    use super::*;
    use crate::observe::{FileRead, NodeObservation};

    const D1: &str = "chaos-d1";
    const D2: &str = "chaos-d2";

    fn ip(i: usize) -> IpAddr {
        format!("127.0.9.{}", i + 1).parse().unwrap()
    }

    /// Three nodes, up; D1 (the first domain) and D2 each hold a prepared claim on
    /// every node: `c1-<n>` and `c2-<n>`.
    fn world() -> World {
        let now = Instant::now() - Duration::from_secs(60);
        let mut world = World::new(
            D1,
            Duration::from_secs(5),
            (0..3).map(|i| (format!("n{i}"), ip(i))),
            now,
        );
        world.sharing = true;
        for i in 0..3 {
            world.set_life(i, Life::Up, now);
            world.set_claim(i, &format!("c1-{i}"), ClaimPhase::Prepared, now);
            world.set_claim(i, &format!("c2-{i}"), ClaimPhase::Prepared, now);
            world.claim_domains.insert(format!("c2-{i}"), D2.into());
        }
        world
    }

    fn domain(uid: &str, channel: Option<ChannelId>) -> DomainView {
        DomainView {
            uid: uid.into(),
            namespace: "chaos".into(),
            name: uid.into(),
            phase: Phase::Ready,
            ready: 3,
            total: 3,
            slot: Some(0),
            local_ready: true,
            members: Vec::new(),
            lost: Vec::new(),
            held: Vec::new(),
            peers: BTreeMap::new(),
            reporter: None,
            isolation: Isolation::Channel,
            channel,
        }
    }

    /// What node `i` shows when D1 is on channel 1 and D2 on channel 2, every claim
    /// handed its own.
    fn view(i: usize) -> NodeView {
        NodeView {
            node: format!("n{i}"),
            claims: vec![format!("c1-{i}"), format!("c2-{i}")],
            prepared: vec![format!("c1-{i}"), format!("c2-{i}")],
            imex: domaind_node::run::ImexView {
                running: true,
                starts: 1,
                restarts: 0,
                last_failure: None,
                restart_delay_ms: None,
                failing: false,
                failures_in_a_row: 0,
            },
            domains: vec![domain(D1, Some(1)), domain(D2, Some(2))],
            gossip: Default::default(),
            checkpoint: Default::default(),
            channels: vec![
                HandedChannel {
                    claim: format!("c1-{i}"),
                    domain: D1.into(),
                    channel: 1,
                },
                HandedChannel {
                    claim: format!("c2-{i}"),
                    domain: D2.into(),
                    channel: 2,
                },
            ],
            shared_imex: Some(SharedImexView {
                uid: "shared-imex.c".into(),
                members: Vec::new(),
                lost: Vec::new(),
                slot: Some(0),
                local_ready: true,
                peers: BTreeMap::new(),
                channels: [(D1.to_owned(), 1), (D2.to_owned(), 2)].into(),
            }),
        }
    }

    fn observe(edit: impl Fn(usize, &mut NodeView)) -> Observation {
        Observation {
            at: Instant::now(),
            nodes: (0..3)
                .map(|i| {
                    let mut seen = NodeObservation::empty();
                    let mut v = view(i);
                    edit(i, &mut v);
                    seen.view = Some(v);
                    seen
                })
                .collect(),
            status: FileRead::Missing,
        }
    }

    fn details(found: &[Violation]) -> Vec<String> {
        found.iter().map(|v| v.detail.clone()).collect()
    }

    #[test]
    fn every_domain_on_its_own_channel_everywhere_is_no_violation() {
        assert_eq!(check(&world(), &observe(|_, _| {})), Vec::new());
    }

    #[test]
    fn a_pod_given_another_domains_channel_is_seen() {
        // n1 hands D2's claim D1's channel, as D1's.
        let found = check(
            &world(),
            &observe(|i, v| {
                if i == 1 {
                    v.channels[1].domain = D1.into();
                    v.channels[1].channel = 1;
                }
            }),
        );
        let details = details(&found);
        assert!(
            details.iter().any(|d| d
                .contains("claim c2-1 of domain chaos-d2 holds channel 1 as domain chaos-d1's")),
            "{details:?}"
        );
    }

    #[test]
    fn two_live_domains_on_one_channel_are_seen_from_any_two_nodes() {
        // n2 confirms D2 on D1's channel; its own pods still hold 2.
        let found = check(
            &world(),
            &observe(|i, v| {
                if i == 2 {
                    v.domains[1].channel = Some(1);
                }
            }),
        );
        let details = details(&found);
        assert!(
            details
                .iter()
                .any(|d| d.starts_with("channel 1 is held by live domains")),
            "{details:?}"
        );
        assert!(
            details
                .iter()
                .any(|d| d.starts_with("live domain chaos-d2 is seen on channels")),
            "{details:?}"
        );
    }

    #[test]
    fn a_pod_on_a_moved_channel_is_seen() {
        // n0's pod of D2 holds 3 while every node confirms 2.
        let found = check(
            &world(),
            &observe(|i, v| {
                if i == 0 {
                    v.channels[1].channel = 3;
                }
            }),
        );
        let details = details(&found);
        assert!(
            details
                .iter()
                .any(|d| d.contains("live domain chaos-d2 is seen on channels")
                    && d.contains("n0's claim c2-0")),
            "{details:?}"
        );
        assert!(
            details.iter().any(|d| d.contains(
                "assigns domain chaos-d2 channel 2, but handed its claim c2-0 channel 3"
            )),
            "{details:?}"
        );
    }

    #[test]
    fn a_deleted_domains_channel_may_be_another_domains() {
        // D2 deleted: every claim unprepared and answered. n2 still shows it confirmed
        // on channel 2, which a new domain D3 now holds: D2 is not live, no violation.
        let mut world = world();
        let now = Instant::now();
        for i in 0..3 {
            world.set_claim(i, &format!("c2-{i}"), ClaimPhase::Released, now);
        }
        world.set_claim(0, "c3-0", ClaimPhase::Prepared, now);
        world.claim_domains.insert("c3-0".into(), "chaos-d3".into());
        let found = check(
            &world,
            &observe(|i, v| {
                v.channels.truncate(1);
                if i != 2 {
                    v.domains.truncate(1);
                }
                if i == 0 {
                    v.domains.push(domain("chaos-d3", Some(2)));
                    v.channels.push(HandedChannel {
                        claim: "c3-0".into(),
                        domain: "chaos-d3".into(),
                        channel: 2,
                    });
                    let shared = v.shared_imex.as_mut().unwrap();
                    shared.channels.remove(D2);
                    shared.channels.insert("chaos-d3".into(), 2);
                }
            }),
        );
        assert_eq!(found, Vec::new());
        assert!(!live_domains(&world).contains(D2));
    }

    #[test]
    fn an_unconfirmed_assignment_is_not_a_sighting() {
        // Two domains assigned one channel for a moment, neither confirmed nor handed
        // on that node: what confirmation exists for.
        let mut world = world();
        let now = Instant::now();
        world.set_claim(1, "c4-1", ClaimPhase::Preparing, now);
        world.claim_domains.insert("c4-1".into(), "chaos-d4".into());
        let found = check(
            &world,
            &observe(|i, v| {
                if i == 1 {
                    v.shared_imex
                        .as_mut()
                        .unwrap()
                        .channels
                        .insert("chaos-d4".into(), 2);
                }
            }),
        );
        assert_eq!(found, Vec::new());
    }

    #[test]
    fn an_unprepared_claim_still_holding_a_channel_is_seen() {
        let mut world = world();
        world.set_claim(1, "c2-1", ClaimPhase::Released, Instant::now());
        let found = check(&world, &observe(|_, _| {}));
        assert_eq!(
            details(&found),
            vec!["claim c2-1 was unprepared but still holds channel 2".to_owned()]
        );
    }

    #[test]
    fn a_paused_nodes_old_view_is_not_read() {
        let mut world = world();
        world.set_life(2, Life::Paused, Instant::now());
        let found = check(
            &world,
            &observe(|i, v| {
                if i == 2 {
                    v.domains[1].channel = Some(1);
                }
            }),
        );
        assert_eq!(found, Vec::new());
    }
}
