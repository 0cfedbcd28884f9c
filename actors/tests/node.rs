//! The actors of a node, over fakes and in paused time: forming, preparing, the
//! one-domain rule, restarts, and losing and regaining a member.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Rack, claim_ref, domain, prepare_on, run};
use domaind_actors::PrepareError;
use domaind_actors::actors::domain::Crash;
use domaind_actors::actors::node::GetDomain;
use domaind_actors::model::{DomainUid, Phase, ReadinessPolicy};
use domaind_actors::ports::StatusSink;
use domaind_actors::ports::{ClaimError, DomainEvent, PrepareState};
use domaind_actors::rules::channel_health::ChannelHealth;
use domaind_actors::rules::peer_health::PeerHealthConfig;
use domaind_actors::rules::status::digest;
use domaind_actors::testing::{GossipCall, ImexCall};

const LIMIT: Duration = Duration::from_secs(30);
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

fn rack_of(nodes: &[&str]) -> Rack {
    let mut rack = Rack::default();
    for node in nodes {
        rack.start(node);
    }
    rack
}

/// A rack whose IMEX daemons outlive their node daemons (an IMEX runner's), with
/// domain `cd1` formed on every node.
async fn formed_under_runners() -> Rack {
    let mut rack = Rack::default();
    rack.fabric.keep_daemons();
    for node in NODES {
        rack.start(node);
    }
    let cd = domain("cd1", 0);
    register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
    prepare_all(&rack, "c", &NODES).await;
    rack
}

/// Prepares one claim per node concurrently, as kubelets would.
async fn prepare_all(
    rack: &Rack,
    uid: &str,
    nodes: &[&str],
) -> Vec<Result<domaind_actors::Prepared, PrepareError>> {
    let calls: Vec<_> = nodes
        .iter()
        .map(|node| {
            let addr = rack.nodes[*node].addr.clone();
            let claim = claim_ref(&format!("{uid}-{node}"));
            actix::spawn(prepare_on(addr, claim))
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.unwrap());
    }
    results
}

fn register_claims(
    rack: &Rack,
    uid: &str,
    cd: &domaind_actors::model::DomainRef,
    nodes: &[&str],
    policy: ReadinessPolicy,
) {
    for node in nodes {
        rack.claim(&format!("{uid}-{node}"), cd, Some(policy));
    }
}

#[test]
fn three_nodes_form_a_domain_and_agree() {
    run(|| async {
        let rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        for result in prepare_all(&rack, "c", &NODES).await {
            let prepared = result.unwrap();
            assert_eq!(prepared.domain, cd);
        }
        let snapshots = rack.snapshots(&NODES).await;
        let first = &snapshots[0].domains[0].peer_set;
        assert_eq!(first.len(), 3);
        assert!(
            snapshots.iter().all(|s| &s.domains[0].peer_set == first),
            "every node has the same peer set"
        );
        let slots: BTreeSet<_> = snapshots
            .iter()
            .map(|s| s.domains[0].my_slot.unwrap())
            .collect();
        assert_eq!(slots, BTreeSet::from([0, 1, 2]));
        for s in &snapshots {
            assert_eq!(s.domains[0].reporter.as_deref(), Some("node-a"));
            assert_eq!(s.domains[0].phase, Phase::Ready);
        }
        // The IMEX daemons were given that peer set.
        let daemon = rack.fabric.state_of("node-b").unwrap();
        assert_eq!(daemon.peers, snapshots[0].domains[0].peer_set);

        // Only the reporter writes, and the last write says Ready 3/3.
        rack.wait_until(LIMIT, "the status is written", &NODES, |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.status.status == Phase::Ready)
        })
        .await;
        let writes = rack.status.writes();
        assert!(writes.iter().all(|w| w.writer == "node-a"));
        let last = rack.status.latest("cd1").unwrap().status;
        assert_eq!((last.ready_nodes, last.total_nodes), (3, 3));
        assert!(
            rack.nodes["node-a"]
                .events
                .events()
                .iter()
                .any(|(_, e)| matches!(e, DomainEvent::Ready { .. }))
        );
        assert!(
            rack.nodes["node-b"].events.events().is_empty(),
            "only the reporter emits events"
        );
    });
}

