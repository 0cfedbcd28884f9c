//! The gossip frame: what travels inside one length-prefixed record on a TLS stream.
//!
//! ```text
//! version 1:  u32 big-endian length (added by the codec) | 1 | sender: ChitchatId | ChitchatMessage
//!             u32 big-endian length (added by the codec) | 2 | sender: ChitchatId | pulse
//! version ≥ 2: u32 length | 3 | version: u8 | kind: u8 (1 message, 2 pulse)
//!             | extensions length: u16 BE | extensions | sender: ChitchatId | body
//! ```
//!
//! Pulses (`crate::pulse`) share the connections, the sender header and its checks;
//! what follows the header is theirs to read.
//!
//! The sender's `ChitchatId` is there because chitchat replies to the address `recv()`
//! returns, and over TCP the connection's source port is ephemeral: the receiver hands
//! chitchat the sender's advertised gossip address instead, after checking that the
//! node id matches the sender's certificate.
//!
//! Versions: version 1 is written in its own form, which every release reads. A newer
//! version may add header fields in the extensions, which an older reader skips, and
//! kinds of frame, which an older reader skips whole (the connection stays open); what
//! follows the sender is read as version 1 reads it, so changing that takes a new kind.
//! Releases before this one refuse the versioned form: a release writes it only once
//! every node reads it (this one does), and this one writes version 1.

use bytes::{BufMut, Bytes, BytesMut};
use chitchat::{ChitchatId, ChitchatMessage, Deserializable, Serializable};
use tokio_util::codec::LengthDelimitedCodec;

use crate::version::WireVersion;

/// The frame version this node speaks; a version-1 frame of a chitchat message starts
/// with it.
pub const FRAME_VERSION: u8 = crate::version::WIRE_VERSION;
/// The first byte of a version-1 frame that carries a pulse.
pub const PULSE_FRAME: u8 = 2;
/// The first byte of a frame of version 2 or later.
pub const VERSIONED_FRAME: u8 = 3;

const KIND_MESSAGE: u8 = 1;
const KIND_PULSE: u8 = 2;

/// What a frame carries after its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    Chitchat,
    Pulse,
    /// A kind of frame of a newer version that this node does not know: skipped.
    Unknown(u8),
}

/// A frame's header, read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    pub version: u8,
    pub carried: Carried,
    pub sender: ChitchatId,
}

/// Chitchat keeps its messages under a UDP datagram (65,507 bytes); the sender id adds
/// at most a few hundred. Anything much larger is not a message we would send, and
/// refusing it early caps what one frame can make a receiver allocate.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 80 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame is empty")]
    Empty,
    #[error("unknown frame type {0}")]
    Type(u8),
    #[error("frame version 0 does not exist")]
    VersionZero,
    #[error("unknown kind {kind} of a version-{version} frame")]
    Kind { version: u8, kind: u8 },
    #[error("a pulse frame is not a gossip message")]
    NotAMessage,
    #[error("frame header is malformed: {0}")]
    Header(String),
    #[error("gossip message is malformed: {0}")]
    Message(String),
    #[error("{0} unexpected bytes after the gossip message")]
    Trailing(usize),
    #[error("frame of {size} bytes exceeds the {limit}-byte limit")]
    TooLarge { size: usize, limit: usize },
}

impl FrameError {
    /// The metric label for a rejected inbound frame.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooLarge { .. } => "oversized",
            _ => "malformed",
        }
    }
}

/// A decoded frame.
#[derive(Debug, PartialEq, Eq)]
pub struct Frame {
    pub sender: ChitchatId,
    pub message: ChitchatMessage,
}

/// Encodes a version-1 frame body (without the length prefix), refusing one over
/// `limit`.
pub fn encode(
    sender: &ChitchatId,
    message: &ChitchatMessage,
    limit: usize,
) -> Result<Bytes, FrameError> {
    let size = 1 + sender.serialized_len() + message.serialized_len();
    if size > limit {
        return Err(FrameError::TooLarge { size, limit });
    }
    let mut buf = Vec::with_capacity(size);
    buf.put_u8(FRAME_VERSION);
    sender.serialize(&mut buf);
    message.serialize(&mut buf);
    Ok(Bytes::from(buf))
}

