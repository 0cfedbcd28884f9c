//! Channel isolation over fakes, in paused time: several ComputeDomains on the same
//! nodes share the clique's IMEX domain, each with its own channel.

mod common;

use std::collections::BTreeSet;
use std::time::Duration;

use common::{Rack, domain, run};
use domaind_actors::PrepareError;
use domaind_actors::model::{AllocationMode, Phase};
use domaind_actors::ports::DomainEvent;

const LIMIT: Duration = Duration::from_secs(30);
const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

fn rack_of(nodes: &[&str], configure: fn(&mut domaind_actors::NodeConfig)) -> Rack {
    let mut rack = Rack {
        configure,
        ..Rack::default()
    };
    for node in nodes {
        rack.start(node);
    }
    rack
}

/// Prepares `claims` (node, claim) all at once, as kubelets would.
async fn prepare_at_once(
    rack: &Rack,
    claims: &[(&str, String)],
) -> Vec<Result<domaind_actors::Prepared, PrepareError>> {
    let calls: Vec<_> = claims
        .iter()
        .map(|(node, claim)| {
            let addr = rack.nodes[*node].addr.clone();
            actix::spawn(common::prepare_on(addr, common::claim_ref(claim)))
        })
        .collect();
    let mut results = Vec::new();
    for call in calls {
        results.push(call.await.unwrap());
    }
    results
}

/// A claim of each of `domains` on each of `nodes`, as (node, claim uid).
fn claims_of(
    rack: &Rack,
    domains: &[&domaind_actors::model::DomainRef],
    nodes: &[&'static str],
) -> Vec<(&'static str, String)> {
    let mut claims = Vec::new();
    for node in nodes {
        for cd in domains {
            let uid = format!("{}-{node}", cd.uid);
            rack.sharing_claim(&uid, cd, AllocationMode::Single);
            claims.push((*node, uid));
        }
    }
    claims
}

/// Two domains created at the same moment on the same three nodes: each pod gets its
/// own domain's channel, never the other's, and one IMEX domain serves both.
#[test]
fn two_sharing_domains_on_the_same_nodes_get_their_own_channels() {
    run(|| async {
        let rack = rack_of(&NODES, |_| {});
        let (cd1, cd2) = (domain("cd1", 0), domain("cd2", 0));
        let claims = claims_of(&rack, &[&cd1, &cd2], &NODES);
        let results = prepare_at_once(&rack, &claims).await;
        let mut channels = std::collections::BTreeMap::new();
        for ((_, claim), result) in claims.iter().zip(results) {
            let prepared = result.unwrap_or_else(|e| panic!("{claim}: {e}"));
            let channel = prepared
                .channel
                .expect("a sharing domain's pod gets a channel");
            channels
                .entry(prepared.domain.uid.0.clone())
                .or_insert_with(BTreeSet::new)
                .insert(channel);
        }
        assert_eq!(channels.len(), 2);
        for (cd, set) in &channels {
            assert_eq!(
                set.len(),
                1,
                "every pod of {cd} has one channel: {channels:?}"
            );
        }
        assert_ne!(channels["cd1"], channels["cd2"], "{channels:?}");

        // One IMEX daemon per node, for the shared IMEX domain of the three.
        let snapshots = rack.snapshots(&NODES).await;
        for s in &snapshots {
            let shared = s.shared_imex.as_ref().expect("the shared IMEX domain runs");
            assert_eq!(shared.peer_set.len(), 3);
            assert_eq!(s.domains.len(), 2);
            assert!(
                s.domains.iter().all(|d| d.peer_set.is_empty()),
                "sharing domains drive no IMEX"
            );
        }
        assert_eq!(
            rack.fabric.state_of("node-b").unwrap().peers,
            snapshots[0].shared_imex.as_ref().unwrap().peer_set
        );

        // Each domain's status says Ready with its channel.
        rack.wait_until(
            LIMIT,
            "both statuses are Ready with their channels",
            &NODES,
            |_| {
                ["cd1", "cd2"].iter().all(|cd| {
                    rack.status.latest(cd).is_some_and(|w| {
                        w.status.status == Phase::Ready
                            && w.status.channel == channels[*cd].first().copied()
                    })
                })
            },
        )
        .await;
        // Ready is never written before the channel is known: a Ready status carries it.
        for write in rack.status.writes() {
            if write.status.status == Phase::Ready {
                assert!(write.status.channel.is_some(), "{write:?}");
            }
        }
    });
}

/// Deleting one domain's pods leaves the other Ready on its channel, and the shared
/// IMEX domain with it; the last sharing domain gone, the node leaves it too.
#[test]
fn ending_one_sharing_domain_leaves_the_other_ready() {
    run(|| async {
        let rack = rack_of(&NODES, |_| {});
        let (cd1, cd2) = (domain("cd1", 0), domain("cd2", 0));
        let claims = claims_of(&rack, &[&cd1, &cd2], &NODES);
        for result in prepare_at_once(&rack, &claims).await {
            result.unwrap();
        }
        let before = rack.snapshot("node-a").await;
        let cd2_channel = before
            .domains
            .iter()
            .find(|d| d.domain.uid.0 == "cd2")
            .unwrap()
            .channel;
        for node in NODES {
            rack.unprepare(node, &format!("cd1-{node}")).await.unwrap();
        }
        rack.wait_until(
            LIMIT,
            "cd1 is gone and cd2 still Ready",
            &NODES,
            |snapshots| {
                snapshots.iter().all(|s| {
                    s.domains.len() == 1
                        && s.domains[0].domain.uid.0 == "cd2"
                        && s.domains[0].phase == Phase::Ready
                        && s.domains[0].channel == cd2_channel
                        && s.shared_imex
                            .as_ref()
                            .is_some_and(|d| !d.channels.contains_key(&cd1.uid))
                })
            },
        )
        .await;
        for node in NODES {
            rack.unprepare(node, &format!("cd2-{node}")).await.unwrap();
        }
        let after = rack.snapshots(&NODES).await;
        assert!(
            after
                .iter()
                .all(|s| s.shared_imex.is_none() && s.domains.is_empty())
        );
    });
}

/// A domain with its own IMEX domain and a sharing one cannot hold one node at once,
/// whichever came first; the refusal names the holder.
#[test]
fn an_exclusive_and_a_sharing_domain_refuse_each_other() {
    run(|| async {
        let rack = rack_of(&["node-a"], |_| {});
        let (own, shared) = (domain("own", 0), domain("shared", 0));
        rack.claim("c-own", &own, None);
        rack.sharing_claim("c-shared", &shared, AllocationMode::Single);
        rack.prepare("node-a", "c-own").await.unwrap();
        let err = rack.prepare("node-a", "c-shared").await.unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, PrepareError::Busy { .. }), "{text}");
        assert!(
            text.contains("cd-own (own) (isolation IMEXDomain)")
                && text.contains("cd-shared (shared) (isolation Channel)"),
            "{text}"
        );
        rack.unprepare("node-a", "c-own").await.unwrap();

        rack.prepare("node-a", "c-shared").await.unwrap();
        let err = rack.prepare("node-a", "c-own").await.unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, PrepareError::Busy { .. }) && text.contains("cd-shared"),
            "{text}"
        );
    });
}

