//! The `domaind` binary's command line: each subcommand run as a process, as a user or
//! a manifest runs it. One test binary: each costs link time and disk.

mod bench;
mod certs;
mod controller;
mod demo;
mod deploy_manifests;
mod fixtures;
mod imex_failing;
mod imex_kill;
mod imex_orphans;
mod imex_tls;
mod kubelet_sim;
mod monitoring;
mod topology;