/// Encodes a version-1 pulse frame body (without the length prefix), refusing one
/// over `limit`.
pub fn encode_pulse(sender: &ChitchatId, pulse: &[u8], limit: usize) -> Result<Bytes, FrameError> {
    let size = 1 + sender.serialized_len() + pulse.len();
    if size > limit {
        return Err(FrameError::TooLarge { size, limit });
    }
    let mut buf = Vec::with_capacity(size);
    buf.put_u8(PULSE_FRAME);
    sender.serialize(&mut buf);
    buf.put_slice(pulse);
    Ok(Bytes::from(buf))
}

/// Encodes a message as `wire` writes it.
pub fn encode_as(
    wire: WireVersion,
    sender: &ChitchatId,
    message: &ChitchatMessage,
    limit: usize,
) -> Result<Bytes, FrameError> {
    if wire == WireVersion::Current {
        return encode(sender, message, limit);
    }
    let mut body = Vec::with_capacity(message.serialized_len());
    message.serialize(&mut body);
    encode_versioned(
        wire.version(),
        KIND_MESSAGE,
        wire.extension(),
        sender,
        &body,
        limit,
    )
}

/// Encodes a pulse as `wire` writes it.
pub fn encode_pulse_as(
    wire: WireVersion,
    sender: &ChitchatId,
    pulse: &[u8],
    limit: usize,
) -> Result<Bytes, FrameError> {
    if wire == WireVersion::Current {
        return encode_pulse(sender, pulse, limit);
    }
    encode_versioned(
        wire.version(),
        KIND_PULSE,
        wire.extension(),
        sender,
        pulse,
        limit,
    )
}

/// Encodes a frame in the versioned form: `kind` 1 for a message, 2 for a pulse.
pub fn encode_versioned(
    version: u8,
    kind: u8,
    extensions: &[u8],
    sender: &ChitchatId,
    body: &[u8],
    limit: usize,
) -> Result<Bytes, FrameError> {
    let size = 5 + extensions.len() + sender.serialized_len() + body.len();
    if size > limit || extensions.len() > usize::from(u16::MAX) {
        return Err(FrameError::TooLarge { size, limit });
    }
    let mut buf = Vec::with_capacity(size);
    buf.put_u8(VERSIONED_FRAME);
    buf.put_u8(version);
    buf.put_u8(kind);
    buf.put_u16(extensions.len() as u16);
    buf.put_slice(extensions);
    sender.serialize(&mut buf);
    buf.put_slice(body);
    Ok(Bytes::from(buf))
}

/// Decodes a frame body that carries a chitchat message; every byte must belong to
/// the frame.
pub fn decode(body: &[u8]) -> Result<Frame, FrameError> {
    let (header, message) = split(body)?;
    if header.carried != Carried::Chitchat {
        return Err(FrameError::NotAMessage);
    }
    let message = decode_message(message)?;
    Ok(Frame {
        sender: header.sender,
        message,
    })
}

