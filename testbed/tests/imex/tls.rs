//! IMEX's links over mutual TLS, with real `imex-sim` processes on loopback driven by
//! the IMEX adapter: the files the adapter writes, links that come up only between
//! certificates of one CA, a foreign certificate refused and counted, a certificate
//! without the IP dialled refused in IPs mode and one without IMEX's shared name in
//! DNS-names mode, and a rotation reaching new links through SIGUSR1 without a restart.

use std::net::IpAddr;
use std::os::unix::fs::PermissionsExt as _;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use domaind_actors::ports::Imex;
use domaind_actors::rules::peers::{Peer, PeerSet};
use domaind_gossip::NodeName;
use domaind_gossip::identity::IMEX_SHARED_NAME;
use domaind_gossip::pki::{DevCa, NodeCert, NodeCertRequest};
use domaind_gossip::tls::{TlsFiles, client_config};
use domaind_imex::config::parse_config;
use domaind_imex::{AddressingMode, Command, ImexDaemon, ImexSettings};
use domaind_testbed::imex_sim::tls::ACCEPTED;
use domaind_testbed::rack::imex_ports;
use domaind_testkit::poll_until_every;
use rustls_pki_types::pem::PemObject as _;
use rustls_pki_types::{CertificateDer, PrivateKeyDer, ServerName};
use serde_json::Value;
use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::sync::watch;

const LIMIT: Duration = Duration::from_secs(20);

fn ip(octet: u8) -> IpAddr {
    domaind_loopback::addr(domaind_loopback::NODE_IMEX_TLS_TESTS, octet).into()
}

fn ca() -> DevCa {
    named_ca("imex test CA")
}

fn named_ca(name: &str) -> DevCa {
    DevCa::generate(name, time::Duration::days(1)).unwrap()
}

fn issue(ca: &DevCa, node: &str) -> NodeCert {
    ca.issue(&NodeCertRequest::new(
        NodeName::new(node).unwrap(),
        time::Duration::days(1),
    ))
    .unwrap()
}

/// A certificate for `node` that also carries `ips` as IP SANs, as the signer issues
/// in IPs mode.
fn issue_with_ips(ca: &DevCa, node: &str, ips: &[IpAddr]) -> NodeCert {
    let mut request = NodeCertRequest::new(NodeName::new(node).unwrap(), time::Duration::days(1));
    request.ips = ips.to_vec();
    ca.issue(&request).unwrap()
}

/// A certificate of `ca` for `node` without IMEX's shared name, as a run before it
/// was issued, or a certificate manager that does not know it, left one.
fn issue_without_shared_name(ca: &DevCa, node: &str) -> NodeCert {
    let mut request = NodeCertRequest::new(NodeName::new(node).unwrap(), time::Duration::days(1));
    request.imex_shared_name = false;
    ca.issue(&request).unwrap()
}

fn files(cert: &NodeCert) -> Arc<TlsFiles> {
    Arc::new(TlsFiles::from_pem(
        cert.ca_cert_pem.clone(),
        cert.cert_pem.clone(),
        cert.key_pem.clone(),
    ))
}

struct Node {
    ip: IpAddr,
    daemon: ImexDaemon,
    /// What the adapter follows: a rotation is a new value.
    credentials: watch::Sender<Arc<TlsFiles>>,
}

struct Rack {
    nodes: Vec<Node>,
    server_port: u16,
}

/// One simulated IMEX per `(octet, credentials)`, TLS on or off for all.
fn rack(dir: &Path, members: Vec<(u8, Arc<TlsFiles>)>, tls: bool) -> Rack {
    rack_in(dir, members, tls, AddressingMode::DnsNames)
}

