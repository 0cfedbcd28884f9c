//! One function per target: the bytes go to the real parser, and what it answers is
//! held to the parser's contract. A violated contract panics, which AFL++ records as a
//! crash. Each returns whether the parser took the input (for the seeds' test: a seed
//! meant to be accepted that is refused would starve the fuzzer).

use std::net::{IpAddr, Ipv4Addr};
use std::sync::OnceLock;
use std::time::Duration;

use bytes::BytesMut;
use chitchat::{ChitchatId, ChitchatMessage, Deserializable, Serializable};
use domaind_actors::model::ClaimRef;
use domaind_backends::kube::claim::allocated_claim;
use domaind_backends::local::{ClaimFile, LocalClaimSource, LocalDir};
use domaind_checkpoint::line::{self, Decoded};
use domaind_controller::signer::{Policy, Request, decide};
use domaind_gossip::pulse::table::{Mark, PulseTable};
use domaind_gossip::pulse::wire::{Beats, PULSE_VERSION, Pulse};
use domaind_gossip::signed::envelope;
use domaind_gossip::signed::verify::{CertCache, Checker, Held};
use domaind_gossip::transport::frame::{self, Carried};
use domaind_gossip::transport::{Judged, guard, judge_frame, wire};
use domaind_kube_api::ChannelConfig;
use domaind_kube_api::names::GOSSIP_CERT_USAGES;
use domaind_kubelet_plugin::AuthorityRewriter;
use k8s_openapi::api::resource::v1::ResourceClaim;

use crate::fixture::{self, CLUSTER};

/// A gossip frame body as a certified peer sends it: the transport's judgement
/// (identity, address, the guard, chitchat's decoder), with and without the
/// receiver's id (the state check's transport and the bare one).
///
/// Contract: no panic; the guard reads a message's delta as chitchat's decoder does, so
/// a message chitchat decodes is never refused by the guard as malformed; the sender's
/// id is read back as written.
pub fn frame(data: &[u8]) -> bool {
    let receiver = fixture::receiver_id();
    // Taken by the bare transport, which refuses parts about the receiver.
    let mut accepted = false;
    for receiver in [None, Some(&receiver)] {
        accepted = match judge_frame(data, fixture::sender_name(), fixture::SENDER_IP, receiver) {
            Ok((_, Judged::Pulse(pulse))) => pulse_bytes(&pulse),
            Ok((_, Judged::Chitchat(_) | Judged::Skipped)) => true,
            Err(reason) => {
                assert!(
                    FRAME_REFUSALS.contains(&reason),
                    "a refusal no metric counts: {reason}"
                );
                false
            }
        };
    }
    let Ok((header, message)) = frame::split(data) else {
        return accepted;
    };
    let mut sender = Vec::new();
    header.sender.serialize(&mut sender);
    let end = data.len() - message.len();
    let start = end.checked_sub(sender.len());
    assert_eq!(
        start.map(|start| &data[start..end]),
        Some(&sender[..]),
        "the sender id reads back as written"
    );
    if header.carried == Carried::Chitchat
        && frame::decode_message(message).is_ok()
        && let Err(violation) = guard::check(message, None)
    {
        assert_ne!(
            violation.reason(),
            "malformed",
            "chitchat decodes what the guard calls malformed: {violation}"
        );
    }
    accepted
}

/// The refusal reasons of `domaind_gossip_frames_rejected_total` a frame can meet here.
const FRAME_REFUSALS: [&str; 6] = [
    "malformed",
    "oversized",
    "identity_mismatch",
    "address_mismatch",
    "version_above_max",
    "delta_about_receiver",
];

