//! Versions of what domaind writes for another domaind to read: gossip frames, pulses
//! and signed values here, the checkpoint journal and run.json in the node crate.
//!
//! A rolling upgrade (or its rollback) runs two releases side by side, so a reader
//! takes a newer version as far as it understands it: the fields it knows, skipping
//! the extensions it does not. A version number alone never makes input be refused;
//! only a change an older reader could not skip does (each format says which).
//! Meeting a newer version is counted in [`NEWER_VERSION`](crate::metrics::NEWER_VERSION)
//! by `format`, and logged once per format and peer (or file): during an upgrade it
//! happens on every frame, and one line says all there is to say.

use std::collections::HashSet;
use std::sync::Mutex;

use tracing::info;

/// The version of the gossip formats (frames, pulses, signed values) this release
/// speaks, and the newest it reads whole.
pub const WIRE_VERSION: u8 = 1;

/// What this node writes on the gossip wire.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum WireVersion {
    /// [`WIRE_VERSION`], in the form every release reads.
    #[default]
    Current,
    /// The next version, with an extension this release does not know, in every
    /// frame, pulse and signed value: for tests that play a node of the next release
    /// in a rack of this one.
    Next,
}

/// What a node of the next version adds, as far as tests need it: bytes this
/// release skips.
const NEXT_EXTENSION: &[u8] = b"next-version-extension";

impl WireVersion {
    pub fn version(self) -> u8 {
        match self {
            Self::Current => WIRE_VERSION,
            Self::Next => WIRE_VERSION + 1,
        }
    }

    /// The extension bytes written with [`WireVersion::version`].
    pub fn extension(self) -> &'static [u8] {
        match self {
            Self::Current => &[],
            Self::Next => NEXT_EXTENSION,
        }
    }
}

/// Peers (or files) already logged past this many, only counted: the set is bounded
/// whatever the input.
const MAX_LOGGED: usize = 4096;

/// Newer versions met by one reader (one node's transport, pulse task or state check;
/// one checkpoint store), each logged the first time per format and source.
#[derive(Debug, Default)]
pub struct NewerVersions {
    logged: Mutex<HashSet<(&'static str, String)>>,
}

impl NewerVersions {
    /// Counts `count` items of `format` from `from` written in `version`, newer than
    /// the `understood` one this node reads whole; logs the first from each source.
    /// True when it logged.
    pub fn note(
        &self,
        format: &'static str,
        from: &str,
        version: u64,
        understood: u64,
        count: usize,
    ) -> bool {
        crate::metrics::newer_version(format, count);
        let first = {
            let mut logged = self.logged.lock().unwrap_or_else(|p| p.into_inner());
            logged.len() < MAX_LOGGED && logged.insert((format, from.to_owned()))
        };
        if first {
            info!(
                format,
                from,
                version,
                understood,
                "read a {format} of a newer version than this domaind's, as far as this version understands it (an upgrade under way?); further ones from there are counted in domaind_newer_version_total, not logged"
            );
        }
        first
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_format_and_source_is_logged_once() {
        let newer = NewerVersions::default();
        assert!(newer.note("frame", "node-a", 2, 1, 1));
        assert!(!newer.note("frame", "node-a", 3, 1, 1));
        assert!(newer.note("pulse", "node-a", 2, 1, 1));
        assert!(newer.note("frame", "node-b", 2, 1, 1));
    }

    #[test]
    fn the_next_version_is_one_up_with_an_extension() {
        assert_eq!(WireVersion::default().version(), WIRE_VERSION);
        assert!(WireVersion::Current.extension().is_empty());
        assert_eq!(WireVersion::Next.version(), WIRE_VERSION + 1);
        assert!(!WireVersion::Next.extension().is_empty());
    }
}
