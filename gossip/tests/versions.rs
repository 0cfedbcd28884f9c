//! A rack in the middle of a rolling upgrade: one node speaks the next version of
//! every gossip format (frames, pulses, signed values), the rest this one. The rack
//! stays one membership, news crosses both ways, and the newer versions are counted,
//! not refused.

mod common;
use common::poll_until_true;

use std::time::Duration;

use common::{Metrics, Pki, any_port, name};
use domaind_gossip::metrics::{FRAMES_REJECTED, NEWER_VERSION, STATE_REFUSED};
use domaind_gossip::pulse::PULSES_REFUSED;
use domaind_gossip::transport::TransportLimits;
use domaind_gossip::version::WireVersion;
use domaind_gossip::{GossipConfig, GossipNode, cluster_id_for_clique};

const LIMIT: Duration = Duration::from_secs(30);

async fn start(
    pki: &Pki,
    node: &str,
    octet: u8,
    seeds: &[&GossipNode],
    wire: WireVersion,
) -> GossipNode {
    let mut config = GossipConfig::new(name(node), any_port(octet), cluster_id_for_clique("v-1.0"));
    config.seeds = seeds.iter().map(|s| s.gossip_addr().to_string()).collect();
    config.wire_version = wire;
    GossipNode::start_tls(config, pki.node_tls(node), TransportLimits::default())
        .await
        .unwrap()
}

fn sees_all(node: &GossipNode, nodes: &[&str]) -> bool {
    let live = node.live_nodes();
    live.len() == nodes.len() && nodes.iter().all(|n| live.contains_key(*n))
}

fn holds(observer: &GossipNode, node: &str, key: &str, value: &str) -> bool {
    observer
        .live_nodes()
        .get(node)
        .is_some_and(|m| m.keys.get(key).is_some_and(|v| v == value))
}

#[tokio::test]
async fn a_rack_with_a_node_of_the_next_version_does_not_split() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    // Everyone joins through the node of the next version: nothing reaches the
    // others but what they read of it, and what they relay for each other through it.
    let next = start(&pki, "node-0", 71, &[], WireVersion::Next).await;
    let mut nodes = vec![next];
    for (i, octet) in [72u8, 73, 74].into_iter().enumerate() {
        let node = start(
            &pki,
            &format!("node-{}", i + 1),
            octet,
            &[&nodes[0]],
            WireVersion::Current,
        )
        .await;
        nodes.push(node);
    }
    let all = ["node-0", "node-1", "node-2", "node-3"];
    poll_until_true("every node to see every other", LIMIT, async || {
        nodes.iter().all(|n| sees_all(n, &all))
    })
    .await;

    nodes[0].set("probe/next", "from the next version").await;
    nodes[1].set("probe/current", "from this version").await;
    poll_until_true(
        "news to cross between the versions both ways",
        LIMIT,
        async || {
            nodes[1..]
                .iter()
                .all(|n| holds(n, "node-0", "probe/next", "from the next version"))
                && nodes
                    .iter()
                    .all(|n| holds(n, "node-1", "probe/current", "from this version"))
        },
    )
    .await;
    poll_until_true("each newer format to be counted", LIMIT, async || {
        ["frame", "pulse", "envelope"]
            .iter()
            .all(|format| metrics.counter(NEWER_VERSION, Some(("format", format))) > 0)
    })
    .await;

    assert!(nodes.iter().all(|n| sees_all(n, &all)));
    assert_eq!(metrics.counter(FRAMES_REJECTED, None), 0);
    assert_eq!(metrics.counter(PULSES_REFUSED, None), 0);
    // Stale values and a node's own state relayed back are not refusals of a peer.
    let refused = metrics.counter(STATE_REFUSED, None)
        - metrics.counter(STATE_REFUSED, Some(("reason", "stale")))
        - metrics.counter(STATE_REFUSED, Some(("reason", "own_state")));
    assert_eq!(refused, 0);
    for node in nodes {
        node.stop().await.unwrap();
    }
}
