use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use domaind_membership::{Member, Membership};
use proptest::prelude::*;
use tokio::time::Instant;

use super::*;
use crate::actors::imex_process::ImexFailure;
use crate::model::{CliqueId, DomainUid, Phase, Sharing};
use crate::ports::DomainEvent;
use crate::rules::fixtures::advertisement;
use crate::rules::membership::{domain_key, encode_advertisement};
use crate::rules::reporter_role::ReadOutcome;
use crate::rules::roster::Change;

const ME: &str = "a";

fn domain() -> DomainRef {
    DomainRef {
        uid: DomainUid("uid-1".into()),
        namespace: "ns".into(),
        name: "cd".into(),
        num_nodes: 0,
    }
}

fn config(max_slots: Slot) -> Arc<NodeConfig> {
    let mut config = NodeConfig::new(ME, "10.0.0.1".parse().unwrap(), CliqueId("c.0".into()));
    config.max_slots = max_slots;
    Arc::new(config)
}

fn core(role: Role, now: Instant) -> DomainCore {
    DomainCore::new(domain(), config(4), role, now)
}

fn fresh() -> Restore {
    Restore {
        previous: None,
        checkpoint_slot: None,
        checkpoint_channel: None,
        imex_outlives_daemon: false,
        now_ms: 1_000,
    }
}

/// A node alive in gossip; advertising the domain with `ad` when there is one.
fn node(name: &str, generation: u64, ad: Option<&Advertisement>) -> (String, Member) {
    let keys = ad
        .map(|ad| (domain_key(&domain().uid), encode_advertisement(ad)))
        .into_iter()
        .collect();
    (
        name.to_owned(),
        Member {
            node: name.to_owned(),
            generation,
            gossip_addr: "10.0.0.9:7946".parse().unwrap(),
            keys,
        },
    )
}

fn remote(slot: Option<Slot>, imex_ready: bool, joined_at_ms: u64) -> Advertisement {
    Advertisement {
        slot,
        imex_ready,
        joined_at_ms,
        ..advertisement()
    }
}

fn pass(core: &mut DomainCore, live: &Membership, now: Instant) -> Pass {
    core.pass(PassInput {
        live,
        holds_claims: true,
        writing: false,
        now,
        now_ms: 5_000,
    })
    .expect("restored")
}

fn ready_report(
    version: u64,
    links: BTreeMap<Slot, bool>,
    asked_at: Option<Instant>,
) -> ImexReport {
    ImexReport {
        version: Some(version),
        running: true,
        ready: true,
        links,
        kept: None,
        adopted: false,
        catching_up: false,
        asked_at,
        failure: None,
    }
}

fn signals(effects: &[DomainEffect], to: &str) -> Vec<PeerSignal> {
    effects
        .iter()
        .filter_map(|effect| match effect {
            DomainEffect::Signal { node, signal, .. } if node == to => Some(*signal),
            _ => None,
        })
        .collect()
}

#[test]
fn nothing_is_decided_before_the_advertisement_is_restored() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    let live: Membership = [node(ME, 1, None)].into();
    assert!(
        core.pass(PassInput {
            live: &live,
            holds_claims: false,
            writing: false,
            now,
            now_ms: 5_000,
        })
        .is_none()
    );
}

