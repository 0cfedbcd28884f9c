//! Forged state on a rack gossiping over mutual TLS. The attacker holds a certificate
//! our CA signed for a node outside the clique, harvests the rack's genuinely signed
//! state by gossiping like a member, and sends each node deltas that forge, move,
//! delete and roll back other nodes' state. Every forgery is refused and counted; no
//! node's view changes, and gossip goes on.

mod common;

use std::net::SocketAddr;
use std::time::Duration;

use chitchat::{ChitchatId, ChitchatMessage, Deserializable, Serializable};
use common::{Metrics, Pki, any_port, client_config, loopback, name, syn, tcp_from};
use domaind_gossip::metrics::STATE_REFUSED;
use domaind_gossip::signed::CERT_KEY;
use domaind_gossip::signed::envelope::{self, Subject, cert_payload, seal};
use domaind_gossip::transport::wire::{
    self, KeyValue, NodeOp, NodePart, STATUS_DELETED, STATUS_SET,
};
use domaind_gossip::transport::{TlsTransport, TransportLimits, frame};
use domaind_gossip::{GossipConfig, GossipNode, StateCredentials, cluster_id_for_clique};
use rustls_pki_types::ServerName;
use tokio::io::AsyncWriteExt;
use tokio_rustls::TlsConnector;

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
        common::wait_until(CLUSTER, what, || condition(self)).await;
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

    fn id(&self, i: usize) -> ChitchatId {
        ChitchatId::new(NODES[i], 1, self.nodes[i].gossip_addr())
    }
}

/// The attacker: a node our CA certified, outside the clique.
struct Attacker {
    credentials: StateCredentials,
    config: std::sync::Arc<rustls::ClientConfig>,
    id: ChitchatId,
}

impl Attacker {
    fn new(pki: &Pki) -> Self {
        let cert = pki.issue("node-evil");
        Self {
            credentials: cert.credentials(&name("node-evil")).unwrap(),
            config: client_config(pki.ca.cert_pem(), Some(&cert)),
            id: ChitchatId::new("node-evil", 1, SocketAddr::new(loopback(54), 7946)),
        }
    }

    /// Sends `message` (its wire form) to `target`, as the frame layer would.
    async fn send(&self, target: (SocketAddr, &str), message: &[u8]) {
        let (target, server) = target;
        ChitchatMessage::deserialize(&mut &message[..]).expect("chitchat's decoder accepts it");
        let mut body = vec![frame::FRAME_VERSION];
        self.id.serialize(&mut body);
        body.extend_from_slice(message);
        let mut stream = TlsConnector::from(self.config.clone())
            .connect(
                ServerName::try_from(server.to_owned()).unwrap(),
                tcp_from(54, target).await,
            )
            .await
            .unwrap();
        stream
            .write_all(&frame::encode_with_prefix(&body))
            .await
            .unwrap();
        stream.flush().await.unwrap();
    }

    async fn send_parts(&self, target: (SocketAddr, &str), parts: Vec<NodePart>) {
        let mut message = ack_header();
        message.extend(wire::encode_delta(&parts));
        self.send(target, &message).await;
    }

    /// A value signed with the attacker's own key, as if `owner` had written it.
    fn sign_as(&self, owner: &ChitchatId, key: &str, payload: &str, version: u64) -> KeyValue {
        signed(&self.credentials, owner, key, payload, version)
    }
}

fn signed(
    credentials: &StateCredentials,
    owner: &ChitchatId,
    key: &str,
    payload: &str,
    version: u64,
) -> KeyValue {
    let cluster = cluster();
    let message = Subject {
        cluster: &cluster,
        owner,
        key,
        deleted: false,
        version,
        payload,
    }
    .message();
    let (scheme, signature) = credentials.sign(&message).unwrap();
    KeyValue {
        key: key.into(),
        value: seal(scheme, &signature, payload),
        version,
        status: STATUS_SET,
    }
}

fn ack_header() -> Vec<u8> {
    let mut out = 45_139u16.to_le_bytes().to_vec();
    out.extend([0u8, 2u8]);
    out
}

/// A Syn whose digest claims heartbeats for `ids`: chitchat starts tracking every id
/// a digest names.
fn syn_naming(ids: &[ChitchatId]) -> Vec<u8> {
    let mut out = 45_139u16.to_le_bytes().to_vec();
    out.extend([0u8, 0u8]);
    (ids.len() as u16).serialize(&mut out);
    for id in ids {
        id.serialize(&mut out);
        for value in [1_000u64, 0, 0] {
            value.serialize(&mut out);
        }
    }
    cluster().serialize(&mut out);
    out
}

fn part(id: ChitchatId, from: u64, kvs: Vec<KeyValue>) -> NodePart {
    NodePart {
        id,
        last_gc_version: 0,
        from_version_excluded: from,
        ops: kvs.into_iter().map(NodeOp::KeyValue).collect(),
    }
}

