//! Simulated racks under scripted faults: real actors and real gossip on an in-memory
//! network, fakes for IMEX and the API, paused time.

use std::collections::BTreeMap;
use std::time::Duration;

use domaind_actors::model::Phase;
use domaind_actors::ports::DomainEvent;
use domaind_chaos::checks::{all, dropped, isolated, prepared, ready, refused, status};
use domaind_chaos::script::assert_within;
use domaind_chaos::sim::{node_name, run_simulation};
use domaind_chaos::{Operation, SimCluster, SimConfig};

const FORM: Duration = Duration::from_secs(30);

fn init_logs() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// Starts nodes `0..=max(nodes)`, prepares a claim of `domain` on each of `nodes`,
/// and waits until they form it.
fn formed(domain: &str, nodes: &[usize]) -> Vec<Operation> {
    let last = nodes.iter().max().map_or(0, |n| n + 1);
    vec![
        Operation::AddNodes(0..last),
        Operation::PrepareOnEach {
            nodes: nodes.to_vec(),
            domain: domain.into(),
        },
        assert_within(FORM, "formed", ready(domain, nodes)),
    ]
}

fn range(n: usize) -> Vec<usize> {
    (0..n).collect()
}

fn slots(view: &domaind_chaos::ClusterView, uid: &str, observer: usize) -> BTreeMap<String, u16> {
    view.nodes[&node_name(observer)]
        .domains
        .iter()
        .find(|d| d.domain.uid.0 == uid)
        .map(|d| d.slots.clone())
        .unwrap_or_default()
}

#[test]
fn eighteen_nodes_form_one_domain_with_stable_slots() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig::default());
        sim.domain("cd", 0);
        let nodes = range(16);
        sim.run(vec![
            Operation::AddNodes(0..18),
            Operation::PrepareOnEach {
                nodes: nodes.clone(),
                domain: "cd".into(),
            },
            assert_within(
                FORM,
                "16 nodes form the domain",
                all(vec![ready("cd", &nodes), isolated()]),
            ),
        ])
        .await
        .unwrap();
        let before = slots(&sim.view().await, "cd", 0);

        // One leaves, then two join: nobody else moves.
        let mut after_nodes: Vec<usize> = (0..18).filter(|i| *i != 5).collect();
        after_nodes.sort();
        let without_5: Vec<usize> = nodes.iter().copied().filter(|i| *i != 5).collect();
        sim.run(vec![
            Operation::Unprepare {
                node: 5,
                claim: "cd-5".into(),
            },
            assert_within(FORM, "node-005 leaves", ready("cd", &without_5)),
            Operation::PrepareOnEach {
                nodes: vec![16, 17],
                domain: "cd".into(),
            },
            assert_within(FORM, "the domain re-forms", ready("cd", &after_nodes)),
        ])
        .await
        .unwrap();
        let after = slots(&sim.view().await, "cd", 0);
        for (node, slot) in &before {
            if node != &node_name(5) {
                assert_eq!(after.get(node), Some(slot), "{node} moved");
            }
        }
        assert_eq!(after.len(), 17);
        // The newcomers took the slot node-005 vacated and the next free one.
        let vacated = before[&node_name(5)];
        let mut new_slots: Vec<u16> = [16, 17].iter().map(|i| after[&node_name(*i)]).collect();
        new_slots.sort();
        assert_eq!(new_slots, vec![vacated.min(16), vacated.max(16)]);
    });
}

#[test]
fn an_nvl576_clique_of_144_nodes_forms_one_domain() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig {
            node: |c| c.max_slots = 144,
            ..SimConfig::default()
        });
        sim.domain("big", 0);
        let nodes = range(144);
        let report = sim
            .run(vec![
                Operation::AddNodes(0..144),
                Operation::PrepareOnEach {
                    nodes: nodes.clone(),
                    domain: "big".into(),
                },
                assert_within(
                    Duration::from_secs(60),
                    "144 nodes form the domain",
                    ready("big", &nodes),
                ),
                assert_within(
                    FORM,
                    "the status says so",
                    status("big", Phase::Ready, 144, 144, "144/144"),
                ),
            ])
            .await
            .unwrap();
        println!("{report:?}");
    });
}