#[test]
fn prepare_is_idempotent_and_unknown_unprepare_succeeds() {
    run(|| async {
        let rack = rack_of(&["node-a"]);
        rack.claim("c1", &domain("cd1", 0), None);
        let first = rack.prepare("node-a", "c1").await.unwrap();
        let saved = rack.nodes["node-a"].checkpoint.saved().unwrap();
        assert_eq!(saved.claims["c1"].state, PrepareState::PrepareCompleted);
        let second = rack.prepare("node-a", "c1").await.unwrap();
        assert_eq!(first, second);
        assert_eq!(
            rack.claims.lookups(),
            vec!["c1".to_string()],
            "the second call is answered from the checkpoint"
        );
        assert_eq!(rack.unprepare("node-a", "never-seen").await, Ok(()));
        assert_eq!(rack.unprepare("node-a", "c1").await, Ok(()));
        assert_eq!(rack.unprepare("node-a", "c1").await, Ok(()));
    });
}

#[test]
fn a_second_domain_on_a_busy_node_is_refused_naming_both() {
    run(|| async {
        let rack = rack_of(&["node-a"]);
        rack.claim("c1", &domain("cd1", 0), None);
        rack.claim("c2", &domain("cd2", 0), None);
        rack.prepare("node-a", "c1").await.unwrap();
        let err = rack.prepare("node-a", "c2").await.unwrap_err();
        assert!(matches!(err, PrepareError::Busy { .. }));
        assert!(!err.retryable());
        let text = err.to_string();
        assert!(text.contains("cd-cd1") && text.contains("cd-cd2"), "{text}");
        tokio::task::yield_now().await;
        assert!(
            rack.nodes["node-a"]
                .events
                .events()
                .iter()
                .any(|(d, e)| d.uid.0 == "cd2" && matches!(e, DomainEvent::PrepareRefused { .. }))
        );

        // Once the first domain's claim is gone, the node may serve the second.
        rack.unprepare("node-a", "c1").await.unwrap();
        rack.prepare("node-a", "c2").await.unwrap();
    });
}

#[test]
fn several_claims_share_a_domain_and_the_last_unprepare_leaves_it_promptly() {
    run(|| async {
        let rack = rack_of(&["node-a", "node-b"]);
        let cd = domain("cd1", 0);
        for uid in ["a1", "a2"] {
            rack.claim(uid, &cd, None);
        }
        rack.claim("b1", &cd, None);
        rack.prepare("node-a", "a1").await.unwrap();
        rack.prepare("node-a", "a2").await.unwrap();
        rack.prepare("node-b", "b1").await.unwrap();
        let s = rack.snapshot("node-a").await;
        assert_eq!(s.domains.len(), 1);
        assert_eq!(
            s.domains[0].claims,
            vec!["a1".to_string(), "a2".to_string()]
        );

        rack.unprepare("node-a", "a1").await.unwrap();
        assert_eq!(
            rack.snapshot("node-a").await.domains.len(),
            1,
            "one claim still holds the domain"
        );
        rack.unprepare("node-a", "a2").await.unwrap();
        assert!(
            rack.nodes["node-a"]
                .gossip
                .calls()
                .contains(&GossipCall::Delete {
                    key: "domain/cd1".into()
                })
        );
        // node-b drops it by gossip, without waiting for any grace, and does not
        // list it as lost.
        rack.wait_until(
            Duration::from_millis(200),
            "node-b drops node-a",
            &["node-b"],
            |s| {
                s[0].domains[0].members == vec!["node-b".to_string()]
                    && s[0].domains[0].lost.is_empty()
            },
        )
        .await;
        assert!(
            !rack.fabric.state_of("node-a").unwrap().running,
            "node-a's IMEX stopped"
        );
    });
}

#[test]
fn prepare_waits_then_answers_with_a_retryable_error_saying_what_it_waits_for() {
    run(|| async {
        let rack = rack_of(&["node-a"]);
        rack.claim("c1", &domain("cd1", 3), Some(ReadinessPolicy::Domain));
        let started = tokio::time::Instant::now();
        let err = rack.prepare("node-a", "c1").await.unwrap_err();
        assert!(
            started.elapsed() >= Duration::from_secs(10),
            "answered before the deadline"
        );
        assert!(err.retryable());
        let text = err.to_string();
        assert!(
            text.contains("1/1 nodes ready, waiting for 3 nodes (spec.numNodes)"),
            "{text}"
        );
        assert!(text.contains("team-a/cd-cd1"), "{text}");
    });
}

