//! The book's reference pages (docs/src/reference/), generated from the code so that
//! they cannot drift from it: each crate that owns a page has a test that renders it
//! with these functions and compares it with the committed file ([`page::check`]),
//! which writes it instead when `DOMAIND_WRITE_REFERENCE=1` is set.
//!
//! - the command lines, from clap's own model of them ([`cli`]);
//! - the Helm chart's values, from values.yaml and its comments ([`helm`]; this
//!   crate's own test renders that page);
//! - the metrics, from their descriptions as the processes register them ([`metrics`]);
//! - events and conditions, as tables the daemon's test fills from the code's
//!   catalogues ([`markdown::table`]).

pub mod cli;
pub mod helm;
pub mod markdown;
pub mod metrics;
pub mod page;