fn rack_in(dir: &Path, members: Vec<(u8, Arc<TlsFiles>)>, tls: bool, mode: AddressingMode) -> Rack {
    let ips: Vec<IpAddr> = members.iter().map(|(o, _)| ip(*o)).collect();
    let (server_port, cmd_port) = imex_ports::pick(&ips).unwrap();
    let sim = env!("CARGO_BIN_EXE_imex-sim");
    let nodes = members
        .into_iter()
        .map(|(octet, credentials)| {
            let ip = ip(octet);
            let node_dir = dir.join(ip.to_string());
            let mut s = ImexSettings::new(&node_dir, ip);
            s.daemon = Command::new(sim);
            s.ctl = Command::new(sim).arg("ctl");
            s.hosts_file = node_dir.join("hosts");
            s.daemon_env = vec![(
                domaind_testbed::imex_sim::HOSTS_ENV.into(),
                s.hosts_file.display().to_string(),
            )];
            s.server_port = server_port;
            s.cmd_port = cmd_port;
            s.max_slots = 8;
            s.stop_timeout = Duration::from_millis(500);
            s.reload_min_interval = Duration::from_millis(300);
            s.tls = tls;
            // As `domaind run` has it for certificates that carry IMEX's shared name, as
            // `issue`'s do: the override is set in DNS-names mode.
            s.shared_name = true;
            s.mode = mode;
            let (sender, receiver) = watch::channel(credentials);
            Node {
                ip,
                daemon: ImexDaemon::with_credentials(s, receiver),
                credentials: sender,
            }
        })
        .collect();
    Rack { nodes, server_port }
}

impl Rack {
    fn peers(&self) -> PeerSet {
        PeerSet {
            peers: self
                .nodes
                .iter()
                .enumerate()
                .map(|(slot, n)| {
                    (
                        slot as u16,
                        Peer {
                            node: format!("node-{}", n.ip),
                            ip: n.ip,
                        },
                    )
                })
                .collect(),
        }
    }

    async fn start(&self) {
        let peers = self.peers();
        for node in &self.nodes {
            node.daemon.start(&peers).await.unwrap();
        }
    }

    async fn stop(&self) {
        for node in &self.nodes {
            node.daemon.stop().await.unwrap();
        }
    }
}

/// The simulator's per-node listing (`ctl -N -j`).
async fn listing(node: &Node) -> Value {
    let s = node.daemon.settings();
    let output = tokio::process::Command::new(&s.ctl.program)
        .args(&s.ctl.args)
        .arg("-c")
        .arg(s.config_path())
        .args(["-N", "-j", "-t", "2000"])
        .output()
        .await
        .unwrap();
    serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
}

fn link_of<'a>(listing: &'a Value, peer: &Node) -> &'a Value {
    listing["nodes"]
        .as_array()
        .and_then(|nodes| {
            nodes
                .iter()
                .find(|n| n["address"] == Value::String(peer.ip.to_string()))
        })
        .unwrap_or(&Value::Null)
}

/// Polls `node`'s listing until `holds`, for at most [`LIMIT`]; the last listing.
async fn until(node: &Node, what: &str, holds: impl Fn(&Value) -> bool) -> Value {
    let what = format!("{} {what}", node.ip);
    domaind_testkit::poll_for(&what, LIMIT, async || {
        let listing = listing(node).await;
        if holds(&listing) {
            Ok(listing)
        } else {
            Err(listing)
        }
    })
    .await
}

fn connected(listing: &Value, peer: &Node) -> bool {
    link_of(listing, peer)["status"] == "CONNECTED"
}

