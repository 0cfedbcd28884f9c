//! Fuzz targets for every parser of bytes that come from outside the node: each target
//! feeds the bytes to the real parser and asserts the parser's contract (no panic;
//! what decodes re-encodes to the same bytes where the format is canonical, to the
//! same value where it is not; a refusal is one of the reasons the code counts).
//!
//! The targets are plain functions, so that the seed corpora replay through them in
//! `cargo test` (tests/corpora.rs), where each must take the seeds meant to be taken
//! and refuse those named `refused-*`; `src/bin/` wraps each in AFL++'s persistent loop,
//! built only by `cargo afl build --features afl` (run.sh).

pub mod fixture;
pub mod seeds;
pub mod targets;

/// A target: takes an input, panics if the parser breaks its contract, and says
/// whether the parser took the input.
pub type Target = fn(&[u8]) -> bool;

/// Every target, by the name of its binary and corpus directory.
pub const TARGETS: [(&str, Target); 8] = [
    ("frame", targets::frame),
    ("signed_state", targets::signed_state),
    ("pulse", targets::pulse),
    ("authority", targets::authority),
    ("journal", targets::journal),
    ("claim_file", targets::claim_file),
    ("claim_params", targets::claim_params),
    ("csr", targets::csr),
];