#[test]
fn two_domains_in_one_clique_stay_disjoint() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig::default());
        sim.domain("blue", 0);
        sim.domain("green", 0);
        let blue: Vec<usize> = (0..18).filter(|i| i % 2 == 0).collect();
        let green: Vec<usize> = (0..18).filter(|i| i % 2 == 1).collect();
        sim.run(vec![
            Operation::AddNodes(0..18),
            Operation::PrepareOnEach {
                nodes: blue.clone(),
                domain: "blue".into(),
            },
            Operation::PrepareOnEach {
                nodes: green.clone(),
                domain: "green".into(),
            },
            assert_within(
                FORM,
                "both form, apart",
                all(vec![
                    ready("blue", &blue),
                    ready("green", &green),
                    isolated(),
                ]),
            ),
            // A node of blue asked to join green is refused, and blue is untouched.
            Operation::Prepare {
                node: 0,
                claim: "intruder".into(),
                domain: "green".into(),
                policy: None,
            },
            assert_within(
                FORM,
                "the intruder is refused",
                refused("intruder", "cd-blue"),
            ),
            assert_within(
                FORM,
                "and nothing moved",
                all(vec![
                    ready("blue", &blue),
                    ready("green", &green),
                    isolated(),
                ]),
            ),
        ])
        .await
        .unwrap();
    });
}

#[test]
fn a_killed_node_is_dropped_reported_and_rejoins() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig::default());
        sim.domain("cd", 0);
        let nodes = range(18);
        let survivors: Vec<usize> = (0..18).filter(|i| *i != 7).collect();
        sim.run(formed("cd", &nodes)).await.unwrap();
        let report = sim
            .run(vec![
                Operation::Kill(7),
                assert_within(
                    Duration::from_secs(20),
                    "survivors drop node-007",
                    dropped("cd", 7, &survivors),
                ),
                assert_within(
                    FORM,
                    "status: degraded",
                    status("cd", Phase::NotReady, 17, 18, "lost: node-007"),
                ),
                Operation::Restart(7),
                assert_within(
                    FORM,
                    "node-007 rejoins",
                    all(vec![
                        ready("cd", &nodes),
                        status("cd", Phase::Ready, 18, 18, "18/18"),
                    ]),
                ),
            ])
            .await
            .unwrap();
        println!("{report:?}");
        assert!(sim.events_of(0).iter().any(|(_, e)| matches!(e, domaind_actors::ports::DomainEvent::NodeLost { node } if node == "node-007")));
    });
}

#[test]
fn ten_percent_message_loss_causes_no_false_removal() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig {
            seed: 10,
            ..SimConfig::default()
        });
        sim.domain("cd", 0);
        let nodes = range(18);
        sim.run(formed("cd", &nodes)).await.unwrap();
        sim.run(vec![Operation::Loss(10.0)]).await.unwrap();
        let check = ready("cd", &nodes);
        for second in 0..60 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let view = sim.view().await;
            if let Err(why) = check(&view) {
                panic!("after {second} s of 10% loss: {why}");
            }
        }
        assert!(sim.faults().stats().lost > 0);
    });
}

#[test]
fn a_partition_splits_the_domain_then_heals() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig::default());
        sim.domain("cd", 0);
        let nodes = range(12);
        let (left, right): (Vec<usize>, Vec<usize>) = (0..6).zip(6..12).unzip();
        sim.run(formed("cd", &nodes)).await.unwrap();
        sim.run(vec![
            Operation::Partition(left.clone(), right.clone()),
            assert_within(
                FORM,
                "each side drops the other",
                all(vec![
                    dropped("cd", 0, &right),
                    dropped("cd", 11, &left),
                    isolated(),
                ]),
            ),
            Operation::Heal,
            assert_within(
                FORM,
                "one domain again",
                all(vec![ready("cd", &nodes), isolated()]),
            ),
        ])
        .await
        .unwrap();
    });
}