/// A SynAck or Ack whose delta carries signed state, checked part by part as the
/// receiving node checks it (`signed::verify`), against nothing held of the owner or
/// against its certificate and a value held (the first byte chooses).
///
/// Contract: no panic; a part's verdict is the same when checked again (the
/// certificate cache changes nothing); a value that opens seals back to the same text;
/// what is kept of a message chitchat decodes, re-encoded as the state check rebuilds
/// it, decodes too.
pub fn signed_state(data: &[u8]) -> bool {
    let Some((&choice, message)) = data.split_first() else {
        return false;
    };
    let Ok(split) = wire::split(message) else {
        return false;
    };
    let Some(Ok(parts)) = split.delta.map(wire::parse_delta) else {
        return false;
    };
    let held = (choice % 2 == 1).then(held_state);
    let mut certs = CertCache::default();
    let mut checker = Checker {
        cluster: CLUSTER,
        credentials: fixture::credentials(),
        certs: &mut certs,
        now: fixture::now(),
    };
    let mut kept = Vec::new();
    for part in &parts {
        for kv in part.key_values() {
            if let Ok(sealed) = envelope::open(&kv.value) {
                let again = envelope::seal_as(
                    sealed.version,
                    &sealed.extensions,
                    sealed.scheme,
                    &sealed.signature,
                    sealed.payload,
                );
                assert_eq!(again, kv.value, "a value opens and seals back the same");
            }
        }
        let first = checker.check(part, held.as_ref());
        let second = checker.check(part, held.as_ref());
        assert_eq!(
            first, second,
            "a part's verdict does not change when checked again"
        );
        if first.is_ok() {
            kept.push(part.clone());
        }
    }
    if kept.len() < parts.len() && frame::decode_message(message).is_ok() {
        let mut rebuilt = split.head.to_vec();
        rebuilt.extend(wire::encode_delta(&kept));
        if let Err(error) = ChitchatMessage::deserialize(&mut &rebuilt[..]) {
            panic!(
                "what the state check keeps of a message chitchat decoded does not decode: {error}"
            );
        }
    }
    kept.len() == parts.len()
}

/// What the receiver holds of the sender for `signed_state`: its certificate at
/// version 1 and one value at version 2.
pub fn held_state() -> Held {
    static VALUE: OnceLock<String> = OnceLock::new();
    let cert = VALUE.get_or_init(|| {
        let credentials = fixture::credentials();
        envelope::signed_key_value(
            credentials,
            CLUSTER,
            &fixture::sender_id(),
            domaind_gossip::signed::CERT_KEY,
            &envelope::cert_payload(credentials.cert()),
            1,
        )
        .value
    });
    Held {
        cert: Some(cert.clone()),
        versions: [
            (domaind_gossip::signed::CERT_KEY.to_owned(), 1),
            ("domain/held".to_owned(), 2),
        ]
        .into(),
        max_version: 2,
        last_gc_version: 0,
    }
}

/// A pulse's bytes, as the pulse task reads them from a frame, taken in by a table of
/// three nodes.
///
/// Contract: no panic; a version-1 pulse re-encodes to as many bytes and decodes back
/// to itself (its bitmap's padding bits are not read, so the bytes may differ there);
/// positions lie inside the table the pulse names, one beat each.
pub fn pulse(data: &[u8]) -> bool {
    pulse_bytes(data)
}

fn pulse_bytes(data: &[u8]) -> bool {
    let Ok(read) = Pulse::read(data) else {
        return false;
    };
    let Some(pulse) = read.pulse else {
        assert!(
            read.version > PULSE_VERSION,
            "only a newer pulse is skipped"
        );
        return true;
    };
    let encoded = pulse.encode();
    assert_eq!(Pulse::decode(&encoded).as_ref(), Ok(&pulse), "decodes back");
    // Unwrapped (a newer version's wrapper starts with 3, where version 1 has its kind).
    if data.first() != Some(&3) {
        assert_eq!(encoded.len(), data.len(), "re-encodes to as many bytes");
    }
    if let Beats::Positions {
        len,
        positions,
        beats,
        ..
    } = &pulse.beats
    {
        assert_eq!(positions.len(), beats.len(), "one beat per position");
        assert!(
            positions.windows(2).all(|w| w[0] < w[1]),
            "positions ascend"
        );
        assert!(
            positions.iter().all(|p| p < len),
            "positions inside the table"
        );
    }
    let mut table = pulse_table();
    let now = tokio::time::Instant::now();
    let received = table.receive(&pulse, now);
    assert!(received.advanced <= 3, "at most the table's nodes advance");
    true
}

/// The receiving table: the sender, the receiver and one more node, each heard once.
pub fn pulse_table() -> PulseTable {
    let mut table = PulseTable::new(fixture::receiver_id());
    let third = ChitchatId::new(
        "node-c",
        1,
        (IpAddr::V4(Ipv4Addr::new(127, 0, 0, 4)), 7946).into(),
    );
    let mark = Mark {
        heartbeat: 5,
        max_version: 3,
    };
    table.sync(
        [
            (fixture::sender_id(), mark),
            (fixture::receiver_id(), mark),
            (third, mark),
        ],
        tokio::time::Instant::now(),
    );
    table
}