#[test]
fn permanent_claim_errors_are_not_retried() {
    run(|| async {
        let rack = rack_of(&["node-a"]);
        rack.bad_claim(
            "c1",
            ClaimError::Permanent("namespace mismatch: claim in team-b, domain in team-a".into()),
        );
        let err = rack.prepare("node-a", "c1").await.unwrap_err();
        assert!(!err.retryable());
        assert!(err.to_string().contains("namespace mismatch"));
        assert!(rack.snapshot("node-a").await.claims.is_empty());
        let err = rack.prepare("node-a", "unknown").await.unwrap_err();
        assert!(
            err.retryable(),
            "an unknown claim may just not be visible yet"
        );
    });
}

#[test]
fn a_crashed_domain_actor_is_restarted_and_rebuilds_its_state() {
    run(|| async {
        let rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        prepare_all(&rack, "c", &NODES).await;
        let before = rack.snapshot("node-b").await.domains[0].clone();
        let starts_before = rack.nodes["node-b"]
            .imex
            .count(|c| matches!(c, ImexCall::Start(_)));

        let actor = rack.nodes["node-b"]
            .addr
            .send(GetDomain(DomainUid("cd1".into())))
            .await
            .unwrap()
            .unwrap();
        actor.do_send(Crash);
        rack.wait_until(LIMIT, "the domain is rebuilt and ready", &["node-b"], |s| {
            let d = &s[0].domains[0];
            d.restarts == 1 && d.phase == Phase::Ready
        })
        .await;
        let after = rack.snapshot("node-b").await.domains[0].clone();
        assert_eq!(
            after.claims, before.claims,
            "claims rebuilt from the checkpoint"
        );
        assert_eq!(after.my_slot, before.my_slot, "slot rebuilt from gossip");
        assert_eq!(after.peer_set, before.peer_set);
        let starts_after = rack.nodes["node-b"]
            .imex
            .count(|c| matches!(c, ImexCall::Start(_)));
        assert_eq!(
            starts_before, starts_after,
            "the IMEX daemon was not restarted"
        );
        // The claim is still answered.
        rack.prepare("node-b", "c-node-b").await.unwrap();
    });
}

#[test]
fn an_imex_daemon_that_exits_is_restarted_with_backoff() {
    run(|| async {
        let rack = rack_of(&["node-a", "node-b"]);
        let cd = domain("cd1", 0);
        register_claims(
            &rack,
            "c",
            &cd,
            &["node-a", "node-b"],
            ReadinessPolicy::Local,
        );
        prepare_all(&rack, "c", &["node-a", "node-b"]).await;
        rack.fabric.crash("node-a");
        rack.wait_until(
            LIMIT,
            "node-a's IMEX is restarted and the domain ready",
            &["node-a"],
            |s| s[0].imex.restarts == 1 && s[0].domains[0].phase == Phase::Ready,
        )
        .await;
        // A daemon that fails to start is retried, not given up on.
        rack.nodes["node-a"]
            .imex
            .fail_next(3, "nvidia-imex: cannot bind");
        rack.fabric.crash("node-a");
        rack.wait_until(
            LIMIT,
            "it comes back after three failed starts",
            &["node-a"],
            |s| {
                s[0].imex.restarts == 2
                    && s[0].imex.failures >= 3
                    && s[0].domains[0].phase == Phase::Ready
            },
        )
        .await;
    });
}

