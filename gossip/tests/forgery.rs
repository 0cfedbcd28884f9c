//! Forged state on a rack gossiping over mutual TLS. The attacker holds a certificate
//! our CA signed for a node outside the clique, harvests the rack's genuinely signed
//! state by gossiping like a member, and sends each node deltas that forge, move,
//! delete and roll back other nodes' state. Every forgery is refused and counted; no
//! node's view changes, and gossip goes on.

mod common;
use common::poll_until_true;

use std::net::SocketAddr;
use std::time::Duration;

use chitchat::ChitchatId;
use common::{Metrics, Pki, any_port, loopback, name, within};
use domaind_gossip::forge::{Forger, forgeries};
use domaind_gossip::metrics::STATE_REFUSED;
use domaind_gossip::transport::TransportLimits;
use domaind_gossip::transport::wire::NodePart;
use domaind_gossip::{GossipConfig, GossipNode, cluster_id_for_clique};

const CLUSTER: Duration = Duration::from_secs(30);
const NODES: [&str; 3] = ["node-0", "node-1", "node-2"];

fn cluster() -> String {
    cluster_id_for_clique("c-1.0")
}

struct Rack {
    pki: Pki,
    nodes: Vec<GossipNode>,
}

impl Rack {
    async fn start() -> Self {
        let pki = Pki::new();
        let mut nodes: Vec<GossipNode> = Vec::new();
        for (i, node) in NODES.into_iter().enumerate() {
            let mut config = GossipConfig::new(name(node), any_port(51 + i as u8), cluster());
            config.seeds = nodes.iter().map(|n| n.gossip_addr().to_string()).collect();
            config.generation = 1;
            let gossip =
                GossipNode::start_tls(config, pki.node_tls(node), TransportLimits::default())
                    .await
                    .unwrap();
            gossip
                .set("domain/d", format!("advertisement of {node}"))
                .await;
            gossip.set("status/d", "digest 1").await;
            nodes.push(gossip);
        }
        let rack = Self { pki, nodes };
        rack.wait_for("the rack to converge", |rack| {
            rack.views_are_honest("digest 1")
        })
        .await;
        rack
    }

    async fn wait_for(&self, what: &str, condition: impl Fn(&Self) -> bool) {
        poll_until_true(what, CLUSTER, async || condition(self)).await;
    }

    /// Every node sees exactly the three nodes, at their own addresses, with the keys
    /// they published.
    fn views_are_honest(&self, status: &str) -> bool {
        self.nodes.iter().all(|observer| {
            let live = observer.live_nodes();
            live.len() == NODES.len()
                && self.nodes.iter().zip(NODES).all(|(owner, node)| {
                    live.get(node).is_some_and(|m| {
                        m.gossip_addr == owner.gossip_addr()
                            && m.keys.get("domain/d").map(String::as_str)
                                == Some(format!("advertisement of {node}").as_str())
                            && m.keys.get("status/d").map(String::as_str) == Some(status)
                    })
                })
        })
    }
}

/// node-0's state as node-1 relays it to anyone who gossips.
async fn node_0_as_relayed(forger: &Forger, rack: &Rack) -> NodePart {
    forger
        .harvest(rack.nodes[1].gossip_addr(), CLUSTER)
        .await
        .unwrap()
        .into_iter()
        .find(|part| *part.id.node_id == *"node-0")
        .expect("node-1 relays node-0's state")
}