/// A kubelet client's side of an HTTP/2 connection through the `:authority` filter,
/// given whole and in two pieces (cut where the first two bytes say).
///
/// Contract: no panic; the answer, and the output of an input taken, do not depend on
/// how the input was cut; what the
/// filter writes passes through a fresh filter unchanged, with nothing replaced (its
/// HPACK blocks decode to headers h2 accepts, re-encoded as our encoder writes them).
pub fn authority(data: &[u8]) -> bool {
    let Some(([hi, lo], input)) = data.split_first_chunk::<2>() else {
        return false;
    };
    let cut = usize::from(u16::from_be_bytes([*hi, *lo])).min(input.len());
    let mut whole = BytesMut::new();
    let whole_result = AuthorityRewriter::default().feed(input, &mut whole);
    let mut pieces = BytesMut::new();
    let mut rewriter = AuthorityRewriter::default();
    let pieces_result = rewriter
        .feed(&input[..cut], &mut pieces)
        .and_then(|first| Ok(first + rewriter.feed(&input[cut..], &mut pieces)?));
    assert_eq!(whole_result, pieces_result, "the same answer however cut");
    // After an error the connection is closed: what went out before it (a preface's
    // first bytes, as they came) is of no account.
    if whole_result.is_ok() {
        assert_eq!(whole, pieces, "the same output however cut");
        let mut again = BytesMut::new();
        let replaced = AuthorityRewriter::default().feed(&whole, &mut again);
        assert_eq!(replaced, Ok(0), "the filter's output needs no filtering");
        assert_eq!(again, whole, "the filter's output passes through unchanged");
    }
    whole_result.is_ok()
}

/// The boot the journal target's records are replayed on.
const BOOT: &str = "6f1c3c1e-boot";

/// A checkpoint journal. First byte even: one line, given as is and with a correct
/// checksum put in front of it (so that the fuzzer reaches the key and the JSON);
/// odd: a journal of lines, replayed whole as given and with each line given a
/// correct checksum.
///
/// Contract: no panic; a record that reads back re-encodes to a line that reads back
/// to the same record; a replay accounts for every line.
pub fn journal(data: &[u8]) -> bool {
    let Some((&choice, rest)) = data.split_first() else {
        return false;
    };
    if choice % 2 == 0 {
        let mut accepted = false;
        for candidate in [rest.to_vec(), checksummed(rest)] {
            let decoded = line::decode(&candidate);
            let _ = line::attribute(&candidate);
            accepted |= decoded.is_ok();
            if let Ok(Decoded::Record { boot, op, .. }) = decoded {
                let again = line::encode(&op, &boot);
                let again = line::decode(&again[..again.len() - 1]);
                assert_eq!(
                    again,
                    Ok(Decoded::Record {
                        boot,
                        op,
                        rev: line::REVISION
                    }),
                    "a record re-encodes to a line that reads back"
                );
            }
        }
        return accepted;
    }
    let mut journal = Vec::with_capacity(rest.len() + 16);
    for text in rest.split(|b| *b == b'\n') {
        journal.extend(checksummed(text));
        journal.push(b'\n');
    }
    let mut accepted = false;
    for bytes in [rest, &journal[..]] {
        let replay = domaind_checkpoint::replay(bytes, BOOT);
        let lines = bytes
            .split(|b| *b == b'\n')
            .filter(|l| !l.is_empty())
            .count();
        assert!(
            replay.records + replay.damaged.len() + replay.other_boot_records
                <= lines + replay.repaired + 1,
            "more records than lines"
        );
        accepted |= replay.damaged.is_empty() && replay.records > 0;
    }
    accepted
}

/// `rest` with the checksum its line needs.
fn checksummed(rest: &[u8]) -> Vec<u8> {
    let mut line = format!("{:08x} ", crc32fast::hash(rest)).into_bytes();
    line.extend_from_slice(rest);
    line
}

/// The node and driver the claim targets resolve claims for.
const NODE: &str = "node-a";
const DRIVER: &str = "compute-domain.nvidia.com";