/// A prepared channel's health follows its node's IMEX: Unknown before the domain is
/// judged, Healthy once IMEX is ready and linked to both peers in a Ready domain,
/// Unhealthy with the failure's reason while IMEX keeps failing, and Healthy again once
/// it is back. A link cut names the peer. The claim's data (clique, index, peers
/// linked) comes with it.
#[test]
fn a_prepared_channels_health_follows_its_imex_and_links() {
    run(|| async {
        let rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        for node in NODES {
            rack.claim_with_device(&format!("c-{node}"), &cd, node);
        }
        let board = rack.nodes["node-a"].health.clone();
        let device_health = |board: &domaind_actors::HealthBoard| {
            let view = board.view();
            view.devices
                .iter()
                .find(|d| d.claim.uid == "c-node-a")
                .map(|d| (d.health().clone(), d.status.clone()))
        };
        prepare_all(&rack, "c", &NODES).await;
        domaind_testkit::poll_for(
            "node-a's channel is Healthy",
            LIMIT,
            async || match device_health(&board) {
                Some((ChannelHealth::Healthy, Some(status))) if status.linked_peers == 2 => {
                    Ok(status)
                }
                other => Err(other),
            },
        )
        .await;
        let status = device_health(&board).unwrap().1.unwrap();
        assert_eq!(status.clique.0, "cluster-1.0");
        assert_eq!(status.peers, 2);
        assert!(status.index.is_some());

        rack.nodes["node-a"]
            .imex
            .fail_next(u32::MAX, "nvidia-imex: cannot bind");
        rack.fabric.crash("node-a");
        domaind_testkit::poll_for(
            "node-a's channel is Unhealthy, saying why",
            LIMIT,
            async || match device_health(&board) {
                Some((ChannelHealth::Unhealthy(why), _)) if why.contains("IMEX is failing") => {
                    Ok(())
                }
                other => Err(other),
            },
        )
        .await;
        assert!(board.view().imex_failing.is_some());

        rack.nodes["node-a"].imex.fail_next(0, "");
        domaind_testkit::poll_for("node-a's channel is Healthy again", LIMIT, async || {
            match device_health(&board) {
                Some((ChannelHealth::Healthy, _)) => Ok(()),
                other => Err(other),
            }
        })
        .await;
        assert_eq!(board.view().imex_failing, None);

        rack.fabric.cut("node-a", "node-c");
        domaind_testkit::poll_for(
            "the cut link names node-c",
            LIMIT,
            async || match device_health(&board) {
                Some((ChannelHealth::Unhealthy(why), _)) if why.contains("node-c") => Ok(()),
                other => Err(other),
            },
        )
        .await;

        rack.unprepare("node-a", "c-node-a").await.unwrap();
        assert!(board.view().devices.is_empty());
    });
}

/// A node whose IMEX daemon keeps failing (it crashed, then every start is refused:
/// its port is taken) says so: its members see the domain NotReady with the node named
/// ("IMEX failing on: node-c"), the status is written once for the whole episode however
/// many restarts it takes, and one ImexFailing event is recorded by the node itself.
/// Once starts succeed and the daemon stays up, the domain is Ready again, nothing
/// named; a later crash is a new episode and a new event.
#[test]
fn a_crash_looping_imex_is_named_in_the_status_and_told_once_per_episode() {
    run(|| async {
        let rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Local);
        prepare_all(&rack, "c", &NODES).await;
        rack.wait_until(LIMIT, "the status says Ready", &NODES, |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.status.status == Phase::Ready)
        })
        .await;

        let failing_c = rack.nodes["node-c"].imex.clone();
        failing_c.fail_next(
            u32::MAX,
            "IMEX cannot listen on 127.0.1.3:50000 (SERVER_PORT): Address already in use",
        );
        rack.fabric.crash("node-c");
        let named = |status: &domaind_actors::rules::status::DomainStatus| {
            status.status == Phase::NotReady
                && status.message.ends_with(", IMEX failing on: node-c")
                && status
                    .nodes
                    .iter()
                    .any(|n| n.name == "node-c" && n.status == Phase::NotReady)
        };
        rack.wait_until(LIMIT, "the status names node-c", &NODES, |_| {
            rack.status.latest("cd1").is_some_and(|w| named(&w.status))
        })
        .await;
        // Its peers' links to it are down too, until their 5 s failing grace drops it
        // (it says it is failing): then they are ready without it.
        rack.wait_until(
            LIMIT * 2,
            "node-c is the only one not ready",
            &NODES,
            |_| {
                rack.status
                    .latest("cd1")
                    .is_some_and(|w| w.status.message == "2/3 nodes ready, IMEX failing on: node-c")
            },
        )
        .await;
        let writes_when_named = rack.status.writes().len();
        let snapshot = rack.snapshot("node-a").await;
        assert_eq!(snapshot.domains[0].phase, Phase::NotReady);

        // Two more minutes of failing, once the waits have reached their 30 s cap
        // (1 + 2 + 4 + 8 + 16 s): the document does not change, and nothing more is
        // written or told.
        let starts = |imex: &domaind_actors::testing::FakeImex| {
            imex.count(|c| matches!(c, ImexCall::Start(_)))
        };
        tokio::time::sleep(Duration::from_secs(31)).await;
        let starts_before = starts(&failing_c);
        tokio::time::sleep(Duration::from_secs(120)).await;
        let tries = starts(&failing_c) - starts_before;
        assert!(
            (4..=5).contains(&tries),
            "{tries} starts in 2 minutes: not backing off to 30 s"
        );
        assert_eq!(
            rack.status.writes().len(),
            writes_when_named,
            "a restart rewrote the status: {:#?}",
            rack.status.writes()
        );
        let lifecycle = rack.snapshot("node-c").await.imex;
        assert_eq!(lifecycle.restart_delay, Some(Duration::from_secs(30)));
        assert!(
            lifecycle
                .failing
                .as_ref()
                .is_some_and(|f| f.reason.contains("Address already in use")),
            "{lifecycle:?}"
        );
        let told = |node: &str| -> Vec<DomainEvent> {
            rack.nodes[node]
                .events
                .events()
                .into_iter()
                .filter(|(_, e)| matches!(e, DomainEvent::ImexFailing { .. }))
                .map(|(_, e)| e)
                .collect()
        };
        let events = told("node-c");
        assert!(
            matches!(events.as_slice(), [DomainEvent::ImexFailing { node, reason }]
                if node == "node-c" && reason.starts_with("crashed (FakeImexFabric::crash)")),
            "one event for the episode, with the failure that began it: {events:?}"
        );
        assert!(told("node-a").is_empty() && told("node-b").is_empty());

        // The port is free again: the next start (at most the 30 s cap away) runs, and
        // its peers, which had dropped it, take it back as soon as it says it is no
        // longer failing, not after a link grace of its own: the domain is whole.
        failing_c.fail_next(0, "");
        let heal = Duration::from_secs(30) + Duration::from_secs(5);
        rack.wait_until(heal, "the status is Ready again", &NODES, |_| {
            rack.status.latest("cd1").is_some_and(|w| {
                w.status.status == Phase::Ready && w.status.message == "3/3 nodes ready"
            })
        })
        .await;
        tokio::time::sleep(Duration::from_secs(11)).await;
        assert!(rack.snapshot("node-c").await.imex.failing.is_none());
        rack.fabric.crash("node-c");
        rack.wait_until(LIMIT, "a new episode is told", &["node-c"], |_| {
            told("node-c").len() == 2
        })
        .await;
    });
}

