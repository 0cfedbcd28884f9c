//! What chitchat 0.11.2 asserts about an incoming message, checked before it sees one.
//!
//! Chitchat applies a delta with `assert!`s that hold only for deltas its own encoder
//! wrote. Its decoder enforces part of that shape (strictly increasing key versions, one
//! entry per node, key-values after a node header), but lets a `SetMaxVersion` op lower
//! a node's max version below the key versions just read, and applies deltas about the
//! receiving node itself. Either one makes the chitchat server task panic, which stops
//! the node's gossip. This module reads the message's wire form the way chitchat does
//! and refuses such a message, so that it never reaches chitchat.
//!
//! Pure: the bytes and the receiver's own id in, a verdict out. Chitchat keeps its
//! message parts private, so the wire form is read here rather than the decoded value.

use chitchat::ChitchatId;

pub use super::violation::{MAX_INFLATED_BYTES, Violation};
use super::wire::{self, KeyValue, NodeOp, NodePart};

/// Checks one chitchat message (its wire form, without our frame header) addressed to
/// `receiver`. Without a receiver, parts about the receiver itself pass: the state
/// check that follows strips them (`signed::StateCheck`), so that an honest echo of a
/// node's own state does not cost the rest of the frame. Passed, the bytes of keys and
/// values the delta carries: what its decoded form holds.
pub fn check(message: &[u8], receiver: Option<&ChitchatId>) -> Result<usize, Violation> {
    // A digest only reports heartbeats and versions; chitchat applies nothing from it
    // that one of its assertions depends on.
    let Some(delta) = wire::split(message)?.delta else {
        return Ok(0);
    };
    let mut carried = 0;
    for part in wire::parse_delta(delta)? {
        verdict(&part, receiver)?;
        carried += part
            .key_values()
            .map(|kv| kv.key.len() + kv.value.len())
            .sum::<usize>();
    }
    Ok(carried)
}

