//! The fleet: many racks, each its own NVLink clique and gossip cluster, in one
//! simulation. What a fleet adds to the one-rack figures: how fast a new node finds
//! its clique, whether gossip stays inside cliques, and whether a node's idle cost
//! stays flat as racks are added. Prints; asserts nothing.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use domaind_actors::model::Phase;
use domaind_chaos::checks::{all, dropped, ready, status};
use domaind_chaos::sim::{node_name, run_simulation};
use domaind_chaos::traffic::Count;
use domaind_chaos::{SimCluster, SimConfig};
use domaind_testkit::percentile::percentile;

const RACK: usize = 18;
const LIMIT: Duration = Duration::from_secs(120);
const IDLE_WINDOW: Duration = Duration::from_secs(20);
const JOINS: usize = 20;

fn rack_clique(c: usize) -> String {
    format!("rack-{c:02}")
}

const BIG_CLIQUE: &str = "rack-big";

/// Which nodes belong to which clique: racks of 18 first, then the big clique.
struct Layout {
    racks: Vec<(String, Vec<usize>)>,
    big: Vec<usize>,
}

impl Layout {
    fn new(racks: usize, big: usize) -> Self {
        let racks: Vec<(String, Vec<usize>)> = (0..racks)
            .map(|c| (rack_clique(c), (c * RACK..(c + 1) * RACK).collect()))
            .collect();
        let first_big = racks_len(&racks);
        Self {
            racks,
            big: (first_big..first_big + big).collect(),
        }
    }

    fn nodes(&self) -> usize {
        racks_len(&self.racks) + self.big.len()
    }
}

fn racks_len(racks: &[(String, Vec<usize>)]) -> usize {
    racks.iter().map(|(_, m)| m.len()).sum()
}

async fn start(sim: &mut SimCluster, layout: &Layout) {
    for (clique, members) in &layout.racks {
        for i in members {
            sim.start_node_in(*i, clique).await;
        }
    }
    for i in &layout.big {
        sim.start_node_in(*i, BIG_CLIQUE).await;
    }
    // Gossip membership first, as on a fleet whose daemons have been up a while.
    tokio::time::sleep(Duration::from_secs(10)).await;
}

/// Idle gossip of the racks of 18 and of the big clique, per node per second, and what
/// crossed cliques, over one window.
struct Idle {
    rack: (f64, f64),
    big: Option<(f64, f64)>,
    across_bytes_per_node_s: f64,
    across_messages: u64,
}

async fn idle(sim: &SimCluster, layout: &Layout) -> Idle {
    let sum = |sim: &SimCluster| {
        layout
            .racks
            .iter()
            .map(|(c, _)| sim.traffic_within(c))
            .fold(Count::default(), |a, b| Count {
                messages: a.messages + b.messages,
                bytes: a.bytes + b.bytes,
            })
    };
    let (racks_before, big_before, across_before) = (
        sum(sim),
        sim.traffic_within(BIG_CLIQUE),
        sim.traffic_across_cliques(),
    );
    tokio::time::sleep(IDLE_WINDOW).await;
    let per = |count: Count, nodes: usize| {
        let per = |d: u64| d as f64 / nodes as f64 / IDLE_WINDOW.as_secs_f64();
        (per(count.messages), per(count.bytes))
    };
    let across = sim.traffic_across_cliques().since(across_before);
    Idle {
        rack: per(sum(sim).since(racks_before), racks_len(&layout.racks)),
        big: (!layout.big.is_empty()).then(|| {
            per(
                sim.traffic_within(BIG_CLIQUE).since(big_before),
                layout.big.len(),
            )
        }),
        across_bytes_per_node_s: across.bytes as f64
            / layout.nodes() as f64
            / IDLE_WINDOW.as_secs_f64(),
        across_messages: across.messages,
    }
}

