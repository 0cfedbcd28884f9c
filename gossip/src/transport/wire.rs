//! Chitchat 0.11.2's message wire form, read and written here because chitchat keeps
//! its message parts private: the guard and the signed-state check must see a delta
//! node by node before chitchat applies it, and the state check hands chitchat a
//! delta with the refused nodes taken out.
//!
//! ```text
//! message = magic: u16 LE | protocol: u8 = 0 | kind: u8 | body
//! Syn     = cluster id: str | digest
//! SynAck  = digest | delta
//! Ack     = delta
//! digest  = count: u16 | count × (ChitchatId | heartbeat u64 | last gc u64 | max u64)
//! delta   = blocks of an op stream (zstd or raw, up to 64 KiB each), then an end block
//! op      = Node(ChitchatId, last gc u64, from version excluded u64)
//!         | KeyValue(key str, value str, version u64, status u8)
//!         | SetMaxVersion(u64)
//! ```

use std::cell::RefCell;

use chitchat::{ChitchatId, Deserializable, Serializable};

use super::violation::{MAX_INFLATED_BYTES, Violation};

pub const MAGIC: u16 = 45_139;
pub const PROTOCOL_V0: u8 = 0;
pub const TYPE_SYN: u8 = 0;
pub const TYPE_SYN_ACK: u8 = 1;
pub const TYPE_ACK: u8 = 2;
pub const TYPE_BAD_CLUSTER: u8 = 3;

pub const BLOCK_END: u8 = 0;
pub const BLOCK_COMPRESSED: u8 = 1;
pub const BLOCK_RAW: u8 = 2;

pub const OP_NODE: u8 = 0;
pub const OP_KEY_VALUE: u8 = 1;
pub const OP_SET_MAX_VERSION: u8 = 2;

/// A key-value's status byte: set, deleted (a tombstone, value emptied), or set and
/// to be deleted after the grace period.
pub const STATUS_SET: u8 = 0;
pub const STATUS_DELETED: u8 = 1;
pub const STATUS_DELETE_AFTER_TTL: u8 = 2;

/// One key-value mutation of a delta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    pub key: String,
    pub value: String,
    pub version: u64,
    pub status: u8,
}

/// What follows a node header, in order: chitchat's decoder reads them in order, and
/// a `SetMaxVersion` overwrites the max version the key-values before it raised.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NodeOp {
    KeyValue(KeyValue),
    SetMaxVersion(u64),
}

/// One node's part of a delta.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodePart {
    pub id: ChitchatId,
    pub last_gc_version: u64,
    pub from_version_excluded: u64,
    pub ops: Vec<NodeOp>,
}

impl NodePart {
    pub fn key_values(&self) -> impl Iterator<Item = &KeyValue> {
        self.ops.iter().filter_map(|op| match op {
            NodeOp::KeyValue(kv) => Some(kv),
            NodeOp::SetMaxVersion(_) => None,
        })
    }
}

/// A message split where its delta starts.
#[derive(Debug)]
pub struct Split<'a> {
    /// Everything before the delta (header and, for a SynAck, the digest); the whole
    /// message when it carries no delta.
    pub head: &'a [u8],
    /// The delta's bytes, for a SynAck or an Ack.
    pub delta: Option<&'a [u8]>,
}

pub fn split(message: &[u8]) -> Result<Split<'_>, Violation> {
    let mut buf = message;
    let magic = u16::from_le_bytes(take::<2>(&mut buf)?);
    let [protocol] = take::<1>(&mut buf)?;
    let [kind] = take::<1>(&mut buf)?;
    if magic != MAGIC || protocol != PROTOCOL_V0 {
        return Err(malformed("not a chitchat v0 message"));
    }
    match kind {
        TYPE_SYN | TYPE_BAD_CLUSTER => Ok(Split {
            head: message,
            delta: None,
        }),
        TYPE_SYN_ACK => {
            skip_digest(&mut buf)?;
            let head_len = message.len() - buf.len();
            Ok(Split {
                head: &message[..head_len],
                delta: Some(buf),
            })
        }
        TYPE_ACK => Ok(Split {
            head: &message[..4],
            delta: Some(buf),
        }),
        other => Err(malformed(format!("unknown message type {other}"))),
    }
}

/// A message's first bytes: magic, protocol and kind.
pub fn header(kind: u8) -> Vec<u8> {
    let mut out = MAGIC.to_le_bytes().to_vec();
    out.extend([PROTOCOL_V0, kind]);
    out
}