#[test]
fn a_dead_node_is_dropped_after_grace_and_rejoins_with_its_slot() {
    run(|| async {
        let mut rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        prepare_all(&rack, "c", &NODES).await;
        let slot_of_c = rack.snapshot("node-c").await.domains[0].my_slot;

        rack.kill("node-c");
        let survivors = ["node-a", "node-b"];
        rack.wait_until(LIMIT, "survivors drop node-c from IMEX", &survivors, |s| {
            s.iter().all(|n| {
                let d = &n.domains[0];
                !d.peer_set.contains("node-c")
                    && d.lost == vec!["node-c".to_string()]
                    && d.phase == Phase::NotReady
            })
        })
        .await;
        rack.wait_until(LIMIT, "the status shows node-c lost", &survivors, |_| {
            rack.status.latest("cd1").is_some_and(|w| {
                w.status.status == Phase::NotReady
                    && w.status.message.contains("lost: node-c")
                    && w.status
                        .nodes
                        .iter()
                        .any(|n| n.name == "node-c" && n.status == Phase::NotReady)
            })
        })
        .await;
        assert!(rack.nodes["node-a"].events.events().iter().any(|(_, e)| *e
            == DomainEvent::NodeLost {
                node: "node-c".into()
            }));

        // Back, with its checkpoint: it rejoins its domain in its old slot.
        rack.start("node-c");
        rack.wait_until(LIMIT, "node-c rejoins in its slot", &NODES, |s| {
            s.iter().all(|n| {
                n.domains.first().is_some_and(|d| {
                    d.phase == Phase::Ready
                        && d.peer_set.contains("node-c")
                        && d.slots.get("node-c").copied() == slot_of_c
                })
            })
        })
        .await;
    });
}

#[test]
fn status_writes_are_retried_and_coalesced() {
    run(|| async {
        let rack = rack_of(&NODES);
        rack.status.fail_next(2, "apiserver unavailable");
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        prepare_all(&rack, "c", &NODES).await;
        rack.wait_until(
            LIMIT,
            "the Ready status is written despite failures",
            &NODES,
            |_| {
                rack.status
                    .latest("cd1")
                    .is_some_and(|w| w.status.status == Phase::Ready)
            },
        )
        .await;
        let writes = rack.status.writes();
        assert!(
            writes.windows(2).all(|w| w[0].status != w[1].status),
            "the same document written twice in a row: {writes:#?}"
        );
    });
}

