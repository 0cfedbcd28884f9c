//! The node's NVLink clique at run time. NVIDIA's driver gives a node a new clique when
//! its fabric registers again (a fabric manager restart, a repartition); the node reads
//! its fabric every `--clique-check-interval` and when its IMEX daemon starts failing
//! ([`ObservedImex`]), decides with a pure rule ([`rule`]) whether that is a move, and
//! hands each move to the daemon, which moves its clique-bound parts
//! (`daemon/moving.rs`).

mod imex;
pub mod rule;
mod watch;

pub use imex::ObservedImex;
pub use rule::{CliqueTiming, CliqueTracker, ReadFailure, Verdict};
pub use watch::{CliqueMove, CliqueWatch, FabricReader, InventoryReader};

/// Reads of the fabric that said nothing usable, by `kind`: `nvml`, `topology`,
/// `registering` (a registration under way), `gpus_disagree`, `fabric_lost` (no GPU
/// registered any more: not believed as a move), `timeout`, `panicked`.
pub const CLIQUE_READ_FAILURES: &str = "domaind_clique_read_failures_total";
/// New cliques read once and not confirmed by the next read.
pub const CLIQUE_FLAPS: &str = "domaind_clique_flaps_total";
/// Moves to another clique carried out.
pub const CLIQUE_MOVES: &str = "domaind_clique_moves_total";
