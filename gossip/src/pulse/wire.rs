//! A pulse on the wire: heartbeats, two bytes each.
//!
//! ```text
//! by position: kind | 0 | state: u64 | table: u64 | n: u16 | bitmap: ⌈n/8⌉ bytes | beat: u16 per bit set
//! keyed:       kind | 1 | state: u64 | n: u16 | n × (key: u32, beat: u16)
//! kind: 1 = push, 2 = reply
//! ```
//!
//! `state` identifies what the sender holds of its clique's state (every node's max
//! version): a receiver holding something else knows an exchange would bring news one
//! way or the other.
//!
//! Heartbeats travel as their low 16 bits: a receiver holds the full count and adds
//! the (signed) difference, so a beat older than the one held is recognised as such for
//! as long as the two are less than 32,768 rounds apart (over an hour at 150 ms). By
//! position, the bits name places in the sender's table of n nodes, identified by the
//! table's hash: peers holding the same table (every node, once gossip has settled)
//! name no node at all. Keyed, each beat carries a 32-bit key of its node, for peers
//! whose tables differ. Big-endian throughout.
//!
//! Versions: the above is version 1, which every release reads. A newer version wraps
//! it, `3 | version: u8 | extensions length: u16 | extensions | pulse as above`: an
//! older reader skips the extensions and reads the pulse inside, and ignores (does not
//! refuse) one of a kind or form it does not know. Releases before this one refuse the
//! wrapper: a release writes it only once every node reads it (this one does), and this
//! one writes version 1.

use bytes::{Buf, BufMut};

use crate::version::WireVersion;

/// The most beats one pulse may carry: a 576-node clique with room to spare, and a
/// bound on what one frame makes a receiver do.
pub const MAX_BEATS: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Sent every round to a peer, which replies.
    Push,
    /// The answer to a push: what the replier holds newer than the push said.
    Reply,
}

/// What a pulse carries.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Beats {
    /// Beats at some positions of the sender's table of `len` nodes.
    Positions {
        table: u64,
        len: usize,
        positions: Vec<usize>,
        beats: Vec<u16>,
    },
    /// Beats by node key.
    Keyed(Vec<(u32, u16)>),
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Pulse {
    pub kind: Kind,
    /// A hash of the sender's clique state: each node's max version.
    pub state: u64,
    pub beats: Beats,
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PulseError {
    #[error("pulse is truncated")]
    Truncated,
    #[error("unknown pulse kind {0}")]
    Kind(u8),
    #[error("unknown pulse form {0}")]
    Form(u8),
    #[error("pulse carries {0} beats, more than {MAX_BEATS}")]
    TooMany(usize),
    #[error("{0} unexpected bytes after the pulse")]
    Trailing(usize),
}

impl PulseError {
    /// The metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            Self::TooMany(_) => "oversized",
            _ => "malformed",
        }
    }
}

const FORM_POSITIONS: u8 = 0;
const FORM_KEYED: u8 = 1;

/// The pulse version this node speaks.
pub const PULSE_VERSION: u8 = crate::version::WIRE_VERSION;
/// The first byte of a pulse of version 2 or later (where version 1 has its kind).
const VERSIONED: u8 = 3;

/// A pulse as read, of any version.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Read {
    pub version: u8,
    /// `None` for a newer version's pulse of a kind or form this version does not know.
    pub pulse: Option<Pulse>,
}

impl Pulse {
    pub fn encode(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(16 + self.beat_count() * 6);
        out.put_u8(match self.kind {
            Kind::Push => 1,
            Kind::Reply => 2,
        });
        match &self.beats {
            Beats::Positions {
                table,
                len,
                positions,
                beats,
            } => {
                out.put_u8(FORM_POSITIONS);
                out.put_u64(self.state);
                out.put_u64(*table);
                out.put_u16(*len as u16);
                let mut bitmap = vec![0u8; len.div_ceil(8)];
                for &position in positions {
                    bitmap[position / 8] |= 1 << (position % 8);
                }
                out.extend_from_slice(&bitmap);
                for beat in beats {
                    out.put_u16(*beat);
                }
            }
            Beats::Keyed(beats) => {
                out.put_u8(FORM_KEYED);
                out.put_u64(self.state);
                out.put_u16(beats.len() as u16);
                for (key, beat) in beats {
                    out.put_u32(*key);
                    out.put_u16(*beat);
                }
            }
        }
        out
    }