#[test]
fn a_node_alone_takes_slot_zero_runs_imex_with_itself_and_is_ready_once_imex_says_so() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    assert!(!core.restore(fresh()));
    let live: Membership = [node(ME, 1, None)].into();
    let first = pass(&mut core, &live, now);
    let DomainEffect::ApplyPeers { version, peers, .. } = first
        .effects
        .iter()
        .find(|e| matches!(e, DomainEffect::ApplyPeers { .. }))
        .cloned()
        .expect("IMEX configured")
    else {
        unreachable!()
    };
    assert_eq!((version, peers.nodes().collect::<Vec<_>>()), (1, vec![ME]));
    assert!(first.effects.contains(&DomainEffect::SlotChanged(Some(0))));
    assert_eq!(core.advertisement().unwrap().slot, Some(0));
    assert!(!core.advertisement().unwrap().imex_ready);
    assert!(!core.progress().unwrap().local_ready);

    let effects = core.imex_reported(ready_report(1, BTreeMap::new(), Some(now)), now);
    assert_eq!(effects, vec![DomainEffect::Pass]);
    pass(&mut core, &live, now);
    assert!(core.advertisement().unwrap().imex_ready);
    assert!(core.readiness().unwrap().is_ready());
    let progress = core.progress().unwrap();
    assert!(progress.local_ready && progress.domain_ready);
    // Nothing changed since: nothing to carry out.
    assert!(pass(&mut core, &live, now).effects.is_empty());
}

#[test]
fn a_report_for_an_older_peer_set_is_no_readiness() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.restore(fresh());
    let alone: Membership = [node(ME, 1, None)].into();
    pass(&mut core, &alone, now);
    let b = remote(None, false, 2_000);
    let two: Membership = [node(ME, 1, None), node("b", 1, Some(&b))].into();
    let effects = pass(&mut core, &two, now).effects;
    assert!(
        effects
            .iter()
            .any(|e| matches!(e, DomainEffect::ApplyPeers { version: 2, .. }))
    );
    core.imex_reported(ready_report(1, BTreeMap::new(), None), now);
    pass(&mut core, &two, now);
    assert!(!core.advertisement().unwrap().imex_ready);
}

#[test]
fn every_remote_member_hears_it_is_alive_and_what_it_advertises_each_pass() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.restore(fresh());
    let b = remote(Some(1), true, 2_000);
    let live: Membership = [node(ME, 1, None), node("b", 3, Some(&b))].into();
    for _ in 0..2 {
        let effects = pass(&mut core, &live, now).effects;
        let heard = signals(&effects, "b");
        assert_eq!(heard.len(), 2);
        assert_eq!(heard[0], PeerSignal::Gossip { alive: true });
        assert!(matches!(heard[1], PeerSignal::Advertised(a) if a.generation == 3 && a.imex_ready));
    }
}

#[test]
fn a_member_silent_in_gossip_is_lost_its_imex_peer_told_once_and_imex_asked_now() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.restore(fresh());
    let b = remote(Some(1), true, 2_000);
    let both: Membership = [node(ME, 1, None), node("b", 1, Some(&b))].into();
    pass(&mut core, &both, now);
    let alone: Membership = [node(ME, 1, None)].into();
    let lost = pass(&mut core, &alone, now);
    assert!(matches!(&lost.changes[..], [Change::Lost { node, .. }] if node == "b"));
    assert_eq!(
        signals(&lost.effects, "b"),
        vec![PeerSignal::Gossip { alive: false }]
    );
    assert!(lost.effects.contains(&DomainEffect::QueryImex));
    // Still lost: told once, and it keeps its slot.
    let again = pass(&mut core, &alone, now);
    assert!(signals(&again.effects, "b").is_empty());
    assert_eq!(core.assignment().slot_of("b"), Some(1));
    assert_eq!(core.readiness().unwrap().phase, Phase::NotReady);
    assert!(lost.expiry.is_some());
}

#[test]
fn a_sharing_domain_never_drives_imex() {
    let now = Instant::now();
    let mut core = core(Role::Sharing, now);
    core.restore(fresh());
    let b = remote(Some(1), true, 2_000);
    let both: Membership = [node(ME, 1, None), node("b", 1, Some(&b))].into();
    let alone: Membership = [node(ME, 1, None)].into();
    let effects: Vec<DomainEffect> = [&both, &alone]
        .into_iter()
        .flat_map(|live| pass(&mut core, live, now).effects)
        .collect();
    assert!(!effects.iter().any(|e| matches!(
        e,
        DomainEffect::ApplyPeers { .. } | DomainEffect::ReleaseImex | DomainEffect::QueryImex
    )));
    // Its pods wait for a channel the shared IMEX domain has not given yet.
    assert!(!core.progress().unwrap().domain_ready);
    assert!(core.progress().unwrap().summary.contains("domain ns/cd"));
}