/// Reads a frame's header and returns it, with the rest still encoded: the receiver
/// checks who speaks before it decodes what is said.
pub fn split(body: &[u8]) -> Result<(Header, &[u8]), FrameError> {
    let (&first, mut rest) = body.split_first().ok_or(FrameError::Empty)?;
    let (version, carried) = match first {
        FRAME_VERSION => (FRAME_VERSION, Carried::Chitchat),
        PULSE_FRAME => (FRAME_VERSION, Carried::Pulse),
        VERSIONED_FRAME => {
            let header =
                |what: &str| FrameError::Header(format!("versioned header ends in its {what}"));
            let [version, kind, len_hi, len_lo, after @ ..] = rest else {
                return Err(header("first bytes"));
            };
            let len = usize::from(u16::from_be_bytes([*len_hi, *len_lo]));
            // Extensions of a newer version: nothing this version reads.
            rest = after.get(len..).ok_or_else(|| header("extensions"))?;
            let carried = match (*kind, *version) {
                (_, 0) => return Err(FrameError::VersionZero),
                (KIND_MESSAGE, _) => Carried::Chitchat,
                (KIND_PULSE, _) => Carried::Pulse,
                (kind, version) if version > FRAME_VERSION => Carried::Unknown(kind),
                (kind, version) => return Err(FrameError::Kind { version, kind }),
            };
            (*version, carried)
        }
        other => return Err(FrameError::Type(other)),
    };
    let sender =
        ChitchatId::deserialize(&mut rest).map_err(|e| FrameError::Header(e.to_string()))?;
    Ok((
        Header {
            version,
            carried,
            sender,
        },
        rest,
    ))
}

/// Decodes the message part of a frame; every byte must belong to it.
pub fn decode_message(mut bytes: &[u8]) -> Result<ChitchatMessage, FrameError> {
    let message =
        ChitchatMessage::deserialize(&mut bytes).map_err(|e| FrameError::Message(e.to_string()))?;
    if !bytes.is_empty() {
        return Err(FrameError::Trailing(bytes.len()));
    }
    Ok(message)
}

/// The length-prefix codec both ends use.
pub fn codec(max_frame_bytes: usize) -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .length_field_type::<u32>()
        .max_frame_length(max_frame_bytes)
        .new_codec()
}

/// Encodes a frame with its length prefix, for tests and tools that speak to a
/// listener directly.
pub fn encode_with_prefix(body: &[u8]) -> BytesMut {
    let mut out = BytesMut::with_capacity(4 + body.len());
    out.put_u32(body.len() as u32);
    out.put_slice(body);
    out
}