    /// The pulse as `wire` writes it.
    pub fn encode_as(&self, wire: WireVersion) -> Vec<u8> {
        if wire == WireVersion::Current {
            return self.encode();
        }
        let extension = wire.extension();
        let inner = self.encode();
        let mut out = Vec::with_capacity(4 + extension.len() + inner.len());
        out.put_u8(VERSIONED);
        out.put_u8(wire.version());
        out.put_u16(extension.len() as u16);
        out.extend_from_slice(extension);
        out.extend_from_slice(&inner);
        out
    }

    /// Reads a pulse of any version: a newer one as far as this version understands it.
    pub fn read(bytes: &[u8]) -> Result<Read, PulseError> {
        let [VERSIONED, version, len_hi, len_lo, rest @ ..] = bytes else {
            return Self::decode(bytes).map(|pulse| Read {
                version: PULSE_VERSION,
                pulse: Some(pulse),
            });
        };
        let len = usize::from(u16::from_be_bytes([*len_hi, *len_lo]));
        let inner = rest.get(len..).ok_or(PulseError::Truncated)?;
        let pulse = match Self::decode(inner) {
            Ok(pulse) => Some(pulse),
            Err(PulseError::Kind(_) | PulseError::Form(_)) if *version > PULSE_VERSION => None,
            Err(error) => return Err(error),
        };
        Ok(Read {
            version: *version,
            pulse,
        })
    }

    fn beat_count(&self) -> usize {
        match &self.beats {
            Beats::Positions { beats, .. } => beats.len(),
            Beats::Keyed(beats) => beats.len(),
        }
    }

