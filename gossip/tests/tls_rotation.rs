//! Certificates from files, and rotation without restart.

mod common;
use common::poll_until_true;

use std::sync::Arc;
use std::time::Duration;

use chitchat::transport::Transport;
use common::{Metrics, Pki, any_port, name, syn, within};
use domaind_gossip::metrics::{CERT_EXPIRY, CONNECTIONS_REFUSED, TLS_RELOADS};
use domaind_gossip::pki::{DevCa, NodeCertRequest};
use domaind_gossip::tls::{NodeTls, TlsError};
use domaind_gossip::transport::{TlsTransport, TransportLimits};

#[test]
fn rotated_certificate_is_picked_up() {
    let pki = Pki::new();
    let tls = pki.node_tls("node-a");
    let before = tls.material();
    let mut files = tls.files();
    assert!(!tls.reload_if_changed().unwrap(), "nothing changed yet");
    assert!(!files.has_changed().unwrap());
    let rotated = pki.issue("node-a");
    rotated.write(&pki.node_dir("node-a")).unwrap();
    assert!(tls.reload_if_changed().unwrap());
    assert!(!Arc::ptr_eq(&before, &tls.material()));
    // What the node's other TLS users (its IMEX daemon) copy is the set just accepted.
    assert!(files.has_changed().unwrap());
    let published = files.borrow_and_update().clone();
    assert_eq!(published.cert(), rotated.cert_pem.as_bytes());
    assert_eq!(published.key(), rotated.key_pem.as_bytes());
    assert_eq!(published.ca_cert(), rotated.ca_cert_pem.as_bytes());
}

#[test]
fn rotation_to_another_nodes_certificate_is_refused_once_and_the_old_kept() {
    let pki = Pki::new();
    let tls = pki.node_tls("node-a");
    let before = tls.material();
    let files = tls.files();
    pki.issue("node-b").write(&pki.node_dir("node-a")).unwrap();
    let err = tls.reload_if_changed().unwrap_err();
    assert!(matches!(err, TlsError::WrongNode { .. }), "{err}");
    assert!(Arc::ptr_eq(&before, &tls.material()));
    assert!(
        !files.has_changed().unwrap(),
        "a refused set is never published"
    );
    // The same broken set is not retried until the files change again.
    assert!(!tls.reload_if_changed().unwrap());
}

