//! What a peer holding a certificate of our CA could send to forge other nodes' state:
//! hand-written gossip messages, for tests and for the chaos harness's attacker
//! (`domaind-chaos forge`). Behind the `forge` feature; never in the daemon.
//!
//! The forger gossips like a member to harvest the clique's genuinely signed state,
//! then builds from it every forgery that [`crate::signed`] refuses (see
//! [`forgeries`]), and sends them as Acks over its own mutual-TLS connection.

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::{Context as _, bail};
use chitchat::transport::Transport as _;
use chitchat::{ChitchatId, ChitchatMessage, Deserializable, Serializable};
use rustls::ClientConfig;
use rustls_pki_types::ServerName;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::TcpSocket;
use tokio_rustls::TlsConnector;

use crate::identity::NodeName;
use crate::pki::NodeCert;
use crate::signed::CERT_KEY;
use crate::signed::credentials::StateCredentials;
use crate::signed::envelope::{self, cert_payload, seal, signed_key_value};
use crate::tls::NodeTls;
use crate::transport::wire::{
    self, KeyValue, NodeOp, NodePart, STATUS_DELETED, TYPE_ACK, TYPE_SYN,
};
use crate::transport::{TlsTransport, TransportLimits, frame};

/// How long a node may take to close a connection after the forger ended its side.
const CLOSE_LIMIT: Duration = Duration::from_secs(10);

/// A peer with a certificate of our CA, writing messages by hand.
pub struct Forger {
    cluster: String,
    credentials: StateCredentials,
    client: Arc<ClientConfig>,
    tls: Arc<NodeTls>,
    /// The id it claims in its frames; its IP is where it connects from.
    id: ChitchatId,
}

impl std::fmt::Debug for Forger {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Forger")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

impl Forger {
    /// A forger for gossip cluster `cluster`, with the certificate `cert` (written to
    /// `tls_dir`, which it also listens with), speaking from `ip`.
    pub fn new(
        cluster: impl Into<String>,
        node: &NodeName,
        cert: &NodeCert,
        tls_dir: &std::path::Path,
        ip: std::net::IpAddr,
    ) -> anyhow::Result<Self> {
        let credentials = cert.credentials(node)?;
        let paths = cert.write(tls_dir)?;
        let tls = NodeTls::load(paths, node.clone())?;
        // Our client configuration: it presents the certificate, and accepts any
        // node's server certificate of the CA.
        let client = tls.material().client_config();
        Ok(Self {
            cluster: cluster.into(),
            credentials,
            client,
            tls,
            id: ChitchatId::new(node.as_str(), 1, SocketAddr::new(ip, 7946)),
        })
    }

    pub fn credentials(&self) -> &StateCredentials {
        &self.credentials
    }

    /// Sends `message` (its wire form) to the node `server` at `target`, framed as the
    /// transport frames it.
    pub async fn send(
        &self,
        target: SocketAddr,
        server: &str,
        message: &[u8],
    ) -> anyhow::Result<()> {
        ChitchatMessage::deserialize(&mut &message[..]).context("chitchat would not decode it")?;
        let mut body = vec![frame::FRAME_VERSION];
        self.id.serialize(&mut body);
        body.extend_from_slice(message);
        let socket = TcpSocket::new_v4()?;
        socket.bind(SocketAddr::new(self.id.gossip_advertise_addr.ip(), 0))?;
        let tcp = socket.connect(target).await?;
        let mut stream = TlsConnector::from(self.client.clone())
            .connect(ServerName::try_from(server.to_owned())?, tcp)
            .await?;
        stream.write_all(&frame::encode_with_prefix(&body)).await?;
        stream.flush().await?;
        // Returning now would leave the frame in the node's socket, read whenever the
        // node gets to it; what is counted after a send would race that. A node closes
        // its end once it has read ours (or at once, on a frame it refuses), so end
        // ours cleanly and wait for its.
        stream.shutdown().await?;
        let mut rest = Vec::new();
        match tokio::time::timeout(CLOSE_LIMIT, stream.read_to_end(&mut rest)).await {
            Ok(_) => Ok(()),
            Err(_) => {
                bail!("{server} at {target} did not close the connection within {CLOSE_LIMIT:?}")
            }
        }
    }