#[test]
fn when_the_reporter_dies_the_next_takes_over_once() {
    run(|| async {
        let mut rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        prepare_all(&rack, "c", &NODES).await;
        rack.wait_until(LIMIT, "Ready is written", &NODES, |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.status.status == Phase::Ready)
        })
        .await;
        let before = rack.status.writes().len();
        rack.kill("node-a");
        rack.wait_until(LIMIT, "node-b reports node-a lost", &["node-b"], |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.writer == "node-b" && w.status.message.contains("lost: node-a"))
        })
        .await;
        // Settle: nothing else changes for a while.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let writes = rack.status.writes();
        let after = &writes[before..];
        assert!(
            after.windows(2).all(|w| w[0].status != w[1].status),
            "the same document written twice in a row after the handover: {after:#?}"
        );
        assert!(after.iter().all(|w| w.writer == "node-b"));
    });
}

#[test]
fn failing_ports_do_not_stop_a_domain_from_forming() {
    run(|| async {
        let rack = rack_of(&NODES);
        rack.nodes["node-a"]
            .events
            .fail_next(5, "events API unavailable");
        rack.nodes["node-b"].checkpoint.fail_next(1, "disk full");
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        let results = prepare_all(&rack, "c", &NODES).await;
        // The node whose checkpoint could not be written says so, retryably; the
        // kubelet's next call succeeds.
        let b = results[1].as_ref().unwrap_err();
        assert!(b.retryable() && b.to_string().contains("disk full"), "{b}");
        rack.prepare("node-b", "c-node-b").await.unwrap();
        let saved = rack.nodes["node-b"].checkpoint.saved().unwrap();
        assert!(
            saved.claims.contains_key("c-node-b"),
            "the claim was answered before it was saved"
        );
        rack.wait_until(LIMIT, "the domain is Ready", &NODES, |s| {
            s.iter().all(|n| n.domains[0].phase == Phase::Ready)
        })
        .await;
    });
}

#[test]
fn a_departing_node_is_dropped_at_once_and_rejoins_from_its_checkpoint() {
    run(|| async {
        let mut rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        prepare_all(&rack, "c", &NODES).await;

        rack.nodes["node-c"]
            .addr
            .send(domaind_actors::Depart)
            .await
            .unwrap();
        let departed = &rack.nodes["node-c"];
        assert!(
            departed.imex.count(|c| matches!(c, ImexCall::Stop)) >= 1,
            "the IMEX daemon was stopped: {:?}",
            departed.imex.calls()
        );
        let kept = departed.checkpoint.saved().unwrap();
        assert!(kept.claims.contains_key("c-node-c"), "the claim is kept");
        assert!(kept.slots.contains_key(&DomainUid("cd1".into())));

        // Well inside the failure detector's grace: the survivors saw the retraction,
        // so node-c left rather than was lost.
        let survivors = ["node-a", "node-b"];
        rack.wait_until(
            PeerHealthConfig::default().dead_grace / 2,
            "survivors drop node-c",
            &survivors,
            |s| {
                s.iter().all(|n| {
                    let d = &n.domains[0];
                    !d.peer_set.contains("node-c") && d.lost.is_empty()
                })
            },
        )
        .await;

        rack.start("node-c");
        rack.wait_until(LIMIT, "node-c rejoins", &NODES, |s| {
            s.iter().all(|n| {
                n.domains
                    .first()
                    .is_some_and(|d| d.phase == Phase::Ready && d.peer_set.contains("node-c"))
            })
        })
        .await;
    });
}

#[test]
fn a_late_write_of_a_former_reporter_is_written_over() {
    run(|| async {
        let rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        prepare_all(&rack, "c", &NODES).await;
        rack.wait_until(LIMIT, "node-a writes Ready", &NODES, |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.writer == "node-a" && w.status.status == Phase::Ready)
        })
        .await;
        let truth = rack.status.latest("cd1").unwrap().status;

        // node-c, reporter for a moment while it was alone, lands its stale write
        // now, and publishes its digest as every writer does.
        let mut stale = truth.clone();
        stale.status = Phase::NotReady;
        stale.ready_nodes = 1;
        stale.total_nodes = 1;
        rack.status
            .for_node("node-c")
            .write(&cd, &stale)
            .await
            .unwrap();
        rack.net.set_key_of("node-c", "status/cd1", &digest(&stale));

        rack.wait_until(LIMIT, "the reporter writes the truth again", &NODES, |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.writer == "node-a" && w.status == truth)
        })
        .await;
    });
}