#[test]
fn a_sharing_domain_with_allocation_mode_all_is_refused() {
    run(|| async {
        let rack = rack_of(&["node-a"], |_| {});
        rack.sharing_claim("c", &domain("cd", 0), AllocationMode::All);
        let err = rack.prepare("node-a", "c").await.unwrap_err();
        assert!(!err.retryable());
        assert!(err.to_string().contains("allocationMode All"), "{err}");
        assert!(rack.snapshot("node-a").await.shared_imex.is_none());
    });
}

/// With one channel, the second domain waits, saying why, and gets the channel once
/// the first domain ends.
#[test]
fn an_exhausted_channel_range_makes_the_junior_wait_and_says_why() {
    run(|| async {
        let rack = rack_of(&["node-a"], |config| config.channels = 1);
        let (cd1, cd2) = (domain("cd1", 0), domain("cd2", 0));
        rack.sharing_claim("c1", &cd1, AllocationMode::Single);
        rack.sharing_claim("c2", &cd2, AllocationMode::Single);
        let first = rack.prepare("node-a", "c1").await.unwrap();
        assert_eq!(first.channel, Some(0));
        let err = rack.prepare("node-a", "c2").await.unwrap_err();
        assert!(err.retryable());
        assert!(err.to_string().contains("no free channel"), "{err}");
        rack.unprepare("node-a", "c1").await.unwrap();
        let second = rack.prepare("node-a", "c2").await.unwrap();
        assert_eq!(second.channel, Some(0));
    });
}