#[test]
fn the_shared_imex_domain_assigns_a_channel_and_confirms_it_once_settled() {
    let now = Instant::now();
    let mut core = core(Role::SharedImex, now);
    core.restore(fresh());
    let sharing_domain = DomainUid("s-1".into());
    let wants = Advertisement {
        sharing: Some(Sharing::default()),
        ..advertisement()
    };
    let mut me = node(ME, 1, None);
    me.1.keys
        .insert(domain_key(&sharing_domain), encode_advertisement(&wants));
    let live: Membership = [me].into();
    let settle = config(4).channel_settle;
    let told = |effects: &[DomainEffect]| {
        effects.iter().find_map(|e| match e {
            DomainEffect::TellNode(progress) => Some(progress.clone()),
            _ => None,
        })
    };
    let first = pass(&mut core, &live, now).effects;
    assert!(first.contains(&DomainEffect::PassAt(now + settle)));
    let news = told(&first).expect("the node is told");
    assert_eq!(news.assigned, [(sharing_domain.clone(), 0)].into());
    assert!(news.confirmed.is_empty());
    assert_eq!(core.channels(), [(sharing_domain.clone(), 0)].into());
    let settled = pass(&mut core, &live, now + settle).effects;
    assert_eq!(
        told(&settled).expect("the node is told").confirmed,
        [(sharing_domain, 0)].into()
    );
    // Told once.
    assert_eq!(told(&pass(&mut core, &live, now + settle).effects), None);
    assert!(core.hold_channels([(DomainUid("s-1".into()), 0)].into()));
    assert!(!core.hold_channels([(DomainUid("s-1".into()), 0)].into()));
}

#[test]
fn a_sharing_domain_is_ready_once_the_shared_imex_domain_confirms_its_channel() {
    let now = Instant::now();
    let mut core = core(Role::Sharing, now);
    core.restore(fresh());
    let live: Membership = [node(ME, 1, None)].into();
    pass(&mut core, &live, now);
    assert!(!core.progress().unwrap().local_ready);
    let uid = domain().uid;
    let effects = core.shared_progress(SharedImexProgress {
        local_ready: true,
        assigned: [(uid.clone(), 2)].into(),
        confirmed: [(uid, 2)].into(),
        ..SharedImexProgress::default()
    });
    assert_eq!(effects, vec![DomainEffect::Pass]);
    pass(&mut core, &live, now);
    let progress = core.progress().unwrap();
    assert!(progress.local_ready && progress.domain_ready);
    assert_eq!((progress.channel, core.channel()), (Some(2), Some(2)));
    assert!(core.advertisement().unwrap().sharing.as_ref().unwrap().held);
}

#[test]
fn a_member_gone_from_the_view_but_alive_in_gossip_left_and_its_peer_is_retired() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.restore(fresh());
    let b = remote(Some(1), true, 2_000);
    let both: Membership = [node(ME, 1, None), node("b", 1, Some(&b))].into();
    pass(&mut core, &both, now);
    let without: Membership = [node(ME, 1, None), node("b", 1, None)].into();
    let left = pass(&mut core, &without, now);
    assert_eq!(left.changes, vec![Change::Left("b".into())]);
    assert!(left.effects.contains(&DomainEffect::RetirePeer("b".into())));
    assert_eq!(core.assignment().slot_of("b"), None);
}