/// Found by `domaind-chaos run` (5 nodes, seed 1: node-01 paused right after it was
/// partitioned): while the reporter is paused, its successor writes it lost; the
/// successor's document is the same each time, and so was the digest it published,
/// so after the second pause the reporter saw nothing new in gossip and never wrote
/// over the stale NotReady.
#[test]
fn a_reporter_writes_over_its_successor_after_every_pause() {
    run(|| async {
        let rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        prepare_all(&rack, "c", &NODES).await;
        rack.wait_until(LIMIT, "node-a writes Ready", &NODES, |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.writer == "node-a" && w.status.status == Phase::Ready)
        })
        .await;
        let truth = rack.status.latest("cd1").unwrap().status;
        let mut stale = None;
        for pause in 1..=3 {
            rack.net.pause("node-a");
            rack.wait_until(LIMIT, "node-b reports node-a lost", &["node-b"], |_| {
                rack.status.latest("cd1").is_some_and(|w| {
                    w.writer == "node-b" && w.status.message.contains("lost: node-a")
                })
            })
            .await;
            let written = rack.status.latest("cd1").unwrap().status;
            // The successor writes the same document each time: the case to cover.
            assert_eq!(stale.get_or_insert(written.clone()), &written);
            rack.net.resume("node-a");
            rack.wait_until(
                LIMIT,
                &format!("node-a writes the truth again after pause {pause}"),
                &NODES,
                |_| {
                    rack.status
                        .latest("cd1")
                        .is_some_and(|w| w.writer == "node-a" && w.status == truth)
                },
            )
            .await;
        }
        // Once written over, nothing more: no write storm between the two.
        let settled = rack.status.writes().len();
        tokio::time::sleep(Duration::from_secs(10)).await;
        assert_eq!(
            rack.status.writes().len(),
            settled,
            "{:#?}",
            &rack.status.writes()[settled..]
        );
    });
}

/// Found by `domaind-chaos run` (8 nodes, seed 1): a member that stopped gracefully
/// had its IMEX link go down first, so each peer's ImexPeer for it turned suspect with
/// the 30 s link grace running. The retraction removed that ImexPeer from the domain,
/// but the actor lived on for its timer, and 30 s later told the domain to drop the
/// node, long after it had rejoined with a fresh ImexPeer; nothing re-admitted it.
#[test]
fn a_member_that_left_and_rejoined_is_not_dropped_by_its_old_link_grace() {
    run(|| async {
        let mut rack = rack_of(&NODES);
        let cd = domain("cd1", 0);
        register_claims(&rack, "c", &cd, &NODES, ReadinessPolicy::Domain);
        prepare_all(&rack, "c", &NODES).await;

        // node-c's IMEX daemon goes first (its links drop), then it retracts.
        rack.fabric.cut("node-a", "node-c");
        rack.fabric.cut("node-b", "node-c");
        let survivors = ["node-a", "node-b"];
        rack.wait_until(
            LIMIT,
            "the survivors see node-c's link down",
            &survivors,
            |s| s.iter().all(|n| n.domains[0].phase == Phase::NotReady),
        )
        .await;
        rack.nodes["node-c"]
            .addr
            .send(domaind_actors::Depart)
            .await
            .unwrap();
        rack.fabric.heal();
        rack.start("node-c");
        rack.wait_until(LIMIT, "node-c rejoins", &NODES, |s| {
            s.iter().all(|n| {
                n.domains
                    .first()
                    .is_some_and(|d| d.phase == Phase::Ready && d.peer_set.contains("node-c"))
            })
        })
        .await;

        // Paused time: past the link grace that started when node-c's IMEX stopped.
        tokio::time::sleep(PeerHealthConfig::default().link_grace + Duration::from_secs(5)).await;
        for node in NODES {
            let snapshot = rack.snapshot(node).await;
            let d = &snapshot.domains[0];
            assert!(
                d.phase == Phase::Ready && d.peer_set.contains("node-c"),
                "{node} dropped node-c after it rejoined: {d:#?}"
            );
        }
    });
}