/// Starts `index` into `mates`' clique and measures until it lists every mate as a
/// gossip member and every mate lists it.
async fn join(sim: &mut SimCluster, index: usize, clique: &str, mates: &[usize]) -> Duration {
    let started = tokio::time::Instant::now();
    sim.start_node_in(index, clique).await;
    let mut everyone: BTreeSet<String> = mates.iter().map(|m| node_name(*m)).collect();
    everyone.insert(node_name(index));
    loop {
        let joined = sim
            .gossip_members(index)
            .is_some_and(|m| everyone.is_subset(&m))
            && mates.iter().all(|m| {
                sim.gossip_members(*m)
                    .is_some_and(|members| members.contains(&node_name(index)))
            });
        if joined {
            return started.elapsed();
        }
        assert!(
            started.elapsed() < LIMIT,
            "{} never joined",
            node_name(index)
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

/// Formation and node loss in one rack of the fleet, as the one-rack bench measures them.
async fn form_and_lose(sim: &mut SimCluster, members: &[usize]) -> (Duration, Duration) {
    let n = members.len() as u32;
    sim.domain("fleet", 0);
    for i in members {
        sim.prepare(*i, &format!("fleet-{i}"), "fleet", None);
    }
    let form = sim
        .wait_for_nodes(
            members,
            LIMIT,
            "formation",
            all(vec![
                ready("fleet", members),
                status("fleet", Phase::Ready, n, n, ""),
            ]),
        )
        .await
        .expect("the rack's domain forms");
    tokio::time::sleep(Duration::from_secs(5)).await;
    let victim = members[members.len() / 2];
    let survivors: Vec<usize> = members.iter().copied().filter(|i| *i != victim).collect();
    sim.kill(victim).await;
    let drop = sim
        .wait_for_nodes(
            &survivors,
            LIMIT,
            "dead node dropped",
            dropped("fleet", victim, &survivors),
        )
        .await
        .expect("the dead node is dropped");
    (form, drop)
}

fn idle_only(racks: usize) -> Idle {
    run_simulation(async move {
        let layout = Layout::new(racks, 0);
        let mut sim = SimCluster::new(SimConfig {
            seed: racks as u64,
            ..SimConfig::default()
        });
        start(&mut sim, &layout).await;
        idle(&sim, &layout).await
    })
}

fn print_idle(label: &str, nodes: usize, idle: &Idle, wall: Duration) {
    println!(
        "{label:>22} | {nodes:>5} | {:>11.1} | {:>12.0} | {:>15.1} | {:>8.1?}",
        idle.rack.0, idle.rack.1, idle.across_bytes_per_node_s, wall
    );
}

pub fn run(racks: usize, big: usize) {
    println!(
        "fleet over the in-memory transport, simulated time: racks of {RACK}, each its own clique, seeds scoped to the clique"
    );
    println!(
        "{:>22} | {:>5} | {:>11} | {:>12} | {:>15} | {:>8}",
        "idle, racks of 18", "nodes", "msgs/node/s", "bytes/node/s", "cross B/node/s", "wall"
    );
    for k in [1, 8].into_iter().filter(|k| *k < racks) {
        let wall = Instant::now();
        let figures = idle_only(k);
        print_idle(&format!("{k} cliques"), k * RACK, &figures, wall.elapsed());
    }

    let wall = Instant::now();
    run_simulation(async move {
        let layout = Layout::new(racks, big);
        let mut sim = SimCluster::new(SimConfig {
            seed: 56,
            node: |c| c.max_slots = 144,
            ..SimConfig::default()
        });
        sim.set_poll_interval(Duration::from_millis(10));
        start(&mut sim, &layout).await;
        let steady = idle(&sim, &layout).await;
        let label = match big {
            0 => format!("{racks} cliques"),
            _ => format!("{racks} cliques + {big}"),
        };
        print_idle(&label, layout.nodes(), &steady, wall.elapsed());
        if let Some((messages, bytes)) = steady.big {
            println!(
                "{:>22} | {:>5} | {messages:>11.1} | {bytes:>12.0} |",
                format!("(the {big}-node clique)"),
                big
            );
        }
        println!(
            "cross-clique at steady state: {:.1} bytes/node/s ({} messages in {IDLE_WINDOW:?})",
            steady.across_bytes_per_node_s, steady.across_messages
        );

        // New nodes, one at a time, into racks spread across the fleet.
        let mut joins = Vec::new();
        let mut joined_racks = BTreeSet::new();
        for j in 0..JOINS {
            let r = j * racks / JOINS;
            joined_racks.insert(r);
            let (clique, members) = &layout.racks[r];
            let mates = members.clone();
            joins.push(join(&mut sim, layout.nodes() + j, clique, &mates).await);
        }
        joins.sort();
        println!(
            "join ({} joins into {} cliques): p50 {:.2?}, p99 {:.2?}, max {:.2?}",
            joins.len(),
            joined_racks.len(),
            percentile(&joins, 50),
            percentile(&joins, 99),
            joins[joins.len() - 1]
        );

        // A rack nobody joined, so that it has its 18 nodes.
        let rack = (0..racks)
            .find(|r| !joined_racks.contains(r))
            .unwrap_or(racks - 1);
        let (form, drop) = form_and_lose(&mut sim, &layout.racks[rack].1).await;
        println!(
            "one rack of the fleet ({}): form {form:.2?}, drop dead node {drop:.2?}",
            rack_clique(rack)
        );
        println!(
            "cross-clique over the whole run: {} messages, {} bytes",
            sim.traffic_across_cliques().messages,
            sim.traffic_across_cliques().bytes
        );
        println!("wall: {:.1?}", wall.elapsed());
    });
}
