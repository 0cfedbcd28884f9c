//! Test fixtures shared by the gossip integration tests.
#![allow(dead_code)]

use std::net::{IpAddr, SocketAddr};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rustls::client::WebPkiServerVerifier;
use rustls::{ClientConfig, RootCertStore};
use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use tokio::net::{TcpSocket, TcpStream};

use chitchat::{ChitchatMessage, Deserializable, Serializable};
use domaind_gossip::pki::{DevCa, NodeCert, NodeCertRequest};
use domaind_gossip::tls::{NodeTls, TlsPaths};
use domaind_gossip::{CredentialsWatch, NodeName};
use metrics_util::debugging::{DebugValue, DebuggingRecorder, Snapshotter};
use tempfile::TempDir;

/// A CA in a temporary directory that issues node certificates on demand.
pub struct Pki {
    pub dir: TempDir,
    pub ca: DevCa,
}

impl Pki {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().unwrap(),
            ca: DevCa::generate("domaind test CA", time::Duration::days(1)).unwrap(),
        }
    }

    pub fn issue(&self, node: &str) -> NodeCert {
        self.ca
            .issue(&NodeCertRequest::new(name(node), time::Duration::days(1)))
            .unwrap()
    }

    /// A certificate for `node` that expired yesterday.
    pub fn issue_expired(&self, node: &str) -> NodeCert {
        let now = time::OffsetDateTime::now_utc();
        self.ca
            .issue(&NodeCertRequest {
                node: name(node),
                ips: Vec::new(),
                imex_shared_name: true,
                not_before: now - time::Duration::days(2),
                not_after: now - time::Duration::days(1),
            })
            .unwrap()
    }

    /// Gossip-signing credentials for `node`, for nodes on the in-memory transport.
    pub fn credentials(&self, node: &str) -> CredentialsWatch {
        self.issue(node).credentials(&name(node)).unwrap().fixed()
    }

    pub fn node_dir(&self, node: &str) -> PathBuf {
        self.dir.path().join(node)
    }

    /// Issues and writes a node's files, and loads them.
    pub fn node_tls(&self, node: &str) -> Arc<NodeTls> {
        let paths = self.issue(node).write(&self.node_dir(node)).unwrap();
        NodeTls::load(paths, name(node)).unwrap()
    }

    pub fn paths(&self, node: &str) -> TlsPaths {
        TlsPaths::in_dir(self.node_dir(node))
    }
}

pub fn name(node: &str) -> NodeName {
    NodeName::new(node).unwrap()
}

pub fn loopback(last_octet: u8) -> IpAddr {
    IpAddr::from([127, 0, 0, last_octet])
}

pub fn any_port(last_octet: u8) -> SocketAddr {
    SocketAddr::new(loopback(last_octet), 0)
}

/// A rustls client that trusts `trusted_ca` and presents `identity`, if any: a peer
/// that writes frames by hand.
pub fn client_config(trusted_ca: &str, identity: Option<&NodeCert>) -> Arc<ClientConfig> {
    let provider = domaind_gossip::tls::crypto_provider();
    let mut roots = RootCertStore::empty();
    roots
        .add(CertificateDer::from_pem_slice(trusted_ca.as_bytes()).unwrap())
        .unwrap();
    let verifier = WebPkiServerVerifier::builder_with_provider(Arc::new(roots), provider.clone())
        .build()
        .unwrap();
    let builder = ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_webpki_verifier(verifier);
    let config = match identity {
        None => builder.with_no_client_auth(),
        Some(cert) => builder
            .with_client_auth_cert(
                vec![CertificateDer::from_pem_slice(cert.cert_pem.as_bytes()).unwrap()],
                PrivateKeyDer::from_pem_slice(cert.key_pem.as_bytes()).unwrap(),
            )
            .unwrap(),
    };
    Arc::new(config)
}

/// A TCP connection from 127.0.0.`source`.
pub async fn tcp_from(source: u8, to: SocketAddr) -> TcpStream {
    let socket = TcpSocket::new_v4().unwrap();
    socket.bind(any_port(source)).unwrap();
    socket.connect(to).await.unwrap()
}

/// A Syn with an empty digest, built from its wire form since chitchat keeps the
/// message parts private: magic 45139 (LE), protocol 0, type 0, digest, cluster id.
pub fn syn(cluster_id: &str) -> ChitchatMessage {
    let mut bytes = 45_139u16.to_le_bytes().to_vec();
    bytes.extend([0u8, 0u8]);
    0u16.serialize(&mut bytes);
    cluster_id.to_string().serialize(&mut bytes);
    ChitchatMessage::deserialize(&mut &bytes[..]).unwrap()
}

/// A metrics recorder for this thread only: tests run on current-thread runtimes, so
/// every task of the test records here and tests do not see each other's counts.
pub struct Metrics {
    snapshotter: Snapshotter,
    /// Snapshots drain counters, so their values are summed here.
    totals: std::sync::Mutex<Vec<(metrics_util::CompositeKey, u64)>>,
    _guard: metrics::LocalRecorderGuard<'static>,
}

impl Metrics {
    pub fn install() -> Self {
        let recorder: &'static DebuggingRecorder = Box::leak(Box::new(DebuggingRecorder::new()));
        let snapshotter = recorder.snapshotter();
        let guard = metrics::set_default_local_recorder(recorder);
        Self {
            snapshotter,
            totals: Default::default(),
            _guard: guard,
        }
    }

    /// The counter `name`, summed over label sets that include `label` (if given).
    pub fn counter(&self, name: &str, label: Option<(&str, &str)>) -> u64 {
        let mut totals = self.totals.lock().unwrap();
        for (key, _, _, value) in self.snapshotter.snapshot().into_vec() {
            let DebugValue::Counter(n) = value else {
                continue;
            };
            match totals.iter_mut().find(|(k, _)| *k == key) {
                Some((_, total)) => *total += n,
                None => totals.push((key, n)),
            }
        }
        totals
            .iter()
            .filter(|(key, _)| key.key().name() == name)
            .filter(|(key, _)| {
                label
                    .is_none_or(|(k, v)| key.key().labels().any(|l| l.key() == k && l.value() == v))
            })
            .map(|(_, n)| n)
            .sum()
    }
}

// Shared by test binaries that each use some of it.
#[allow(unused_imports)]
pub use domaind_testkit::{poll_until_true, within};

pub fn write(path: &Path, contents: &str) {
    std::fs::write(path, contents).unwrap();
}