#[test]
fn garbage_files_are_refused_with_the_file_named() {
    let pki = Pki::new();
    let tls = pki.node_tls("node-a");
    let paths = pki.paths("node-a");
    common::write(
        &paths.cert,
        "-----BEGIN CERTIFICATE-----\nnot base64\n-----END CERTIFICATE-----\n",
    );
    let err = tls.reload_if_changed().unwrap_err().to_string();
    assert!(err.contains("tls.crt"), "{err}");
    common::write(&paths.cert, "");
    let err = NodeTls::load(paths.clone(), name("node-a"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("holds no certificate"), "{err}");
    std::fs::remove_file(&paths.key).unwrap();
    let err = NodeTls::load(paths, name("node-a"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("tls.key"), "{err}");
}

#[test]
fn expired_own_certificate_is_refused_at_load() {
    let pki = Pki::new();
    let expired = pki.issue_expired("node-a");
    let paths = expired.write(&pki.node_dir("node-a")).unwrap();
    let err = NodeTls::load(paths, name("node-a")).unwrap_err();
    assert!(matches!(err, TlsError::NotValidNow { .. }), "{err}");
}

#[test]
fn ip_names_beside_the_node_name_are_fine() {
    let pki = Pki::new();
    let mut request = NodeCertRequest::new(name("node-a"), time::Duration::days(1));
    request.ips.push("127.0.0.5".parse().unwrap());
    // An IP SAN is fine: the identity is the single DNS name.
    let paths = pki
        .ca
        .issue(&request)
        .unwrap()
        .write(&pki.node_dir("node-a"))
        .unwrap();
    NodeTls::load(paths, name("node-a")).unwrap();
}

/// A live listener starts trusting a second CA when its CA bundle is rotated.
#[tokio::test]
async fn ca_bundle_rotation_applies_to_a_live_listener() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let server_tls = pki.node_tls("server");
    let transport = TlsTransport::new(server_tls.clone(), 1, TransportLimits::default());
    let server_addr = transport.bind(any_port(1)).await.unwrap();
    let mut server = transport.open(server_addr).await.unwrap();

    // A node certified by a second CA, trusting both.
    let new_ca = DevCa::generate("next CA", time::Duration::days(1)).unwrap();
    let bundle = format!("{}{}", pki.ca.cert_pem(), new_ca.cert_pem());
    let newcomer_dir = pki.node_dir("newcomer");
    let mut newcomer = new_ca
        .issue(&NodeCertRequest::new(
            name("newcomer"),
            time::Duration::days(1),
        ))
        .unwrap();
    newcomer.ca_cert_pem = bundle.clone();
    let newcomer_paths = newcomer.write(&newcomer_dir).unwrap();
    let newcomer_tls = NodeTls::load(newcomer_paths, name("newcomer")).unwrap();

    let client_transport = TlsTransport::new(newcomer_tls.clone(), 1, TransportLimits::default());
    let client_addr = client_transport.bind(any_port(2)).await.unwrap();
    let mut client = client_transport.open(client_addr).await.unwrap();
    client.send(server_addr, syn("before")).await.unwrap();
    within("the refusal", Duration::from_secs(10), async {
        loop {
            tokio::select! {
                _ = server.recv() => panic!("a certificate of an untrusted CA got through"),
                _ = tokio::time::sleep(Duration::from_millis(10)) => {
                    if metrics.counter(CONNECTIONS_REFUSED, Some(("reason", "unknown_ca"))) == 1 {
                        return;
                    }
                }
            }
        }
    })
    .await;

    common::write(&pki.paths("server").ca_cert, &bundle);
    assert!(server_tls.reload_if_changed().unwrap());

    // A fresh connection (a new socket) now gets through.
    drop(client);
    let mut client = client_transport.open(client_addr).await.unwrap();
    client.send(server_addr, syn("after")).await.unwrap();
    let (from, message) = within("the message", Duration::from_secs(10), server.recv())
        .await
        .unwrap();
    assert_eq!((from, message), (client_addr, syn("after")));
}

#[tokio::test(start_paused = true)]
async fn reloader_task_rotates_on_its_own() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let tls = pki.node_tls("node-a");
    let before = tls.material();
    let reloader = tls.spawn_reloader(Duration::from_secs(10));
    pki.issue("node-a").write(&pki.node_dir("node-a")).unwrap();
    poll_until_true(
        "the reloader to rotate",
        Duration::from_secs(60),
        async || !Arc::ptr_eq(&before, &tls.material()),
    )
    .await;
    assert_eq!(metrics.counter(TLS_RELOADS, Some(("result", "rotated"))), 1);

    pki.issue("node-z").write(&pki.node_dir("node-a")).unwrap();
    poll_until_true(
        "the reloader to refuse",
        Duration::from_secs(60),
        async || metrics.counter(TLS_RELOADS, Some(("result", "refused"))) == 1,
    )
    .await;
    // Refused once, not on every tick.
    tokio::time::sleep(Duration::from_secs(60)).await;
    assert_eq!(metrics.counter(TLS_RELOADS, Some(("result", "refused"))), 1);

    // The reloader ends with the last handle on the TLS material.
    drop(tls);
    within("the reloader to stop", Duration::from_secs(60), reloader)
        .await
        .unwrap();
}