#[test]
fn when_the_reporter_dies_another_takes_over_with_one_write_per_change() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig::default());
        sim.domain("cd", 0);
        let nodes = range(6);
        sim.run(vec![
            Operation::AddNodes(0..6),
            Operation::PrepareOnEach {
                nodes: nodes.clone(),
                domain: "cd".into(),
            },
            assert_within(
                FORM,
                "formed and written",
                all(vec![
                    ready("cd", &nodes),
                    status("cd", Phase::Ready, 6, 6, ""),
                ]),
            ),
        ])
        .await
        .unwrap();
        let before = sim.status().writes().len();
        sim.run(vec![
            Operation::Kill(0),
            assert_within(
                FORM,
                "node-001 reports the loss",
                status("cd", Phase::NotReady, 5, 6, "lost: node-000"),
            ),
            Operation::Wait(Duration::from_secs(10)),
        ])
        .await
        .unwrap();
        let writes = sim.status().writes();
        let after = &writes[before..];
        assert!(after.iter().all(|w| w.writer == node_name(1)), "{after:#?}");
        assert!(
            after.windows(2).all(|w| w[0].status != w[1].status),
            "a write repeated: {after:#?}"
        );
        println!("status writes for the reporter's death: {}", after.len());
    });
}

#[test]
fn concurrent_joins_settle_on_valid_slots_for_many_seeds() {
    init_logs();
    for seed in 1..=6 {
        run_simulation(async move {
            let mut sim = SimCluster::new(SimConfig {
                seed,
                ..SimConfig::default()
            });
            sim.faults()
                .set_delay(Duration::ZERO, Duration::from_millis(120));
            sim.domain("cd", 0);
            let nodes = range(18);
            sim.run(vec![
                Operation::AddNodes(0..18),
                // Every node joins at once, over a jittery network.
                Operation::PrepareOnEach {
                    nodes: nodes.clone(),
                    domain: "cd".into(),
                },
                assert_within(FORM, "slots settle", ready("cd", &nodes)),
            ])
            .await
            .unwrap_or_else(|e| panic!("seed {seed}: {e}"));
            let view = sim.view().await;
            let s = slots(&view, "cd", 0);
            let mut values: Vec<u16> = s.values().copied().collect();
            values.sort();
            assert_eq!(values, (0..18).collect::<Vec<u16>>(), "seed {seed}");
        });
    }
}

#[test]
fn imex_crash_idempotent_prepare_and_unknown_unprepare() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig::default());
        sim.domain("cd", 0);
        let nodes = range(4);
        sim.run(vec![
            Operation::AddNodes(0..4),
            Operation::PrepareOnEach {
                nodes: nodes.clone(),
                domain: "cd".into(),
            },
            assert_within(
                FORM,
                "formed",
                all(vec![ready("cd", &nodes), prepared("cd-0")]),
            ),
            Operation::Prepare {
                node: 0,
                claim: "cd-0".into(),
                domain: "cd".into(),
                policy: None,
            },
            assert_within(FORM, "prepared again", prepared("cd-0")),
            Operation::Unprepare {
                node: 1,
                claim: "never-prepared".into(),
            },
            Operation::CrashImex(2),
            assert_within(FORM, "IMEX restarted, domain ready", ready("cd", &nodes)),
        ])
        .await
        .unwrap();
        let view = sim.view().await;
        assert_eq!(view.nodes[&node_name(2)].imex.restarts, 1);
    });
}

