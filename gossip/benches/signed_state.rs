//! What owner-signed gossip state costs: signing a value, checking one, a node's
//! first contact (its certificate's chain and its values), and a whole delta as a
//! receiver reads it at formation. Prints a table; asserts nothing.
//!
//! `cargo bench -p domaind-gossip --bench signed_state`

use std::hint::black_box;
use std::time::{Duration, Instant};

use chitchat::ChitchatId;
use domaind_gossip::pki::{DevCa, NodeCertRequest};
use domaind_gossip::signed::CERT_KEY;
use domaind_gossip::signed::envelope::{cert_payload, signed_key_value};
use domaind_gossip::signed::verify::{CertCache, Checker};
use domaind_gossip::transport::wire::{self, KeyValue, NodeOp, NodePart};
use domaind_gossip::{NodeName, StateCredentials};
use rustls_pki_types::UnixTime;

const CLUSTER: &str = "domaind/clique/bench";

fn credentials(ca: &DevCa, node: &str) -> StateCredentials {
    let node = NodeName::new(node).unwrap();
    ca.issue(&NodeCertRequest::new(node.clone(), time::Duration::days(1)))
        .unwrap()
        .credentials(&node)
        .unwrap()
}

fn signed(
    credentials: &StateCredentials,
    owner: &ChitchatId,
    key: &str,
    payload: &str,
    version: u64,
) -> KeyValue {
    signed_key_value(credentials, CLUSTER, owner, key, payload, version)
}

/// A node's state as it is relayed at formation: its certificate, its advertisement
/// (about the size of a real one) and its status stamp.
fn node_state(credentials: &StateCredentials, index: usize) -> NodePart {
    let id = ChitchatId::new(
        format!("node-{index:03}"),
        1,
        format!("127.0.{}.{}:7946", index / 250, index % 250 + 1)
            .parse()
            .unwrap(),
    );
    let advertisement = format!(
        r#"{{"namespace":"default","name":"cd","numNodes":18,"imexIp":"10.0.0.{index}","clique":"c.1","slot":{index},"imexReady":true,"joinedAtMs":1764000000000}}"#
    );
    let kvs = vec![
        signed(
            credentials,
            &id,
            CERT_KEY,
            &cert_payload(credentials.cert()),
            1,
        ),
        signed(credentials, &id, "domain/0b3c1d2e-5f6a", &advertisement, 2),
        signed(
            credentials,
            &id,
            "status/0b3c1d2e-5f6a",
            "9f86d081884c7d65.1764000000000",
            3,
        ),
    ];
    NodePart {
        id,
        last_gc_version: 0,
        from_version_excluded: 0,
        ops: kvs.into_iter().map(NodeOp::KeyValue).collect(),
    }
}

/// Mean time of `f` over `runs` runs.
fn time<T>(runs: u32, mut f: impl FnMut() -> T) -> Duration {
    let start = Instant::now();
    for _ in 0..runs {
        black_box(f());
    }
    start.elapsed() / runs
}

fn main() {
    let ca = DevCa::generate("bench CA", time::Duration::days(1)).unwrap();
    let receiver = credentials(&ca, "receiver");
    let owners: Vec<StateCredentials> = (0..144)
        .map(|i| credentials(&ca, &format!("node-{i:03}")))
        .collect();
    let parts: Vec<NodePart> = owners
        .iter()
        .enumerate()
        .map(|(i, c)| node_state(c, i))
        .collect();
    let value_bytes: usize = parts[0].key_values().map(|kv| kv.value.len()).sum();
    let signature_bytes: usize = parts[0]
        .key_values()
        .map(|kv| kv.value.find('.').unwrap() + 1)
        .sum();

    let owner = &owners[0];
    let id = parts[0].id.clone();
    let sign = time(2_000, || signed(owner, &id, "status/x", "digest.term", 7));

    let check = |parts: &[NodePart], certs: &mut CertCache| {
        let mut checker = Checker {
            cluster: CLUSTER,
            credentials: &receiver,
            certs,
            now: UnixTime::now(),
        };
        for part in parts {
            checker.check(part, None).unwrap();
        }
    };
    // A node met for the first time: its certificate's chain, then its values.
    let first_contact = time(500, || {
        let mut certs = CertCache::default();
        check(&parts[..1], &mut certs)
    });
    // The same node again, its certificate already checked: three signatures.
    let mut warm = CertCache::default();
    check(&parts, &mut warm);
    let known_node = time(2_000, || check(&parts[..1], &mut warm));

    let delta = |n: usize| {
        let encoded = wire::encode_delta(&parts[..n]);
        let t = time(20, || {
            let parsed = wire::parse_delta(&encoded).unwrap();
            let mut certs = CertCache::default();
            check(&parsed, &mut certs)
        });
        (encoded.len(), t)
    };
    let (bytes_18, delta_18) = delta(18);
    let (bytes_144, delta_144) = delta(144);

    println!("| what | time |");
    println!("|---|---:|");
    println!("| sign one value | {:.1} µs |", sign.as_secs_f64() * 1e6);
    println!(
        "| check a node's 3 values, certificate known | {:.1} µs ({:.1} µs per value) |",
        known_node.as_secs_f64() * 1e6,
        known_node.as_secs_f64() * 1e6 / 3.0
    );
    println!(
        "| first contact: certificate chain + 3 values | {:.1} µs |",
        first_contact.as_secs_f64() * 1e6
    );
    println!(
        "| read and check a first-contact delta of 18 nodes ({bytes_18} bytes) | {:.2} ms |",
        delta_18.as_secs_f64() * 1e3
    );
    println!(
        "| read and check a first-contact delta of 144 nodes ({bytes_144} bytes) | {:.2} ms |",
        delta_144.as_secs_f64() * 1e3
    );
    println!();
    println!(
        "bytes per node state (3 values, certificate included): {value_bytes}; of which signatures: {signature_bytes}; certificate payload: {}",
        cert_payload(owner.cert()).len()
    );
}
