//! A node whose NVLink clique changes while it runs: it leaves its domains in the old
//! clique (peers see a leave, not a loss), keeps its IMEX daemon, and its claims
//! rejoin their domains in the new clique. One fake gossip net per clique, as gossip
//! is one cluster per clique; the wiring's part (stopping one gossip, starting the
//! other) is played by the test.

mod common;

use std::sync::Arc;
use std::time::Duration;

use common::{Rack, domain, prepare_on, run};
use domaind_actors::actors::imex_process::{
    ApplyPeers, Handover, ImexProcessActor, ImexReport, ReleaseImex,
};
use domaind_actors::model::{CliqueId, Phase, ReadinessPolicy};
use domaind_actors::ports::{DomainEvent, ImexStatus, PortError};
use domaind_actors::rules::peer_health::PeerHealthConfig;
use domaind_actors::rules::peers::{Peer, PeerSet};
use domaind_actors::testing::{FakeGossipNet, ImexCall};
use domaind_actors::{JoinClique, LeaveClique, PrepareError};

const LIMIT: Duration = Duration::from_secs(30);

fn clique_a() -> CliqueId {
    CliqueId("cluster-1.0".into())
}

fn clique_b() -> CliqueId {
    CliqueId("cluster-2.0".into())
}

/// What the wiring does between the two messages: the old clique's gossip stops (its
/// net declares the node gone) and the node joins the new clique's net.
async fn move_node(rack: &Rack, node: &str, new_net: &FakeGossipNet) {
    let addr = rack.nodes[node].addr.clone();
    addr.send(LeaveClique { to: clique_b() }).await.unwrap();
    rack.net.kill(node);
    let gossip = new_net.join(node, rack.nodes[node].generation + 1);
    addr.send(JoinClique {
        clique: clique_b(),
        gossip: Arc::new(gossip),
    })
    .await
    .unwrap();
}

fn starts(rack: &Rack, node: &str) -> usize {
    rack.nodes[node]
        .imex
        .count(|c| matches!(c, ImexCall::Start(_)))
}

fn stops(rack: &Rack, node: &str) -> usize {
    rack.nodes[node].imex.count(|c| matches!(c, ImexCall::Stop))
}

