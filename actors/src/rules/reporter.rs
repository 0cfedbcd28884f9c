//! Which node writes a domain's status: the live member with the smallest name. Every
//! member computes the same answer from the same view, so there is no election round;
//! when the reporter dies, the next smallest takes over as soon as it is declared dead.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use tokio::time::Instant;

use crate::model::NodeId;
use crate::ports::DomainEvent;

pub fn reporter<V>(members: &BTreeMap<String, V>) -> Option<&str> {
    members.keys().next().map(String::as_str)
}

pub fn is_reporter<V>(members: &BTreeMap<String, V>, node: &str) -> bool {
    reporter(members) == Some(node)
}

/// From when a node may act as a domain's reporter. A node that just joined, or whose
/// view is still filling up (a rack starting cold), sees too few members and would
/// name itself: so not before `settle` after it joined the domain, nor — within
/// `settle_max` of joining — before `settle` after its view last changed (gossip saw a
/// node come or go, or a member joined or left the domain).
/// Past `settle_max` a churning cluster no longer holds the reporter back.
pub fn reporter_from(
    joined: Instant,
    membership_changed: Option<Instant>,
    settle: Duration,
    settle_max: Duration,
) -> Instant {
    let after_join = joined + settle;
    let after_quiet =
        membership_changed.map_or(after_join, |changed| (changed + settle).max(after_join));
    after_quiet.min(joined + settle_max.max(settle))
}

/// What the reporter last told users through node events (the phase events follow
/// the writes: see [`crate::rules::status_writes`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Announced {
    pub members: BTreeSet<NodeId>,
    pub lost: BTreeSet<NodeId>,
}

/// The node events that tell users what changed since `before`: members that joined,
/// members lost. A node new to the role (`before` is none) announces only what is
/// news to users, the losses: the members it finds were there before it reported.
pub fn announcements(before: Option<&Announced>, now: &Announced) -> Vec<DomainEvent> {
    let none_lost = BTreeSet::new();
    let (members_before, lost_before) = match before {
        Some(before) => (&before.members, &before.lost),
        None => (&now.members, &none_lost),
    };
    now.members
        .difference(members_before)
        .map(|node| DomainEvent::NodeJoined { node: node.clone() })
        .chain(
            now.lost
                .difference(lost_before)
                .map(|node| DomainEvent::NodeLost { node: node.clone() }),
        )
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    const SETTLE: Duration = Duration::from_millis(200);
    const MAX: Duration = Duration::from_secs(5);

    #[test]
    fn a_member_reports_once_it_and_gossip_have_settled() {
        let joined = Instant::now();
        let ms = Duration::from_millis;
        // A warm cluster: gossip last changed long before.
        let long_ago = joined.checked_sub(ms(60_000));
        assert_eq!(
            reporter_from(joined, long_ago, SETTLE, MAX),
            joined + SETTLE
        );
        assert_eq!(reporter_from(joined, None, SETTLE, MAX), joined + SETTLE);
        // A cold rack: members still arriving 900 ms after the join.
        assert_eq!(
            reporter_from(joined, Some(joined + ms(900)), SETTLE, MAX),
            joined + ms(1100)
        );
        // Churn without end holds it back no longer than the maximum.
        assert_eq!(
            reporter_from(joined, Some(joined + ms(4_950)), SETTLE, MAX),
            joined + MAX
        );
        // A maximum below the settle is the settle.
        assert_eq!(
            reporter_from(joined, Some(joined + ms(900)), SETTLE, ms(50)),
            joined + SETTLE
        );
    }

    #[test]
    fn smallest_name_reports_and_the_next_takes_over() {
        let mut members: BTreeMap<String, ()> = ["node-10", "node-02", "node-07"]
            .iter()
            .map(|n| ((*n).to_owned(), ()))
            .collect();
        assert_eq!(reporter(&members), Some("node-02"));
        members.remove("node-02");
        assert!(is_reporter(&members, "node-07"));
        members.clear();
        assert_eq!(reporter(&members), None);
    }

    fn names(names: &[&str]) -> BTreeSet<NodeId> {
        names.iter().map(|n| (*n).to_owned()).collect()
    }

    #[test]
    fn joins_and_losses_are_announced_once() {
        let first = Announced {
            members: names(&["a", "b"]),
            lost: names(&["c"]),
        };
        // A new reporter: the members it finds are not news, the loss is.
        assert_eq!(
            announcements(None, &first),
            vec![DomainEvent::NodeLost { node: "c".into() }]
        );
        let next = Announced {
            members: names(&["a", "b", "d"]),
            lost: names(&["c", "e"]),
        };
        assert_eq!(
            announcements(Some(&first), &next),
            vec![
                DomainEvent::NodeJoined { node: "d".into() },
                DomainEvent::NodeLost { node: "e".into() }
            ]
        );
        assert!(announcements(Some(&next), &next).is_empty());
        // A member that leaves, or a lost one forgotten, is no event.
        let after = Announced {
            members: names(&["a"]),
            lost: names(&[]),
        };
        assert!(announcements(Some(&next), &after).is_empty());
    }
}
