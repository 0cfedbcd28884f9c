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
