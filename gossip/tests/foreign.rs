//! Cliques never gossip with each other: a Syn of another cluster id is dropped before
//! chitchat (no BadCluster answer, one log line per peer per hour, a counter), and
//! seeds handed over after start (`set_seeds`) reach only the clique they belong to.

mod common;

use std::io::Write;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Duration;

use chitchat::ChitchatMessage;
use chitchat::transport::Transport;
use common::{Metrics, Pki, any_port, name, poll_until_true, syn, within};
use domaind_gossip::metrics::{CONNECT_FAILURES, FOREIGN_CLUSTER};
use domaind_gossip::transport::{TlsTransport, TransportLimits};
use domaind_gossip::{GossipConfig, GossipNode, cluster_id_for_clique};

const LIMIT: Duration = Duration::from_secs(20);

async fn start(pki: &Pki, node: &str, octet: u8, clique: &str) -> GossipNode {
    let config = GossipConfig::new(name(node), any_port(octet), cluster_id_for_clique(clique));
    GossipNode::start_tls(config, pki.node_tls(node), TransportLimits::default())
        .await
        .unwrap()
}

fn sees(observer: &GossipNode, nodes: &[&str]) -> bool {
    let live = observer.live_nodes();
    live.len() == nodes.len() && nodes.iter().all(|n| live.contains_key(*n))
}

/// Every WARN line of this test binary. A global subscriber: tracing caches whether
/// a call site is enabled across threads, so a thread-local one can miss lines while
/// another test's thread runs without it.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn logs() -> &'static Captured {
    static LOGS: OnceLock<Captured> = OnceLock::new();
    LOGS.get_or_init(|| {
        let logs = Captured::default();
        let writer = logs.clone();
        let subscriber = tracing_subscriber::fmt()
            .with_max_level(tracing::Level::WARN)
            .with_ansi(false)
            .with_writer(move || writer.clone())
            .finish();
        tracing::subscriber::set_global_default(subscriber).unwrap();
        logs
    })
}

impl Captured {
    /// Lines holding every one of `texts`.
    fn lines_with(&self, texts: &[&str]) -> usize {
        String::from_utf8_lossy(&self.0.lock().unwrap())
            .lines()
            .filter(|line| texts.iter().all(|text| line.contains(text)))
            .count()
    }
}

#[tokio::test]
async fn syns_of_another_clique_are_counted_unanswered_and_logged_once() {
    let metrics = Metrics::install();
    let logs = logs();
    let pki = Pki::new();
    let ours = "cluster-1.0";
    let node = start(&pki, "node-a", 41, ours).await;

    // A peer of another clique whose seed list names us, speaking raw frames.
    let stranger = TlsTransport::new(pki.node_tls("node-x"), 1, TransportLimits::default());
    let stranger_addr = stranger.bind(any_port(42)).await.unwrap();
    let mut socket = stranger.open(stranger_addr).await.unwrap();
    for _ in 0..5 {
        socket
            .send(
                node.gossip_addr(),
                syn(&cluster_id_for_clique("cluster-1.7")),
            )
            .await
            .unwrap();
    }
    poll_until_true("five foreign Syns counted", LIMIT, async || {
        metrics.counter(FOREIGN_CLUSTER, Some(("kind", "syn"))) == 5
    })
    .await;

    // One Syn of our cluster afterwards: its answer is the first thing to come back
    // (one connection per peer, in order), so nothing answered the foreign ones.
    socket
        .send(node.gossip_addr(), syn(&cluster_id_for_clique(ours)))
        .await
        .unwrap();
    let (from, answer) = within("the answer to our cluster's Syn", LIMIT, socket.recv())
        .await
        .unwrap();
    assert_eq!(from, node.gossip_addr());
    assert!(
        matches!(answer, ChitchatMessage::SynAck { .. }),
        "a SynAck first, not BadCluster: {answer:?}"
    );
    let peer = stranger_addr.to_string();
    assert_eq!(
        logs.lines_with(&["from another cluster", &peer]),
        1,
        "one line for the peer"
    );
    assert_eq!(
        logs.lines_with(&["wrong cluster"]),
        0,
        "chitchat never saw them"
    );
    assert!(sees(&node, &["node-a"]), "the stranger did not join");
    node.shutdown().await.unwrap();
}

#[tokio::test]
async fn seeds_set_after_start_form_the_clique_and_seeds_of_other_cliques_are_refused() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let (a, b) = ("cluster-1.1", "cluster-1.2");
    let a0 = start(&pki, "a-0", 43, a).await;
    let a1 = start(&pki, "a-1", 44, a).await;
    let b0 = start(&pki, "b-0", 45, b).await;
    // Nothing listens here: a seed that is gone.
    let unreachable: SocketAddr = {
        let taken = std::net::TcpListener::bind(any_port(46)).unwrap();
        taken.local_addr().unwrap()
    };

    // A seed list that names everyone: ourselves, a clique-mate, another clique's node,
    // and a dead address.
    let seeds = vec![
        a0.gossip_addr(),
        a1.gossip_addr(),
        b0.gossip_addr(),
        unreachable,
    ];
    assert_eq!(a0.set_seeds(seeds.clone()), 3, "all but itself");
    let mut sorted = seeds.clone();
    sorted.sort();
    assert_eq!(a0.seeds(), sorted);

    poll_until_true("the clique to form", LIMIT, async || {
        sees(&a0, &["a-0", "a-1"]) && sees(&a1, &["a-0", "a-1"])
    })
    .await;
    poll_until_true(
        "the other clique's node to refuse our Syn",
        LIMIT,
        async || metrics.counter(FOREIGN_CLUSTER, Some(("kind", "syn"))) >= 1,
    )
    .await;
    assert!(sees(&b0, &["b-0"]), "the other clique stays apart");
    // The dead address is counted (and logged once) by the transport, nothing more.
    poll_until_true(
        "the dead seed's connect failure counted",
        LIMIT,
        async || metrics.counter(CONNECT_FAILURES, None) >= 1,
    )
    .await;

    // Members are not contacted again; the others are.
    assert_eq!(a0.set_seeds(seeds), 2, "b-0 and the dead address");
    for node in [a0, a1, b0] {
        node.shutdown().await.unwrap();
    }
}
