//! What a node taking over a domain's reporter role may write, given the status as
//! last written (by a predecessor, or by itself before a restart).
//!
//! A node that just started (or just joined the domain) sees the domain through
//! gossip that is still filling up: members it has not heard of yet are not members
//! in its view, and a document built from that view would drop them. So the status
//! as written is the baseline: a node listed there that this node has never seen as a
//! member is *unaccounted for*, and the new reporter writes nothing while any is,
//! for at most `grace` after it joined. Past the grace, an unaccounted node gossip
//! does not know is listed as lost (NotReady: nobody saw it leave), and one that
//! gossip knows alive without advertising the domain left it and is not listed.
//! A node the reporter did see as a member needs no baseline: its leaving or death
//! was witnessed and is reported as such.

use std::collections::BTreeSet;
use std::time::Duration;

use tokio::time::Instant;

use crate::model::{NodeId, Phase};
use crate::rules::status::{DomainStatus, NodeStatus};

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Takeover {
    /// Write, listing `adopt` as lost members besides what the view shows.
    Write { adopt: Vec<NodeStatus> },
    /// Write nothing yet: the view may still be filling up. Decide again on the next
    /// change, or at `until` at the latest.
    Hold {
        until: Instant,
        unaccounted: Vec<NodeId>,
    },
}

/// `witnessed`: every node this one has seen as a member of the domain since it
/// (re)started; `live`: the node names gossip knows alive now.
pub fn takeover(
    written: Option<&DomainStatus>,
    witnessed: &BTreeSet<NodeId>,
    live: &BTreeSet<NodeId>,
    joined: Instant,
    grace: Duration,
    now: Instant,
) -> Takeover {
    let unaccounted: Vec<&NodeStatus> = written
        .map(|w| {
            w.nodes
                .iter()
                .filter(|n| !witnessed.contains(&n.name))
                .collect()
        })
        .unwrap_or_default();
    if unaccounted.is_empty() {
        return Takeover::Write { adopt: Vec::new() };
    }
    if now < joined + grace {
        return Takeover::Hold {
            until: joined + grace,
            unaccounted: unaccounted.iter().map(|n| n.name.clone()).collect(),
        };
    }
    Takeover::Write {
        adopt: unaccounted
            .into_iter()
            .filter(|n| !live.contains(&n.name))
            .map(|n| NodeStatus {
                status: Phase::NotReady,
                ..n.clone()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(10);

    fn row(name: &str, status: Phase) -> NodeStatus {
        NodeStatus {
            name: name.into(),
            ip_address: "10.0.0.1".into(),
            clique_id: "c.0".into(),
            index: Some(0),
            status,
        }
    }

    fn written(names: &[&str]) -> DomainStatus {
        DomainStatus {
            status: Phase::Ready,
            ready_nodes: names.len() as u32,
            total_nodes: names.len() as u32,
            message: String::new(),
            nodes: names.iter().map(|n| row(n, Phase::Ready)).collect(),
            channel: None,
        }
    }

    fn names(names: &[&str]) -> BTreeSet<NodeId> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn a_restarted_node_holds_while_written_members_are_unseen() {
        let joined = Instant::now();
        let before = written(&["gb-1", "gb-2", "gb-3"]);
        // Just restarted: gossip has told gb-3 of nobody yet.
        assert_eq!(
            takeover(
                Some(&before),
                &names(&["gb-3"]),
                &names(&["gb-3"]),
                joined,
                GRACE,
                joined + Duration::from_millis(2_100),
            ),
            Takeover::Hold {
                until: joined + GRACE,
                unaccounted: vec!["gb-1".into(), "gb-2".into()],
            }
        );
        // Once it has seen them as members, their fate is its own to report.
        assert_eq!(
            takeover(
                Some(&before),
                &names(&["gb-1", "gb-2", "gb-3"]),
                &names(&["gb-3"]),
                joined,
                GRACE,
                joined + Duration::from_millis(2_100),
            ),
            Takeover::Write { adopt: vec![] }
        );
    }

    #[test]
    fn nothing_written_or_nothing_unseen_writes_at_once() {
        let joined = Instant::now();
        for status in [None, Some(written(&[])), Some(written(&["a"]))] {
            assert_eq!(
                takeover(
                    status.as_ref(),
                    &names(&["a"]),
                    &names(&["a"]),
                    joined,
                    GRACE,
                    joined
                ),
                Takeover::Write { adopt: vec![] }
            );
        }
    }

    #[test]
    fn past_the_grace_the_unseen_are_lost_unless_gossip_knows_them_alive() {
        let joined = Instant::now();
        let before = written(&["a", "b", "c"]);
        // b is alive but does not advertise the domain: it left. c is nowhere.
        assert_eq!(
            takeover(
                Some(&before),
                &names(&["a"]),
                &names(&["a", "b"]),
                joined,
                GRACE,
                joined + GRACE,
            ),
            Takeover::Write {
                adopt: vec![row("c", Phase::NotReady)]
            }
        );
    }
}