    /// Sends an Ack carrying `parts`.
    pub async fn send_parts(
        &self,
        target: SocketAddr,
        server: &str,
        parts: &[NodePart],
    ) -> anyhow::Result<()> {
        let mut message = wire::header(TYPE_ACK);
        message.extend(wire::encode_delta(parts));
        self.send(target, server, &message).await
    }

    /// Sends a Syn whose digest names `ids`, with heartbeats: chitchat starts
    /// tracking every id a digest names.
    pub async fn send_digest_naming(
        &self,
        target: SocketAddr,
        server: &str,
        ids: &[ChitchatId],
    ) -> anyhow::Result<()> {
        let mut message = wire::header(TYPE_SYN);
        (ids.len() as u16).serialize(&mut message);
        for id in ids {
            id.serialize(&mut message);
            for value in [1_000u64, 0, 0] {
                value.serialize(&mut message);
            }
        }
        self.cluster.serialize(&mut message);
        self.send(target, server, &message).await
    }

    /// Every node's state as `target` relays it: gossips with it like a member (a Syn
    /// with an empty digest is answered with everything it holds).
    pub async fn harvest(
        &self,
        target: SocketAddr,
        limit: Duration,
    ) -> anyhow::Result<Vec<NodePart>> {
        let transport = TlsTransport::new(
            self.tls.clone(),
            self.id.generation_id,
            TransportLimits::default(),
        );
        let listen = transport
            .bind(SocketAddr::new(self.id.gossip_advertise_addr.ip(), 0))
            .await?;
        let mut socket = transport.open(listen).await?;
        let mut syn = wire::header(TYPE_SYN);
        0u16.serialize(&mut syn);
        self.cluster.serialize(&mut syn);
        socket
            .send(target, ChitchatMessage::deserialize(&mut &syn[..])?)
            .await?;
        let (_, reply) = tokio::time::timeout(limit, socket.recv())
            .await
            .context("no answer to the harvesting Syn")??;
        let mut bytes = Vec::new();
        reply.serialize(&mut bytes);
        let split = wire::split(&bytes)?;
        let Some(delta) = split.delta else {
            bail!("the answer carried no state");
        };
        Ok(wire::parse_delta(delta)?)
    }

