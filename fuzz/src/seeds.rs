//! The seed corpora, made with the real encoders: a few inputs each target must accept
//! and a few it must refuse, each refusal a different one. `seeds` (src/bin/seeds.rs)
//! writes them under `corpus/<target>/`; tests/corpora.rs runs them through their
//! targets. Signatures are made afresh each time (ECDSA draws a nonce), so a rewritten
//! corpus differs from the committed one in those bytes only.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};

use base64::Engine;
use base64::engine::general_purpose::STANDARD;
use chitchat::{ChitchatId, ChitchatMessage, Deserializable, Serializable};
use domaind_actors::model::{
    AllocatedDevice, AllocationMode, ClaimInfo, ClaimRef, DomainRef, DomainUid, Isolation,
    ReadinessPolicy,
};
use domaind_actors::ports::{ClaimRecord, PrepareState};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_checkpoint::line::{self, Op};
use domaind_gossip::pulse::table::key_of;
use domaind_gossip::pulse::wire::{Beats, Kind, Pulse};
use domaind_gossip::signed::CERT_KEY;
use domaind_gossip::signed::envelope::{self, Subject};
use domaind_gossip::transport::frame;
use domaind_gossip::transport::wire::{
    self, KeyValue, NodeOp, NodePart, STATUS_DELETE_AFTER_TTL, STATUS_DELETED, TYPE_ACK, TYPE_SYN,
    TYPE_SYN_ACK,
};
use domaind_gossip::version::WireVersion;
use domaind_kube_api::ChannelConfig;
use domaind_kube_api::crd::ChannelAllocationMode;
use domaind_kube_api::names::IMEX_SHARED_NAME;
use loona_hpack::Encoder;
use rcgen::{CertificateParams, DnType, IsCa, KeyPair, SanType};

use crate::fixture::{self, CLUSTER};

