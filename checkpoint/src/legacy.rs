//! Format 1 of the checkpoint, `checkpoint.json`: one versioned envelope around the whole
//! [`Checkpoint`], rewritten on every change. Read once at start to migrate to the
//! journal; a corrupt one costs everything it held, which is why the journal's
//! records each carry their own checksum.
//!
//! ```json
//! {"format":1,"boot_id":"…","checksum":"crc32:1a2b3c4d","payload":{"claims":{…},"slots":{…}}}
//! ```
//!
//! The checksum covers the payload's bytes exactly as they stand in the file (kept raw
//! when reading), so it never depends on how a JSON library re-serialises a value.
//! The format is read first and alone: a newer domaind may have changed everything
//! else.

use std::borrow::Cow;

use domaind_actors::ports::Checkpoint;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;

/// The envelope's format; the journal's records are format 2.
pub const FORMAT_VERSION: u32 = 1;

const CHECKSUM_ALGORITHM: &str = "crc32";

/// Why a file is not a checkpoint we can trust.
#[derive(Debug, thiserror::Error)]
pub enum Corruption {
    #[error("not a JSON checkpoint envelope (truncated or overwritten?): {0}")]
    NotAnEnvelope(serde_json::Error),
    #[error("format version 0 does not exist")]
    FormatZero,
    #[error("empty boot id")]
    EmptyBootId,
    #[error("checksum {found:?} is not of the form \"crc32:<8 hex digits>\"")]
    ChecksumSyntax { found: String },
    #[error("checksum mismatch: the file says {recorded}, the payload sums to {computed}")]
    ChecksumMismatch { recorded: String, computed: String },
    #[error("payload does not hold a checkpoint: {0}")]
    Payload(serde_json::Error),
}

/// A file that is an envelope we understand.
#[derive(Debug)]
pub enum Decoded {
    Current {
        boot_id: String,
        checkpoint: Checkpoint,
    },
    /// Written by a newer domaind: not to be read, nor overwritten.
    Newer { format: u32 },
}

#[derive(Deserialize)]
struct Header {
    format: u32,
}

#[derive(Serialize, Deserialize)]
struct Envelope<'a> {
    format: u32,
    #[serde(borrow)]
    boot_id: Cow<'a, str>,
    checksum: String,
    #[serde(borrow)]
    payload: &'a RawValue,
}

fn checksum(payload: &[u8]) -> String {
    format!("{CHECKSUM_ALGORITHM}:{:08x}", crc32fast::hash(payload))
}

fn valid_checksum_syntax(value: &str) -> bool {
    value
        .strip_prefix(CHECKSUM_ALGORITHM)
        .and_then(|rest| rest.strip_prefix(':'))
        .is_some_and(|hex| hex.len() == 8 && hex.bytes().all(|b| b.is_ascii_hexdigit()))
}

/// The file's bytes for `checkpoint`, written on the boot `boot_id`: what a domaind of
/// format 1 left, for the migration's tests.
#[cfg(test)]
pub fn encode(checkpoint: &Checkpoint, boot_id: &str) -> Result<Vec<u8>, serde_json::Error> {
    let payload = serde_json::value::to_raw_value(checkpoint)?;
    let envelope = Envelope {
        format: FORMAT_VERSION,
        boot_id: Cow::Borrowed(boot_id),
        checksum: checksum(payload.get().as_bytes()),
        payload: &payload,
    };
    let mut bytes = serde_json::to_vec(&envelope)?;
    bytes.push(b'\n');
    Ok(bytes)
}

/// The format version a file claims, if it is JSON with one. For refusing to overwrite a
/// newer file without reading all of it.
pub fn format_of(bytes: &[u8]) -> Option<u32> {
    serde_json::from_slice::<Header>(bytes)
        .ok()
        .map(|header| header.format)
}

