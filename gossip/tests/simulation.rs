//! Simulated racks: GossipNode over chitchat's in-memory transport with injected loss,
//! delay and partitions, in paused time: a minute of gossip costs milliseconds. Fault
//! decisions are seeded, but chitchat picks gossip peers with its own RNG, so runs
//! differ in detail: the tests assert outcomes within bounds, never a schedule.

mod common;
use common::poll_until_true;

use std::net::SocketAddr;
use std::time::Duration;

use chitchat::transport::ChannelTransport;
use common::{loopback, name};
use domaind_gossip::pulse::MemoryPulses;
use domaind_gossip::transport::{FaultyTransport, NetworkFaults};
use domaind_gossip::{GossipConfig, GossipNode, cluster_id_for_clique};
use tokio::time::Instant;

const LIMIT: Duration = Duration::from_secs(60);

struct Rack {
    faults: NetworkFaults,
    transport: FaultyTransport<ChannelTransport>,
    pulses: MemoryPulses,
    pki: common::Pki,
    nodes: Vec<GossipNode>,
}

fn addr(i: usize) -> SocketAddr {
    SocketAddr::new(loopback(10 + i as u8), 7946)
}

fn node_name(i: usize) -> String {
    format!("node-{i:02}")
}

impl Rack {
    async fn start(size: usize, seed: u64) -> Self {
        let faults = NetworkFaults::new(seed);
        let transport = FaultyTransport::new(ChannelTransport::with_mtu(65_507), faults.clone());
        let mut rack = Self {
            pulses: MemoryPulses::new().with_faults(faults.clone()),
            faults,
            transport,
            pki: common::Pki::new(),
            nodes: Vec::new(),
        };
        for i in 0..size {
            let node = rack.start_node(i, "cluster-1.0", 1).await;
            rack.nodes.push(node);
        }
        rack
    }

    async fn start_node(&self, i: usize, clique: &str, generation: u64) -> GossipNode {
        let mut config =
            GossipConfig::new(name(&node_name(i)), addr(i), cluster_id_for_clique(clique));
        config.generation = generation;
        if i > 0 {
            config.seeds = vec![addr(0).to_string()];
        }
        let credentials = self.pki.credentials(&node_name(i));
        GossipNode::start(config, &self.transport, &self.pulses, credentials)
            .await
            .unwrap()
    }

    fn all_see(&self, live: &[usize]) -> bool {
        live.iter().all(|&observer| {
            let members = self.nodes[observer].live_nodes();
            members.len() == live.len() && live.iter().all(|i| members.contains_key(&node_name(*i)))
        })
    }

    async fn wait_all_see(&self, live: &[usize], what: &str) -> Duration {
        let start = Instant::now();
        poll_until_true(what, LIMIT, async || self.all_see(live)).await;
        start.elapsed()
    }
}

#[tokio::test(start_paused = true)]
async fn eighteen_nodes_converge_and_heal_a_partition() {
    let rack = Rack::start(18, 1).await;
    let everyone: Vec<usize> = (0..18).collect();
    let formed = rack.wait_all_see(&everyone, "the rack converges").await;
    println!("18 simulated nodes converged in {formed:?} of gossip time");

    rack.nodes[5].set("domain/cd-1", "slot=5").await;
    poll_until_true("every node sees node-05's key", LIMIT, async || {
        rack.nodes.iter().all(|n| {
            n.live_nodes()
                .get("node-05")
                .is_some_and(|m| m.keys.contains_key("domain/cd-1"))
        })
    })
    .await;

    rack.faults.isolate(addr(7));
    let others: Vec<usize> = everyone.iter().copied().filter(|&i| i != 7).collect();
    let detected = rack.wait_all_see(&others, "the others drop node-07").await;
    println!("isolated node dropped by every survivor in {detected:?}");
    rack.wait_all_see(&[7], "node-07 sees itself alone").await;

    rack.faults.heal();
    let healed = rack.wait_all_see(&everyone, "node-07 rejoins").await;
    println!("healed partition rejoined in {healed:?}");
}

#[tokio::test(start_paused = true)]
async fn ten_percent_loss_and_jitter_cause_no_false_removal() {
    let rack = Rack::start(18, 2).await;
    let everyone: Vec<usize> = (0..18).collect();
    rack.wait_all_see(&everyone, "the rack converges").await;

    rack.faults.set_loss(0.10);
    rack.faults
        .set_delay(Duration::ZERO, Duration::from_millis(50));
    let until = Instant::now() + Duration::from_secs(60);
    let mut checks = 0;
    while Instant::now() < until {
        tokio::time::sleep(Duration::from_millis(150)).await;
        assert!(
            rack.all_see(&everyone),
            "a live node was declared dead under 10% loss"
        );
        checks += 1;
    }
    let stats = rack.faults.stats();
    assert!(stats.lost > 0, "the loss was never applied: {stats:?}");
    println!("{checks} checks over 60 s of gossip under loss: {stats:?}");
}

#[tokio::test(start_paused = true)]
async fn nodes_of_another_clique_never_merge() {
    let rack = Rack::start(3, 3).await;
    rack.wait_all_see(&[0, 1, 2], "the clique converges").await;
    // A node of clique 1 that knows a seed of clique 0.
    let stranger = rack.start_node(3, "cluster-1.1", 1).await;
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(
        rack.all_see(&[0, 1, 2]),
        "a node of another clique was admitted"
    );
    assert_eq!(stranger.live_nodes().len(), 1);
}

#[tokio::test(start_paused = true)]
async fn restart_replaces_the_old_generation_under_the_same_address() {
    let mut rack = Rack::start(4, 4).await;
    rack.wait_all_see(&[0, 1, 2, 3], "the rack converges").await;
    rack.nodes[3].set("domain/old", "1").await;
    poll_until_true("node-00 sees the old key", LIMIT, async || {
        rack.nodes[0].live_nodes()["node-03"]
            .keys
            .contains_key("domain/old")
    })
    .await;

    let old = rack.nodes.pop().unwrap();
    old.shutdown().await.unwrap();
    let new = rack.start_node(3, "cluster-1.0", 2).await;
    rack.nodes.push(new);
    poll_until_true("every node follows generation 2", LIMIT, async || {
        rack.nodes.iter().all(|n| {
            n.live_nodes()
                .get("node-03")
                .is_some_and(|m| m.generation == 2 && m.keys.is_empty())
        })
    })
    .await;
    // Long after the old generation is declared dead, the view stays on the new one.
    tokio::time::sleep(Duration::from_secs(30)).await;
    assert!(rack.all_see(&[0, 1, 2, 3]));
    assert_eq!(rack.nodes[0].live_nodes()["node-03"].generation, 2);
}