#[test]
fn links_a_live_peer_hears_of_changes_only_and_a_silent_one_hears_every_answer() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.restore(fresh());
    let b = remote(Some(1), true, 2_000);
    let both: Membership = [node(ME, 1, None), node("b", 1, Some(&b))].into();
    pass(&mut core, &both, now);
    let up: BTreeMap<Slot, bool> = [(0, true), (1, true)].into();
    let first = core.imex_reported(ready_report(1, up.clone(), Some(now)), now);
    assert_eq!(signals(&first, "b").len(), 1);
    let same = core.imex_reported(ready_report(1, up.clone(), Some(now)), now);
    assert!(signals(&same, "b").is_empty());

    let alone: Membership = [node(ME, 1, None)].into();
    pass(&mut core, &alone, now);
    let asked = now + Duration::from_millis(10);
    let heard = signals(
        &core.imex_reported(ready_report(1, up, Some(asked)), asked),
        "b",
    );
    assert!(matches!(heard[..], [PeerSignal::ImexLink(answer)] if answer.up && answer.listed));
    // Missing from the answer: down, unlisted.
    let heard = signals(
        &core.imex_reported(ready_report(1, [(0, true)].into(), Some(asked)), asked),
        "b",
    );
    assert!(
        matches!(heard[..], [PeerSignal::ImexLink(answer)] if !answer.up && !answer.listed && answer.asked_at == asked)
    );
    // No question answered: nothing said of links.
    assert!(
        signals(
            &core.imex_reported(ready_report(1, BTreeMap::new(), None), asked),
            "b"
        )
        .is_empty()
    );
}

#[test]
fn a_failure_episode_and_a_kept_imex_are_each_told_once() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.restore(fresh());
    let failing = |episode| ImexReport {
        failure: Some(ImexFailure {
            episode,
            reason: format!("exit {episode}"),
        }),
        kept: Some("another config".into()),
        running: false,
        ..ready_report(1, BTreeMap::new(), None)
    };
    let told = core.imex_reported(failing(1), now);
    assert!(told.contains(&DomainEffect::ImexKept("another config".into())));
    assert!(told.contains(&DomainEffect::ImexFailing("exit 1".into())));
    let again = core.imex_reported(failing(1), now);
    assert!(again.is_empty());
    let next = core.imex_reported(failing(2), now);
    assert_eq!(
        next,
        vec![
            DomainEffect::ImexFailing("exit 2".into()),
            DomainEffect::Pass
        ]
    );
    // The episode told is kept across a restart of the actor.
    core.reset();
    core.restore(fresh());
    assert!(
        !core
            .imex_reported(failing(2), now)
            .contains(&DomainEffect::ImexFailing("exit 2".into()))
    );
}

#[test]
fn the_shared_imex_domains_failure_is_told_by_the_sharing_domain_not_by_itself() {
    let now = Instant::now();
    let mut shared = core(Role::SharedImex, now);
    shared.restore(fresh());
    let report = ImexReport {
        failure: Some(ImexFailure {
            episode: 1,
            reason: "exit".into(),
        }),
        ..ready_report(1, BTreeMap::new(), None)
    };
    assert!(
        !shared
            .imex_reported(report, now)
            .iter()
            .any(|e| matches!(e, DomainEffect::ImexFailing(_)))
    );

    let mut sharing = core(Role::Sharing, now);
    let news = SharedImexProgress {
        failure: Some((1, "exit".into())),
        ..SharedImexProgress::default()
    };
    let effects = sharing.shared_progress(news.clone());
    assert!(
        matches!(&effects[..], [DomainEffect::ImexFailing(why), DomainEffect::Pass] if why.starts_with("exit (the shared IMEX domain of clique c.0"))
    );
    assert!(sharing.shared_progress(news).is_empty());
}