/// One seed: its file name (what it is) and its bytes.
pub type Seed = (&'static str, Vec<u8>);

/// The seeds of `target`.
pub fn of(target: &str) -> Vec<Seed> {
    match target {
        "frame" => frame(),
        "signed_state" => signed_state(),
        "pulse" => pulse(),
        "authority" => authority(),
        "journal" => journal(),
        "claim_file" => claim_file(),
        "claim_params" => claim_params(),
        "csr" => csr(),
        other => panic!("no target {other}"),
    }
}

/// A PEM block of `label` around `der`, lines of 64 characters.
pub fn pem_block(label: &str, der: &[u8]) -> String {
    let base64 = STANDARD.encode(der);
    let lines: Vec<&str> = base64
        .as_bytes()
        .chunks(64)
        .map(|chunk| std::str::from_utf8(chunk).expect("base64 is ASCII"))
        .collect();
    format!(
        "-----BEGIN {label}-----\n{}\n-----END {label}-----\n",
        lines.join("\n")
    )
}

// ---- gossip -------------------------------------------------------------------------

/// A value the fixture's key signs for the sender, as the owner writes it; `version`
/// above 1 writes the newer envelope with an extension.
fn signed(key: &str, payload: &str, version: u64, envelope_version: u8) -> KeyValue {
    sign(key, payload, version, envelope_version, false)
}

/// A signed deletion, as the owner's `delete` writes it.
fn signed_deletion(key: &str, version: u64) -> KeyValue {
    sign(key, "", version, 2, true)
}

fn sign(key: &str, payload: &str, version: u64, envelope_version: u8, deleted: bool) -> KeyValue {
    let owner = fixture::sender_id();
    if envelope_version <= 1 && !deleted {
        return envelope::signed_key_value(
            fixture::credentials(),
            CLUSTER,
            &owner,
            key,
            payload,
            version,
        );
    }
    let extensions = b"next-version-extension";
    let message = Subject {
        cluster: CLUSTER,
        owner: &owner,
        key,
        deleted,
        version,
        payload,
    }
    .message_as(envelope_version, extensions);
    let (scheme, signature) = fixture::credentials().sign(&message).expect("signs");
    KeyValue {
        key: key.into(),
        value: envelope::seal_as(envelope_version, extensions, scheme, &signature, payload),
        version,
        status: if deleted {
            STATUS_DELETE_AFTER_TTL
        } else {
            wire::STATUS_SET
        },
    }
}

fn cert_value(version: u64) -> KeyValue {
    signed(
        CERT_KEY,
        &envelope::cert_payload(fixture::credentials().cert()),
        version,
        1,
    )
}

fn part(id: ChitchatId, last_gc: u64, from: u64, ops: Vec<NodeOp>) -> NodePart {
    NodePart {
        id,
        last_gc_version: last_gc,
        from_version_excluded: from,
        ops,
    }
}

fn kvs(values: Vec<KeyValue>) -> Vec<NodeOp> {
    values.into_iter().map(NodeOp::KeyValue).collect()
}

/// The sender's whole state from nothing: its certificate, then two values.
fn full_state() -> NodePart {
    part(
        fixture::sender_id(),
        0,
        0,
        kvs(vec![
            cert_value(1),
            signed("domain/cd-1", r#"{"joinedAtMs":1,"slot":0}"#, 2, 1),
            signed("imex/ready", "true", 3, 1),
        ]),
    )
}

fn message(kind: u8, digest: &[(ChitchatId, [u64; 3])], parts: &[NodePart]) -> Vec<u8> {
    let mut out = wire::header(kind);
    if kind == TYPE_SYN_ACK {
        (digest.len() as u16).serialize(&mut out);
        for (id, numbers) in digest {
            id.serialize(&mut out);
            for n in numbers {
                n.serialize(&mut out);
            }
        }
    }
    out.extend(wire::encode_delta(parts));
    out
}

fn syn() -> ChitchatMessage {
    let mut bytes = wire::header(TYPE_SYN);
    0u16.serialize(&mut bytes);
    CLUSTER.to_string().serialize(&mut bytes);
    decoded(&bytes)
}

/// An Ack as chitchat writes it when compression pays: its delta in one zstd block.
/// (Chitchat's own encoder cannot be used on a decoded delta: re-encoding one trips its
/// length assertion, which is why the transport keeps a message's wire form.)
fn compressed(ack: &[u8]) -> Vec<u8> {
    let (head, delta) = ack.split_at(4);
    // One raw block: kind, u16 length, the ops; then the end.
    let plain = &delta[3..delta.len() - 1];
    let body = zstd::bulk::compress(plain, 0).expect("compresses");
    let mut out = head.to_vec();
    out.push(wire::BLOCK_COMPRESSED);
    (body.len() as u16).serialize(&mut out);
    out.extend(body);
    out.push(wire::BLOCK_END);
    out
}

fn decoded(bytes: &[u8]) -> ChitchatMessage {
    ChitchatMessage::deserialize(&mut &bytes[..]).expect("chitchat decodes its own form")
}

fn frame_of(message: &ChitchatMessage) -> Vec<u8> {
    frame::encode(
        &fixture::sender_id(),
        message,
        frame::DEFAULT_MAX_FRAME_BYTES,
    )
    .expect("fits")
    .to_vec()
}

/// A frame of our own wire form around message bytes chitchat need not accept.
fn raw_frame(sender: &ChitchatId, message: &[u8]) -> Vec<u8> {
    let mut out = vec![frame::FRAME_VERSION];
    sender.serialize(&mut out);
    out.extend_from_slice(message);
    out
}

fn frame() -> Vec<Seed> {
    let sender = fixture::sender_id();
    let ack = message(TYPE_ACK, &[], &[full_state()]);
    let digest = [
        (sender.clone(), [7, 0, 3]),
        (fixture::receiver_id(), [4, 0, 9]),
    ];
    let syn_ack = message(TYPE_SYN_ACK, &digest, &[full_state()]);
    let pulse = crate::targets::pulse_table().push().encode();
    let mut trailing = frame_of(&syn());
    trailing.push(0);
    let elsewhere = ChitchatId::new(
        sender.node_id.clone(),
        sender.generation_id,
        SocketAddr::new(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 9)), 7946),
    );
    let impostor = ChitchatId::new("node-z", 1, sender.gossip_advertise_addr);
    // A key above the max version a later op lowers it to: chitchat would assert.
    let lowered = part(
        sender.clone(),
        0,
        0,
        vec![NodeOp::KeyValue(cert_value(5)), NodeOp::SetMaxVersion(2)],
    );
    let about_receiver = part(fixture::receiver_id(), 0, 0, kvs(vec![cert_value(1)]));
    let full = raw_frame(&sender, &ack);
    let next = WireVersion::Next;
    vec![
        ("syn", frame_of(&syn())),
        ("ack-signed-state", full.clone()),
        ("ack-compressed", raw_frame(&sender, &compressed(&ack))),
        ("syn-ack-digest-and-state", raw_frame(&sender, &syn_ack)),
        (
            "pulse",
            frame::encode_pulse(&sender, &pulse, frame::DEFAULT_MAX_FRAME_BYTES)
                .expect("fits")
                .to_vec(),
        ),
        (
            "next-version-message",
            // Kind 1: a chitchat message.
            frame::encode_versioned(
                next.version(),
                1,
                next.extension(),
                &sender,
                &ack,
                frame::DEFAULT_MAX_FRAME_BYTES,
            )
            .expect("fits")
            .to_vec(),
        ),
        (
            "next-version-pulse",
            frame::encode_pulse_as(
                WireVersion::Next,
                &sender,
                &pulse,
                frame::DEFAULT_MAX_FRAME_BYTES,
            )
            .expect("fits")
            .to_vec(),
        ),
        (
            "refused-version-above-max",
            raw_frame(&sender, &message(TYPE_ACK, &[], &[lowered])),
        ),
        (
            "refused-about-receiver",
            raw_frame(&sender, &message(TYPE_ACK, &[], &[about_receiver])),
        ),
        ("refused-trailing-byte", trailing),
        ("refused-truncated", full[..full.len() / 2].to_vec()),
        ("refused-address-mismatch", raw_frame(&elsewhere, &ack)),
        ("refused-identity-mismatch", raw_frame(&impostor, &ack)),
    ]
}