#[test]
fn a_moved_node_leaves_its_old_clique_and_forms_its_domain_with_the_new_one() {
    run(|| async {
        let net_b = FakeGossipNet::default();
        let mut rack = Rack::default();
        rack.start("node-a");
        rack.start("node-b");
        rack.start_in("node-c", &net_b, clique_b());
        let cd = domain("cd1", 0);
        for node in ["node-a", "node-b", "node-c"] {
            rack.claim(&format!("c-{node}"), &cd, Some(ReadinessPolicy::Domain));
            let addr = rack.nodes[node].addr.clone();
            prepare_on(addr, common::claim_ref(&format!("c-{node}")))
                .await
                .unwrap_or_else(|e| panic!("{node}: {e}"));
        }
        // One domain per clique: a and b in clique A, c alone in clique B.
        rack.wait_until(
            LIMIT,
            "formed in each clique",
            &["node-a", "node-b", "node-c"],
            |s| {
                s[0].domains[0].members == ["node-a", "node-b"]
                    && s[2].domains[0].members == ["node-c"]
                    && s.iter().all(|n| n.domains[0].phase == Phase::Ready)
            },
        )
        .await;
        let b_started = starts(&rack, "node-b");

        let b = rack.nodes["node-b"].addr.clone();
        b.send(LeaveClique { to: clique_b() }).await.unwrap();
        // Still live in clique A's gossip, its advertisement retracted: node-a sees it
        // leave, well inside the failure detector's grace, and loses nobody.
        rack.wait_until(
            PeerHealthConfig::default().dead_grace / 2,
            "node-a sees node-b leave",
            &["node-a"],
            |s| {
                let d = &s[0].domains[0];
                d.members == ["node-a"] && d.lost.is_empty() && !d.peer_set.contains("node-b")
            },
        )
        .await;
        // Moving: a prepare finds no domain to wait on, and is told to come back.
        rack.claim("late", &cd, None);
        match prepare_on(b.clone(), common::claim_ref("late")).await {
            Err(PrepareError::Transient(message)) => {
                assert!(message.contains("moving to NVLink clique"), "{message}")
            }
            other => panic!("a prepare while moving: {other:?}"),
        }

        rack.net.kill("node-b");
        let gossip = net_b.join("node-b", rack.nodes["node-b"].generation + 1);
        b.send(JoinClique {
            clique: clique_b(),
            gossip: Arc::new(gossip),
        })
        .await
        .unwrap();
        rack.wait_until(
            LIMIT,
            "node-b forms cd1 with node-c",
            &["node-b", "node-c"],
            |s| {
                s.iter().all(|n| {
                    let d = &n.domains[0];
                    d.members == ["node-b", "node-c"]
                        && d.peer_set.contains("node-b")
                        && d.peer_set.contains("node-c")
                        && d.phase == Phase::Ready
                        && d.lost.is_empty()
                })
            },
        )
        .await;
        let a = &rack.snapshot("node-a").await.domains[0];
        assert!(a.lost.is_empty() && a.members == ["node-a"], "{a:?}");

        // The daemon was handed over, never stopped or started again: it took the new
        // clique's peers as an apply.
        assert_eq!(
            stops(&rack, "node-b"),
            0,
            "{:?}",
            rack.nodes["node-b"].imex.calls()
        );
        assert_eq!(starts(&rack, "node-b"), b_started);
        let last_apply = rack.nodes["node-b"]
            .imex
            .calls()
            .into_iter()
            .rev()
            .find_map(|c| match c {
                ImexCall::Apply(peers) => Some(peers),
                _ => None,
            })
            .expect("an apply after the move");
        assert!(
            last_apply.contains("node-c") && !last_apply.contains("node-a"),
            "{last_apply:?}"
        );
        // The domain heard of the move from the node.
        let moved: Vec<DomainEvent> = rack.nodes["node-b"]
            .events
            .events()
            .into_iter()
            .filter(|(d, _)| d.uid == cd.uid)
            .map(|(_, e)| e)
            .filter(|e| matches!(e, DomainEvent::CliqueMoved { .. }))
            .collect();
        assert_eq!(
            moved,
            [DomainEvent::CliqueMoved {
                node: "node-b".into(),
                from: clique_a().0,
                to: clique_b().0,
            }]
        );
        // And takes prepares again, in its new clique.
        prepare_on(b, common::claim_ref("late")).await.unwrap();
    });
}

#[test]
fn a_rack_that_moves_whole_keeps_its_imex_daemons_and_its_slots() {
    run(|| whole_rack_moves(false));
}

/// The same with IMEX runners: a restarted domain waits to adopt an IMEX that outlives
/// the node daemon; a moved one must not wait for ever on the one it was handed.
#[test]
fn a_rack_under_imex_runners_that_moves_whole_keeps_its_imex_daemons_and_its_slots() {
    run(|| whole_rack_moves(true));
}

async fn whole_rack_moves(runners: bool) {
    let net_b = FakeGossipNet::default();
    let mut rack = Rack::default();
    if runners {
        rack.fabric.keep_daemons();
    }
    let nodes = ["node-a", "node-b", "node-c"];
    for node in nodes {
        rack.start(node);
    }
    let cd = domain("cd1", 0);
    for node in nodes {
        rack.claim(&format!("c-{node}"), &cd, Some(ReadinessPolicy::Domain));
    }
    for node in nodes {
        let addr = rack.nodes[node].addr.clone();
        actix::spawn(prepare_on(addr, common::claim_ref(&format!("c-{node}"))));
    }
    rack.wait_until(LIMIT, "formed", &nodes, |s| {
        s.iter().all(|n| {
            n.domains
                .first()
                .is_some_and(|d| d.phase == Phase::Ready && d.total == 3)
        })
    })
    .await;
    let before = rack.snapshot("node-a").await.domains[0].slots.clone();

    // The fabric manager restarted: every node registers in clique B, one by one.
    for node in nodes {
        move_node(&rack, node, &net_b).await;
    }
    rack.wait_until(LIMIT, "formed again in clique B", &nodes, |s| {
        s.iter().all(|n| {
            let d = &n.domains[0];
            d.phase == Phase::Ready && d.members.len() == 3 && d.lost.is_empty()
        })
    })
    .await;
    // Each node's slot was its preference in the new clique: the same IMEX
    // nodes config as before the move.
    assert_eq!(rack.snapshot("node-c").await.domains[0].slots, before);
    for node in nodes {
        assert_eq!((starts(&rack, node), stops(&rack, node)), (1, 0), "{node}");
        assert!(rack.fabric.state_of(node).unwrap().running);
    }
}