    pub fn decode(mut bytes: &[u8]) -> Result<Self, PulseError> {
        let need = |bytes: &[u8], n: usize| {
            if bytes.remaining() < n {
                Err(PulseError::Truncated)
            } else {
                Ok(())
            }
        };
        need(bytes, 2)?;
        let kind = match bytes.get_u8() {
            1 => Kind::Push,
            2 => Kind::Reply,
            other => return Err(PulseError::Kind(other)),
        };
        let form = bytes.get_u8();
        need(bytes, 8)?;
        let state = bytes.get_u64();
        let beats = match form {
            FORM_POSITIONS => {
                need(bytes, 10)?;
                let table = bytes.get_u64();
                let len = usize::from(bytes.get_u16());
                if len > MAX_BEATS {
                    return Err(PulseError::TooMany(len));
                }
                need(bytes, len.div_ceil(8))?;
                let (bitmap, rest) = bytes.split_at(len.div_ceil(8));
                let positions: Vec<usize> = (0..len)
                    .filter(|&p| bitmap[p / 8] & (1 << (p % 8)) != 0)
                    .collect();
                bytes = rest;
                need(bytes, positions.len() * 2)?;
                let beats = positions.iter().map(|_| bytes.get_u16()).collect();
                Beats::Positions {
                    table,
                    len,
                    positions,
                    beats,
                }
            }
            FORM_KEYED => {
                need(bytes, 2)?;
                let len = usize::from(bytes.get_u16());
                if len > MAX_BEATS {
                    return Err(PulseError::TooMany(len));
                }
                need(bytes, len * 6)?;
                Beats::Keyed(
                    (0..len)
                        .map(|_| (bytes.get_u32(), bytes.get_u16()))
                        .collect(),
                )
            }
            other => return Err(PulseError::Form(other)),
        };
        if !bytes.is_empty() {
            return Err(PulseError::Trailing(bytes.len()));
        }
        Ok(Self { kind, state, beats })
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn round_trip(pulse: Pulse) {
        let bytes = pulse.encode();
        assert_eq!(Pulse::decode(&bytes), Ok(pulse));
    }

    #[test]
    fn each_form_reads_back_as_written() {
        round_trip(Pulse {
            kind: Kind::Push,
            state: 42,
            beats: Beats::Positions {
                table: 0xfeed,
                len: 3,
                positions: vec![0, 1, 2],
                beats: vec![1, 2, 65535],
            },
        });
        round_trip(Pulse {
            kind: Kind::Reply,
            state: 0,
            beats: Beats::Positions {
                table: 7,
                len: 11,
                positions: vec![0, 9, 10],
                beats: vec![5, 6, 7],
            },
        });
        round_trip(Pulse {
            kind: Kind::Reply,
            state: u64::MAX,
            beats: Beats::Keyed(vec![(1, 2), (u32::MAX, 0)]),
        });
    }

    #[test]
    fn a_push_by_position_costs_two_bytes_and_a_bit_a_node() {
        let pulse = Pulse {
            kind: Kind::Push,
            state: 2,
            beats: Beats::Positions {
                table: 1,
                len: 144,
                positions: (0..144).collect(),
                beats: vec![0; 144],
            },
        };
        assert_eq!(pulse.encode().len(), 20 + 18 + 288);
    }

    #[test]
    fn bad_pulses_are_refused_with_a_reason() {
        assert_eq!(Pulse::decode(&[]), Err(PulseError::Truncated));
        assert_eq!(Pulse::decode(&[9, 0]), Err(PulseError::Kind(9)));
        assert_eq!(
            Pulse::decode(&[1, 7, 0, 0, 0, 0, 0, 0, 0, 0]),
            Err(PulseError::Form(7))
        );
        assert_eq!(Pulse::decode(&[1, 0, 0]), Err(PulseError::Truncated));
        let mut too_many = vec![1, 1, 0, 0, 0, 0, 0, 0, 0, 0];
        too_many.extend_from_slice(&(MAX_BEATS as u16 + 1).to_be_bytes());
        assert_eq!(
            Pulse::decode(&too_many),
            Err(PulseError::TooMany(MAX_BEATS + 1))
        );
        assert_eq!(PulseError::TooMany(0).reason(), "oversized");
        let mut trailing = Pulse {
            kind: Kind::Push,
            state: 0,
            beats: Beats::Keyed(vec![(1, 1)]),
        }
        .encode();
        trailing.push(0);
        assert_eq!(Pulse::decode(&trailing), Err(PulseError::Trailing(1)));
        // A count that promises more beats than follow.
        let mut short = vec![1, 0];
        short.extend_from_slice(&9u64.to_be_bytes());
        short.extend_from_slice(&5u64.to_be_bytes());
        short.extend_from_slice(&3u16.to_be_bytes());
        short.extend_from_slice(&[0b111, 0, 1]);
        assert_eq!(Pulse::decode(&short), Err(PulseError::Truncated));
    }

    #[test]
    fn a_newer_version_is_read_as_far_as_this_one_understands_it() {
        let pulse = Pulse {
            kind: Kind::Reply,
            state: 9,
            beats: Beats::Keyed(vec![(4, 5)]),
        };
        assert_eq!(
            Pulse::read(&pulse.encode()),
            Ok(Read {
                version: PULSE_VERSION,
                pulse: Some(pulse.clone())
            })
        );
        let next = pulse.encode_as(WireVersion::Next);
        assert_eq!(
            Pulse::read(&next),
            Ok(Read {
                version: PULSE_VERSION + 1,
                pulse: Some(pulse.clone())
            })
        );
        // A kind of pulse the next version added: ignored, not refused.
        let mut new_kind = next.clone();
        let inner = new_kind.len() - pulse.encode().len();
        new_kind[inner] = 7;
        assert_eq!(
            Pulse::read(&new_kind),
            Ok(Read {
                version: PULSE_VERSION + 1,
                pulse: None
            })
        );
        // Damage is damage whatever the version.
        assert_eq!(
            Pulse::read(&next[..next.len() - 1]),
            Err(PulseError::Truncated)
        );
        assert_eq!(Pulse::read(&next[..6]), Err(PulseError::Truncated));
        let mut of_ours = new_kind;
        of_ours[1] = PULSE_VERSION;
        assert_eq!(Pulse::read(&of_ours), Err(PulseError::Kind(7)));
    }

    #[test]
    fn the_next_version_is_counted_and_logged_once_by_the_reader() {
        let recorder = metrics_util::debugging::DebuggingRecorder::new();
        let snapshotter = recorder.snapshotter();
        let newer = crate::version::NewerVersions::default();
        let next = Pulse {
            kind: Kind::Push,
            state: 1,
            beats: Beats::Keyed(Vec::new()),
        }
        .encode_as(WireVersion::Next);
        metrics::with_local_recorder(&recorder, || {
            let read = Pulse::read(&next).unwrap();
            assert!(read.pulse.is_some());
            assert!(newer.note("pulse", "127.0.0.2:7000", u64::from(read.version), 1, 1));
        });
        assert_eq!(
            crate::metrics::counted(&snapshotter, crate::metrics::NEWER_VERSION, "pulse"),
            1
        );
    }

    proptest! {
        #[test]
        fn arbitrary_bytes_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = Pulse::decode(&bytes);
            let _ = Pulse::read(&bytes);
        }

        #[test]
        fn replies_read_back(len in 1usize..300, seed in any::<u64>()) {
            let positions: Vec<usize> = (0..len).filter(|p| (seed >> (p % 64)) & 1 == 1).collect();
            let beats = positions.iter().map(|&p| p as u16).collect();
            round_trip(Pulse { kind: Kind::Reply, state: !seed, beats: Beats::Positions { table: seed, len, positions, beats } });
        }
    }
}
