//! One journal record: a line `<crc32 of the JSON, 8 hex digits> <JSON>\n`.
//!
//! ```text
//! 5c1d0e9a {"v":2,"boot":"…","op":{"claim":{"claim":{"uid":"…",…},…}}}
//! 0b6f13c2 {"v":2,"boot":"…","op":{"claim_gone":"…"}}
//! 93aa7d01 {"v":2,"boot":"…","op":{"slot":{"domain":"…","slot":3}}}
//! ```
//!
//! Each record carries its own checksum, format and boot id, so that one damaged
//! record costs that record and no other: nothing a record needs is elsewhere in the
//! file. The checksum covers the JSON bytes exactly as stored. The format is read
//! before anything else, since a newer domaind may have changed the rest.

use std::borrow::Cow;

use domaind_actors::model::{DomainRef, DomainUid, Slot};
use domaind_actors::ports::{CheckpointChange, ClaimRecord};
use serde::{Deserialize, Serialize};

/// The record format this domaind writes, and the newest it reads. Format 1 was the
/// whole-file envelope (`legacy`).
pub const FORMAT_VERSION: u32 = 2;

const CHECKSUM_DIGITS: usize = 8;

/// What a record says happened, as the file spells it (the port's
/// [`CheckpointChange`] may be renamed; the file must not change with it).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Op {
    Claim(ClaimRecord),
    ClaimGone(String),
    Slot { domain: DomainUid, slot: Slot },
    SlotGone(DomainUid),
}

impl From<CheckpointChange> for Op {
    fn from(change: CheckpointChange) -> Self {
        match change {
            CheckpointChange::Claim(record) => Self::Claim(record),
            CheckpointChange::ClaimGone(uid) => Self::ClaimGone(uid),
            CheckpointChange::Slot { domain, slot } => Self::Slot { domain, slot },
            CheckpointChange::SlotGone(domain) => Self::SlotGone(domain),
        }
    }
}

impl From<Op> for CheckpointChange {
    fn from(op: Op) -> Self {
        match op {
            Op::Claim(record) => Self::Claim(record),
            Op::ClaimGone(uid) => Self::ClaimGone(uid),
            Op::Slot { domain, slot } => Self::Slot { domain, slot },
            Op::SlotGone(domain) => Self::SlotGone(domain),
        }
    }
}

/// What a record is about: the unit that a damaged record can cost.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Key {
    Claim(String),
    Slot(DomainUid),
}

impl Op {
    pub fn key(&self) -> Key {
        match self {
            Self::Claim(record) => Key::Claim(record.claim.uid.clone()),
            Self::ClaimGone(uid) => Key::Claim(uid.clone()),
            Self::Slot { domain, .. } | Self::SlotGone(domain) => Key::Slot(domain.clone()),
        }
    }
}

#[derive(Serialize)]
struct LineOut<'a> {
    v: u32,
    boot: &'a str,
    op: &'a Op,
}

#[derive(Deserialize)]
struct Version {
    v: u32,
}

#[derive(Deserialize)]
struct LineIn<'a> {
    #[serde(borrow)]
    boot: Cow<'a, str>,
    op: Op,
}

/// A record that reads back.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Decoded {
    Record {
        boot: String,
        op: Op,
    },
    /// Written by a newer domaind: not to be read, nor overwritten.
    Newer {
        format: u32,
    },
}

/// Why a line is not a record we can trust.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error("no checksum: the line does not start with 8 hex digits and a space")]
    NoChecksum,
    #[error("checksum mismatch: the line says {recorded:08x}, its record sums to {computed:08x}")]
    Checksum { recorded: u32, computed: u32 },
    #[error("the record is not JSON of a known shape: {0}")]
    Shape(String),
    #[error("format version 0 does not exist")]
    FormatZero,
    #[error("empty boot id")]
    EmptyBootId,
}

/// The line for `op`, written on boot `boot`, newline included.
pub fn encode(op: &Op, boot: &str) -> Vec<u8> {
    let json = serde_json::to_vec(&LineOut {
        v: FORMAT_VERSION,
        boot,
        op,
    })
    // Our own types, with string keys only: serialising them cannot fail.
    .expect("a checkpoint record serialises");
    let mut line = Vec::with_capacity(json.len() + CHECKSUM_DIGITS + 2);
    line.extend_from_slice(format!("{:08x} ", crc32fast::hash(&json)).as_bytes());
    line.extend_from_slice(&json);
    line.push(b'\n');
    line
}

/// Reads one line (without its newline).
pub fn decode(line: &[u8]) -> Result<Decoded, Damage> {
    let (recorded, json) = split(line).ok_or(Damage::NoChecksum)?;
    let computed = crc32fast::hash(json);
    if computed != recorded {
        return Err(Damage::Checksum { recorded, computed });
    }
    let Version { v } = serde_json::from_slice(json).map_err(|e| Damage::Shape(e.to_string()))?;
    match v {
        0 => return Err(Damage::FormatZero),
        format if format > FORMAT_VERSION => return Ok(Decoded::Newer { format }),
        _ => {}
    }
    let LineIn { boot, op } =
        serde_json::from_slice(json).map_err(|e| Damage::Shape(e.to_string()))?;
    if boot.trim().is_empty() {
        return Err(Damage::EmptyBootId);
    }
    Ok(Decoded::Record {
        boot: boot.into_owned(),
        op,
    })
}

