//! What the rules' tests build their members from.

use crate::model::{Advertisement, CliqueId, DomainMember};

/// An advertisement of domain `ns/cd` in clique `c.0` at 10.0.0.1, with no slot and
/// IMEX not ready; a test sets what it is about.
pub fn advertisement() -> Advertisement {
    Advertisement {
        namespace: "ns".into(),
        name: "cd".into(),
        num_nodes: 0,
        ip: "10.0.0.1".parse().expect("an IP"),
        clique: CliqueId("c.0".into()),
        slot: None,
        imex_ready: false,
        imex_failing: false,
        imex_outlives_daemon: false,
        joined_at_ms: 0,
        sharing: None,
    }
}

/// `node`, in its first generation, advertising `ad`.
pub fn member(node: &str, ad: Advertisement) -> DomainMember {
    DomainMember {
        node: node.to_owned(),
        generation: 1,
        ad,
    }
}
