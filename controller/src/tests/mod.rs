//! The controller's tests against a scripted API server.

pub mod api;
pub mod fixtures;
mod rack;
mod reconcile;
mod wiring;