#[test]
fn a_restarted_daemon_waits_for_its_adopted_imex_and_the_peer_set_to_settle() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    let waits = core.restore(Restore {
        checkpoint_slot: Some(0),
        imex_outlives_daemon: true,
        ..fresh()
    });
    assert!(waits && core.awaiting_adoption());
    let live: Membership = [node(ME, 2, None)].into();
    pass(&mut core, &live, now);
    let adopted = ImexReport {
        adopted: true,
        ..ready_report(1, BTreeMap::new(), None)
    };
    let settle = config(4).reporter_settle;
    let effects = core.imex_reported(adopted.clone(), now);
    assert_eq!(
        effects.last(),
        Some(&DomainEffect::CheckAdoptionAt(now + settle))
    );
    assert!(core.awaiting_adoption());
    assert_eq!(
        core.end_adoption_wait(now + settle),
        Some(DomainEffect::AdoptionEnded { anew: false })
    );
    assert!(!core.awaiting_adoption());
    assert_eq!(core.end_adoption_wait(now + settle), None);
}

#[test]
fn a_restarted_daemon_whose_imex_started_anew_advertises_at_once() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.restore(Restore {
        checkpoint_slot: Some(0),
        imex_outlives_daemon: true,
        ..fresh()
    });
    let effects = core.imex_reported(ready_report(1, BTreeMap::new(), None), now);
    assert_eq!(
        effects.last(),
        Some(&DomainEffect::AdoptionEnded { anew: true })
    );
    assert!(!core.awaiting_adoption());
}

#[test]
fn no_adoption_wait_without_a_previous_slot_or_an_imex_that_outlives_the_daemon() {
    let now = Instant::now();
    for (restore, role) in [
        (
            Restore {
                imex_outlives_daemon: true,
                ..fresh()
            },
            Role::Exclusive,
        ),
        (
            Restore {
                checkpoint_slot: Some(0),
                ..fresh()
            },
            Role::Exclusive,
        ),
        (
            Restore {
                checkpoint_slot: Some(0),
                imex_outlives_daemon: true,
                ..fresh()
            },
            Role::Sharing,
        ),
    ] {
        let mut core = core(role, now);
        assert!(!core.restore(restore));
        assert!(!core.give_up_adoption());
    }
}

#[test]
fn a_restart_keeps_its_slot_its_join_time_and_the_peer_set_imex_runs_with() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.restore(fresh());
    let live: Membership = [node(ME, 1, None)].into();
    pass(&mut core, &live, now);
    let previous = core.advertisement().cloned();
    core.reset();
    core.restore(Restore {
        previous: previous.clone(),
        now_ms: 9_999,
        ..fresh()
    });
    let ad = core.advertisement().unwrap();
    assert_eq!((ad.slot, ad.joined_at_ms), (Some(0), 1_000));
    let effects = pass(&mut core, &live, now).effects;
    assert!(
        !effects
            .iter()
            .any(|e| matches!(e, DomainEffect::ApplyPeers { .. }))
    );
}

#[test]
fn a_sharing_domain_restores_the_channel_its_pods_hold() {
    let now = Instant::now();
    let mut core = core(Role::Sharing, now);
    core.restore(Restore {
        checkpoint_channel: Some(3),
        ..fresh()
    });
    let sharing = core.advertisement().unwrap().sharing.clone().unwrap();
    assert_eq!((sharing.channel, sharing.held), (Some(3), true));
}

#[test]
fn a_new_view_counts_as_a_membership_change_only_when_its_names_differ() {
    let now = Instant::now();
    let mut core = core(Role::Exclusive, now);
    core.gossip_changed(["a".into()].into(), now);
    assert_eq!(core.membership_changed, None);
    let later = now + Duration::from_secs(1);
    core.gossip_changed(["a".into()].into(), later);
    assert_eq!(core.membership_changed, None);
    core.gossip_changed(["a".into(), "b".into()].into(), later);
    assert_eq!(core.membership_changed, Some(later));
}

fn reporting(
    core: &mut DomainCore,
    live: &Membership,
    writing: bool,
    now: Instant,
) -> Vec<DomainEffect> {
    core.gossip_changed(live.keys().cloned().collect(), now);
    core.pass(PassInput {
        live,
        holds_claims: true,
        writing,
        now,
        now_ms: 5_000,
    })
    .expect("restored")
    .report
}

