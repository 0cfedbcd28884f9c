//! Figures of the domain core over the in-memory transport, in simulated time:
//! formation, dead-node removal, gossip traffic and status writes, for racks of 18,
//! 72 and 144 nodes. Prints a table; asserts nothing.
//!
//! `cargo bench -p domaind-chaos --bench formation` (add `-- 18` to run one size).
//! `cargo bench -p domaind-chaos --bench formation -- fleet` runs the fleet instead:
//! 56 cliques of 18 and one of 144 (`-- fleet 28 72`: 28 cliques of 18 and one of 72); see `fleet.rs`.

#[path = "formation/fleet.rs"]
mod fleet;

use std::time::{Duration, Instant};

use domaind_actors::model::Phase;
use domaind_chaos::checks::{all, dropped, ready, status};
use domaind_chaos::sim::run_simulation;
use domaind_chaos::{SimCluster, SimConfig};

const LIMIT: Duration = Duration::from_secs(120);

#[derive(Debug)]
struct Figures {
    nodes: usize,
    form: Duration,
    drop: Duration,
    messages_per_node_s: f64,
    bytes_per_node_s: f64,
    /// Under 10% message loss for a minute: samples (a node's view, once a second) that
    /// missed a live node, and status writes.
    loss_missed: usize,
    loss_writes: usize,
    writes_forming: usize,
    writes_node_loss: usize,
    wall: Duration,
}

fn measure(n: usize) -> Figures {
    let wall = Instant::now();
    run_simulation(async move {
        let mut sim = SimCluster::new(SimConfig {
            seed: n as u64,
            node: |c| c.max_slots = 144,
            ..SimConfig::default()
        });
        sim.domain("cd", 0);
        sim.set_poll_interval(Duration::from_millis(10));
        let nodes: Vec<usize> = (0..n).collect();
        for i in &nodes {
            sim.start_node(*i).await;
        }
        // Gossip membership first, as on a rack whose daemons have been up a while.
        tokio::time::sleep(Duration::from_secs(10)).await;

        // Formation: every claim prepared at once -> all Ready and the status written.
        let writes_before = sim.status().writes().len();
        for i in &nodes {
            sim.prepare(*i, &format!("cd-{i}"), "cd", None);
        }
        let form = sim
            .wait_for(
                LIMIT,
                "formation",
                all(vec![
                    ready("cd", &nodes),
                    status("cd", Phase::Ready, n as u32, n as u32, ""),
                ]),
            )
            .await
            .expect("the domain forms");
        let writes_forming = sim.status().writes().len() - writes_before;
        if std::env::var_os("FIGURES_DEBUG").is_some() {
            for w in &sim.status().writes()[writes_before..] {
                eprintln!("{} {}", w.writer, w.status.message);
            }
        }

        // Idle traffic, per node per second, over three anti-entropy rounds.
        tokio::time::sleep(Duration::from_secs(5)).await;
        let (messages_before, bytes_before) = sim.traffic();
        let window = Duration::from_secs(30);
        tokio::time::sleep(window).await;
        let (messages_after, bytes_after) = sim.traffic();
        let per = |d: u64| d as f64 / n as f64 / window.as_secs_f64();

        // A minute of 10% message loss: nobody should lose sight of anybody.
        let writes_before = sim.status().writes().len();
        sim.loss(10.0);
        let mut loss_missed = 0;
        for _ in 0..60 {
            tokio::time::sleep(Duration::from_secs(1)).await;
            loss_missed += nodes
                .iter()
                .filter(|i| sim.gossip_members(**i).is_none_or(|m| m.len() != n))
                .count();
        }
        sim.loss(0.0);
        let loss_writes = sim.status().writes().len() - writes_before;

        // A node dies: time until no survivor's IMEX daemon lists it.
        let victim = n / 2;
        let survivors: Vec<usize> = nodes.iter().copied().filter(|i| *i != victim).collect();
        let writes_before = sim.status().writes().len();
        sim.kill(victim).await;
        let drop = sim
            .wait_for(
                LIMIT,
                "dead node dropped",
                dropped("cd", victim, &survivors),
            )
            .await
            .expect("the dead node is dropped");
        sim.wait_for(
            LIMIT,
            "loss reported",
            status("cd", Phase::NotReady, n as u32 - 1, n as u32, "lost"),
        )
        .await
        .expect("the loss is reported");
        tokio::time::sleep(Duration::from_secs(5)).await;
        let writes_node_loss = sim.status().writes().len() - writes_before;
        if std::env::var_os("FIGURES_DEBUG").is_some() {
            for w in &sim.status().writes()[writes_before..] {
                eprintln!("{} {}", w.writer, w.status.message);
            }
        }

        Figures {
            nodes: n,
            form,
            drop,
            messages_per_node_s: per(messages_after - messages_before),
            bytes_per_node_s: per(bytes_after - bytes_before),
            loss_missed,
            loss_writes,
            writes_forming,
            writes_node_loss,
            wall: wall.elapsed(),
        }
    })
}

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.iter().any(|a| a == "fleet") {
        let numbers: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
        fleet::run(
            numbers.first().copied().unwrap_or(56),
            numbers.get(1).copied().unwrap_or(144),
        );
        return;
    }
    let sizes: Vec<usize> = args.iter().filter_map(|a| a.parse().ok()).collect();
    let sizes = if sizes.is_empty() {
        vec![18, 72, 144]
    } else {
        sizes
    };
    println!(
        "domain core over the in-memory transport, simulated time (pulses every 150 ms, anti-entropy every 10 s, IMEX polled on change and every 5 s when ready)"
    );
    println!(
        "{:>5} | {:>10} | {:>14} | {:>11} | {:>12} | {:>18} | {:>16} | {:>17} | {:>8}",
        "nodes",
        "form",
        "drop dead node",
        "msgs/node/s",
        "bytes/node/s",
        "10% loss: missed",
        "writes: forming",
        "writes: node loss",
        "wall"
    );
    for n in sizes {
        let f = measure(n);
        println!(
            "{:>5} | {:>10.2?} | {:>14.2?} | {:>11.1} | {:>12.0} | {:>18} | {:>16} | {:>17} | {:>8.1?}",
            f.nodes,
            f.form,
            f.drop,
            f.messages_per_node_s,
            f.bytes_per_node_s,
            format!("{} ({} writes)", f.loss_missed, f.loss_writes),
            f.writes_forming,
            f.writes_node_loss,
            f.wall
        );
    }
}