fn verdict(part: &NodePart, receiver: Option<&ChitchatId>) -> Result<(), Violation> {
    // Mirrors chitchat's decoder: a key-value raises the max version, a
    // `SetMaxVersion` overwrites it (it does not take the maximum: this is the op that
    // can lower the max version below the keys already read).
    let mut max_version = 0;
    let mut top_key: Option<&KeyValue> = None;
    for op in &part.ops {
        match op {
            NodeOp::KeyValue(kv) => {
                max_version = max_version.max(kv.version);
                if top_key.is_none_or(|top| kv.version > top.version) {
                    top_key = Some(kv);
                }
            }
            NodeOp::SetMaxVersion(max) => max_version = *max,
        }
    }
    // Chitchat asserts, after applying, that the node's max version is at least every
    // key version it applied (state.rs, `NodeState::apply_delta`).
    if let Some(top) = top_key
        && top.version > max_version
    {
        return Err(Violation::VersionAboveMax {
            node: part.id.node_id.to_string(),
            key: top.key.clone(),
            key_version: top.version,
            max_version,
        });
    }
    // A node's own state is the newest there is: chitchat never sends it back to its
    // owner (a restart takes a new generation, hence a new id). Applied, it would let a
    // peer set the owner's versions, and the owner's next write (`max_version + 1`,
    // then `assert!(version > max_version)`) would panic.
    if receiver.is_some_and(|receiver| part.id == *receiver) {
        return Err(Violation::AboutReceiver { max_version });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::transport::wire::header;
    use crate::transport::wire::{
        BLOCK_COMPRESSED, BLOCK_END, BLOCK_RAW, OP_KEY_VALUE, OP_NODE, OP_SET_MAX_VERSION,
        TYPE_ACK, TYPE_BAD_CLUSTER, TYPE_SYN_ACK,
    };
    use chitchat::{ChitchatMessage, Deserializable, Serializable};

    fn node(name: &str) -> ChitchatId {
        ChitchatId::new(name, 1, "127.0.0.2:7000".parse().unwrap())
    }

    /// Delta ops in chitchat's wire form.
    enum Op {
        Node(ChitchatId),
        Kv(&'static str, u64),
        SetMax(u64),
    }

    fn ops_bytes(ops: &[Op]) -> Vec<u8> {
        let mut out = Vec::new();
        for op in ops {
            match op {
                Op::Node(id) => {
                    out.push(OP_NODE);
                    id.serialize(&mut out);
                    0u64.serialize(&mut out);
                    0u64.serialize(&mut out);
                }
                Op::Kv(key, version) => {
                    out.push(OP_KEY_VALUE);
                    key.to_string().serialize(&mut out);
                    "v".to_string().serialize(&mut out);
                    version.serialize(&mut out);
                    out.push(0);
                }
                Op::SetMax(max) => {
                    out.push(OP_SET_MAX_VERSION);
                    max.serialize(&mut out);
                }
            }
        }
        out
    }

    fn blocks(plain: &[u8], compress: bool) -> Vec<u8> {
        let mut out = Vec::new();
        if !plain.is_empty() {
            let body = if compress {
                zstd::bulk::compress(plain, 0).unwrap()
            } else {
                plain.to_vec()
            };
            out.push(if compress {
                BLOCK_COMPRESSED
            } else {
                BLOCK_RAW
            });
            (body.len() as u16).serialize(&mut out);
            out.extend(body);
        }
        out.push(BLOCK_END);
        out
    }

    fn ack(ops: &[Op], compress: bool) -> Vec<u8> {
        let mut out = header(TYPE_ACK);
        out.extend(blocks(&ops_bytes(ops), compress));
        out
    }

    /// Every crafted message must be one chitchat's own decoder accepts: the point is
    /// what passes its decoder and then trips its state.
    fn decodes(bytes: &[u8]) -> ChitchatMessage {
        ChitchatMessage::deserialize(&mut &bytes[..]).expect("chitchat decodes it")
    }

    #[test]
    fn a_key_above_a_lowered_max_version_is_refused() {
        for compress in [false, true] {
            let bytes = ack(
                &[Op::Node(node("a")), Op::Kv("k", 10), Op::SetMax(3)],
                compress,
            );
            decodes(&bytes);
            let violation = check(&bytes, Some(&node("me"))).unwrap_err();
            assert_eq!(violation.reason(), "version_above_max");
            assert!(violation.to_string().contains("\"k\" at version 10"));
        }
    }

    #[test]
    fn a_key_above_max_after_a_lowering_and_another_key_is_refused() {
        let bytes = ack(
            &[
                Op::Node(node("a")),
                Op::Kv("k", 10),
                Op::SetMax(1),
                Op::Kv("j", 5),
            ],
            false,
        );
        decodes(&bytes);
        assert_eq!(
            check(&bytes, Some(&node("me"))).unwrap_err().reason(),
            "version_above_max"
        );
    }

    #[test]
    fn only_the_offending_node_matters() {
        let bytes = ack(
            &[
                Op::Node(node("a")),
                Op::Kv("k", 2),
                Op::Node(node("b")),
                Op::Kv("k", 7),
                Op::SetMax(6),
            ],
            false,
        );
        decodes(&bytes);
        let violation = check(&bytes, Some(&node("me"))).unwrap_err();
        assert!(violation.to_string().contains("\"b\""), "{violation}");
    }

    #[test]
    fn deltas_chitchat_writes_pass() {
        // With the bytes of keys and values each carries: one byte of key, one of value.
        let cases: [(&[Op], usize); 4] = [
            (&[], 0),
            (&[Op::Node(node("a")), Op::Kv("k", 1), Op::Kv("l", 4)], 4),
            // An emptied (garbage-collected) node state carries only its max version.
            (&[Op::Node(node("a")), Op::SetMax(9)], 0),
            (
                &[Op::Node(node("a")), Op::Node(node("b")), Op::Kv("k", 3)],
                2,
            ),
        ];
        for (ops, carried) in cases {
            for compress in [false, true] {
                let bytes = ack(ops, compress);
                decodes(&bytes);
                assert_eq!(check(&bytes, Some(&node("me"))), Ok(carried));
            }
        }
    }

    #[test]
    fn a_delta_about_the_receiver_is_refused() {
        let me = node("me");
        let bytes = ack(&[Op::Node(me.clone()), Op::Kv("k", u64::MAX)], false);
        decodes(&bytes);
        assert_eq!(
            check(&bytes, Some(&me)).unwrap_err().reason(),
            "delta_about_receiver"
        );
        // An earlier generation of the same node is another node to chitchat.
        let earlier = ChitchatId::new("me", 0, me.gossip_advertise_addr);
        let bytes = ack(&[Op::Node(earlier), Op::Kv("k", 4)], false);
        assert_eq!(check(&bytes, Some(&me)), Ok(2));
        // Left to the state check, which strips it.
        let bytes = ack(&[Op::Node(me), Op::Kv("k", u64::MAX)], false);
        assert_eq!(check(&bytes, None), Ok(2));
    }

    #[test]
    fn a_syn_ack_is_checked_past_its_digest() {
        let mut bytes = header(TYPE_SYN_ACK);
        1u16.serialize(&mut bytes);
        node("a").serialize(&mut bytes);
        for v in [5u64, 0, 7] {
            v.serialize(&mut bytes);
        }
        bytes.extend(blocks(
            &ops_bytes(&[Op::Node(node("a")), Op::Kv("k", 8), Op::SetMax(2)]),
            true,
        ));
        decodes(&bytes);
        assert_eq!(
            check(&bytes, Some(&node("me"))).unwrap_err().reason(),
            "version_above_max"
        );
    }

    #[test]
    fn a_delta_that_inflates_too_far_is_refused() {
        let plain = vec![OP_SET_MAX_VERSION; usize::from(u16::MAX)];
        let compressed = zstd::bulk::compress(&plain, 19).unwrap();
        let mut bytes = header(TYPE_ACK);
        for _ in 0..(MAX_INFLATED_BYTES / plain.len() + 1) {
            bytes.push(BLOCK_COMPRESSED);
            (compressed.len() as u16).serialize(&mut bytes);
            bytes.extend(&compressed);
        }
        bytes.push(BLOCK_END);
        assert_eq!(check(&bytes, Some(&node("me"))), Err(Violation::Inflated));
    }

    #[test]
    fn syn_and_bad_cluster_carry_nothing_to_check() {
        let syn = crate::transport::frame::syn_for_tests("c");
        let mut bytes = Vec::new();
        syn.serialize(&mut bytes);
        assert_eq!(check(&bytes, Some(&node("me"))), Ok(0));
        assert_eq!(check(&header(TYPE_BAD_CLUSTER), Some(&node("me"))), Ok(0));
    }

    #[test]
    fn truncations_are_malformed_not_panics() {
        let bytes = ack(&[Op::Node(node("a")), Op::Kv("k", 3), Op::SetMax(3)], true);
        for len in 0..bytes.len() {
            let verdict = check(&bytes[..len], Some(&node("me")));
            assert!(
                matches!(verdict, Err(Violation::Malformed(_))),
                "{len}: {verdict:?}"
            );
        }
    }

    proptest::proptest! {
        #[test]
        fn random_bytes_never_panic(tail in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..512)) {
            let mut bytes = header(TYPE_ACK);
            bytes.extend(tail);
            let _ = check(&bytes, Some(&node("me")));
        }
    }
}