/// Reads a delta's node parts. Every byte must belong to the delta.
pub fn parse_delta(mut buf: &[u8]) -> Result<Vec<NodePart>, Violation> {
    let inflated = inflate(&mut buf)?;
    if !buf.is_empty() {
        return Err(malformed(format!(
            "{} unexpected bytes after the delta",
            buf.len()
        )));
    }
    let mut ops = &inflated[..];
    let mut parts: Vec<NodePart> = Vec::new();
    while !ops.is_empty() {
        let [op] = take::<1>(&mut ops)?;
        match op {
            OP_NODE => parts.push(NodePart {
                id: read(&mut ops)?,
                last_gc_version: read(&mut ops)?,
                from_version_excluded: read(&mut ops)?,
                ops: Vec::new(),
            }),
            OP_KEY_VALUE => {
                let kv = KeyValue {
                    key: read(&mut ops)?,
                    value: read(&mut ops)?,
                    version: read(&mut ops)?,
                    status: take::<1>(&mut ops)?[0],
                };
                parts
                    .last_mut()
                    .ok_or_else(|| malformed("key-value before any node"))?
                    .ops
                    .push(NodeOp::KeyValue(kv));
            }
            OP_SET_MAX_VERSION => {
                let max_version: u64 = read(&mut ops)?;
                parts
                    .last_mut()
                    .ok_or_else(|| malformed("max version before any node"))?
                    .ops
                    .push(NodeOp::SetMaxVersion(max_version));
            }
            other => return Err(malformed(format!("unknown delta op {other}"))),
        }
    }
    Ok(parts)
}

/// Writes node parts as a delta chitchat decodes: raw blocks, since the message is
/// handed over in memory and never travels again in this form.
pub fn encode_delta(parts: &[NodePart]) -> Vec<u8> {
    let mut plain = Vec::new();
    for part in parts {
        plain.push(OP_NODE);
        part.id.serialize(&mut plain);
        part.last_gc_version.serialize(&mut plain);
        part.from_version_excluded.serialize(&mut plain);
        for op in &part.ops {
            match op {
                NodeOp::KeyValue(kv) => {
                    plain.push(OP_KEY_VALUE);
                    kv.key.serialize(&mut plain);
                    kv.value.serialize(&mut plain);
                    kv.version.serialize(&mut plain);
                    plain.push(kv.status);
                }
                NodeOp::SetMaxVersion(max) => {
                    plain.push(OP_SET_MAX_VERSION);
                    max.serialize(&mut plain);
                }
            }
        }
    }
    let mut out = Vec::with_capacity(plain.len() + plain.len() / usize::from(u16::MAX) * 3 + 4);
    for block in plain.chunks(usize::from(u16::MAX)) {
        out.push(BLOCK_RAW);
        (block.len() as u16).serialize(&mut out);
        out.extend_from_slice(block);
    }
    out.push(BLOCK_END);
    out
}

pub fn malformed(detail: impl Into<String>) -> Violation {
    Violation::Malformed(detail.into())
}

fn take<const N: usize>(buf: &mut &[u8]) -> Result<[u8; N], Violation> {
    let (head, rest) = buf
        .split_first_chunk::<N>()
        .ok_or_else(|| malformed("message ends early"))?;
    *buf = rest;
    Ok(*head)
}

fn read<T: Deserializable>(buf: &mut &[u8]) -> Result<T, Violation> {
    T::deserialize(buf).map_err(|error| malformed(error.to_string()))
}

fn skip_digest(buf: &mut &[u8]) -> Result<(), Violation> {
    let nodes: u16 = read(buf)?;
    for _ in 0..nodes {
        let _: ChitchatId = read(buf)?;
        // heartbeat, last GC version, max version
        for _ in 0..3 {
            let _: u64 = read(buf)?;
        }
    }
    Ok(())
}

thread_local! {
    /// A zstd context and a block's buffer per thread rather than per block: the
    /// context costs ~160 KB to make, the buffer 64 KiB to zero, and every frame of
    /// every peer carries a block (a rack's daemon reads ~100 a second). Each
    /// decompression starts a new frame, so no state leaks between them.
    static INFLATER: RefCell<Option<Inflater>> = const { RefCell::new(None) };
}

struct Inflater {
    decompressor: zstd::bulk::Decompressor<'static>,
    block: Box<[u8]>,
}

/// Decompresses one block and appends it to `inflated`, unless that would pass
/// [`MAX_INFLATED_BYTES`].
fn inflate_block(body: &[u8], inflated: &mut Vec<u8>) -> Result<(), Violation> {
    INFLATER.with_borrow_mut(|slot| {
        let inflater = match slot {
            Some(inflater) => inflater,
            None => slot.insert(Inflater {
                decompressor: zstd::bulk::Decompressor::new()
                    .map_err(|error| malformed(format!("zstd context: {error}")))?,
                block: vec![0u8; usize::from(u16::MAX)].into_boxed_slice(),
            }),
        };
        let n = inflater
            .decompressor
            .decompress_to_buffer(body, &mut inflater.block[..])
            .map_err(|error| malformed(format!("delta block: {error}")))?;
        append(inflated, &inflater.block[..n])
    })
}

fn append(inflated: &mut Vec<u8>, plain: &[u8]) -> Result<(), Violation> {
    if inflated.len() + plain.len() > MAX_INFLATED_BYTES {
        return Err(Violation::Inflated);
    }
    inflated.extend_from_slice(plain);
    Ok(())
}

