//! The node's IMEX daemon: its files, the adapter that runs it (itself, or through a
//! keeper that outlives it: the runner or the host's systemd unit). Its fake, `imex-sim`,
//! is in `domaind-testbed`.

pub mod child;
pub mod config;
pub mod daemon;
pub mod guard;
pub mod holders;
pub mod host_service;
pub mod hosts;
pub mod keeper;
pub mod leftover;
pub mod listen_check;
pub mod output;
pub mod processes;
pub mod procfs;
pub mod relink;
pub mod runner;
pub(crate) mod spawner;

pub use config::{AddressingMode, Command, HostUnit, ImexSettings};
pub use daemon::ImexDaemon;

/// Gives the IMEX adapter's metrics their help text (`# HELP` on `/metrics`, and the
/// book's metrics reference); the daemon calls it once, after installing its recorder.
pub fn describe_metrics() {
    use daemon::{
        IMEX_ADOPTIONS, IMEX_EXITS, IMEX_RELOADS, IMEX_RELOADS_DEFERRED, IMEX_STARTS,
        IMEX_TLS_ROTATIONS,
    };
    use metrics::describe_counter;
    describe_counter!(IMEX_STARTS, "IMEX daemons started by this node.");
    describe_counter!(
        IMEX_RELOADS,
        "Reloads (SIGUSR1) sent to the IMEX daemon after its peers changed."
    );
    describe_counter!(IMEX_EXITS, "IMEX daemons of this node seen to exit.");
    describe_counter!(
        IMEX_RELOADS_DEFERRED,
        "Reloads held back until a freshly started IMEX daemon answers (a SIGUSR1 before \
         then would kill it)."
    );
    describe_counter!(
        IMEX_TLS_ROTATIONS,
        "Rotated gossip credentials written for IMEX's own TLS, by `outcome`: `written` (then \
         a reload), `failed` (retried)."
    );
    describe_counter!(
        IMEX_ADOPTIONS,
        "IMEX daemons found running at start outside this process (the runner's, the host \
         unit's), by `outcome`: `adopted` (it serves the config this node would write), \
         `kept` (it serves another, but prepared claims use it), `replaced`."
    );
    describe_counter!(
        leftover::IMEX_LEFTOVERS,
        "Leftover IMEX daemons on this node's config stopped at start."
    );
    describe_counter!(
        listen_check::IMEX_PORT_BUSY,
        "IMEX starts refused because its server or command port was taken on the node's \
         address (the holder is logged)."
    );
}