    /// A value signed with this forger's own key, as if `owner` had written it.
    pub fn sign_as(&self, owner: &ChitchatId, key: &str, payload: &str, version: u64) -> KeyValue {
        signed_key_value(
            &self.credentials,
            &self.cluster,
            owner,
            key,
            payload,
            version,
        )
    }
}

/// One forged delta, and the refusal it must meet.
#[derive(Debug, Clone)]
pub struct Forgery {
    pub name: &'static str,
    /// The `reason` of `domaind_gossip_state_refused_total` it is counted under.
    pub reason: &'static str,
    pub parts: Vec<NodePart>,
}

/// Forgeries against one node, built from its state as harvested: `now` (a full state,
/// from version 0, as recent as can be) and, if the node has written since, `earlier`
/// (whose outdated values are replayed). `foreign` signs with a certificate of another
/// CA naming the node.
pub fn forgeries(
    forger: &Forger,
    now: &NodePart,
    earlier: Option<&NodePart>,
    foreign: &StateCredentials,
) -> Vec<Forgery> {
    let victim = now.id.clone();
    let newest = now.key_values().map(|kv| kv.version).max().unwrap_or(0);
    // Above anything the victim writes by the time these arrive, or chitchat would
    // ignore them before anything is checked.
    let ahead = newest + 1_000;
    let part = |id: ChitchatId, from: u64, kvs: Vec<KeyValue>| NodePart {
        id,
        last_gc_version: 0,
        from_version_excluded: from,
        ops: kvs.into_iter().map(NodeOp::KeyValue).collect(),
    };
    let elsewhere = SocketAddr::new(
        forger.id.gossip_advertise_addr.ip(),
        victim.gossip_advertise_addr.port(),
    );
    let ghost = ChitchatId::new("node-ghost", 1, elsewhere);
    let ghost_state = vec![
        forger.sign_as(
            &ghost,
            CERT_KEY,
            &cert_payload(forger.credentials.cert()),
            1,
        ),
        forger.sign_as(&ghost, "domain/ghost", r#"{"joinedAtMs":1}"#, 2),
    ];
    let mut forged = vec![Forgery {
        name: "a ghost member claiming seniority",
        reason: "wrong_signer",
        parts: vec![part(ghost, 0, ghost_state)],
    }];
    let values: Vec<&KeyValue> = now.key_values().filter(|kv| kv.key != CERT_KEY).collect();
    if let Some(newest_value) = values.iter().max_by_key(|kv| kv.version) {
        let mut rewritten = (*newest_value).clone();
        if let Ok(sealed) = envelope::open(&newest_value.value) {
            rewritten.value = seal(
                sealed.scheme,
                &sealed.signature,
                r#"{"joinedAtMs":1,"slot":0}"#,
            );
        }
        rewritten.version = ahead;
        forged.push(Forgery {
            name: "a value rewritten under its owner's signature",
            reason: "bad_signature",
            parts: vec![part(victim.clone(), newest, vec![rewritten])],
        });
        forged.push(Forgery {
            name: "a forged tombstone",
            reason: "unsigned_tombstone",
            parts: vec![part(
                victim.clone(),
                newest,
                vec![KeyValue {
                    key: newest_value.key.clone(),
                    value: String::new(),
                    version: ahead,
                    status: STATUS_DELETED,
                }],
            )],
        });
        // A reset that leaves the newest value out, claiming it was collected.
        let mut rollback = now.clone();
        rollback.last_gc_version = ahead;
        rollback
            .ops
            .retain(|op| !matches!(op, NodeOp::KeyValue(kv) if kv.version == newest_value.version));
        forged.push(Forgery {
            name: "a reset that drops a value",
            reason: "rollback",
            parts: vec![rollback],
        });
    }
    for old in earlier.into_iter().flat_map(NodePart::key_values) {
        let outdated = now
            .key_values()
            .any(|kv| kv.key == old.key && kv.version > old.version);
        if outdated {
            forged.push(Forgery {
                name: "an outdated value replayed",
                reason: "stale",
                parts: vec![part(victim.clone(), old.version - 1, vec![old.clone()])],
            });
            break;
        }
    }
    let moved = ChitchatId::new(victim.node_id.clone(), victim.generation_id, elsewhere);
    forged.push(Forgery {
        name: "the node moved to the forger's address",
        reason: "bad_signature",
        parts: vec![NodePart {
            id: moved,
            ..now.clone()
        }],
    });
    forged.push(Forgery {
        name: "a certificate of another CA in the node's state",
        reason: "untrusted_certificate",
        parts: vec![part(
            victim.clone(),
            newest,
            vec![
                signed_key_value(
                    foreign,
                    &forger.cluster,
                    &victim,
                    CERT_KEY,
                    &cert_payload(foreign.cert()),
                    ahead,
                ),
                signed_key_value(
                    foreign,
                    &forger.cluster,
                    &victim,
                    "domain/forged",
                    "{}",
                    ahead + 1,
                ),
            ],
        )],
    });
    let mut bare = part(victim, newest, Vec::new());
    bare.ops.push(NodeOp::SetMaxVersion(ahead + 1_000_000));
    forged.push(Forgery {
        name: "a bare max version",
        reason: "unsigned_max_version",
        parts: vec![bare],
    });
    forged
}