fn mode(path: &Path) -> u32 {
    std::fs::metadata(path).unwrap().permissions().mode() & 0o777
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_daemons_with_certificates_of_one_ca_link_over_tls() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let rack = rack(
        dir.path(),
        vec![
            (81, files(&issue(&ca, "node-a"))),
            (82, files(&issue(&ca, "node-b"))),
        ],
        true,
    );
    rack.start().await;
    let (a, b) = (&rack.nodes[0], &rack.nodes[1]);
    for (node, other) in [(a, b), (b, a)] {
        let listing = until(node, "linked", |l| {
            l["ready"] == true && connected(l, other)
        })
        .await;
        assert_eq!(listing["tls"]["enabled"], true, "{listing}");
        assert_eq!(listing["tls"]["refused"], 0, "{listing}");
    }

    // What the adapter wrote: IMEX's TLS options, and the files they name, root's only.
    let s = a.daemon.settings();
    let config = parse_config(&std::fs::read_to_string(s.config_path()).unwrap());
    assert_eq!(config["IMEX_ENABLE_AUTH_ENCRYPTION"], "1");
    for path in [s.tls_key_path(), s.tls_cert_path(), s.tls_ca_path()] {
        assert_eq!(mode(&path), 0o600, "{}", path.display());
    }
    assert_eq!(
        std::fs::read(s.tls_cert_path()).unwrap(),
        a.credentials.borrow().cert()
    );

    // The port speaks TLS only: something in the clear is a refused handshake.
    let mut clear = tokio::net::TcpStream::connect((a.ip, rack.server_port))
        .await
        .unwrap();
    clear.write_all(b"hello in the clear\n").await.unwrap();
    let listing = until(a, "refused a peer in the clear", |l| {
        l["tls"]["refused"].as_u64() >= Some(1)
    })
    .await;
    assert!(
        connected(&listing, b),
        "the real link is untouched: {listing}"
    );
    rack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_with_a_certificate_of_another_ca_is_refused_and_counted_while_the_others_link() {
    let dir = tempfile::tempdir().unwrap();
    let ours = named_ca("our cluster's CA");
    let foreign = named_ca("another CA");
    // The intruder knows our CA (a CA certificate is public), and has a certificate of
    // another CA for a name of ours.
    let stolen_name = issue(&foreign, "node-b");
    let intruder = Arc::new(TlsFiles::from_pem(
        ours.cert_pem(),
        stolen_name.cert_pem.clone(),
        stolen_name.key_pem.clone(),
    ));
    let rack = rack(
        dir.path(),
        vec![
            (83, files(&issue(&ours, "node-a"))),
            (84, files(&issue(&ours, "node-b"))),
            (85, intruder),
        ],
        true,
    );
    rack.start().await;
    let (a, b, c) = (&rack.nodes[0], &rack.nodes[1], &rack.nodes[2]);
    for (node, other) in [(a, b), (b, a)] {
        let listing = until(
            node,
            "linked to its CA-mate and refused the intruder",
            |l| connected(l, other) && link_of(l, c)["error"].is_string(),
        )
        .await;
        let refusal = link_of(&listing, c)["error"].as_str().unwrap().to_owned();
        assert_eq!(link_of(&listing, c)["status"], "DISCONNECTED", "{listing}");
        assert!(refusal.contains("UnknownIssuer"), "{refusal}");
        assert!(listing["tls"]["refused"].as_u64() >= Some(1), "{listing}");
        assert_eq!(
            listing["ready"], false,
            "an unlinked peer keeps it from READY"
        );
    }
    // The intruder links to nobody: each refuses its certificate, whichever dials.
    let listing = until(c, "told it was refused", |l| {
        link_of(l, a)["error"].is_string() && link_of(l, b)["error"].is_string()
    })
    .await;
    assert!(
        !connected(&listing, a) && !connected(&listing, b),
        "{listing}"
    );
    let refusal = link_of(&listing, a)["error"].as_str().unwrap();
    assert!(refusal.contains("refused our certificate"), "{refusal}");

    // Once the intruder is out of the peer set, the others are whole again (after an
    // answer: no SIGUSR1 reaches a daemon before it has answered).
    for node in [a, b] {
        node.daemon.status().await.unwrap();
    }
    let two = PeerSet {
        peers: rack.peers().peers.into_iter().take(2).collect(),
    };
    a.daemon.apply(&two).await.unwrap();
    b.daemon.apply(&two).await.unwrap();
    until(a, "ready without the intruder", |l| l["ready"] == true).await;
    rack.stop().await;
}

/// IPs mode, IMEX's contract: a dialler checks the server's certificate against the IP
/// it dialled. A peer whose certificate (of our CA) lacks its IP is refused by those
/// that dial it; once it is given one that carries the IP, a reload lets them link.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_ips_mode_a_certificate_without_the_dialled_ip_is_refused_and_one_with_it_links() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let rack = rack_in(
        dir.path(),
        vec![
            (95, files(&issue_with_ips(&ca, "node-a", &[ip(95)]))),
            (96, files(&issue_with_ips(&ca, "node-b", &[ip(96)]))),
            // Right CA, right node name, but another node's IP.
            (97, files(&issue_with_ips(&ca, "node-c", &[ip(95)]))),
        ],
        true,
        AddressingMode::Ips,
    );
    rack.start().await;
    let (a, b, c) = (&rack.nodes[0], &rack.nodes[1], &rack.nodes[2]);
    for (node, other) in [(a, b), (b, a)] {
        let listing = until(node, "linked to b and refused c", |l| {
            connected(l, other) && link_of(l, c)["error"].is_string()
        })
        .await;
        let refusal = link_of(&listing, c)["error"].as_str().unwrap();
        assert!(
            refusal.contains(&format!("not valid for name \"{}\"", ip(97))),
            "{refusal}"
        );
        assert_eq!(link_of(&listing, c)["status"], "DISCONNECTED", "{listing}");
        assert_eq!(listing["ready"], false, "{listing}");
    }
    let config = parse_config(&std::fs::read_to_string(a.daemon.settings().config_path()).unwrap());
    assert!(
        !config.contains_key("IMEX_SECURITY_TARGET_OVERRIDE"),
        "the dialled IP is what is checked: {config:?}"
    );

    // c's certificate now carries its own IP: a rotation, a reload, no restart.
    until(c, "answering", |l| l["nodes"].is_array()).await;
    c.daemon.status().await.unwrap();
    let pid = c.daemon.pid().await;
    c.credentials
        .send_replace(files(&issue_with_ips(&ca, "node-c", &[ip(97)])));
    for node in [a, b] {
        until(node, "linked to c once it carries its IP", |l| {
            l["ready"] == true && connected(l, c)
        })
        .await;
    }
    assert_eq!(c.daemon.pid().await, pid, "a rotation is a reload");
    rack.stop().await;
}