/// Inflates the delta's block stream, bounded by [`MAX_INFLATED_BYTES`].
fn inflate(buf: &mut &[u8]) -> Result<Vec<u8>, Violation> {
    let mut inflated = Vec::new();
    loop {
        let [kind] = take::<1>(buf)?;
        if kind == BLOCK_END {
            return Ok(inflated);
        }
        let len = usize::from(u16::from_le_bytes(take::<2>(buf)?));
        let body = buf
            .get(..len)
            .ok_or_else(|| malformed("delta block ends early"))?;
        *buf = &buf[len..];
        match kind {
            BLOCK_COMPRESSED => inflate_block(body, &mut inflated)?,
            BLOCK_RAW => append(&mut inflated, body)?,
            other => return Err(malformed(format!("unknown delta block type {other}"))),
        }
    }
}

#[cfg(test)]
pub(crate) mod testing {
    //! Builders of raw messages, for tests that must craft what chitchat would not.
    use super::*;

    pub fn header(kind: u8) -> Vec<u8> {
        let mut out = MAGIC.to_le_bytes().to_vec();
        out.extend([PROTOCOL_V0, kind]);
        out
    }

    pub fn ack(parts: &[NodePart]) -> Vec<u8> {
        let mut out = header(TYPE_ACK);
        out.extend(encode_delta(parts));
        out
    }

    /// An Ack exactly as chitchat's own writer encodes it (one block, zstd at level 0
    /// when that is smaller), so that chitchat can encode the decoded message again.
    pub fn ack_as_chitchat_writes(parts: &[NodePart]) -> Vec<u8> {
        let raw = encode_delta(parts);
        // One raw block: its type, its length, the ops, the end.
        let plain = &raw[3..raw.len() - 1];
        let mut out = header(TYPE_ACK);
        match zstd::bulk::compress(plain, 0) {
            Ok(compressed) if compressed.len() < plain.len() => out.extend(compressed_block(plain)),
            _ => out.extend_from_slice(&raw[..raw.len() - 1]),
        }
        out.push(BLOCK_END);
        out
    }

    pub fn compressed_block(plain: &[u8]) -> Vec<u8> {
        let body = zstd::bulk::compress(plain, 0).unwrap();
        let mut out = vec![BLOCK_COMPRESSED];
        (body.len() as u16).serialize(&mut out);
        out.extend(body);
        out
    }
}

#[cfg(test)]
mod tests {
    use super::testing::{ack, compressed_block};
    use super::*;
    use chitchat::ChitchatMessage;

    fn part(name: &str, kvs: &[(&str, u64)], max: Option<u64>) -> NodePart {
        let mut ops: Vec<NodeOp> = kvs
            .iter()
            .map(|(key, version)| {
                NodeOp::KeyValue(KeyValue {
                    key: key.to_string(),
                    value: format!("value of {key}"),
                    version: *version,
                    status: STATUS_SET,
                })
            })
            .collect();
        ops.extend(max.map(NodeOp::SetMaxVersion));
        NodePart {
            id: ChitchatId::new(name, 3, "127.0.0.9:7000".parse().unwrap()),
            last_gc_version: 1,
            from_version_excluded: 0,
            ops,
        }
    }

    #[test]
    fn what_is_encoded_parses_back_and_chitchat_decodes_it() {
        let parts = vec![
            part("a", &[("k", 2), ("l", 5)], None),
            part("b", &[], Some(9)),
        ];
        let bytes = ack(&parts);
        ChitchatMessage::deserialize(&mut &bytes[..]).expect("chitchat decodes it");
        let split = split(&bytes).unwrap();
        assert_eq!(split.head, &header(TYPE_ACK)[..]);
        assert_eq!(parse_delta(split.delta.unwrap()).unwrap(), parts);
    }

    #[test]
    fn a_delta_larger_than_one_block_spans_blocks() {
        let keys: Vec<(String, u64)> = (1..=3000).map(|i| (format!("key-{i:05}"), i)).collect();
        let kvs: Vec<(&str, u64)> = keys.iter().map(|(k, v)| (k.as_str(), *v)).collect();
        let parts = vec![part("a", &kvs, None)];
        let delta = encode_delta(&parts);
        assert!(delta.len() > usize::from(u16::MAX));
        assert_eq!(parse_delta(&delta).unwrap(), parts);
    }

    #[test]
    fn compressed_blocks_are_read_too() {
        let mut plain = Vec::new();
        plain.push(OP_NODE);
        ChitchatId::new("a", 1, "127.0.0.9:7000".parse().unwrap()).serialize(&mut plain);
        0u64.serialize(&mut plain);
        0u64.serialize(&mut plain);
        let mut delta = compressed_block(&plain);
        delta.push(BLOCK_END);
        assert_eq!(parse_delta(&delta).unwrap().len(), 1);

        // The thread's zstd context, after a block it could not read, reads the next.
        let mut corrupt = delta.clone();
        let body = corrupt.len() - 2;
        corrupt[body] ^= 0xff;
        corrupt[4] ^= 0xff;
        assert!(parse_delta(&corrupt).is_err());
        assert_eq!(parse_delta(&delta).unwrap().len(), 1);
    }

    #[test]
    fn bytes_after_the_delta_are_malformed() {
        let mut delta = encode_delta(&[part("a", &[("k", 1)], None)]);
        delta.push(7);
        assert!(matches!(parse_delta(&delta), Err(Violation::Malformed(_))));
    }
}