/// FAKE IMEX daemon whose starts and applies take a second, so that a handover can
/// come while one is under way; it records every call with the peers asked for.
#[derive(Debug, Clone, Default)]
struct SlowImex(Arc<std::sync::Mutex<Vec<ImexCall>>>);

impl SlowImex {
    fn calls(&self) -> Vec<ImexCall> {
        self.0.lock().unwrap().clone()
    }
}

#[async_trait::async_trait]
impl domaind_actors::ports::Imex for SlowImex {
    async fn start(&self, peers: &PeerSet) -> Result<(), PortError> {
        self.0.lock().unwrap().push(ImexCall::Start(peers.clone()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }
    async fn apply(&self, peers: &PeerSet) -> Result<(), PortError> {
        self.0.lock().unwrap().push(ImexCall::Apply(peers.clone()));
        tokio::time::sleep(Duration::from_secs(1)).await;
        Ok(())
    }
    async fn reload(&self) -> Result<(), PortError> {
        Ok(())
    }
    async fn status(&self) -> Result<ImexStatus, PortError> {
        Ok(ImexStatus {
            running: true,
            ready: true,
            ..ImexStatus::default()
        })
    }
    async fn stop(&self) -> Result<(), PortError> {
        self.0.lock().unwrap().push(ImexCall::Stop);
        Ok(())
    }
    async fn exited(&self) {
        std::future::pending().await
    }
}

/// Takes the supervisor's reports and drops them.
struct Owner;
impl actix::Actor for Owner {
    type Context = actix::Context<Self>;
}
impl actix::Handler<ImexReport> for Owner {
    type Result = ();
    fn handle(&mut self, _: ImexReport, _: &mut Self::Context) {}
}

fn peers_of(nodes: &[&str]) -> PeerSet {
    PeerSet {
        peers: nodes
            .iter()
            .enumerate()
            .map(|(slot, node)| {
                let peer = Peer {
                    node: (*node).to_owned(),
                    ip: std::net::IpAddr::from([10, 0, 0, slot as u8 + 1]),
                };
                (slot as u16, peer)
            })
            .collect(),
    }
}

#[test]
fn a_handover_during_an_apply_neither_stops_the_daemon_nor_keeps_the_old_version() {
    use actix::Actor as _;
    run(|| async {
        let imex = SlowImex::default();
        let config = domaind_actors::NodeConfig::new(
            "node-a",
            std::net::IpAddr::from([10, 0, 0, 1]),
            clique_a(),
        );
        let supervisor = ImexProcessActor::new(Arc::new(imex.clone()), &config).start();
        let owner = Owner.start();
        let apply = |version, peers| ApplyPeers {
            owner: owner.clone().recipient().downgrade(),
            version,
            peers,
            claims_in_use: false,
        };
        supervisor.do_send(apply(1, peers_of(&["node-a"])));
        tokio::time::sleep(Duration::from_secs(2)).await;
        supervisor.do_send(apply(2, peers_of(&["node-a", "node-b"])));
        // The old clique's last apply is under way when the node moves.
        tokio::time::sleep(Duration::from_millis(100)).await;
        supervisor.send(Handover).await.unwrap();
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(
            !imex.calls().contains(&ImexCall::Stop),
            "stopped for want of a peer set during the handover: {:?}",
            imex.calls()
        );

        // The new clique's domain numbers afresh: its version 2 is not the old one's.
        supervisor.do_send(apply(2, peers_of(&["node-a", "node-c"])));
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert_eq!(
            imex.calls().last(),
            Some(&ImexCall::Apply(peers_of(&["node-a", "node-c"]))),
            "{:?}",
            imex.calls()
        );
        assert!(!imex.calls().contains(&ImexCall::Stop));

        // With no domain to drive it in the new clique, a release stops it.
        supervisor.do_send(Handover);
        supervisor.do_send(ReleaseImex);
        tokio::time::sleep(Duration::from_secs(1)).await;
        assert_eq!(imex.calls().last(), Some(&ImexCall::Stop));
    });
}
