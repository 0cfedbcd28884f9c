//! The checkpoint store: what this node's prepared claims and slots were, kept in
//! `<state dir>/checkpoint.json` so that a restarted daemon answers the kubelet as before.
//!
//! - The file is an envelope: a format version, the boot id it was written on, a CRC-32
//!   of the payload and the payload (the actors' [`Checkpoint`](domaind_actors::ports::Checkpoint)).
//! - Saves replace the file atomically; a temporary file left by a crash is removed at
//!   the next load, and the previous checkpoint still loads.
//! - A checkpoint of a previous boot is deleted and loading starts empty: claims,
//!   device nodes and containers do not survive a node reboot.
//! - A corrupt file is moved aside and loading starts empty, counted in
//!   [`CORRUPT_TOTAL`]: a bad file must never crash-loop the daemon.
//! - A file of a newer format fails the load, and every save, until domaind is
//!   upgraded or the file removed: a downgrade never overwrites newer state.

mod envelope;
mod error;
mod store;
#[cfg(test)]
mod tests;

// decode: outside readers (the chaos harness) inspect a live node's file without the
// store's side effects (moving a corrupt file aside, deleting a previous boot's).
pub use envelope::{Corruption, Decoded, FORMAT_VERSION, decode};
pub use error::CheckpointError;
pub use store::{
    CHECKPOINT_FILE, CheckpointConfig, DEFAULT_BOOT_ID_PATH, FileCheckpointStore, LoadOutcome,
    Loaded,
};

/// Counter: checkpoint files found corrupt and moved aside.
pub const CORRUPT_TOTAL: &str = "domaind_checkpoint_corrupt_total";