/// A member's death is one membership change and one status write: its IMEX links
/// drop seconds before gossip declares it dead, and the writer holds a Ready domain's
/// degradation until the loss is known, instead of writing each step.
#[test]
fn a_node_loss_is_one_status_write() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig::default());
        sim.domain("cd", 0);
        let nodes = range(18);
        sim.run(formed("cd", &nodes)).await.unwrap();
        sim.run(vec![assert_within(
            FORM,
            "the Ready status is written",
            status("cd", Phase::Ready, 18, 18, ""),
        )])
        .await
        .unwrap();
        let before = sim.status().writes().len();
        sim.run(vec![
            Operation::Kill(7),
            assert_within(
                FORM,
                "the loss is reported",
                status("cd", Phase::NotReady, 17, 18, "lost: node-007"),
            ),
            Operation::Wait(Duration::from_secs(10)),
        ])
        .await
        .unwrap();
        let writes = sim.status().writes();
        let after = &writes[before..];
        assert_eq!(after.len(), 1, "{after:#?}");
        assert!(
            after[0].status.message.contains("lost: node-007"),
            "{after:#?}"
        );
    });
}

/// A restarted node comes back before gossip has told it about the other members
/// (here: its links are cut for 3 s, longer than the reporter settle's 2 s bound for
/// a node alone in gossip). It must not write a status that drops them: a real
/// cluster saw `NotReady 1/1, nodes=[gb-3]` for 0.4 s, with a stray `NotReady` event.
#[test]
fn a_restarted_node_never_shrinks_the_written_status() {
    init_logs();
    // node-002 restarts behind the reporter; node-000 was the reporter itself.
    for victim in [2, 0] {
        run_simulation(async move {
            let mut sim = SimCluster::new(SimConfig::default());
            sim.domain("cd", 0);
            let nodes = range(3);
            sim.run(formed("cd", &nodes)).await.unwrap();
            sim.run(vec![
                assert_within(FORM, "written", status("cd", Phase::Ready, 3, 3, "")),
                Operation::Kill(victim),
                assert_within(
                    FORM,
                    "the loss is reported",
                    status("cd", Phase::NotReady, 2, 3, "lost"),
                ),
            ])
            .await
            .unwrap();
            let before = sim.status().writes().len();
            let events_before: Vec<usize> = nodes.iter().map(|n| sim.events_of(*n).len()).collect();
            sim.run(vec![
                Operation::Isolate(victim),
                Operation::Restart(victim),
                Operation::Wait(Duration::from_secs(3)),
                Operation::Heal,
                assert_within(
                    FORM,
                    "back to Ready",
                    all(vec![
                        ready("cd", &nodes),
                        status("cd", Phase::Ready, 3, 3, "3/3"),
                    ]),
                ),
                Operation::Wait(Duration::from_secs(5)),
            ])
            .await
            .unwrap();
            let writes = sim.status().writes();
            let after = &writes[before..];
            assert!(
                after.iter().all(|w| w.status.nodes.len() == 3),
                "node-{victim:03} restarted: a write dropped members: {after:#?}"
            );
            for (n, skip) in nodes.iter().zip(events_before) {
                // The restarted node's events start afresh.
                let skip = if *n == victim { 0 } else { skip };
                let stray: Vec<_> = sim.events_of(*n)[skip..]
                    .iter()
                    .filter(|(_, e)| matches!(e, DomainEvent::NotReady { .. }))
                    .cloned()
                    .collect();
                assert!(stray.is_empty(), "node-{n:03}: stray events {stray:#?}");
            }
        });
    }
}

fn vacated(uid: &str) -> domaind_chaos::script::Check {
    let uid = uid.to_owned();
    Box::new(move |view| {
        let last = view
            .writes
            .iter()
            .rev()
            .find(|w| w.domain.uid.0 == uid)
            .ok_or("nothing written")?;
        let s = &last.status;
        if s.status == Phase::NotReady && s.total_nodes == 0 && s.nodes.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "last status by {}: {} {:?}",
                last.writer, s.message, s.status
            ))
        }
    })
}