#[tokio::test]
async fn forged_state_is_refused_counted_and_changes_no_view() {
    let metrics = Metrics::install();
    let rack = Rack::start().await;
    let tls_dir = tempfile::tempdir().unwrap();
    let forger = Forger::new(
        cluster(),
        &name("node-evil"),
        &rack.pki.issue("node-evil"),
        tls_dir.path(),
        loopback(54),
    )
    .unwrap();
    let other_ca = Pki::new();
    let foreign = other_ca
        .issue("node-0")
        .credentials(&name("node-0"))
        .unwrap();

    // What node-0 really signed; then the rack moves on, so that it becomes old.
    let earlier = node_0_as_relayed(&forger, &rack).await;
    for node in &rack.nodes {
        node.set("status/d", "digest 2").await;
    }
    rack.wait_for("digest 2 everywhere", |rack| {
        rack.views_are_honest("digest 2")
    })
    .await;
    let now = node_0_as_relayed(&forger, &rack).await;

    let forged = forgeries(&forger, &now, Some(&earlier), &foreign);
    let reasons: std::collections::BTreeSet<&str> = forged.iter().map(|f| f.reason).collect();
    assert_eq!(
        reasons.into_iter().collect::<Vec<_>>(),
        [
            "bad_signature",
            "rollback",
            "stale",
            "unsigned_max_version",
            "unsigned_tombstone",
            "untrusted_certificate",
            "wrong_signer"
        ]
    );
    for forgery in forged {
        let before = metrics.counter(STATE_REFUSED, Some(("reason", forgery.reason)));
        for (node, gossip) in NODES.iter().zip(&rack.nodes).skip(1) {
            forger
                .send_parts(gossip.gossip_addr(), node, &forgery.parts)
                .await
                .unwrap();
        }
        poll_until_true(
            &format!("{} to be counted twice", forgery.name),
            CLUSTER,
            async || metrics.counter(STATE_REFUSED, Some(("reason", forgery.reason))) >= before + 2,
        )
        .await;
        assert!(rack.views_are_honest("digest 2"), "after {}", forgery.name);
    }
    // A ghost named only in digests: chitchat tracks it, domaind does not see it.
    let ghost = ChitchatId::new("node-ghost", 1, SocketAddr::new(loopback(54), 7946));
    for (node, gossip) in NODES.iter().zip(&rack.nodes) {
        forger
            .send_digest_naming(gossip.gossip_addr(), node, std::slice::from_ref(&ghost))
            .await
            .unwrap();
    }

    // Gossip lives on everywhere, and the views are still the honest ones.
    for node in &rack.nodes {
        node.set("status/d", "digest 3").await;
    }
    rack.wait_for("news after the attacks to reach everyone", |rack| {
        rack.views_are_honest("digest 3")
    })
    .await;
    for node in rack.nodes {
        node.stop().await.unwrap();
    }
}

/// The forger's `send` returns once the node has read the frame, however late the node
/// reads (a loaded one): what `domaind-chaos forge` counts after it does not race the
/// network.
#[tokio::test]
async fn a_send_returns_once_the_node_has_read_the_frame() {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::AsyncReadExt as _;

    let pki = Pki::new();
    let listener = tokio::net::TcpListener::bind(any_port(55)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let acceptor =
        tokio_rustls::TlsAcceptor::from(pki.node_tls("node-1").material().server_config());
    let read_bytes = Arc::new(AtomicUsize::new(0));
    let server = tokio::spawn({
        let read_bytes = read_bytes.clone();
        async move {
            let (tcp, _) = listener.accept().await.unwrap();
            let mut tls = acceptor.accept(tcp).await.unwrap();
            // The late read the test is about, not a wait for something to settle.
            tokio::time::sleep(Duration::from_millis(300)).await;
            let mut received = Vec::new();
            let read = tls.read_to_end(&mut received).await;
            read_bytes.store(received.len(), Ordering::SeqCst);
            (read.map_err(|e| e.to_string()), received)
        }
    });
    let tls_dir = tempfile::tempdir().unwrap();
    let forger = Forger::new(
        cluster(),
        &name("node-evil"),
        &pki.issue("node-evil"),
        tls_dir.path(),
        loopback(56),
    )
    .unwrap();
    let ghost = ChitchatId::new("node-ghost", 1, SocketAddr::new(loopback(56), 7946));
    within(
        "the forger's send",
        CLUSTER,
        forger.send_digest_naming(addr, "node-1", std::slice::from_ref(&ghost)),
    )
    .await
    .unwrap();
    let read_when_sent = read_bytes.load(Ordering::SeqCst);
    let (read, received) = server.await.unwrap();
    assert_eq!(
        read,
        Ok(received.len()),
        "the forger ends its side cleanly (close_notify)"
    );
    assert!(
        received.len() > 4 && received.ends_with(cluster().as_bytes()),
        "the whole frame arrived: {received:?}"
    );
    assert_eq!(
        read_when_sent,
        received.len(),
        "send returned before the node had read the frame"
    );
}
