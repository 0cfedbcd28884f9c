//! One journal record: a line
//! `<crc32 of the rest, 8 hex digits> <crc32 of the key, 8 hex digits> <key> <JSON>\n`.
//!
//! ```text
//! 5c1d0e9a 0b6f13c2 claim/417f1e95-… {"v":2,"rev":1,"boot":"…","op":{"claim":{…}}}
//! 93aa7d01 77e0c4d1 claim/417f1e95-… {"v":2,"rev":1,"boot":"…","op":{"claim_gone":"417f1e95-…"}}
//! 2f0a9b3e 1c2d3e4f slot/5b0e7c7e-… {"v":2,"rev":1,"boot":"…","op":{"slot":{"domain":"…","slot":3}}}
//! ```
//!
//! Each record carries its own checksum, format and boot id, so that one damaged
//! record costs that record and no other: nothing a record needs is elsewhere in the
//! file. The first checksum covers everything after it, exactly as stored. The key
//! (which claim or slot the record is about) has a checksum of its own: when the record
//! is damaged, the key tells what it cost only if the key itself is intact; a byte
//! flipped inside a uid must not make the record name, and cost, another claim. The
//! format is read before anything else, since a newer domaind may have changed the
//! rest.
//!
//! Versions: `v` is the format, which a reader must know (a newer one is refused: a
//! downgrade never overwrites newer state); `rev` (absent before it was added: 0) the
//! revision within it. A newer revision may add fields to a record or its op, which an
//! older reader skips, and which an older domaind's compaction drops: only what a newer
//! domaind can do without. A new kind of op, or anything an older reader must not
//! skip, takes a new format.

use std::borrow::Cow;

use domaind_actors::model::{DomainRef, DomainUid, Slot};
use domaind_actors::ports::{CheckpointChange, ClaimRecord};
use serde::{Deserialize, Serialize};

/// The record format this domaind writes, and the newest it reads. Format 1, a
/// whole-file envelope, was never released and is not read.
pub const FORMAT_VERSION: u32 = 2;

/// The revision of the format this domaind writes, and the newest it reads whole.
pub const REVISION: u32 = 1;

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

impl Key {
    /// The key as the line spells it; none for a uid that could not stand between two
    /// spaces on one line (then a damaged record of it cannot be attributed).
    fn spelled(&self) -> Option<String> {
        let (kind, id) = match self {
            Self::Claim(uid) => ("claim", uid.as_str()),
            Self::Slot(domain) => ("slot", domain.0.as_str()),
        };
        (!id.is_empty() && id.bytes().all(|b| b.is_ascii_graphic())).then(|| format!("{kind}/{id}"))
    }

    fn parse(text: &str) -> Option<Self> {
        let (kind, id) = text.split_once('/')?;
        match kind {
            "claim" => Some(Self::Claim(id.to_owned())),
            "slot" => Some(Self::Slot(DomainUid(id.to_owned()))),
            _ => None,
        }
    }
}

/// The key of a record that cannot be attributed.
const NO_KEY: &str = "-";

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
    rev: u32,
    boot: &'a str,
    op: &'a Op,
}

#[derive(Deserialize)]
struct Version {
    v: u32,
    #[serde(default)]
    rev: u32,
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
        op: Box<Op>,
        /// Above [`REVISION`]: written by a newer domaind, read as far as this one
        /// understands it.
        rev: u32,
    },
    /// Written by a newer domaind: not to be read, nor overwritten.
    Newer { format: u32 },
}

/// Why a line is not a record we can trust.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Damage {
    #[error("no checksum: the line does not start with 8 hex digits and a space")]
    NoChecksum,
    #[error("checksum mismatch: the line says {recorded:08x}, its record sums to {computed:08x}")]
    Checksum { recorded: u32, computed: u32 },
    #[error("no key: the checksum is not followed by the key's checksum and the key")]
    NoKey,
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
        rev: REVISION,
        boot,
        op,
    })
    // Our own types, with string keys only: serialising them cannot fail.
    .expect("a checkpoint record serialises");
    let key = op.key().spelled().unwrap_or_else(|| NO_KEY.to_owned());
    let mut rest = Vec::with_capacity(json.len() + key.len() + CHECKSUM_DIGITS + 2);
    rest.extend_from_slice(format!("{:08x} {key} ", crc32fast::hash(key.as_bytes())).as_bytes());
    rest.extend_from_slice(&json);
    let mut line = Vec::with_capacity(rest.len() + CHECKSUM_DIGITS + 2);
    line.extend_from_slice(format!("{:08x} ", crc32fast::hash(&rest)).as_bytes());
    line.extend_from_slice(&rest);
    line.push(b'\n');
    line
}

/// Reads one line (without its newline).
pub fn decode(line: &[u8]) -> Result<Decoded, Damage> {
    let (recorded, rest) = split_checksum(line).ok_or(Damage::NoChecksum)?;
    let computed = crc32fast::hash(rest);
    if computed != recorded {
        return Err(Damage::Checksum { recorded, computed });
    }
    let json = split_key(rest).ok_or(Damage::NoKey)?.1;
    let Version { v, rev } =
        serde_json::from_slice(json).map_err(|e| Damage::Shape(e.to_string()))?;
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
        op: Box::new(op),
        rev,
    })
}

/// What a damaged line was about, when its key survived (its own checksum holds), and
/// the record's domain when what is left of it still reads (for telling the domain; a
/// guess, used only where no intact record told it).
pub fn attribute(line: &[u8]) -> Option<(Key, Option<DomainRef>)> {
    let rest = split_checksum(line)?.1;
    let (key, json) = split_key(rest)?;
    let domain = match serde_json::from_slice::<LineIn<'_>>(json) {
        Ok(LineIn {
            op: Op::Claim(record),
            ..
        }) => Some(record.info.domain),
        _ => None,
    };
    Some((key?, domain))
}

