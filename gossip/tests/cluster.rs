//! Real nodes: GossipNode over mutual TLS on 127.0.0.x addresses.

mod common;
use common::poll_until_true;

use std::time::Duration;

use common::{Pki, any_port, name, within};
use domaind_gossip::pulse::PulseTiming;
use domaind_gossip::transport::TransportLimits;
use domaind_gossip::{GossipConfig, GossipEvent, GossipNode, GossipTiming, cluster_id_for_clique};
use futures::StreamExt;

const LIMIT: Duration = Duration::from_secs(30);

async fn start(
    pki: &Pki,
    node: &str,
    octet: u8,
    seeds: &[&GossipNode],
    generation: u64,
) -> GossipNode {
    let tuning = Tuning {
        generation: Some(generation),
        ..Tuning::default()
    };
    start_tuned(pki, node, octet, seeds, &tuning).await
}

/// What a test may change of a node's defaults.
#[derive(Default)]
struct Tuning {
    /// The config's own (the clock) unless set.
    generation: Option<u64>,
    timing: GossipTiming,
    limits: TransportLimits,
}

async fn start_tuned(
    pki: &Pki,
    node: &str,
    octet: u8,
    seeds: &[&GossipNode],
    tuning: &Tuning,
) -> GossipNode {
    let mut config = GossipConfig::new(
        name(node),
        any_port(octet),
        cluster_id_for_clique("cluster-1.0"),
    );
    config.seeds = seeds.iter().map(|s| s.gossip_addr().to_string()).collect();
    if let Some(generation) = tuning.generation {
        config.generation = generation;
    }
    config.timing = tuning.timing.clone();
    GossipNode::start_tls(config, pki.node_tls(node), tuning.limits.clone())
        .await
        .unwrap()
}