/// Once the workload is gone (every claim unprepared), the status says so: NotReady,
/// no nodes. Before, it kept reading `Ready 3/3` until the domain was deleted.
#[test]
fn the_status_is_vacated_when_the_workload_leaves() {
    init_logs();
    // All at once (a Deployment deleted), or one by one with the reporter last.
    for gap in [Duration::ZERO, Duration::from_secs(2)] {
        run_simulation(async move {
            let mut sim = SimCluster::new(SimConfig::default());
            sim.domain("cd", 0);
            let nodes = range(3);
            sim.run(formed("cd", &nodes)).await.unwrap();
            sim.run(vec![assert_within(
                FORM,
                "written",
                status("cd", Phase::Ready, 3, 3, ""),
            )])
            .await
            .unwrap();
            let mut ops = Vec::new();
            for n in nodes.iter().rev() {
                ops.push(Operation::Unprepare {
                    node: *n,
                    claim: format!("cd-{n}"),
                });
                ops.push(Operation::Wait(gap));
            }
            ops.push(assert_within(FORM, "vacated", vacated("cd")));
            // Nothing writes over it afterwards.
            ops.push(Operation::Wait(Duration::from_secs(20)));
            ops.push(assert_within(
                Duration::ZERO,
                "still vacated",
                vacated("cd"),
            ));
            sim.run(ops).await.unwrap();
            let writes = sim.status().writes();
            let vacated_writes = writes.iter().filter(|w| w.status.nodes.is_empty()).count();
            assert!(vacated_writes <= nodes.len(), "{writes:#?}");
            let events: Vec<_> = nodes.iter().flat_map(|n| sim.events_of(*n)).collect();
            assert!(
                events
                    .iter()
                    .any(|(_, e)| matches!(e, DomainEvent::NotReady { message } if message.starts_with("0/0"))),
                "gap {gap:?}: {events:#?}"
            );
        });
    }
}

/// Three racks of four, each its own clique, and a node with no fabric: each rack
/// forms its own domain, no gossip ever crosses racks, and each node's gossip knows
/// only its rack-mates.
#[test]
fn three_cliques_form_three_domains_and_gossip_never_crosses() {
    init_logs();
    run_simulation(async {
        let mut sim = SimCluster::new(SimConfig::default());
        let racks = [("rack-a", 0..4), ("rack-b", 4..8), ("rack-c", 8..12)];
        for (clique, members) in racks.clone() {
            sim.domain(clique, 0);
            for i in members {
                sim.start_node_in(i, clique).await;
            }
        }
        let loner = 12;
        sim.start_node_in(loner, "").await;
        for (clique, members) in racks.clone() {
            for i in members {
                sim.prepare(i, &format!("{clique}-{i}"), clique, None);
            }
        }
        for (clique, members) in racks.clone() {
            let members: Vec<usize> = members.collect();
            sim.wait_for(FORM, clique, all(vec![ready(clique, &members), isolated()]))
                .await
                .unwrap();
        }

        // Settled: twenty idle seconds more, then every count is read.
        let within_before: Vec<_> = racks
            .iter()
            .map(|(clique, _)| sim.traffic_within(clique))
            .collect();
        tokio::time::sleep(Duration::from_secs(20)).await;
        assert_eq!(
            sim.traffic_across_cliques(),
            domaind_chaos::traffic::Count::default(),
            "gossip crossed cliques"
        );
        for ((clique, _), before) in racks.iter().zip(within_before) {
            assert!(
                sim.traffic_within(clique).since(before).messages > 0,
                "{clique} went quiet"
            );
        }
        for (clique, members) in racks {
            let mates: std::collections::BTreeSet<String> =
                members.clone().map(node_name).collect();
            for i in members {
                assert_eq!(sim.clique_of(i), Some(clique));
                assert_eq!(sim.gossip_members(i).as_ref(), Some(&mates), "{i}");
                let peers = sim.view().await.daemons[&node_name(i)].peers.clone();
                assert_eq!(peers.len(), mates.len(), "{i}: {peers:?}");
                assert!(peers.nodes().all(|p| mates.contains(p)), "{i}: {peers:?}");
            }
        }
        assert_eq!(
            sim.gossip_members(loner),
            Some([node_name(loner)].into_iter().collect())
        );
        assert_eq!(
            sim.traffic_within(""),
            domaind_chaos::traffic::Count::default()
        );
    });
}
