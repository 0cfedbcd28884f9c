//! Eager gossip: a key set between two rounds reaches every node's view before the
//! next round; without eager gossip, pulses' mends bring it before the next round too.
//! Paused time over chitchat's in-memory transport, with rounds four seconds apart so that
//! a round cannot be what carried the news.

mod common;
use common::poll_until_true;

use std::net::SocketAddr;
use std::time::Duration;

use chitchat::transport::ChannelTransport;
use common::{loopback, name};
use domaind_gossip::pulse::MemoryPulses;
use domaind_gossip::{EagerGossip, GossipConfig, GossipNode, GossipTiming, cluster_id_for_clique};
use tokio::time::{Instant, sleep_until};

const NODES: usize = 18;
/// Chitchat's rounds, far apart: long enough for mends (a pulse every 150 ms, news
/// spreading over a handful of push-pull exchanges) to reach 18 nodes before the next
/// round with a wide margin.
const ROUND: Duration = Duration::from_secs(4);

fn addr(i: usize) -> SocketAddr {
    SocketAddr::new(loopback(40 + i as u8), 7946)
}

fn node_name(i: usize) -> String {
    format!("node-{i:02}")
}

/// A converged rack whose rounds all tick at `start + k * ROUND`, and that start.
async fn rack(transport: &ChannelTransport, eager: EagerGossip) -> (Vec<GossipNode>, Instant) {
    let timing = GossipTiming {
        gossip_interval: ROUND,
        initial_heartbeat_interval: ROUND * 2,
        max_heartbeat_interval: ROUND * 10,
        eager,
        ..GossipTiming::default()
    };
    let start = Instant::now();
    let pki = common::Pki::new();
    let pulses = MemoryPulses::new();
    let mut nodes = Vec::new();
    for i in 0..NODES {
        let mut config = GossipConfig::new(
            name(&node_name(i)),
            addr(i),
            cluster_id_for_clique("cluster-1.0"),
        );
        config.timing = timing.clone();
        if i > 0 {
            config.seeds = vec![addr(0).to_string()];
        }
        let credentials = pki.credentials(&node_name(i));
        nodes.push(
            GossipNode::start(config, transport, &pulses, credentials)
                .await
                .unwrap(),
        );
    }
    assert_eq!(
        Instant::now(),
        start,
        "in paused time the nodes start together"
    );
    poll_until_true("the rack converges", Duration::from_secs(120), async || {
        nodes.iter().all(|n| n.live_nodes().len() == NODES)
    })
    .await;
    (nodes, start)
}

/// Half a round after the next round: no round runs for the next 500 ms.
async fn between_rounds(start: Instant) {
    let rounds = start.elapsed().as_millis() / ROUND.as_millis() + 1;
    sleep_until(start + ROUND * rounds as u32 + ROUND / 2).await;
}

fn seen_by(nodes: &[GossipNode], key: &str) -> usize {
    nodes
        .iter()
        .filter(|n| {
            n.live_nodes()
                .get("node-05")
                .is_some_and(|m| m.keys.contains_key(key))
        })
        .count()
}

#[tokio::test(start_paused = true)]
async fn news_reaches_every_view_between_rounds() {
    let transport = ChannelTransport::with_mtu(65_507);
    let (nodes, start) = rack(&transport, EagerGossip::default()).await;
    between_rounds(start).await;
    let set_at = Instant::now();
    nodes[5].set("domain/cd-1", "slot=5").await;
    poll_until_true("every node sees node-05's key", ROUND / 4, async || {
        seen_by(&nodes, "domain/cd-1") == NODES
    })
    .await;
    println!(
        "18 nodes saw the key {:?} after it was set",
        set_at.elapsed()
    );
}

/// Without eager gossip, news does not wait for chitchat's next round either: a pulse
/// carries a hash of what its sender holds, and a peer holding something else
/// exchanges state with it then (`pulse`, "mends"). Rounds are a second apart here, so
/// only mends can bring it before the next one.
#[tokio::test(start_paused = true)]
async fn without_eager_gossip_pulses_bring_news_before_the_next_round() {
    let transport = ChannelTransport::with_mtu(65_507);
    let (nodes, start) = rack(&transport, EagerGossip::OFF).await;
    between_rounds(start).await;
    let set_at = Instant::now();
    nodes[5].set("domain/cd-1", "slot=5").await;
    poll_until_true("every node sees node-05's key", ROUND / 2, async || {
        seen_by(&nodes, "domain/cd-1") == NODES
    })
    .await;
    println!(
        "without eager gossip, 18 nodes saw the key {:?} after it was set",
        set_at.elapsed()
    );
}
