//! The IMEX adapter against `imex-sim`: real processes, files, signals and links. One
//! test binary: each costs link time and disk.

mod host_service;
mod runner;
mod sim;
mod supervisor;
mod tls;