/// Issue 28: a node daemon killed where a runner keeps IMEX. Its peers hold it (their
/// IMEX still reaches its IMEX), so the domain stays Ready and no survivor's IMEX is
/// reconfigured; the restarted daemon adopts the same IMEX instance. A node kill (the
/// daemon and IMEX together) is still dropped within the dead grace.
#[test]
fn a_daemon_killed_under_a_runner_leaves_the_domain_ready_and_no_imex_reconfigured() {
    run(|| async {
        let mut rack = formed_under_runners().await;
        rack.wait_until(LIMIT, "Ready is written", &NODES, |_| {
            rack.status
                .latest("cd1")
                .is_some_and(|w| w.status.status == Phase::Ready)
        })
        .await;
        let survivors = ["node-a", "node-b"];
        let reconfigurations = |rack: &Rack| -> Vec<usize> {
            survivors
                .iter()
                .map(|n| {
                    rack.nodes[*n]
                        .imex
                        .count(|c| matches!(c, ImexCall::Start(_) | ImexCall::Apply(_)))
                })
                .collect()
        };
        let before = reconfigurations(&rack);
        let instance = rack.fabric.state_of("node-c").unwrap().instance;
        let writes = rack.status.writes().len();

        // Ready throughout: checked at every step of paused time, not just at the end.
        let steady = |snapshots: &[domaind_actors::actors::node::NodeSnapshot]| {
            for s in snapshots {
                let d = &s.domains[0];
                assert_eq!(d.phase, Phase::Ready, "{s:#?}");
                assert!(d.peer_set.contains("node-c"), "{s:#?}");
            }
        };
        rack.kill_daemon("node-c");
        for _ in 0..200 {
            steady(&rack.snapshots(&survivors).await);
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        let held = rack.snapshot("node-a").await;
        assert_eq!(held.domains[0].held, vec!["node-c".to_string()]);
        assert!(held.domains[0].lost.is_empty() && held.domains[0].dropped.is_empty());
        assert!(
            !rack.nodes["node-a"]
                .events
                .events()
                .iter()
                .any(|(_, e)| matches!(e, DomainEvent::NodeLost { .. })),
            "a held node is not told lost"
        );

        rack.start("node-c");
        let deadline = tokio::time::Instant::now() + LIMIT;
        loop {
            steady(&rack.snapshots(&survivors).await);
            let back = rack.snapshot("node-c").await;
            if back
                .domains
                .first()
                .is_some_and(|d| d.phase == Phase::Ready)
                && rack.snapshot("node-a").await.domains[0].held.is_empty()
            {
                break;
            }
            assert!(tokio::time::Instant::now() < deadline, "{back:#?}");
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert_eq!(
            reconfigurations(&rack),
            before,
            "no survivor's IMEX changed: {:#?}",
            rack.nodes["node-a"].imex.calls()
        );
        assert_eq!(
            rack.fabric.state_of("node-c").unwrap().instance,
            instance,
            "the restarted daemon adopted the same IMEX instance"
        );
        let since = &rack.status.writes()[writes..];
        assert!(
            since.iter().all(|w| w.status.status == Phase::Ready),
            "{since:#?}"
        );

        // The node itself dies: its IMEX with its daemon.
        rack.kill("node-c");
        let killed = tokio::time::Instant::now();
        rack.wait_until(LIMIT, "survivors drop node-c", &survivors, |s| {
            s.iter().all(|n| !n.domains[0].peer_set.contains("node-c"))
        })
        .await;
        let dropped_after = killed.elapsed();
        assert!(
            dropped_after <= PeerHealthConfig::default().dead_grace + Duration::from_millis(200),
            "a dead node is dropped within the dead grace: {dropped_after:?}"
        );
    });
}

/// Issue 28: after an upgrade that changed IMEX's config, the restarted daemon finds an
/// IMEX it cannot adopt. Prepared claims use it, so it is kept, not replaced (a new
/// instance would clean up their jobs' imports), and the domain is told why once.
#[test]
fn an_unadoptable_imex_that_claims_use_is_kept_and_told() {
    run(|| async {
        let mut rack = formed_under_runners().await;
        let instance = rack.fabric.state_of("node-c").unwrap().instance;

        rack.kill_daemon("node-c");
        rack.fabric.change_config("node-c");
        rack.start("node-c");
        rack.wait_until(LIMIT, "node-c is back", &NODES, |s| {
            s.iter()
                .all(|n| n.domains.first().is_some_and(|d| d.phase == Phase::Ready))
        })
        .await;
        let state = rack.fabric.state_of("node-c").unwrap();
        assert_eq!(state.instance, instance, "kept, not replaced");
        assert!(state.kept.is_some());
        rack.wait_until(LIMIT, "the domain is told once", &["node-c"], |_| {
            let told: Vec<_> = rack.nodes["node-c"]
                .events
                .events()
                .into_iter()
                .filter(|(_, e)| matches!(e, DomainEvent::ImexKept { .. }))
                .collect();
            told.len() == 1
        })
        .await;
    });
}