#[test]
fn the_reporter_settles_reads_the_written_status_once_then_writes_and_tells_what_changes() {
    let start = Instant::now();
    let mut core = core(Role::Exclusive, start);
    core.restore(fresh());
    let b = remote(Some(1), true, 2_000);
    let live: Membership = [node(ME, 1, None), node("b", 1, Some(&b))].into();
    let settle = config(4).reporter_settle;
    assert_eq!(
        reporting(&mut core, &live, false, start),
        vec![DomainEffect::PassAt(start + settle)]
    );
    let now = start + settle;
    assert_eq!(
        reporting(&mut core, &live, false, now),
        vec![DomainEffect::ReadWritten]
    );
    assert!(reporting(&mut core, &live, false, now).is_empty());
    assert_eq!(
        core.read_finished(Ok::<_, ()>(None), now),
        ReadOutcome::Read
    );
    let started = reporting(&mut core, &live, false, now);
    // The members found at the start of a tenure are no news.
    assert!(matches!(
        &started[..],
        [
            DomainEffect::StartWriter { written: None, adopted, members: 2, .. },
            DomainEffect::PublishStatus(_),
        ] if adopted.is_empty()
    ));
    // The tenure goes on: the document again, no event when nothing changed.
    let next = reporting(&mut core, &live, true, now);
    assert!(matches!(&next[..], [DomainEffect::PublishStatus(_)]));
    // b is silent; c, in no domain, keeps this node from being alone in gossip.
    let without_b: Membership = [node(ME, 1, None), node("c", 1, None)].into();
    // A view that changed settles first.
    let gone = now + settle;
    assert_eq!(
        reporting(&mut core, &without_b, true, gone),
        vec![DomainEffect::PassAt(gone + settle)]
    );
    let lost = reporting(&mut core, &without_b, true, gone + settle);
    assert!(
        lost.contains(&DomainEffect::Events(vec![DomainEvent::NodeLost {
            node: "b".into()
        }]))
    );
}

#[test]
fn a_node_the_rule_does_not_name_stops_writing() {
    let start = Instant::now();
    let mut core = core(Role::Exclusive, start);
    core.restore(fresh());
    let senior = remote(Some(1), true, 2_000);
    let live: Membership = [node(ME, 1, None), node("0", 1, Some(&senior))].into();
    reporting(&mut core, &live, false, start);
    let later = start + config(4).reporter_settle;
    assert_eq!(
        reporting(&mut core, &live, true, later),
        vec![DomainEffect::StopWriter]
    );
}

#[test]
fn the_shared_imex_domain_writes_no_status() {
    let start = Instant::now();
    let mut core = core(Role::SharedImex, start);
    core.restore(fresh());
    let live: Membership = [node(ME, 1, None)].into();
    for at in [start, start + Duration::from_secs(5)] {
        assert!(reporting(&mut core, &live, false, at).is_empty());
    }
}

/// One step of a random history: which remote nodes are in gossip, advertising the
/// domain or not, and whether they say their IMEX is ready.
#[derive(Debug, Clone)]
struct Step {
    /// Per remote node: absent from gossip, alive without the domain, or a member.
    presence: Vec<u8>,
    ready: Vec<bool>,
    imex_ready_here: bool,
}

fn steps() -> impl Strategy<Value = Vec<Step>> {
    prop::collection::vec(
        (
            prop::collection::vec(0u8..3, 5),
            // Mostly ready, so that histories reach a Ready domain often.
            prop::collection::vec(prop::bool::weighted(0.8), 5),
            prop::bool::weighted(0.8),
        )
            .prop_map(|(presence, ready, imex_ready_here)| Step {
                presence,
                ready,
                imex_ready_here,
            }),
        1..25,
    )
}