fn split_checksum(line: &[u8]) -> Option<(u32, &[u8])> {
    let digits = line.get(..CHECKSUM_DIGITS)?;
    if line.get(CHECKSUM_DIGITS) != Some(&b' ') || !digits.iter().all(u8::is_ascii_hexdigit) {
        return None;
    }
    let recorded = u32::from_str_radix(std::str::from_utf8(digits).ok()?, 16).ok()?;
    Some((recorded, &line[CHECKSUM_DIGITS + 1..]))
}

/// `<key checksum> <key> <json>`: the key (none when it is `-` or fails its checksum)
/// and the JSON.
fn split_key(rest: &[u8]) -> Option<(Option<Key>, &[u8])> {
    let (recorded, rest) = split_checksum(rest)?;
    let end = rest.iter().position(|b| *b == b' ')?;
    let (key, json) = (&rest[..end], &rest[end + 1..]);
    let key = (crc32fast::hash(key) == recorded)
        .then(|| std::str::from_utf8(key).ok().and_then(Key::parse))
        .flatten();
    Some((key, json))
}

/// A line as a domaind of a newer revision writes it: a field this one does not
/// know, in the record and in its op.
#[cfg(test)]
pub(crate) fn next_revision(line: &[u8]) -> Vec<u8> {
    let text = std::str::from_utf8(&line[..line.len() - 1]).unwrap();
    let (_, rest) = text.split_once(' ').unwrap();
    let (key_sum, rest) = rest.split_once(' ').unwrap();
    let (key, json) = rest.split_once(' ').unwrap();
    let json = json
        .replacen(
            &format!("\"rev\":{REVISION}"),
            &format!("\"rev\":{},\"added\":[1,2]", REVISION + 1),
            1,
        )
        .replacen("\"claim\":{", "\"claim\":{\"added_too\":true,", 1);
    let rest = format!("{key_sum} {key} {json}");
    format!("{:08x} {rest}\n", crc32fast::hash(rest.as_bytes())).into_bytes()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tests::record;
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
                    op: Box::new(op),
                    rev: REVISION,
                })
            );
        }
    }

    #[test]
    fn any_flipped_bit_is_damage_never_another_record() {
        let line = claim_line();
        let body = body(&line);
        let original = decode(body).unwrap();
        for index in 0..body.len() {
            for bit in 0..8 {
                let mut flipped = body.to_vec();
                flipped[index] ^= 1 << bit;
                // A hex digit's case may flip: the same checksum, the same record.
                if let Ok(read) = decode(&flipped) {
                    assert_eq!(
                        read, original,
                        "flipping bit {bit} of byte {index} was read as another record"
                    );
                }
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
        let key = "claim/x";
        let json = r#"{"v":7,"whatever":"a newer domaind writes"}"#;
        let rest = format!("{:08x} {key} {json}", crc32fast::hash(key.as_bytes()));
        let line = format!("{:08x} {rest}", crc32fast::hash(rest.as_bytes()));
        assert_eq!(decode(line.as_bytes()), Ok(Decoded::Newer { format: 7 }));
    }

    #[test]
    fn a_damaged_record_is_attributed_only_by_an_intact_key() {
        let line = claim_line();
        let text = String::from_utf8(body(&line).to_vec()).unwrap();
        // Damage in the JSON: the key still says whose record it was.
        let in_json = text.replacen("\"team-a\"", "\"team-b\"", 1);
        assert!(matches!(
            decode(in_json.as_bytes()),
            Err(Damage::Checksum { .. })
        ));
        let (key, domain) = attribute(in_json.as_bytes()).unwrap();
        assert_eq!(key, Key::Claim("uid-1".into()));
        assert_eq!(domain.unwrap().uid, DomainUid("cd-uid-1".into()));
        // Damage in the key: it names another claim, and is not believed.
        let in_key = text.replacen("claim/uid-1", "claim/uid-0", 1);
        assert_ne!(in_key, text);
        assert_eq!(attribute(in_key.as_bytes()), None);
        assert_eq!(attribute(b"garbage"), None);
    }

    #[test]
    fn a_uid_that_cannot_be_a_key_still_round_trips_without_one() {
        let op = Op::ClaimGone("has space".into());
        let line = encode(&op, "boot-a");
        assert!(String::from_utf8_lossy(&line).contains(" - {"));
        assert_eq!(
            decode(body(&line)),
            Ok(Decoded::Record {
                boot: "boot-a".into(),
                op: Box::new(op),
                rev: REVISION,
            })
        );
    }

    #[test]
    fn a_newer_revision_is_read_as_far_as_this_one_understands_it() {
        let line = claim_line();
        let newer = next_revision(&line);
        assert!(String::from_utf8_lossy(&newer).contains("added_too"));
        let Ok(Decoded::Record { op, rev, .. }) = decode(body(&newer)) else {
            panic!("a newer revision reads")
        };
        let Ok(Decoded::Record { op: ours, .. }) = decode(body(&line)) else {
            panic!("ours reads")
        };
        assert_eq!((op, rev), (ours, REVISION + 1));
    }

    #[test]
    fn a_line_without_a_revision_is_revision_0() {
        let line = String::from_utf8(claim_line()).unwrap();
        let (_, rest) = line.trim_end().split_once(' ').unwrap();
        let rest = rest.replacen(&format!("\"rev\":{REVISION},"), "", 1);
        let old = format!("{:08x} {rest}", crc32fast::hash(rest.as_bytes()));
        assert!(matches!(
            decode(old.as_bytes()),
            Ok(Decoded::Record { rev: 0, .. })
        ));
    }
}
