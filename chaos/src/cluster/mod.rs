//! `domaind-chaos run --cluster`: the chaos run against a real cluster, through the
//! API server.

pub mod access;
pub mod pods;
