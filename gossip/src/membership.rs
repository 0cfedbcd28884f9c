//! Builds what domaind's core sees of gossip (`domaind_membership`) from chitchat's
//! live-node snapshots, and streams its changes.

use std::collections::BTreeMap;

use chitchat::{ChitchatId, NodeState};
use futures::{Stream, StreamExt};

pub use domaind_membership::{GossipEvent, Member, Membership, apply, diff};

/// Builds the membership from chitchat's live nodes. When a restarted node is briefly
/// live under two generations, the newest one speaks for it: state of an old
/// generation must not resurrect what the new one has dropped. Only nodes whose state
/// carries their signed certificate count: chitchat also lists ids it has only seen in
/// digests, which anyone can write.
pub fn membership_from(live: &BTreeMap<ChitchatId, NodeState>) -> Membership {
    let mut members = Membership::new();
    for (id, state) in live {
        let Some(keys) = crate::signed::visible(state) else {
            continue;
        };
        let candidate = Member {
            node: id.node_id.to_string(),
            generation: id.generation_id,
            gossip_addr: id.gossip_advertise_addr,
            keys,
        };
        match members.get(candidate.node.as_str()) {
            Some(existing) if existing.generation >= candidate.generation => {}
            _ => {
                members.insert(candidate.node.clone(), candidate);
            }
        }
    }
    members
}

/// Turns a stream of membership snapshots into the events between them, starting
/// from an empty view: the first snapshot yields a join (and keys) for every member.
pub fn event_stream(
    snapshots: impl Stream<Item = Membership> + Send + 'static,
) -> impl Stream<Item = GossipEvent> + Send + 'static {
    futures::stream::unfold(
        (Box::pin(snapshots), Membership::new()),
        |(mut snapshots, before)| async move {
            let after = snapshots.next().await?;
            let events = diff(&before, &after);
            Some((futures::stream::iter(events), (snapshots, after)))
        },
    )
    .flatten()
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn member(node: &str, generation: u64, keys: &[(&str, &str)]) -> Member {
        Member {
            node: node.to_owned(),
            generation,
            gossip_addr: "127.0.0.1:1".parse().unwrap(),
            keys: keys
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect(),
        }
    }

    fn view(members: &[Member]) -> Membership {
        members
            .iter()
            .map(|m| (m.node.clone(), m.clone()))
            .collect()
    }

    #[test]
    fn join_brings_its_keys() {
        let after = view(&[member("a", 1, &[("domain/x", "1")])]);
        assert_eq!(
            diff(&Membership::new(), &after),
            vec![
                GossipEvent::NodeJoined {
                    node: "a".into(),
                    generation: 1,
                    gossip_addr: "127.0.0.1:1".parse().unwrap()
                },
                GossipEvent::KeySet {
                    node: "a".into(),
                    key: "domain/x".into(),
                    value: "1".into()
                },
            ]
        );
    }

    #[test]
    fn key_changes_and_deletions() {
        let before = view(&[member("a", 1, &[("k1", "1"), ("k2", "2")])]);
        let after = view(&[member("a", 1, &[("k1", "10")])]);
        assert_eq!(
            diff(&before, &after),
            vec![
                GossipEvent::KeySet {
                    node: "a".into(),
                    key: "k1".into(),
                    value: "10".into()
                },
                GossipEvent::KeyDeleted {
                    node: "a".into(),
                    key: "k2".into()
                },
            ]
        );
    }

    #[test]
    fn restart_is_leave_then_join_without_stale_keys() {
        let before = view(&[member("a", 1, &[("old", "1")])]);
        let after = view(&[member("a", 2, &[("new", "1")])]);
        let events = diff(&before, &after);
        assert_eq!(
            events[0],
            GossipEvent::NodeLeft {
                node: "a".into(),
                generation: 1
            }
        );
        assert!(matches!(
            events[1],
            GossipEvent::NodeJoined { generation: 2, .. }
        ));
        let mut replay = before.clone();
        apply(&mut replay, &events);
        assert_eq!(replay, after);
    }

    /// A node state as the signed-state check lets it in: its certificate first. The
    /// values here are not really signed: `membership_from` reads states already
    /// checked, and trusts them.
    fn certified(keys: &[(&str, &str)]) -> NodeState {
        let mut state = NodeState::for_test();
        state.set(crate::signed::CERT_KEY, "c2ln.certificate");
        for (key, value) in keys {
            state.set(*key, format!("c2ln.{value}"));
        }
        state
    }

    #[test]
    fn newest_generation_speaks_for_a_node() {
        let mut live = BTreeMap::new();
        let old = ChitchatId::new("a", 1, "127.0.0.1:1".parse().unwrap());
        let new = ChitchatId::new("a", 2, "127.0.0.1:1".parse().unwrap());
        live.insert(new, certified(&[]));
        live.insert(old, certified(&[]));
        let members = membership_from(&live);
        assert_eq!(members.len(), 1);
        assert_eq!(members["a"].generation, 2);
    }

    #[test]
    fn a_node_known_only_from_digests_is_no_member_and_shadows_nobody() {
        let mut live = BTreeMap::new();
        let real = ChitchatId::new("a", 1, "127.0.0.1:1".parse().unwrap());
        // A later generation of `a`, and a node nobody runs, both seen in a forged
        // digest: chitchat tracks them, with no state.
        let forged = ChitchatId::new("a", 9, "127.0.0.66:1".parse().unwrap());
        let ghost = ChitchatId::new("ghost", 1, "127.0.0.66:2".parse().unwrap());
        live.insert(real, certified(&[("domain/x", "ad")]));
        live.insert(forged, NodeState::for_test());
        live.insert(ghost, NodeState::for_test());
        let members = membership_from(&live);
        assert_eq!(members.keys().collect::<Vec<_>>(), ["a"]);
        assert_eq!(members["a"].generation, 1);
        assert_eq!(members["a"].keys["domain/x"], "ad");
        assert!(!members["a"].keys.contains_key(crate::signed::CERT_KEY));
    }

    #[test]
    fn a_signed_deletion_hides_the_key() {
        let mut state = certified(&[("domain/x", "ad"), ("status/x", "s")]);
        state.set_with_ttl("status/x", "c2ln.");
        let mut live = BTreeMap::new();
        live.insert(
            ChitchatId::new("a", 1, "127.0.0.1:1".parse().unwrap()),
            state,
        );
        let members = membership_from(&live);
        assert_eq!(members["a"].keys.keys().collect::<Vec<_>>(), ["domain/x"]);
    }

    fn arb_view() -> impl Strategy<Value = Membership> {
        proptest::collection::btree_map(
            "[a-d]",
            (
                1u64..3,
                proptest::collection::btree_map("[k-n]", "[0-2]", 0..4),
            ),
            0..4,
        )
        .prop_map(|nodes| {
            nodes
                .into_iter()
                .map(|(node, (generation, keys))| {
                    let m = Member {
                        node: node.clone(),
                        generation,
                        gossip_addr: "127.0.0.1:1".parse().unwrap(),
                        keys,
                    };
                    (node, m)
                })
                .collect()
        })
    }

    proptest! {
        #[test]
        fn diff_then_apply_reproduces_the_new_view(before in arb_view(), after in arb_view()) {
            let mut replay = before.clone();
            apply(&mut replay, &diff(&before, &after));
            prop_assert_eq!(replay, after);
        }

        #[test]
        fn no_change_no_events(v in arb_view()) {
            prop_assert!(diff(&v, &v).is_empty());
        }
    }
}