/// A local backend's claim file, as the daemon reads it at prepare, for the claim it
/// names and for another.
///
/// Contract: no panic; a file that parses serialises to one that parses the same; a
/// claim that resolves names its domain in its own namespace and gets one device of
/// this node.
pub fn claim_file(data: &[u8]) -> bool {
    let Ok(file) = serde_json::from_slice::<ClaimFile>(data) else {
        return false;
    };
    let again = serde_json::to_vec(&file).expect("a claim file serialises");
    assert_eq!(
        serde_json::from_slice::<ClaimFile>(&again).ok().as_ref(),
        Some(&file),
        "a claim file reads back"
    );
    let source = LocalClaimSource::new(LocalDir::new("/nonexistent"), NODE, DRIVER);
    let named = ClaimRef {
        uid: file.uid.clone(),
        namespace: file.namespace.clone(),
        name: file.name.clone(),
    };
    let other = ClaimRef {
        uid: "other-uid".into(),
        namespace: "other".into(),
        name: "other".into(),
    };
    let mut accepted = false;
    for asked in [other, named] {
        let checked = source.check(&asked, file.clone());
        if let Ok(info) = &checked {
            assert_eq!(info.domain.namespace, asked.namespace, "its own namespace");
            assert!(!info.domain.uid.0.is_empty(), "a domain uid");
            assert_eq!(info.devices.len(), 1, "one device");
            assert!(info.devices.iter().all(|d| d.pool == NODE), "this node's");
        }
        accepted = checked.is_ok();
    }
    accepted
}

/// A ResourceClaim as the API server serves it (first byte even), whose allocation and
/// opaque configs the node reads at prepare; or the opaque parameters alone (odd).
///
/// Contract: no panic; parameters that decode name the same domain to the
/// controller's reading and serialise to parameters that decode the same; an
/// allocated claim resolves to devices of this node only, with a domain.
pub fn claim_params(data: &[u8]) -> bool {
    let Some((&choice, rest)) = data.split_first() else {
        return false;
    };
    if choice % 2 == 1 {
        return serde_json::from_slice::<serde_json::Value>(rest)
            .is_ok_and(|parameters| parameters_contract(&parameters));
    }
    let Ok(claim) = serde_json::from_slice::<ResourceClaim>(rest) else {
        return false;
    };
    for parameters in claim
        .status
        .iter()
        .filter_map(|s| s.allocation.as_ref())
        .filter_map(|a| a.devices.as_ref())
        .flat_map(|d| d.config.iter().flatten())
        .filter_map(|c| c.opaque.as_ref())
    {
        parameters_contract(&parameters.parameters.0);
    }
    let allocated = allocated_claim(&claim, NODE, DRIVER);
    if let Ok(allocated) = &allocated {
        assert!(!allocated.domain_uid.trim().is_empty(), "a domain");
        assert!(!allocated.devices.is_empty(), "devices");
        assert!(
            allocated.devices.iter().all(|d| d.pool == NODE),
            "this node's"
        );
    }
    allocated.is_ok()
}

/// Whether `parameters` decode; holds them to the contract when they do.
fn parameters_contract(parameters: &serde_json::Value) -> bool {
    let domain = ChannelConfig::domain_of(parameters);
    let Ok(config) = ChannelConfig::decode(parameters) else {
        return false;
    };
    assert_eq!(domain, Some(config.domain_id.as_str()), "the same domain");
    let again = serde_json::to_value(&config).expect("a config serialises");
    assert_eq!(ChannelConfig::decode(&again), Ok(config), "reads back");
    true
}

/// The address the CSR target's requester's Node lists.
const NODE_ADDRESS: IpAddr = IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2));

/// A CertificateSigningRequest's `spec.request` at the signer, from the node daemons'
/// ServiceAccount bound to [`NODE`]: as sent (first byte even), or DER the target
/// wraps in a PEM block (odd), so that the fuzzer reaches the CSR inside.
///
/// Contract: no panic; a grant is for the requester's node, with only its addresses,
/// for no longer than the policy allows.
pub fn csr(data: &[u8]) -> bool {
    let Some((&choice, rest)) = data.split_first() else {
        return false;
    };
    let pem = if choice % 2 == 1 {
        crate::seeds::pem_block("CERTIFICATE REQUEST", rest).into_bytes()
    } else {
        rest.to_vec()
    };
    let policy = Policy::new("domaind", "domaind-node", Duration::from_secs(86_400));
    let bound = [NODE.to_owned()];
    let usages: Vec<String> = GOSSIP_CERT_USAGES.iter().map(|u| u.to_string()).collect();
    let request = Request {
        username: Some(&policy.node_daemon),
        bound_node: Some(&bound[..]),
        usages: &usages,
        pem: &pem,
        expiration_seconds: (choice & 2 != 0).then_some(600),
        node_addresses: &[NODE_ADDRESS],
    };
    let decided = decide(&policy, &request);
    if let Ok(grant) = &decided {
        assert_eq!(grant.node, NODE, "for the requester's node");
        assert!(
            grant.ips.iter().all(|ip| *ip == NODE_ADDRESS),
            "only its addresses"
        );
        assert!(grant.lifetime <= policy.lifetime, "within the policy");
    }
    decided.is_ok()
}
