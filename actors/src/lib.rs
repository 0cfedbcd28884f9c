//! domaind's domain core: the rules that form, heal and report IMEX domains, and the
//! actors around them. No Kubernetes, tonic or NVML types: those are adapters behind
//! the traits in [`ports`].

pub mod actors;
pub mod config;
pub mod health_board;
pub mod model;
pub mod outcome;
mod port_error;
pub mod ports;
pub mod rules;
#[cfg(feature = "testing")]
pub mod testing;

pub use actors::node::{
    Complete, Depart, GetClaims, GetSnapshot, JoinClique, LeaveClique, NodeActor, NodeSnapshot,
    Prepare, Shutdown, Unprepare,
};
pub use config::NodeConfig;
pub use health_board::{HealthBoard, HealthView, PreparedDevice};
pub use outcome::{PrepareError, Prepared};
pub use ports::Ports;