/// DNS-names mode, IMEX's contract with the override: the slot name dialled is not
/// checked, IMEX's shared name is. Certificates of our CA that carry it link; one of
/// our CA without it is refused by those that dial it, and links once rotated to one
/// with it, by a reload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_dns_names_mode_the_shared_name_is_checked_and_a_certificate_without_it_refused() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let rack = rack(
        dir.path(),
        vec![
            (98, files(&issue(&ca, "node-a"))),
            (99, files(&issue(&ca, "node-b"))),
            (100, files(&issue_without_shared_name(&ca, "node-c"))),
        ],
        true,
    );
    let config = parse_config(&domaind_imex::config::render_config(
        rack.nodes[0].daemon.settings(),
    ));
    assert_eq!(config["IMEX_SECURITY_TARGET_OVERRIDE"], IMEX_SHARED_NAME);
    rack.start().await;
    let (a, b, c) = (&rack.nodes[0], &rack.nodes[1], &rack.nodes[2]);
    for (node, other) in [(a, b), (b, a)] {
        let listing = until(node, "linked to b and refused c", |l| {
            connected(l, other) && link_of(l, c)["error"].is_string()
        })
        .await;
        let refusal = link_of(&listing, c)["error"].as_str().unwrap();
        assert!(
            refusal.contains(&format!("not valid for name \"{IMEX_SHARED_NAME}\"")),
            "{refusal}"
        );
        assert_eq!(link_of(&listing, c)["status"], "DISCONNECTED", "{listing}");
        assert_eq!(listing["ready"], false, "{listing}");
    }
    let written =
        parse_config(&std::fs::read_to_string(a.daemon.settings().config_path()).unwrap());
    assert_eq!(written["IMEX_SECURITY_TARGET_OVERRIDE"], IMEX_SHARED_NAME);

    until(c, "answering", |l| l["nodes"].is_array()).await;
    c.daemon.status().await.unwrap();
    let pid = c.daemon.pid().await;
    c.credentials.send_replace(files(&issue(&ca, "node-c")));
    for node in [a, b] {
        until(node, "linked to c once it carries the shared name", |l| {
            l["ready"] == true && connected(l, c)
        })
        .await;
    }
    assert_eq!(c.daemon.pid().await, pid, "a rotation is a reload");
    rack.stop().await;
}

