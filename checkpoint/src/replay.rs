//! The rule for reading a journal back: a pure fold of its lines into the checkpoint
//! they describe, and what was found wrong on the way.
//!
//! - Records apply in file order; a claim's or slot's last record wins.
//! - A damaged record costs what it was about and nothing else: if it is the last word
//!   on a claim (or slot) it was attributed to, that claim is set aside (left out and
//!   listed in [`Replay::lost`]), since its state is unknown; an intact record after it
//!   settles the claim again, and nothing is lost. A damaged record that cannot be
//!   attributed is reported and costs nothing we can name.
//! - A last line without its newline is a write cut short by a crash: it was never
//!   acknowledged (an answer waits for the write), so it is dropped quietly.
//! - Records of another boot are dropped: claims do not survive a reboot.
//! - A record of a newer format makes the whole file unreadable to us; one of a newer
//!   revision of our format is read as far as we understand it, and counted.

use std::collections::BTreeMap;

use domaind_actors::model::DomainRef;
use domaind_actors::ports::{Checkpoint, CheckpointChange};

use super::line::{self, Damage, Decoded, Key};

/// A damaged line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DamagedRecord {
    /// 1-based, for the log line.
    pub line: usize,
    pub damage: Damage,
    /// What the record was most likely about.
    pub key: Option<Key>,
    /// The line as it stood, to be set aside for a post-mortem.
    pub bytes: Vec<u8>,
}

/// What a journal holds.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Replay {
    pub checkpoint: Checkpoint,
    /// Intact records of this boot.
    pub records: usize,
    pub damaged: Vec<DamagedRecord>,
    /// Claims and slots whose last record is damaged: left out of `checkpoint`. Each
    /// with its domain where a record told it.
    pub lost: Vec<(Key, Option<DomainRef>)>,
    /// Bytes of a last line cut short.
    pub torn_tail: usize,
    /// The boot of records written on another boot (the first one met).
    pub other_boot: Option<String>,
    pub other_boot_records: usize,
    /// A record of a newer format: the newest seen.
    pub newer: Option<u32>,
    /// Records of a newer revision of our format (read all the same), and the newest.
    pub newer_revision_records: usize,
    pub newer_revision: Option<u32>,
    /// Lines that held two whole records because the newline between them was
    /// damaged: both were read, nothing was lost, and the journal wants rewriting.
    pub repaired: usize,
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum Last {
    Intact,
    Damaged,
}

/// Reads `bytes` as the journal of the boot `boot_id`.
pub fn replay(bytes: &[u8], boot_id: &str) -> Replay {
    let mut replay = Replay::default();
    let mut last: BTreeMap<Key, Last> = BTreeMap::new();
    let mut domains: BTreeMap<Key, DomainRef> = BTreeMap::new();
    let (lines, tail) = match bytes.iter().rposition(|b| *b == b'\n') {
        Some(end) => (&bytes[..end], &bytes[end + 1..]),
        None => (&bytes[..0], bytes),
    };
    replay.torn_tail = tail.len();
    for (index, text) in lines.split(|b| *b == b'\n').enumerate() {
        if text.is_empty() {
            continue;
        }
        let decoded = match line::decode(text) {
            Err(damage) => match split_merged(text) {
                Some(pair) => {
                    replay.repaired += 1;
                    pair.into_iter().map(Ok).collect()
                }
                None => vec![Err(damage)],
            },
            decoded => vec![decoded],
        };
        for decoded in decoded {
            read_one(
                &mut replay,
                &mut last,
                &mut domains,
                boot_id,
                index,
                text,
                decoded,
            );
        }
    }
    settle(&mut replay, last, &domains);
    replay
}

fn read_one(
    replay: &mut Replay,
    last: &mut BTreeMap<Key, Last>,
    domains: &mut BTreeMap<Key, DomainRef>,
    boot_id: &str,
    index: usize,
    text: &[u8],
    decoded: Result<Decoded, Damage>,
) {
    if let Ok(Decoded::Record { rev, .. }) = &decoded
        && *rev > line::REVISION
    {
        replay.newer_revision_records += 1;
        replay.newer_revision = replay.newer_revision.max(Some(*rev));
    }
    match decoded {
        Ok(Decoded::Newer { format }) => {
            replay.newer = replay.newer.max(Some(format));
        }
        Ok(Decoded::Record { boot, .. }) if boot != boot_id => {
            replay.other_boot.get_or_insert(boot);
            replay.other_boot_records += 1;
        }
        Ok(Decoded::Record { op, .. }) => {
            replay.records += 1;
            let key = op.key();
            if let line::Op::Claim(record) = op.as_ref() {
                domains.insert(key.clone(), record.info.domain.clone());
            }
            last.insert(key, Last::Intact);
            replay.checkpoint.apply(CheckpointChange::from(*op));
        }
        Err(damage) => {
            let attributed = line::attribute(text);
            if let Some((key, domain)) = &attributed {
                if let Some(domain) = domain {
                    domains.insert(key.clone(), domain.clone());
                }
                last.insert(key.clone(), Last::Damaged);
            }
            replay.damaged.push(DamagedRecord {
                line: index + 1,
                damage,
                key: attributed.map(|(key, _)| key),
                bytes: text.to_vec(),
            });
        }
    }
}

/// Claims and slots whose last word was a damaged record are set aside.
fn settle(replay: &mut Replay, last: BTreeMap<Key, Last>, domains: &BTreeMap<Key, DomainRef>) {
    for (key, state) in last {
        if state == Last::Damaged {
            match &key {
                Key::Claim(uid) => {
                    replay.checkpoint.claims.remove(uid);
                }
                Key::Slot(domain) => {
                    replay.checkpoint.slots.remove(domain);
                }
            }
            let domain = domains.get(&key).cloned();
            replay.lost.push((key, domain));
        }
    }
}

/// Two whole records run together, where the newline between them was damaged into
/// another byte.
fn split_merged(text: &[u8]) -> Option<[Decoded; 2]> {
    let starts_record = |rest: &[u8]| {
        rest.len() > 18
            && rest[..8].iter().all(u8::is_ascii_hexdigit)
            && rest[8] == b' '
            && rest[9..17].iter().all(u8::is_ascii_hexdigit)
            && rest[17] == b' '
    };
    (1..text.len()).find_map(|at| {
        if !starts_record(&text[at + 1..]) {
            return None;
        }
        let first = line::decode(&text[..at]).ok()?;
        let second = line::decode(&text[at + 1..]).ok()?;
        Some([first, second])
    })
}

/// The journal that holds exactly `checkpoint`: one record per claim and slot.
pub fn compacted(checkpoint: &Checkpoint, boot_id: &str) -> Vec<u8> {
    let mut bytes = Vec::new();
    for record in checkpoint.claims.values() {
        bytes.extend(line::encode(&line::Op::Claim(record.clone()), boot_id));
    }
    for (domain, slot) in &checkpoint.slots {
        bytes.extend(line::encode(
            &line::Op::Slot {
                domain: domain.clone(),
                slot: *slot,
            },
            boot_id,
        ));
    }
    bytes
}