fn sees(observer: &GossipNode, nodes: &[&str]) -> bool {
    let live = observer.live_nodes();
    live.len() == nodes.len() && nodes.iter().all(|n| live.contains_key(*n))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn four_nodes_converge_share_keys_and_notice_a_stopped_node() {
    let pki = Pki::new();
    let n0 = start(&pki, "node-0", 11, &[], 1).await;
    let n1 = start(&pki, "node-1", 12, &[&n0], 1).await;
    let n2 = start(&pki, "node-2", 13, &[&n0], 1).await;
    let n3 = start(&pki, "node-3", 14, &[&n0], 1).await;
    let all = ["node-0", "node-1", "node-2", "node-3"];

    poll_until_true("all four nodes see each other", LIMIT, async || {
        [&n0, &n1, &n2, &n3].iter().all(|n| sees(n, &all))
    })
    .await;

    let mut events_on_2 = Box::pin(n2.events());
    n1.set("domain/cd-1", "slot=3").await;
    within("node-2 to hear of node-1's key", LIMIT, async {
        while let Some(event) = events_on_2.next().await {
            if event
                == (GossipEvent::KeySet {
                    node: "node-1".into(),
                    key: "domain/cd-1".into(),
                    value: "slot=3".into(),
                })
            {
                return;
            }
        }
    })
    .await;
    poll_until_true("every node to see node-1's key", LIMIT, async || {
        [&n0, &n2, &n3].iter().all(|n| {
            n.live_nodes()["node-1"]
                .keys
                .get("domain/cd-1")
                .map(String::as_str)
                == Some("slot=3")
        })
    })
    .await;

    n1.delete("domain/cd-1").await;
    within("node-2 to hear of the deletion", LIMIT, async {
        while let Some(event) = events_on_2.next().await {
            if event
                == (GossipEvent::KeyDeleted {
                    node: "node-1".into(),
                    key: "domain/cd-1".into(),
                })
            {
                return;
            }
        }
    })
    .await;

    n3.shutdown().await.unwrap();
    let survivors = ["node-0", "node-1", "node-2"];
    poll_until_true("the survivors to declare node-3 dead", LIMIT, async || {
        [&n0, &n1, &n2].iter().all(|n| sees(n, &survivors))
    })
    .await;
    within("node-2's stream to report node-3 gone", LIMIT, async {
        while let Some(event) = events_on_2.next().await {
            if matches!(&event, GossipEvent::NodeLeft { node, .. } if node == "node-3") {
                return;
            }
        }
    })
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restarted_node_with_a_new_generation_replaces_its_old_self() {
    let pki = Pki::new();
    let n0 = start(&pki, "node-0", 21, &[], 1).await;
    let n1 = start(&pki, "node-1", 22, &[&n0], 1).await;
    let old = start(&pki, "node-2", 23, &[&n0], 100).await;
    old.set("domain/cd-old", "slot=1").await;
    poll_until_true("node-0 and node-1 to see node-2's key", LIMIT, async || {
        [&n0, &n1].iter().all(|n| {
            n.live_nodes()
                .get("node-2")
                .is_some_and(|m| m.keys.contains_key("domain/cd-old"))
        })
    })
    .await;
    // The stream opens with the current view; read it up to the old generation.
    let mut events_on_0 = Box::pin(n0.events());
    within("node-0's stream to show the old generation", LIMIT, async {
        while let Some(event) = events_on_0.next().await {
            if matches!(&event, GossipEvent::KeySet { node, key, .. } if node == "node-2" && key == "domain/cd-old") {
                return;
            }
        }
    })
    .await;

    // Killed and back at once: peers have not yet declared the old generation dead.
    old.shutdown().await.unwrap();
    let new = start(&pki, "node-2", 23, &[&n0], 101).await;
    new.set("domain/cd-new", "slot=1").await;

    poll_until_true("peers to follow the new generation", LIMIT, async || {
        [&n0, &n1].iter().all(|n| {
            n.live_nodes().get("node-2").is_some_and(|m| {
                m.generation == 101
                    && m.keys.contains_key("domain/cd-new")
                    && !m.keys.contains_key("domain/cd-old")
            })
        })
    })
    .await;
    within(
        "node-0's stream to show the generation change",
        LIMIT,
        async {
            let mut left_old = false;
            while let Some(event) = events_on_0.next().await {
                match event {
                    GossipEvent::NodeLeft {
                        node,
                        generation: 100,
                    } if node == "node-2" => left_old = true,
                    GossipEvent::NodeJoined {
                        node,
                        generation: 101,
                        ..
                    } if node == "node-2" => {
                        assert!(
                            left_old,
                            "the new generation joined before the old one left"
                        );
                        return;
                    }
                    _ => {}
                }
            }
        },
    )
    .await;
    // The old generation's death, when the failure detector gets to it, changes nothing.
    assert_eq!(n0.live_nodes()["node-2"].generation, 101);
}

#[tokio::test]
async fn certificate_for_another_node_cannot_start_gossip() {
    let pki = Pki::new();
    let config = GossipConfig::new(name("node-x"), any_port(33), "c");
    let err = GossipNode::start_tls(config, pki.node_tls("node-y"), TransportLimits::default())
        .await
        .unwrap_err();
    assert!(err.to_string().contains("node-y"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ended_gossip_task_is_reported_and_a_stop_is_not() {
    let pki = Pki::new();
    let crashed = start(&pki, "node-0", 45, &[], 1).await;
    let ended = crashed.ended();
    crashed.abort();
    let reason = within(
        "the end of an aborted gossip task to be reported",
        LIMIT,
        ended,
    )
    .await;
    assert!(reason.starts_with("gossip stopped"), "{reason}");

    let stopped = start(&pki, "node-1", 46, &[], 1).await;
    let ended = stopped.ended();
    stopped.stop().await.unwrap();
    // A stop is asked for: `ended` stays pending. The end itself has happened by now
    // (stop waited for it), so one poll of `ended` sees all there is to see.
    assert!(futures::poll!(Box::pin(ended)).is_pending());
}

/// A node that could not reach a peer backs off its link to it; once that peer speaks
/// to it, the link is tried again at once, so that its answers and its news reach the
/// peer now, not when the backoff or the next anti-entropy round says. (Issue 29: a
/// node started first backed off from every later one, its answers to their exchanges
/// were dropped, and the domain formed only at the next round, 10 s on.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_heard_from_is_dialled_at_once_whatever_the_backoff_said() {
    let pki = Pki::new();
    // Neither a retry nor a round can carry anything within the test's limit.
    let slow = Duration::from_secs(120);
    let limits = TransportLimits {
        reconnect_backoff_min: slow,
        reconnect_backoff_max: slow,
        ..TransportLimits::default()
    };
    let timing = domaind_gossip::GossipTiming {
        gossip_interval: slow,
        ..domaind_gossip::GossipTiming::default()
    };
    // node-b's address, held by a stand-in that takes node-a's first dial and hangs up:
    // node-a's link to node-b fails once and backs off.
    let stand_in = tokio::net::TcpListener::bind(any_port(63)).await.unwrap();
    let b_addr = stand_in.local_addr().unwrap();
    let mut config = GossipConfig::new(name("node-a"), any_port(64), cluster_id_for_clique("c.1"));
    config.seeds = vec![b_addr.to_string()];
    config.timing = timing.clone();
    let a = GossipNode::start_tls(config, pki.node_tls("node-a"), limits.clone())
        .await
        .unwrap();
    let (dial, _) = within("node-a's first dial", LIMIT, stand_in.accept())
        .await
        .unwrap();
    drop(dial);
    drop(stand_in);
    a.set("domain/cd-1", "slot=0").await;

    let mut config = GossipConfig::new(name("node-b"), b_addr, cluster_id_for_clique("c.1"));
    config.seeds = vec![a.gossip_addr().to_string()];
    config.timing = timing;
    let b = GossipNode::start_tls(config, pki.node_tls("node-b"), limits)
        .await
        .unwrap();
    poll_until_true(
        "node-b to hear node-a's key through its own exchange with node-a",
        Duration::from_secs(10),
        async || {
            b.live_nodes()
                .get("node-a")
                .is_some_and(|m| m.keys.contains_key("domain/cd-1"))
        },
    )
    .await;
}

/// A node whose daemon is gone (here: stopped, its listener and connections closed, as
/// a crash closes them) is dead to its peers at once: the connection it had to them
/// closed and a dial finds nothing listening. The dead-after time is set far beyond the
/// test's limit, so only that evidence can pass it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_daemon_is_gone_is_dead_at_once_not_after_its_silence() {
    let pki = Pki::new();
    let tuning = Tuning {
        timing: GossipTiming {
            pulse: PulseTiming {
                dead_after: Duration::from_secs(120),
                ..Default::default()
            },
            ..GossipTiming::default()
        },
        ..Tuning::default()
    };
    let a = start_tuned(&pki, "node-a", 71, &[], &tuning).await;
    let b = start_tuned(&pki, "node-b", 72, &[&a], &tuning).await;
    let c = start_tuned(&pki, "node-c", 73, &[&a], &tuning).await;
    let all = ["node-a", "node-b", "node-c"];
    poll_until_true("all three see each other", LIMIT, async || {
        [&a, &b, &c].iter().all(|n| sees(n, &all))
    })
    .await;
    // Each survivor has heard c's pulses on a connection of c's own.
    poll_until_true("c to have pulsed both", LIMIT, async || {
        a.live_nodes().contains_key("node-c") && b.live_nodes().contains_key("node-c")
    })
    .await;
    c.shutdown().await.unwrap();
    poll_until_true(
        "both survivors to count node-c dead, long before its silence would say so",
        Duration::from_secs(10),
        async || [&a, &b].iter().all(|n| sees(n, &["node-a", "node-b"])),
    )
    .await;
}

/// A peer that closes its connections while it lives (idle, here after 200 ms between
/// pulses a second apart) is dialled, found listening and stays live.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_that_only_closes_idle_connections_stays_live() {
    let pki = Pki::new();
    let tuning = Tuning {
        timing: GossipTiming {
            pulse: PulseTiming {
                interval: Duration::from_secs(1),
                dead_after: Duration::from_secs(120),
            },
            ..GossipTiming::default()
        },
        limits: TransportLimits {
            outbound_idle_timeout: Duration::from_millis(200),
            inbound_idle_timeout: Duration::from_millis(400),
            ..TransportLimits::default()
        },
        ..Tuning::default()
    };
    let a = start_tuned(&pki, "node-a", 74, &[], &tuning).await;
    let b = start_tuned(&pki, "node-b", 75, &[&a], &tuning).await;
    let both = ["node-a", "node-b"];
    poll_until_true("both see each other", LIMIT, async || {
        [&a, &b].iter().all(|n| sees(n, &both))
    })
    .await;
    // Five pulse intervals: each side's connection closes idle after every pulse.
    let until = tokio::time::Instant::now() + Duration::from_secs(5);
    while tokio::time::Instant::now() < until {
        assert!(
            sees(&a, &both) && sees(&b, &both),
            "a live peer counted dead"
        );
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}