/// The certificate `node`'s server presents to a new link, as a peer of `ca` sees it.
async fn presented(node: &Node, port: u16, ca: &DevCa) -> Vec<u8> {
    let probe = issue(ca, "node-probe");
    let config = client_config(
        &[CertificateDer::from_pem_slice(ca.cert_pem().as_bytes()).unwrap()],
        vec![CertificateDer::from_pem_slice(probe.cert_pem.as_bytes()).unwrap()],
        PrivateKeyDer::from_pem_slice(probe.key_pem.as_bytes()).unwrap(),
    )
    .unwrap();
    let handshake = async {
        let tcp = tokio::net::TcpStream::connect((node.ip, port))
            .await
            .unwrap();
        let mut stream = tokio_rustls::TlsConnector::from(config)
            .connect(ServerName::IpAddress(node.ip.into()), tcp)
            .await
            .unwrap();
        let mut accepted = [0u8; 1];
        stream.read_exact(&mut accepted).await.unwrap();
        assert_eq!(accepted[0], ACCEPTED);
        let (_, session) = stream.get_ref();
        session.peer_certificates().unwrap()[0].to_vec()
    };
    tokio::time::timeout(LIMIT, handshake)
        .await
        .expect("no TLS handshake with the daemon")
}

fn der(pem: &str) -> Vec<u8> {
    CertificateDer::from_pem_slice(pem.as_bytes())
        .unwrap()
        .to_vec()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rotated_certificate_reaches_new_links_through_sigusr1_without_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let first = issue(&ca, "node-a");
    let rack = rack(
        dir.path(),
        vec![(86, files(&first)), (87, files(&issue(&ca, "node-b")))],
        true,
    );
    rack.start().await;
    let (a, b) = (&rack.nodes[0], &rack.nodes[1]);
    until(a, "linked", |l| l["ready"] == true && connected(l, b)).await;
    // The first answer lets reloads through (no SIGUSR1 before the daemon answers).
    assert!(a.daemon.status().await.unwrap().ready);
    let pid = a.daemon.pid().await;
    assert_eq!(
        presented(a, rack.server_port, &ca).await,
        der(&first.cert_pem)
    );

    let second = issue(&ca, "node-a");
    a.credentials.send_replace(files(&second));
    // Each look is a TLS handshake with the daemon.
    poll_until_every(Duration::from_millis(100), LIMIT, || async {
        (presented(a, rack.server_port, &ca).await == der(&second.cert_pem)).then_some(())
    })
    .await
    .unwrap_or_else(|| panic!("new links still get the old certificate after {LIMIT:?}"));
    let s = a.daemon.settings();
    assert_eq!(
        std::fs::read_to_string(s.tls_key_path()).unwrap(),
        second.key_pem
    );
    assert_eq!(mode(&s.tls_key_path()), 0o600);
    assert_eq!(
        a.daemon.pid().await,
        pid,
        "a rotation is a reload, not a restart"
    );
    let listing = until(a, "relinked with the new certificate", |l| {
        l["ready"] == true && l["tls"]["reloads"] == 1
    })
    .await;
    assert!(connected(&listing, b), "{listing}");

    // A set that does not load is refused by the daemon, which keeps the one it has and
    // its links (the adapter never writes one: gossip publishes only sets that built).
    std::fs::write(s.tls_cert_path(), "not a certificate").unwrap();
    a.daemon.reload().await.unwrap();
    let listing = until(a, "refused the broken reload", |l| {
        l["tls"]["reloads_refused"] == 1
    })
    .await;
    assert!(connected(&listing, b), "{listing}");
    assert_eq!(
        presented(a, rack.server_port, &ca).await,
        der(&second.cert_pem)
    );
    rack.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn with_tls_off_they_link_in_the_clear_and_no_key_is_left() {
    let dir = tempfile::tempdir().unwrap();
    let ca = ca();
    let rack = rack(
        dir.path(),
        vec![
            (88, files(&issue(&ca, "node-a"))),
            (89, files(&issue(&ca, "node-b"))),
        ],
        false,
    );
    let s = rack.nodes[0].daemon.settings();
    // A key from a run with TLS on is removed.
    std::fs::create_dir_all(&s.config_dir).unwrap();
    std::fs::write(s.tls_key_path(), "old key").unwrap();
    rack.start().await;
    let (a, b) = (&rack.nodes[0], &rack.nodes[1]);
    let listing = until(a, "linked", |l| l["ready"] == true && connected(l, b)).await;
    assert_eq!(listing["tls"]["enabled"], false, "{listing}");
    assert_eq!(listing["tls"]["handshakes"], 0, "{listing}");
    let config = std::fs::read_to_string(s.config_path()).unwrap();
    assert!(!config.contains("IMEX_ENABLE_AUTH_ENCRYPTION"), "{config}");
    assert!(!s.tls_key_path().exists());
    rack.stop().await;
}