proptest! {
    /// Over any history of views (remote members advertising the slot they were last
    /// assigned, as they do): peer-set versions only grow and IMEX is advertised ready
    /// only for the version it reported on, slots are unique and in range, a listed member keeps the
    /// slot it advertises (a lost one had to advertise it before it went silent), the peer set is the slotted members', and the
    /// domain is never Ready with a member lost, unslotted or not ready.
    #[test]
    fn slots_stay_unique_and_stable_and_readiness_never_skips_a_member(history in steps()) {
        let max_slots: Slot = 4;
        let start = Instant::now();
        let mut core = DomainCore::new(domain(), config(max_slots), Role::Exclusive, start);
        core.restore(fresh());
        let names = ["b", "c", "d", "e", "f"];
        let mut joined: BTreeMap<&str, u64> = BTreeMap::new();
        let mut clock_ms = 2_000;
        let mut before: BTreeMap<NodeId, Slot> = BTreeMap::new();
        let (mut applied, mut reported) = (0, None);
        for (i, step) in history.iter().enumerate() {
            let now = start + Duration::from_millis(i as u64);
            let mut live: Membership = [node(ME, 1, None)].into();
            for (k, name) in names.iter().enumerate() {
                // A node joins anew, junior to all, unless the roster still has it.
                let listed = core.roster().members().contains_key(*name)
                    || core.roster().lost().contains_key(*name);
                if step.presence[k] == 2 && !listed {
                    clock_ms += 1;
                    joined.insert(name, clock_ms);
                }
                let ad = remote(before.get(*name).copied(), step.ready[k], joined.get(name).copied().unwrap_or(clock_ms));
                match step.presence[k] {
                    0 => {}
                    1 => { live.insert(name.to_string(), node(name, 1, None).1); }
                    _ => { live.insert(name.to_string(), node(name, 1, Some(&ad)).1); }
                }
            }
            let pass = pass(&mut core, &live, now);
            // IMEX is ready for a set only once it reported so for that very version.
            let ad = core.advertisement().unwrap();
            prop_assert!(!ad.imex_ready || (reported == Some(applied) && !core.peer_set().is_empty()));
            let version = pass.effects.iter().find_map(|e| match e {
                DomainEffect::ApplyPeers { version, .. } => Some(*version),
                _ => None,
            });
            if let Some(version) = version {
                prop_assert!(version > applied, "versions only grow");
                applied = version;
                if step.imex_ready_here {
                    core.imex_reported(ready_report(version, BTreeMap::new(), None), now);
                    reported = Some(version);
                }
            }
            let assignment = core.assignment().clone();
            let slots: Vec<Slot> = assignment.slots.values().copied().collect();
            let unique: std::collections::BTreeSet<Slot> = slots.iter().copied().collect();
            prop_assert_eq!(unique.len(), slots.len());
            prop_assert!(slots.iter().all(|slot| *slot < max_slots));
            let members = core.roster().imex_members();
            // Listed, live or lost, and advertising the slot it held: it keeps it.
            for (node, slot) in &before {
                let Some(member) = members.get(node) else {
                    continue;
                };
                if member.ad.slot == Some(*slot) {
                    prop_assert_eq!(assignment.slot_of(node), Some(*slot), "{} moved", node);
                }
            }
            for (slot, peer) in &core.peer_set().peers {
                prop_assert_eq!(assignment.slot_of(&peer.node), Some(*slot));
            }
            let readiness = core.readiness().unwrap();
            if readiness.is_ready() {
                prop_assert_eq!(core.roster().unheld_lost().count(), 0);
                prop_assert!(assignment.unassigned.is_empty());
                for node in core.roster().members().keys() {
                    prop_assert!(readiness.ready_nodes.contains(node), "{} not ready", node);
                }
            }
            prop_assert!(!core.progress().unwrap().domain_ready || readiness.is_ready());
            before = assignment.slots;
        }
    }
}
