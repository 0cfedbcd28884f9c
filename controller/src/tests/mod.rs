//! The controller's tests against the scripted API server (`domaind_kube_api::testing`).

pub mod fixtures;
mod rack;
mod reconcile;
mod wiring;