/// The first byte chooses what the receiver holds (odd: the sender's certificate and a
/// value, `targets::held_state`); the rest is a message.
fn with_held(held: bool, message: Vec<u8>) -> Vec<u8> {
    let mut out = vec![u8::from(held)];
    out.extend(message);
    out
}

fn signed_state() -> Vec<Seed> {
    let sender = fixture::sender_id();
    let ack = |parts: Vec<NodePart>| message(TYPE_ACK, &[], &parts);
    let news = part(
        sender.clone(),
        0,
        2,
        kvs(vec![
            signed("domain/cd-1", r#"{"joinedAtMs":1,"slot":1}"#, 3, 1),
            signed("imex/ready", "true", 4, 2),
        ]),
    );
    let deletion = signed_deletion("domain/held", 3);
    let mut tampered = signed("domain/cd-1", r#"{"joinedAtMs":1}"#, 3, 1);
    tampered.value = tampered.value.replace("joinedAtMs\":1", "joinedAtMs\":9");
    let mut tombstone = signed("domain/held", "", 3, 1);
    tombstone.status = STATUS_DELETED;
    let unsigned = KeyValue {
        key: "domain/cd-1".into(),
        value: "plain".into(),
        version: 3,
        status: wire::STATUS_SET,
    };
    let on_top = |values: Vec<KeyValue>| part(sender.clone(), 0, 2, kvs(values));
    vec![
        (
            "full-state-from-nothing",
            with_held(false, ack(vec![full_state()])),
        ),
        (
            "syn-ack-full-state",
            with_held(
                false,
                message(
                    TYPE_SYN_ACK,
                    &[(sender.clone(), [3, 0, 3])],
                    &[full_state()],
                ),
            ),
        ),
        (
            "news-on-top-newer-envelope",
            with_held(true, ack(vec![news])),
        ),
        (
            "signed-deletion",
            with_held(true, ack(vec![on_top(vec![deletion])])),
        ),
        (
            "refused-bad-signature",
            with_held(true, ack(vec![on_top(vec![tampered])])),
        ),
        (
            "refused-unsigned",
            with_held(true, ack(vec![on_top(vec![unsigned])])),
        ),
        (
            "refused-tombstone",
            with_held(true, ack(vec![on_top(vec![tombstone])])),
        ),
        (
            "refused-bare-max-version",
            with_held(
                true,
                ack(vec![part(
                    sender.clone(),
                    0,
                    2,
                    vec![NodeOp::SetMaxVersion(9)],
                )]),
            ),
        ),
        (
            "refused-reset-without-certificate",
            with_held(
                false,
                ack(vec![part(
                    sender.clone(),
                    0,
                    0,
                    kvs(vec![signed("domain/cd-1", "{}", 2, 1)]),
                )]),
            ),
        ),
        (
            "refused-rollback",
            with_held(
                true,
                ack(vec![part(
                    sender.clone(),
                    // Collected past what it holds, it says, yet it signs nothing
                    // newer than the certificate: the held value would be lost.
                    5,
                    0,
                    kvs(vec![cert_value(1)]),
                )]),
            ),
        ),
        (
            "refused-one-part-of-two",
            with_held(
                false,
                ack(vec![
                    full_state(),
                    part(fixture::receiver_id(), 0, 0, kvs(vec![cert_value(1)])),
                ]),
            ),
        ),
    ]
}

fn pulse() -> Vec<Seed> {
    let table = crate::targets::pulse_table();
    let push = table.push();
    let keyed = Pulse {
        kind: Kind::Reply,
        state: 7,
        beats: Beats::Keyed(vec![
            (key_of(&fixture::sender_id()), 9),
            (key_of(&fixture::receiver_id()), 2),
            (0xdead_beef, 1),
        ]),
    };
    let other_table = Pulse {
        kind: Kind::Push,
        state: 1,
        beats: Beats::Positions {
            table: 42,
            len: 11,
            positions: vec![0, 3, 10],
            beats: vec![1, 2, 3],
        },
    };
    let mut too_many = other_table.encode();
    too_many[18..20].copy_from_slice(&5000u16.to_be_bytes());
    let mut trailing = keyed.encode();
    trailing.push(0);
    let mut unknown_kind = push.encode();
    unknown_kind[0] = 9;
    vec![
        ("push-same-table", push.encode()),
        ("reply-keyed", keyed.encode()),
        ("push-other-table", other_table.encode()),
        ("next-version", push.encode_as(WireVersion::Next)),
        ("refused-too-many", too_many),
        ("refused-trailing", trailing),
        ("refused-kind", unknown_kind),
        ("refused-truncated", push.encode()[..12].to_vec()),
    ]
}

// ---- the kubelet plugin's :authority filter ---------------------------------------------

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const SETTINGS: [u8; 9] = [0, 0, 0, 0x4, 0, 0, 0, 0, 0];

fn h2_frame(frame_type: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = len.to_be_bytes()[1..].to_vec();
    out.extend([frame_type, flags]);
    out.extend(stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

fn request_headers(authority: &[u8]) -> Vec<(&'static [u8], Vec<u8>)> {
    vec![
        (b":method", b"POST".to_vec()),
        (b":scheme", b"http".to_vec()),
        (
            b":path",
            b"/pluginregistration.Registration/GetInfo".to_vec(),
        ),
        (b":authority", authority.to_vec()),
        (b"content-type", b"application/grpc".to_vec()),
        (b"te", b"trailers".to_vec()),
    ]
}

fn block(encoder: &mut Encoder<'static>, authority: &[u8]) -> Vec<u8> {
    let headers = request_headers(authority);
    encoder.encode(headers.iter().map(|(n, v)| (*n, v.as_slice())))
}

/// The first two bytes say where the target cuts the input in two.
fn cut_at(cut: u16, bytes: Vec<u8>) -> Vec<u8> {
    let mut out = cut.to_be_bytes().to_vec();
    out.extend(bytes);
    out
}

fn authority() -> Vec<Seed> {
    const HEADERS: u8 = 0x1;
    const CONTINUATION: u8 = 0x9;
    const DATA: u8 = 0x0;
    const END_STREAM: u8 = 0x1;
    const END_HEADERS: u8 = 0x4;
    const PADDED: u8 = 0x8;
    const PRIORITY: u8 = 0x20;
    let kubelet = b"%2Fvar%2Flib%2Fkubelet%2Fplugins_registry%2Fcompute-domain.nvidia.com-reg.sock";
    let start = |frames: &[Vec<u8>]| {
        let mut out = PREFACE.to_vec();
        out.extend(SETTINGS);
        for frame in frames {
            out.extend(frame);
        }
        out
    };
    let mut encoder = Encoder::new();
    let first = block(&mut encoder, kubelet);
    let second = block(&mut encoder, b"localhost");
    let grpc_message = [0u8, 0, 0, 0, 2, 0x0a, 0];
    let two_requests = start(&[
        h2_frame(HEADERS, END_HEADERS, 1, &first),
        h2_frame(DATA, END_STREAM, 1, &grpc_message),
        h2_frame(HEADERS, END_HEADERS, 3, &second),
        h2_frame(DATA, END_STREAM, 3, &grpc_message),
    ]);
    let block = block(&mut Encoder::new(), kubelet);
    let (head, tail) = block.split_at(block.len() / 2);
    let continued = start(&[
        h2_frame(HEADERS, 0, 1, head),
        h2_frame(CONTINUATION, END_HEADERS, 1, tail),
    ]);
    let mut padded_payload = vec![3];
    padded_payload.extend([0, 0, 0, 0, 16]);
    padded_payload.extend_from_slice(&block);
    padded_payload.extend([0, 0, 0]);
    let padded = start(&[h2_frame(
        HEADERS,
        END_HEADERS | END_STREAM | PADDED | PRIORITY,
        1,
        &padded_payload,
    )]);
    let interrupted = start(&[
        h2_frame(HEADERS, 0, 1, head),
        h2_frame(DATA, 0, 1, &grpc_message),
    ]);
    let stray = start(&[h2_frame(CONTINUATION, END_HEADERS, 1, tail)]);
    let bad_hpack = start(&[h2_frame(HEADERS, END_HEADERS, 1, &[0xff, 0xff, 0xff, 0xff])]);
    let mut no_preface = two_requests.clone();
    no_preface[0] = b'G';
    let whole = two_requests.len() as u16;
    vec![
        (
            "two-requests-cut-in-preface",
            cut_at(10, two_requests.clone()),
        ),
        (
            "two-requests-cut-in-a-block",
            cut_at(40, two_requests.clone()),
        ),
        ("two-requests-whole", cut_at(whole, two_requests)),
        ("continuation", cut_at(0, continued)),
        ("padded-with-priority", cut_at(60, padded)),
        ("refused-interrupted", cut_at(0, interrupted)),
        ("refused-stray-continuation", cut_at(0, stray)),
        ("refused-bad-hpack", cut_at(0, bad_hpack)),
        ("refused-no-preface", cut_at(0, no_preface)),
    ]
}

// ---- the checkpoint journal -------------------------------------------------------------

fn claim_record(uid: &str) -> ClaimRecord {
    ClaimRecord {
        claim: ClaimRef {
            uid: uid.into(),
            namespace: "team-a".into(),
            name: format!("claim-{uid}"),
        },
        info: ClaimInfo {
            domain: DomainRef {
                uid: DomainUid("cd-uid-1".into()),
                namespace: "team-a".into(),
                name: "training".into(),
                num_nodes: 4,
            },
            allocation_mode: AllocationMode::Single,
            readiness: Some(ReadinessPolicy::Domain),
            isolation: Isolation::Channel,
            devices: vec![AllocatedDevice {
                request: "channel".into(),
                pool: "node-a".into(),
                device: "channel-0".into(),
            }],
            admin_access: false,
        },
        policy: ReadinessPolicy::Domain,
        state: PrepareState::PrepareCompleted,
        devices: vec!["compute-domain.nvidia.com/channel=0".into()],
        channel: Some(3),
    }
}

const BOOT: &str = "6f1c3c1e-boot";

/// A line without its checksum and newline: what the journal target checksums.
fn unsummed(line: &[u8]) -> Vec<u8> {
    line[9..line.len() - 1].to_vec()
}

fn journal() -> Vec<Seed> {
    let claim = line::encode(&Op::Claim(claim_record("417f1e95")), BOOT);
    let gone = line::encode(&Op::ClaimGone("417f1e95".into()), BOOT);
    let slot = line::encode(
        &Op::Slot {
            domain: DomainUid("cd-uid-1".into()),
            slot: 3,
        },
        BOOT,
    );
    let slot_gone = line::encode(
        &Op::SlotGone(DomainUid("cd-uid-1".into())),
        "an-earlier-boot",
    );
    let newer_format = String::from_utf8(unsummed(&slot))
        .expect("text")
        .replacen("\"v\":2", "\"v\":3", 1)
        .into_bytes();
    let newer_revision = String::from_utf8(unsummed(&claim))
        .expect("text")
        .replacen("\"rev\":1", "\"rev\":2,\"added\":[1,2]", 1)
        .into_bytes();
    let one = |line: Vec<u8>| {
        let mut out = vec![0];
        out.extend(line);
        out
    };
    let journal = |lines: &[Vec<u8>]| {
        let mut out = vec![1];
        out.extend(lines.join(&b'\n'));
        out
    };
    // Two records as written, the newline between them flipped: read as given.
    let mut merged = claim.clone();
    *merged.last_mut().expect("a newline") ^= 0x20;
    merged.extend(&slot);
    let mut flipped = claim.clone();
    flipped[40] ^= 0x20;
    vec![
        ("claim", one(unsummed(&claim))),
        ("claim-as-written", one(claim[..claim.len() - 1].to_vec())),
        ("claim-gone", one(unsummed(&gone))),
        ("slot", one(unsummed(&slot))),
        ("newer-revision", one(newer_revision.clone())),
        ("newer-format", one(newer_format)),
        (
            "refused-flipped-byte",
            one(flipped[..flipped.len() - 1].to_vec()),
        ),
        (
            "journal",
            journal(&[
                unsummed(&claim),
                unsummed(&slot),
                unsummed(&slot_gone),
                unsummed(&gone),
                newer_revision,
            ]),
        ),
        ("journal-merged-lines", journal(&[merged])),
        (
            "refused-torn-line",
            journal(&[unsummed(&claim), unsummed(&slot)[..20].to_vec()]),
        ),
    ]
}

// ---- claims -------------------------------------------------------------------------------

fn claim_file() -> Vec<Seed> {
    let file = ClaimFile {
        namespace: "team-a".into(),
        name: "claim-1".into(),
        uid: "417f1e95".into(),
        compute_domain: ComputeDomainRef {
            namespace: "team-a".into(),
            name: "training".into(),
            uid: "cd-uid-1".into(),
            num_nodes: 4,
            isolation: Isolation::Channel,
        },
        allocation_mode: AllocationMode::All,
        readiness: Some(ReadinessPolicy::Domain),
        driver: Some("compute-domain.nvidia.com".into()),
        device: Some("channel-2".into()),
        admin_access: false,
    };
    let bare = ClaimFile {
        readiness: None,
        driver: None,
        device: None,
        compute_domain: ComputeDomainRef {
            num_nodes: 0,
            isolation: Isolation::ImexDomain,
            ..file.compute_domain.clone()
        },
        ..file.clone()
    };
    let json = |file: &ClaimFile| serde_json::to_vec_pretty(file).expect("serialises");
    let other_namespace = ClaimFile {
        compute_domain: ComputeDomainRef {
            namespace: "team-b".into(),
            ..file.compute_domain.clone()
        },
        ..file.clone()
    };
    let other_driver = ClaimFile {
        driver: Some("gpu.nvidia.com".into()),
        ..file.clone()
    };
    let mut unknown_field: serde_json::Value = serde_json::to_value(&file).expect("a value");
    unknown_field["allocationmode"] = "All".into();
    vec![
        ("every-field", json(&file)),
        ("defaults", json(&bare)),
        ("refused-other-namespace", json(&other_namespace)),
        ("refused-other-driver", json(&other_driver)),
        (
            "refused-unknown-field",
            serde_json::to_vec(&unknown_field).expect("serialises"),
        ),
    ]
}

fn resource_claim(parameters: serde_json::Value, pool: &str) -> Vec<u8> {
    let claim = serde_json::json!({
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceClaim",
        "metadata": {"name": "claim-1", "namespace": "team-a", "uid": "417f1e95"},
        "spec": {"devices": {"requests": [{"name": "channel", "exactly": {
            "deviceClassName": "compute-domain-default-channel.nvidia.com"}}]}},
        "status": {"allocation": {"devices": {
            "results": [{"request": "channel", "driver": "compute-domain.nvidia.com",
                         "pool": pool, "device": "channel-0"}],
            "config": [{"source": "FromClaim", "requests": ["channel"],
                        "opaque": {"driver": "compute-domain.nvidia.com",
                                   "parameters": parameters}}]}}}
    });
    // Through the API type, as the client reads it.
    let claim: k8s_openapi::api::resource::v1::ResourceClaim =
        serde_json::from_value(claim).expect("a ResourceClaim");
    serde_json::to_vec(&claim).expect("serialises")
}

fn claim_params() -> Vec<Seed> {
    let config = serde_json::to_value(ChannelConfig::new("cd-uid-1", ChannelAllocationMode::All))
        .expect("serialises");
    let mut with_readiness = config.clone();
    with_readiness["readiness"] = "Domain".into();
    let mut other_kind = config.clone();
    other_kind["kind"] = "GpuConfig".into();
    let mut empty_domain = config.clone();
    empty_domain["domainID"] = " ".into();
    let mut typo = config.clone();
    typo["allocationmode"] = "Single".into();
    let claim = |choice: u8, bytes: Vec<u8>| {
        let mut out = vec![choice];
        out.extend(bytes);
        out
    };
    let params = |value: &serde_json::Value| claim(1, serde_json::to_vec(value).expect("json"));
    vec![
        ("claim", claim(0, resource_claim(config.clone(), "node-a"))),
        (
            "claim-with-readiness",
            claim(0, resource_claim(with_readiness.clone(), "node-a")),
        ),
        (
            "refused-claim-other-node",
            claim(0, resource_claim(config.clone(), "node-b")),
        ),
        (
            "refused-claim-other-kind",
            claim(0, resource_claim(other_kind.clone(), "node-a")),
        ),
        ("parameters", params(&config)),
        ("parameters-with-readiness", params(&with_readiness)),
        ("refused-parameters-empty-domain", params(&empty_domain)),
        ("refused-parameters-unknown-field", params(&typo)),
        (
            "refused-parameters-not-an-object",
            params(&serde_json::json!([1])),
        ),
    ]
}

// ---- CSRs ---------------------------------------------------------------------------------

fn csr_pem(params: CertificateParams, key: &KeyPair) -> String {
    params
        .serialize_request(key)
        .expect("a CSR")
        .pem()
        .expect("PEM")
}

fn node_params(names: &[&str]) -> CertificateParams {
    let mut params =
        CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
            .expect("names");
    params.distinguished_name.push(DnType::CommonName, "node-a");
    params
}

fn csr() -> Vec<Seed> {
    let key = KeyPair::generate().expect("a P-256 key");
    let mut full = node_params(&["node-a", IMEX_SHARED_NAME]);
    full.subject_alt_names
        .push(SanType::IpAddress(IpAddr::V4(Ipv4Addr::new(127, 0, 0, 2))));
    let mut ca = node_params(&["node-a"]);
    ca.is_ca = IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
    let p384 = KeyPair::generate_for(&rcgen::PKCS_ECDSA_P384_SHA384).expect("a P-384 key");
    let as_sent = |pem: String| {
        let mut out = vec![0];
        out.extend(pem.into_bytes());
        out
    };
    let as_der = |pem: String| {
        let (_, block) = x509_parser::pem::parse_x509_pem(pem.as_bytes()).expect("PEM");
        let mut out = vec![1];
        out.extend(block.contents);
        out
    };
    let plain = csr_pem(node_params(&["node-a"]), &key);
    vec![
        ("plain", as_sent(plain.clone())),
        ("plain-der", as_der(plain)),
        ("shared-name-and-ip", as_sent(csr_pem(full.clone(), &key))),
        ("shared-name-and-ip-der", as_der(csr_pem(full, &key))),
        (
            "refused-other-node",
            as_sent(csr_pem(node_params(&["node-b"]), &key)),
        ),
        ("refused-ca", as_der(csr_pem(ca, &key))),
        (
            "refused-p384",
            as_der(csr_pem(node_params(&["node-a"]), &p384)),
        ),
        (
            "refused-two-blocks",
            as_sent(format!(
                "{}{}",
                csr_pem(node_params(&["node-a"]), &key),
                csr_pem(node_params(&["node-a"]), &key)
            )),
        ),
    ]
}