/// A node lost from the shared IMEX domain is reported on a domain it was not a member
/// of: its IMEX domain changed too.
#[test]
fn a_fault_in_the_shared_imex_domain_is_told_to_every_domain_sharing_it() {
    run(|| async {
        let mut rack = rack_of(&NODES, |_| {});
        let (cd1, cd2) = (domain("cd1", 0), domain("cd2", 0));
        let mut claims = Vec::new();
        for node in NODES {
            let uid = format!("cd1-{node}");
            rack.sharing_claim(&uid, &cd1, AllocationMode::Single);
            claims.push((node, uid));
        }
        for node in ["node-a", "node-b"] {
            let uid = format!("cd2-{node}");
            rack.sharing_claim(&uid, &cd2, AllocationMode::Single);
            claims.push((node, uid));
        }
        for result in prepare_at_once(&rack, &claims).await {
            result.unwrap();
        }
        rack.wait_until(LIMIT, "cd2 is Ready", &["node-a"], |s| {
            s[0].domains
                .iter()
                .any(|d| d.domain.uid.0 == "cd2" && d.phase == Phase::Ready)
        })
        .await;
        rack.kill("node-c");
        rack.wait_until(LIMIT, "cd2's reporter tells of node-c", &["node-a"], |_| {
            rack.nodes["node-a"].events.events().iter().any(|(d, e)| {
                d.uid.0 == "cd2"
                    && matches!(e, DomainEvent::SharedImexFault { node, fault, .. } if node == "node-c" && fault == "lost")
            })
        })
        .await;
        // cd2 itself never lost a member: Ready again on the shared domain without c.
        rack.wait_until(LIMIT, "cd2 is Ready again", &["node-a", "node-b"], |s| {
            s.iter().all(|s| {
                s.domains
                    .iter()
                    .any(|d| d.domain.uid.0 == "cd2" && d.phase == Phase::Ready)
                    && s.shared_imex
                        .as_ref()
                        .is_some_and(|d| d.peer_set.len() == 2)
            })
        })
        .await;
    });
}

/// Two new domains formed at the same moment on nodes that have not heard of each
/// other yet (gossip slower than usual, up to just under the settle time): neither
/// hands out a channel the other could also hand out. Without the settle each node,
/// alone in its view, confirms channel 0.
#[test]
fn domains_formed_at_once_on_nodes_not_yet_in_touch_never_share_a_channel() {
    run(|| async {
        let rack = rack_of(&["node-a", "node-b"], |_| {});
        let (cd1, cd2) = (domain("cd1", 0), domain("cd2", 0));
        rack.sharing_claim("c1", &cd1, AllocationMode::Single);
        rack.sharing_claim("c2", &cd2, AllocationMode::Single);
        // Each sees only itself: its news reaches the other 0.9 s late.
        rack.net.pause("node-a");
        rack.net.pause("node-b");
        let a = actix::spawn(common::prepare_on(
            rack.nodes["node-a"].addr.clone(),
            common::claim_ref("c1"),
        ));
        let b = actix::spawn(common::prepare_on(
            rack.nodes["node-b"].addr.clone(),
            common::claim_ref("c2"),
        ));
        tokio::time::sleep(Duration::from_millis(900)).await;
        rack.net.resume("node-a");
        rack.net.resume("node-b");
        let (a, b) = (a.await.unwrap().unwrap(), b.await.unwrap().unwrap());
        assert!(a.channel.is_some() && b.channel.is_some());
        assert_ne!(a.channel, b.channel, "two domains were handed one channel");
    });
}

/// A node whose daemon dies keeps its pods (they run on without it): their channel
/// stays reserved while it is away, and a domain formed meanwhile gets another.
#[test]
fn a_lost_nodes_channel_is_not_given_to_a_new_domain() {
    run(|| async {
        let mut rack = rack_of(&["node-a", "node-c"], |_| {});
        let (x, solo, fresh) = (domain("x", 0), domain("solo", 0), domain("fresh", 0));
        rack.sharing_claim("cx", &x, AllocationMode::Single);
        rack.sharing_claim("csolo", &solo, AllocationMode::Single);
        rack.sharing_claim("cfresh", &fresh, AllocationMode::Single);
        let claims = [("node-a", "cx".to_owned()), ("node-c", "csolo".to_owned())];
        let results = prepare_at_once(&rack, &claims).await;
        let held = results[1].as_ref().unwrap().channel.unwrap();
        rack.kill("node-c");
        rack.wait_until(
            LIMIT,
            "node-c is lost to the shared IMEX domain",
            &["node-a"],
            |s| {
                s[0].shared_imex
                    .as_ref()
                    .is_some_and(|d| d.lost == ["node-c"])
            },
        )
        .await;
        let got = rack
            .prepare("node-a", "cfresh")
            .await
            .unwrap()
            .channel
            .unwrap();
        assert_ne!(
            got, held,
            "the channel node-c's pods hold was given to a new domain"
        );

        // Back from its checkpoint, it holds the same channel, and nobody else does.
        rack.start("node-c");
        rack.wait_until(
            LIMIT,
            "node-c serves solo again on its channel",
            &["node-c"],
            |s| {
                s[0].domains
                    .iter()
                    .any(|d| d.domain.uid.0 == "solo" && d.channel == Some(held))
            },
        )
        .await;
    });
}