/// What a damaged line was most likely about, for reporting the damage and setting
/// aside what it may have cost. The record is read ignoring its checksum; when it does
/// not parse (the damage hit its structure), the first claim uid it names is taken.
/// A guess either way: a flipped byte inside a uid names a claim that never was.
pub fn attribute(line: &[u8]) -> Option<(Key, Option<DomainRef>)> {
    let json = split(line).map_or(line, |(_, json)| json);
    if let Ok(LineIn { op, .. }) = serde_json::from_slice::<LineIn<'_>>(json) {
        let domain = match &op {
            Op::Claim(record) => Some(record.info.domain.clone()),
            _ => None,
        };
        return Some((op.key(), domain));
    }
    let text = String::from_utf8_lossy(json);
    let quoted_after = |marker: &str| {
        let start = text.find(marker)? + marker.len();
        let len = text[start..].find('"')?;
        let value = &text[start..start + len];
        (!value.is_empty() && value.len() <= 128 && value.bytes().all(|b| b.is_ascii_graphic()))
            .then(|| value.to_owned())
    };
    quoted_after(r#""claim_gone":""#)
        .or_else(|| quoted_after(r#""uid":""#))
        .map(|uid| (Key::Claim(uid), None))
}

fn split(line: &[u8]) -> Option<(u32, &[u8])> {
    let digits = line.get(..CHECKSUM_DIGITS)?;
    if line.get(CHECKSUM_DIGITS) != Some(&b' ') || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let recorded = u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
    Some((recorded, &line[CHECKSUM_DIGITS + 1..]))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::checkpoint::tests::record;
    use domaind_actors::model::AllocationMode;
    use domaind_actors::ports::PrepareState;

    fn claim_line() -> Vec<u8> {
        let op = Op::Claim(record(
            "uid-1",
            PrepareState::PrepareCompleted,
            AllocationMode::Single,
        ));
        encode(&op, "boot-a")
    }

    fn body(line: &[u8]) -> &[u8] {
        &line[..line.len() - 1]
    }

    #[test]
    fn every_op_round_trips_with_its_boot() {
        let ops = [
            Op::Claim(record(
                "uid-1",
                PrepareState::PrepareStarted,
                AllocationMode::All,
            )),
            Op::ClaimGone("uid-1".into()),
            Op::Slot {
                domain: DomainUid("cd-1".into()),
                slot: 3,
            },
            Op::SlotGone(DomainUid("cd-1".into())),
        ];
        for op in ops {
            let line = encode(&op, "boot-a");
            assert_eq!(line.last(), Some(&b'\n'));
            assert_eq!(
                decode(body(&line)),
                Ok(Decoded::Record {
                    boot: "boot-a".into(),
                    op
                })
            );
        }
    }

    #[test]
    fn any_flipped_bit_is_damage_never_another_record() {
        let line = claim_line();
        let body = body(&line);
        for index in 0..body.len() {
            for bit in 0..8 {
                let mut flipped = body.to_vec();
                flipped[index] ^= 1 << bit;
                assert!(
                    decode(&flipped).is_err(),
                    "flipping bit {bit} of byte {index} was read as a record"
                );
            }
        }
    }

    #[test]
    fn every_truncation_is_damage() {
        let line = claim_line();
        for len in 0..line.len() - 1 {
            assert!(decode(&line[..len]).is_err(), "cut at {len} was accepted");
        }
    }

    #[test]
    fn a_newer_format_is_reported_without_reading_the_rest() {
        let json = br#"{"v":7,"whatever":"a newer domaind writes"}"#;
        let line = [format!("{:08x} ", crc32fast::hash(json)).as_bytes(), json].concat();
        assert_eq!(decode(&line), Ok(Decoded::Newer { format: 7 }));
    }

    #[test]
    fn a_damaged_record_is_attributed_to_its_claim_and_domain_when_it_can_be() {
        let line = claim_line();
        let text = String::from_utf8(body(&line).to_vec()).unwrap();
        // Damage in a value: the record still parses, the checksum does not match.
        let in_value = text.replacen("\"team-a\"", "\"team-b\"", 1);
        assert_ne!(in_value, text);
        assert!(matches!(
            decode(in_value.as_bytes()),
            Err(Damage::Checksum { .. })
        ));
        let (key, domain) = attribute(in_value.as_bytes()).unwrap();
        assert_eq!(key, Key::Claim("uid-1".into()));
        assert_eq!(domain.unwrap().uid, DomainUid("cd-uid-1".into()));
        // Damage in the structure: the uid is still found.
        let in_structure = text.replacen("{\"claim\":{", "{\"claim\"x{", 1);
        assert_eq!(
            attribute(in_structure.as_bytes()),
            Some((Key::Claim("uid-1".into()), None))
        );
        let gone = encode(&Op::ClaimGone("uid-9".into()), "boot-a");
        let broken = String::from_utf8(body(&gone).to_vec())
            .unwrap()
            .replacen("{\"v\"", "{\"w", 1);
        assert_eq!(
            attribute(broken.as_bytes()),
            Some((Key::Claim("uid-9".into()), None))
        );
        assert_eq!(attribute(b"garbage"), None);
    }
}