pub fn decode(bytes: &[u8]) -> Result<Decoded, Corruption> {
    let header: Header = serde_json::from_slice(bytes).map_err(Corruption::NotAnEnvelope)?;
    match header.format {
        0 => return Err(Corruption::FormatZero),
        format if format > FORMAT_VERSION => return Ok(Decoded::Newer { format }),
        _ => {}
    }
    let envelope: Envelope<'_> =
        serde_json::from_slice(bytes).map_err(Corruption::NotAnEnvelope)?;
    if !valid_checksum_syntax(&envelope.checksum) {
        return Err(Corruption::ChecksumSyntax {
            found: envelope.checksum,
        });
    }
    let computed = checksum(envelope.payload.get().as_bytes());
    // Hex digits may have been written in either case by someone fixing a file by hand.
    if !computed.eq_ignore_ascii_case(&envelope.checksum) {
        return Err(Corruption::ChecksumMismatch {
            recorded: envelope.checksum,
            computed,
        });
    }
    if envelope.boot_id.trim().is_empty() {
        return Err(Corruption::EmptyBootId);
    }
    let checkpoint = serde_json::from_str(envelope.payload.get()).map_err(Corruption::Payload)?;
    Ok(Decoded::Current {
        boot_id: envelope.boot_id.into_owned(),
        checkpoint,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use domaind_actors::model::DomainUid;

    fn sample() -> Checkpoint {
        let mut checkpoint = Checkpoint::default();
        checkpoint.slots.insert(DomainUid("cd-1".into()), 3);
        checkpoint
    }

    fn decoded(bytes: &[u8]) -> (String, Checkpoint) {
        match decode(bytes).unwrap() {
            Decoded::Current {
                boot_id,
                checkpoint,
            } => (boot_id, checkpoint),
            Decoded::Newer { format } => panic!("read as newer format {format}"),
        }
    }

    #[test]
    fn round_trips_with_its_boot_id() {
        let bytes = encode(&sample(), "boot-a").unwrap();
        assert_eq!(decoded(&bytes), ("boot-a".to_owned(), sample()));
        assert_eq!(format_of(&bytes), Some(FORMAT_VERSION));
    }

    #[test]
    fn a_changed_payload_fails_the_checksum() {
        let text = String::from_utf8(encode(&sample(), "boot-a").unwrap()).unwrap();
        let tampered = text.replace("\"cd-1\":3", "\"cd-1\":4");
        assert_ne!(text, tampered);
        assert!(matches!(
            decode(tampered.as_bytes()),
            Err(Corruption::ChecksumMismatch { .. })
        ));
    }

    #[test]
    fn every_truncation_is_refused() {
        let bytes = encode(&sample(), "boot-a").unwrap();
        // The last byte is the newline, which JSON does not need.
        for len in 0..bytes.len() - 1 {
            assert!(
                decode(&bytes[..len]).is_err(),
                "a file cut at {len} bytes was accepted"
            );
        }
    }

    #[test]
    fn a_newer_format_is_reported_without_reading_the_rest() {
        let bytes = br#"{"format":7,"whatever":"a newer domaind writes"}"#;
        assert!(matches!(decode(bytes), Ok(Decoded::Newer { format: 7 })));
        assert_eq!(format_of(bytes), Some(7));
    }

    #[test]
    fn a_malformed_checksum_or_format_zero_is_corrupt() {
        let text = String::from_utf8(encode(&sample(), "boot-a").unwrap()).unwrap();
        let bad_sum = text.replacen("crc32:", "md5:", 1);
        assert!(matches!(
            decode(bad_sum.as_bytes()),
            Err(Corruption::ChecksumSyntax { .. })
        ));
        let zero = text.replacen("\"format\":1", "\"format\":0", 1);
        assert!(matches!(
            decode(zero.as_bytes()),
            Err(Corruption::FormatZero)
        ));
    }

    #[test]
    fn an_uppercase_checksum_is_accepted() {
        let text = String::from_utf8(encode(&sample(), "boot-a").unwrap()).unwrap();
        let start = text.find("crc32:").unwrap() + "crc32:".len();
        let upper = format!(
            "{}{}{}",
            &text[..start],
            text[start..start + 8].to_ascii_uppercase(),
            &text[start + 8..]
        );
        assert_ne!(upper, text, "the sample's checksum has no hex letter");
        assert_eq!(decoded(upper.as_bytes()).1, sample());
    }
}