/// node-0's state as relayed: harvested by gossiping with a member like any peer would
/// (a Syn with an empty digest is answered with everything).
async fn harvest(rack: &Rack, attacker_pki: &Pki) -> NodePart {
    let tls = attacker_pki.node_tls("node-evil");
    let transport = TlsTransport::new(tls, 1, TransportLimits::default());
    let addr = transport
        .bind(SocketAddr::new(loopback(55), 0))
        .await
        .unwrap();
    let mut socket = chitchat::transport::Transport::open(&transport, addr)
        .await
        .unwrap();
    socket
        .send(rack.nodes[1].gossip_addr(), syn(&cluster()))
        .await
        .unwrap();
    let (_, reply) = common::within(CLUSTER, "node-1's answer", socket.recv())
        .await
        .unwrap();
    let mut bytes = Vec::new();
    reply.serialize(&mut bytes);
    let split = wire::split(&bytes).unwrap();
    wire::parse_delta(split.delta.unwrap())
        .unwrap()
        .into_iter()
        .find(|part| *part.id.node_id == *"node-0")
        .expect("node-1 relays node-0's state")
}

fn max_version(part: &NodePart) -> u64 {
    part.key_values().map(|kv| kv.version).max().unwrap()
}

#[tokio::test]
async fn forged_state_is_refused_counted_and_changes_no_view() {
    let metrics = Metrics::install();
    let rack = Rack::start().await;
    let attacker = Attacker::new(&rack.pki);
    let node_0 = rack.id(0);

    // What node-0 really signed, with status "digest 1"; then node-0 moves on, so
    // that this becomes an old value.
    let old = harvest(&rack, &rack.pki).await;
    for node in &rack.nodes {
        node.set("status/d", "digest 2").await;
    }
    rack.wait_for("digest 2 everywhere", |rack| {
        rack.views_are_honest("digest 2")
    })
    .await;
    let current = max_version(&old) + 1;
    let old_status = old
        .key_values()
        .find(|kv| kv.key == "status/d")
        .unwrap()
        .clone();
    let advertisement = old
        .key_values()
        .find(|kv| kv.key == "domain/d")
        .unwrap()
        .clone();

    let ghost = ChitchatId::new("node-ghost", 1, SocketAddr::new(loopback(54), 7946));
    let moved = ChitchatId::new("node-0", 1, SocketAddr::new(loopback(54), 7946));
    let other_ca = Pki::new();
    let foreign = other_ca
        .issue("node-0")
        .credentials(&name("node-0"))
        .unwrap();

    // A ghost member that claims to be the most senior.
    let ghost_state = vec![
        attacker.sign_as(
            &ghost,
            CERT_KEY,
            &cert_payload(attacker.credentials.cert()),
            1,
        ),
        attacker.sign_as(&ghost, "domain/d", "joined_at_ms=1", 2),
    ];
    // node-0's advertisement rewritten (its signature kept) at a newer version.
    let mut rewritten = advertisement.clone();
    let sealed = envelope::open(&advertisement.value).unwrap();
    rewritten.value = seal(sealed.scheme, &sealed.signature, "joined_at_ms=1 slot=0");
    rewritten.version = current + 1;
    // node-0 at the attacker's address, with node-0's genuine signatures.
    let redirected = NodePart {
        id: moved,
        ..old.clone()
    };
    let tombstone = KeyValue {
        key: "domain/d".into(),
        value: String::new(),
        version: current + 1,
        status: STATUS_DELETED,
    };
    // node-0's real, older state, as a reset that would replace what is held.
    let mut rollback = old.clone();
    rollback.last_gc_version = current + 100;
    // A certificate of another CA for node-0, signing a new advertisement.
    let other_ca_state = vec![
        signed(
            &foreign,
            &node_0,
            CERT_KEY,
            &cert_payload(foreign.cert()),
            current + 1,
        ),
        signed(&foreign, &node_0, "domain/d", "joined_at_ms=1", current + 2),
    ];
    let mut bare_max = part(node_0.clone(), current, Vec::new());
    bare_max
        .ops
        .push(NodeOp::SetMaxVersion(current + 1_000_000));

    let attacks: Vec<(&str, Vec<NodePart>)> = vec![
        ("wrong_signer", vec![part(ghost.clone(), 0, ghost_state)]),
        (
            "bad_signature",
            vec![part(node_0.clone(), current, vec![rewritten])],
        ),
        ("bad_signature", vec![redirected]),
        (
            "unsigned_tombstone",
            vec![part(node_0.clone(), current, vec![tombstone])],
        ),
        ("rollback", vec![rollback]),
        (
            "stale",
            vec![part(
                node_0.clone(),
                old_status.version - 1,
                vec![old_status.clone()],
            )],
        ),
        (
            "untrusted_certificate",
            vec![part(node_0.clone(), current, other_ca_state)],
        ),
        ("unsigned_max_version", vec![bare_max]),
    ];
    for (reason, parts) in attacks {
        let before = metrics.counter(STATE_REFUSED, Some(("reason", reason)));
        for (node, gossip) in NODES.iter().zip(&rack.nodes).skip(1) {
            attacker
                .send_parts((gossip.gossip_addr(), node), parts.clone())
                .await;
        }
        common::wait_until(CLUSTER, &format!("{reason} to be counted twice"), || {
            metrics.counter(STATE_REFUSED, Some(("reason", reason))) >= before + 2
        })
        .await;
        assert!(rack.views_are_honest("digest 2"), "after a {reason} attack");
    }
    // A ghost named only in digests: chitchat tracks it, domaind does not see it.
    for (node, gossip) in NODES.iter().zip(&rack.nodes) {
        let digest = syn_naming(std::slice::from_ref(&ghost));
        attacker.send((gossip.gossip_addr(), node), &digest).await;
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
