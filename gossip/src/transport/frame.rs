//! The gossip frame: what travels inside one length-prefixed record on a TLS stream.
//!
//! ```text
//! u32 big-endian length (added by the codec) | version: u8 = 1 | sender: ChitchatId | ChitchatMessage
//! u32 big-endian length (added by the codec) | version: u8 = 2 | sender: ChitchatId | pulse
//! ```
//!
//! Pulses (`crate::pulse`) share the connections, the sender header and its checks;
//! what follows the header is theirs to read.
//!
//! The sender's `ChitchatId` is there because chitchat replies to the address `recv()`
//! returns, and over TCP the connection's source port is ephemeral: the receiver hands
//! chitchat the sender's advertised gossip address instead, after checking that the
//! node id matches the sender's certificate.

use bytes::{BufMut, Bytes, BytesMut};
use chitchat::{ChitchatId, ChitchatMessage, Deserializable, Serializable};
use tokio_util::codec::LengthDelimitedCodec;

pub const FRAME_VERSION: u8 = 1;
/// The first byte of a frame that carries a pulse.
pub const PULSE_FRAME: u8 = 2;

/// What a frame carries after its header.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Carried {
    Chitchat,
    Pulse,
}

/// Chitchat keeps its messages under a UDP datagram (65,507 bytes); the sender id adds
/// at most a few hundred. Anything much larger is not a message we would send, and
/// refusing it early caps what one frame can make a receiver allocate.
pub const DEFAULT_MAX_FRAME_BYTES: usize = 80 * 1024;

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum FrameError {
    #[error("frame is empty")]
    Empty,
    #[error("unsupported frame version {0} (this node speaks {FRAME_VERSION})")]
    Version(u8),
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

/// Encodes a frame body (without the length prefix), refusing one over `limit`.
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

/// Encodes a pulse frame body (without the length prefix), refusing one over `limit`.
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

/// Decodes a frame body; every byte must belong to the frame.
pub fn decode(body: &[u8]) -> Result<Frame, FrameError> {
    let (carried, sender, message) = split(body)?;
    if carried != Carried::Chitchat {
        return Err(FrameError::Version(PULSE_FRAME));
    }
    let message = decode_message(message)?;
    Ok(Frame { sender, message })
}

/// Reads a frame's header and returns what it carries and its sender, with the rest
/// still encoded: the receiver checks who speaks before it decodes what is said.
pub fn split(body: &[u8]) -> Result<(Carried, ChitchatId, &[u8]), FrameError> {
    let (&version, mut rest) = body.split_first().ok_or(FrameError::Empty)?;
    let carried = match version {
        FRAME_VERSION => Carried::Chitchat,
        PULSE_FRAME => Carried::Pulse,
        other => return Err(FrameError::Version(other)),
    };
    let sender =
        ChitchatId::deserialize(&mut rest).map_err(|e| FrameError::Header(e.to_string()))?;
    Ok((carried, sender, rest))
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
        assert_eq!(decode(&body), Err(FrameError::Version(9)));
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
        let (carried, from, rest) = split(&body).unwrap();
        assert_eq!(
            (carried, from, rest),
            (Carried::Pulse, sender(), &[1u8, 2, 3][..])
        );
        assert_eq!(decode(&body), Err(FrameError::Version(PULSE_FRAME)));
        assert!(matches!(
            encode_pulse(&sender(), &[0; 64], 16),
            Err(FrameError::TooLarge { limit: 16, .. })
        ));
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