/// A node whose certificate rotates signs its state again with the new key, and its
/// peers accept what it publishes after: the new certificate first, then every value.
#[tokio::test]
async fn a_rotated_certificate_signs_the_nodes_state_again_and_peers_follow() {
    let metrics = Metrics::install();
    let pki = Pki::new();
    let cluster = domaind_gossip::cluster_id_for_clique("c-1.0");
    let start = |node: &'static str, octet: u8, seeds: Vec<String>| {
        let tls = pki.node_tls(node);
        let cluster = cluster.clone();
        async move {
            let mut config =
                domaind_gossip::GossipConfig::new(name(node), any_port(octet), cluster);
            config.seeds = seeds;
            let gossip = domaind_gossip::GossipNode::start_tls(
                config,
                tls.clone(),
                TransportLimits::default(),
            )
            .await
            .unwrap();
            (gossip, tls)
        }
    };
    let (a, a_tls) = start("node-a", 61, Vec::new()).await;
    let (b, _b_tls) = start("node-b", 62, vec![a.gossip_addr().to_string()]).await;
    a.set("domain/d", "before").await;
    let sees = |observer: &domaind_gossip::GossipNode, value: &str| {
        observer
            .live_nodes()
            .get("node-a")
            .is_some_and(|m| m.keys.get("domain/d").map(String::as_str) == Some(value))
    };
    poll_until_true(
        "node-b to see node-a's value",
        Duration::from_secs(30),
        async || sees(&b, "before"),
    )
    .await;
    let signed_before = metrics.counter(domaind_gossip::metrics::STATE_SIGNED, None);

    pki.issue("node-a").write(&pki.node_dir("node-a")).unwrap();
    assert!(a_tls.reload_if_changed().unwrap());
    // The certificate and the one value, signed again.
    poll_until_true(
        "node-a to sign its state again",
        Duration::from_secs(30),
        async || metrics.counter(domaind_gossip::metrics::STATE_SIGNED, None) >= signed_before + 2,
    )
    .await;
    a.set("domain/d", "after").await;
    poll_until_true(
        "node-b to accept what node-a signs now",
        Duration::from_secs(30),
        async || sees(&b, "after"),
    )
    .await;
    assert_eq!(
        metrics.counter(domaind_gossip::metrics::STATE_REFUSED, None),
        0
    );
    a.stop().await.unwrap();
    b.stop().await.unwrap();
}

/// The expiry gauge's values by `cert` label, from a fresh snapshot.
fn expiry_gauges(snapshotter: &metrics_util::debugging::Snapshotter) -> Vec<(String, f64)> {
    let mut found: Vec<(String, f64)> = snapshotter
        .snapshot()
        .into_vec()
        .into_iter()
        .filter(|(key, ..)| key.key().name() == CERT_EXPIRY)
        .map(|(key, _, _, value)| {
            let cert = key
                .key()
                .labels()
                .find(|l| l.key() == "cert")
                .map(|l| l.value().to_string())
                .unwrap_or_default();
            let metrics_util::debugging::DebugValue::Gauge(v) = value else {
                panic!("{CERT_EXPIRY} is not a gauge");
            };
            (cert, v.into_inner())
        })
        .collect();
    found.sort_by(|a, b| a.0.cmp(&b.0));
    found
}

#[test]
fn the_expiry_gauge_follows_the_certificate_in_use() {
    let recorder = metrics_util::debugging::DebuggingRecorder::new();
    let snapshotter = recorder.snapshotter();
    metrics::with_local_recorder(&recorder, || {
        let pki = Pki::new();
        let tls = pki.node_tls("node-a");
        let loaded = tls.material().expiry();
        let now = time::OffsetDateTime::now_utc().unix_timestamp();
        let day = 86_400;
        // Both issued for a day by the test PKI; seconds, not milliseconds.
        assert!((loaded.node_cert - (now + day)).abs() < 120, "{loaded:?}");
        assert!((loaded.ca - (now + day)).abs() < 120, "{loaded:?}");
        assert_eq!(
            expiry_gauges(&snapshotter),
            [
                ("ca".to_string(), loaded.ca as f64),
                ("node".to_string(), loaded.node_cert as f64)
            ]
        );

        // Rotated to a certificate valid for longer than the CA: the node's gauge moves.
        let longer = pki
            .ca
            .issue(&NodeCertRequest::new(
                name("node-a"),
                time::Duration::days(3),
            ))
            .unwrap();
        longer.write(&pki.node_dir("node-a")).unwrap();
        assert!(tls.reload_if_changed().unwrap());
        let rotated = tls.material().expiry();
        assert!(rotated.node_cert > loaded.node_cert + day, "{rotated:?}");
        assert_eq!(
            expiry_gauges(&snapshotter),
            [
                ("ca".to_string(), rotated.ca as f64),
                ("node".to_string(), rotated.node_cert as f64)
            ]
        );
    });
}