/// A Syn with an empty digest. Chitchat keeps its message parts private, so it is
/// built the one public way: by decoding its wire form (magic 45139 LE, protocol 0,
/// type Syn, empty digest, cluster id).
#[cfg(test)]
pub(crate) fn syn_for_tests(cluster_id: &str) -> ChitchatMessage {
    let mut bytes = 45_139u16.to_le_bytes().to_vec();
    bytes.extend([0u8, 0u8]);
    0u16.serialize(&mut bytes);
    cluster_id.to_string().serialize(&mut bytes);
    ChitchatMessage::deserialize(&mut &bytes[..]).expect("valid Syn")
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn sender() -> ChitchatId {
        ChitchatId::new("node-a", 7, "127.0.0.2:7946".parse().unwrap())
    }

    fn syn() -> ChitchatMessage {
        syn_for_tests("cluster")
    }

    #[test]
    fn round_trips() {
        let body = encode(&sender(), &syn(), DEFAULT_MAX_FRAME_BYTES).unwrap();
        let frame = decode(&body).unwrap();
        assert_eq!(frame.sender, sender());
        assert_eq!(frame.message, syn());
    }

    #[test]
    fn refuses_oversized_outbound() {
        let err = encode(&sender(), &syn(), 8).unwrap_err();
        assert!(matches!(err, FrameError::TooLarge { limit: 8, .. }));
        assert_eq!(err.reason(), "oversized");
    }

    #[test]
    fn refuses_unknown_version_and_trailing_bytes() {
        let mut body = encode(&sender(), &syn(), DEFAULT_MAX_FRAME_BYTES)
            .unwrap()
            .to_vec();
        body.push(0xff);
        assert_eq!(decode(&body), Err(FrameError::Trailing(1)));
        body[0] = 9;
        assert_eq!(decode(&body), Err(FrameError::Type(9)));
        assert_eq!(decode(&[]), Err(FrameError::Empty));
    }

    #[test]
    fn refuses_every_truncation() {
        let body = encode(&sender(), &syn(), DEFAULT_MAX_FRAME_BYTES).unwrap();
        for len in 0..body.len() {
            assert!(decode(&body[..len]).is_err(), "truncated to {len} accepted");
        }
    }

    #[test]
    fn a_pulse_frame_names_its_sender_and_is_no_chitchat_message() {
        let body = encode_pulse(&sender(), &[1, 2, 3], DEFAULT_MAX_FRAME_BYTES).unwrap();
        let (header, rest) = split(&body).unwrap();
        assert_eq!(
            (header.carried, header.sender, header.version, rest),
            (Carried::Pulse, sender(), FRAME_VERSION, &[1u8, 2, 3][..])
        );
        assert_eq!(decode(&body), Err(FrameError::NotAMessage));
        assert!(matches!(
            encode_pulse(&sender(), &[0; 64], 16),
            Err(FrameError::TooLarge { limit: 16, .. })
        ));
    }

    /// A frame as the next version writes it: a higher version, and extensions.
    fn next_version(kind: u8, body: &[u8]) -> Bytes {
        encode_versioned(
            FRAME_VERSION + 1,
            kind,
            b"a field this version does not know",
            &sender(),
            body,
            DEFAULT_MAX_FRAME_BYTES,
        )
        .unwrap()
    }

    #[test]
    fn a_newer_version_is_read_as_far_as_this_one_understands_it() {
        let mut message = Vec::new();
        syn().serialize(&mut message);
        let body = next_version(KIND_MESSAGE, &message);
        assert_eq!(
            decode(&body),
            Ok(Frame {
                sender: sender(),
                message: syn()
            })
        );
        assert_eq!(split(&body).unwrap().0.version, FRAME_VERSION + 1);
        let pulse = next_version(KIND_PULSE, &[7, 8]);
        let (header, rest) = split(&pulse).unwrap();
        assert_eq!((header.carried, rest), (Carried::Pulse, &[7u8, 8][..]));
        // A kind it does not know, of a newer version, is skipped, not refused.
        let (header, _) = split(&next_version(9, &[1])).unwrap();
        assert_eq!(header.carried, Carried::Unknown(9));
    }

    #[test]
    fn the_next_version_is_counted_and_logged_once_by_the_reader() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let newer = crate::version::NewerVersions::default();
        metrics::with_local_recorder(&recorder, || {
            let body = encode_as(
                WireVersion::Next,
                &sender(),
                &syn(),
                DEFAULT_MAX_FRAME_BYTES,
            )
            .unwrap();
            let (header, _) = split(&body).unwrap();
            assert!(header.version > FRAME_VERSION);
            newer.note(
                "frame",
                &header.sender.node_id,
                u64::from(header.version),
                1,
                1,
            );
        });
        assert_eq!(
            crate::metrics::counted(&snapshotter, crate::metrics::NEWER_VERSION, "frame"),
            1
        );
    }

    #[test]
    fn the_versioned_form_refuses_what_is_not_there_and_version_zero() {
        let body = next_version(KIND_MESSAGE, &[]);
        // Cut in the fixed header or the extensions: malformed, never read past.
        for len in 1..5 + 34 {
            assert!(
                matches!(split(&body[..len]), Err(FrameError::Header(_))),
                "cut at {len}"
            );
        }
        let mut zero = body.to_vec();
        zero[1] = 0;
        assert_eq!(split(&zero).unwrap_err(), FrameError::VersionZero);
        let mut unknown_kind_of_ours = body.to_vec();
        unknown_kind_of_ours[1] = FRAME_VERSION;
        unknown_kind_of_ours[2] = 9;
        assert_eq!(
            split(&unknown_kind_of_ours).unwrap_err(),
            FrameError::Kind {
                version: FRAME_VERSION,
                kind: 9
            }
        );
    }

    proptest! {
        #[test]
        fn random_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode(&body);
        }

        #[test]
        fn random_bytes_after_a_valid_header_never_panic(tail in proptest::collection::vec(any::<u8>(), 0..512)) {
            let mut body = vec![FRAME_VERSION];
            sender().serialize(&mut body);
            body.extend_from_slice(&tail);
            let _ = decode(&body);
        }
    }
}
