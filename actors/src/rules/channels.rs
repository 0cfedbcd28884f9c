//! Channel isolation: the shared IMEX domain of a clique, the channel each sharing
//! ComputeDomain gets, with no allocator, and when a channel may be handed to a pod.
//!
//! **The shared IMEX domain.** Every node of a clique holding a claim of a domain with
//! `isolation: Channel` joins one IMEX domain: the clique's *shared IMEX domain*, run by
//! the same rules as a ComputeDomain's (membership, slots, peer set, peer health) under
//! the gossip key `domain/<shared_imex_uid(clique)>`. Per clique rather than the union
//! of the sharing domains' members: an IMEX domain's nodes config must list the same
//! nodes on every node, and unions of overlapping domains are not the same on every
//! node (a in D1 with b, b in D2 with c: a would list {a, b}, b {a, b, c}).
//!
//! **Channels, no allocator** (the slot rule, one level up). Each member of a sharing
//! domain advertises the channel it holds for it. Every node computes the same
//! assignment from what it sees:
//!
//! 1. Domains already handed to pods come first (a member advertises `held`: its
//!    channel can no longer move), then by seniority: `(earliest joined_at_ms of its
//!    members, uid)`.
//! 2. In that order, each domain's preference (the channel a holding member
//!    advertises, else its most senior member's) in `0..capacity` is granted unless a
//!    domain before it got it.
//! 3. Then each domain left without one gets the lowest free channel; none free: the
//!    range is exhausted and the domain waits, unassigned.
//!
//! Agreement, uniqueness and stability are the slot rule's (`rules::slots`): a settled
//! domain never moves, a newcomer only takes a free channel.
//!
//! **Handing a channel out.** Views differ while gossip spreads: two domains created at
//! once on different nodes may both be assigned channel 1 for a moment. A pod that got
//! it could import the other domain's memory, and a device given to a running pod
//! cannot be taken back, so a channel is only handed out once it is *confirmed*:
//!
//! - every live node of the shared IMEX domain advertises (on the shared domain's key)
//!   the same channel for the domain: a node advertises one assignment, injective, so
//!   while any node it sees assigns channel 1 to D1, no node sees D2 confirmed on it;
//! - and this node has advertised that assignment, unchanged, for a settle time `T`
//!   longer than gossip takes to spread a change (`L`). Without it, two nodes that
//!   each form a new domain and have not yet heard of the other's shared-domain key
//!   (each alone in its view) would each confirm channel 0. With it: say a confirms D1
//!   on 0 at `t` and b confirms D2 on 0 at `t'`. b advertised its assignment by
//!   `t' - T`, so a saw it by `t' - T + L` and, not having seen it at `t`,
//!   `t < t' - T + L`; likewise `t' < t - T + L`. Adding: `0 < 2(L - T)`, false when
//!   `T > L`.
//! - Once handed out, a domain is `held` and outranks the domains held nowhere, so a
//!   more senior domain seen late cannot take its channel.
//!
//! What this does not cover: a gossip partition (or a delay longer than `T`), where
//! each side confirms with the nodes it sees (ARCHITECTURE, "Several ComputeDomains on
//! one node").

use std::collections::BTreeMap;

use domaind_membership::Membership;

use crate::model::{Advertisement, ChannelId, CliqueId, DomainUid, NodeId};
use crate::rules::membership::{DOMAIN_KEY_PREFIX, decode_advertisement};
use crate::rules::slots::grant;

/// The shared IMEX domain's name among domain keys: not a Kubernetes UID (those are
/// UUIDs), so it cannot collide with a ComputeDomain's.
pub const SHARED_IMEX_PREFIX: &str = "shared-imex.";

/// The uid the clique's shared IMEX domain advertises under.
pub fn shared_imex_uid(clique: &CliqueId) -> DomainUid {
    DomainUid(format!("{SHARED_IMEX_PREFIX}{clique}"))
}

pub fn is_shared_imex(uid: &DomainUid) -> bool {
    uid.0.starts_with(SHARED_IMEX_PREFIX)
}

/// What the assignment needs to know of one sharing domain.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChannelCandidate {
    pub uid: DomainUid,
    /// A member has handed the channel it advertises to a pod.
    pub held: bool,
    /// The earliest `joined_at_ms` among its members.
    pub seniority: u64,
    pub preferred: Option<ChannelId>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct ChannelAssignment {
    pub channels: BTreeMap<DomainUid, ChannelId>,
    /// Domains left without a channel: every channel of the range is taken.
    pub unassigned: Vec<DomainUid>,
}

/// A channel a member advertises, ranked by the member's seniority `(joined, node)`.
type Preference = ((bool, u64, NodeId), ChannelId);

/// The sharing domains advertised in `clique` by the live nodes of `live`, as
/// candidates: a domain's preference is the channel a holding member advertises, else
/// its most senior member's. `away` are the last shared-domain advertisements of nodes
/// gossip lost (kept for the lost retention): the channels their pods held stay
/// reserved, held, while they are away.
pub fn sharing_domains<'a>(
    live: &Membership,
    clique: &CliqueId,
    away: impl IntoIterator<Item = (&'a NodeId, &'a Advertisement)>,
) -> Vec<ChannelCandidate> {
    let mut domains: BTreeMap<DomainUid, (u64, Option<Preference>)> = BTreeMap::new();
    for (node, member) in live {
        for (key, value) in &member.keys {
            let Some(uid) = key.strip_prefix(DOMAIN_KEY_PREFIX) else {
                continue;
            };
            let uid = DomainUid(uid.to_owned());
            if is_shared_imex(&uid) {
                continue;
            }
            let Ok(ad) = decode_advertisement(value) else {
                continue;
            };
            let Some(sharing) = ad.sharing.filter(|_| &ad.clique == clique) else {
                continue;
            };
            let entry = domains.entry(uid).or_insert((ad.joined_at_ms, None));
            entry.0 = entry.0.min(ad.joined_at_ms);
            if let Some(channel) = sharing.channel {
                // A holding member's channel first, then the most senior member's.
                let rank = (!sharing.held, ad.joined_at_ms, node.clone());
                if entry.1.as_ref().is_none_or(|(best, _)| rank < *best) {
                    entry.1 = Some((rank, channel));
                }
            }
        }
    }
    for (node, ad) in away {
        let Some(sharing) = ad.sharing.as_ref().filter(|_| &ad.clique == clique) else {
            continue;
        };
        for (uid, channel) in &sharing.held_channels {
            let entry = domains
                .entry(uid.clone())
                .or_insert((ad.joined_at_ms, None));
            let rank = (false, ad.joined_at_ms, node.clone());
            if entry.1.as_ref().is_none_or(|(best, _)| rank < *best) {
                entry.1 = Some((rank, *channel));
            }
        }
    }
    domains
        .into_iter()
        .map(|(uid, (seniority, preferred))| ChannelCandidate {
            uid,
            held: preferred
                .as_ref()
                .is_some_and(|((not_held, _, _), _)| !not_held),
            seniority,
            preferred: preferred.map(|(_, channel)| channel),
        })
        .collect()
}

/// Assigns channels `0..capacity`; see the module documentation.
pub fn assign_channels(candidates: &[ChannelCandidate], capacity: ChannelId) -> ChannelAssignment {
    let mut order: Vec<&ChannelCandidate> = candidates.iter().collect();
    order.sort_by(|a, b| (!a.held, a.seniority, &a.uid).cmp(&(!b.held, b.seniority, &b.uid)));
    order.dedup_by(|a, b| a.uid == b.uid);
    let (channels, unassigned) =
        grant(order.iter().map(|c| (c.uid.clone(), c.preferred)), capacity);
    ChannelAssignment {
        channels,
        unassigned,
    }
}

/// The channels of `mine` that every node's assignment in `others` agrees with: what
/// may be handed to pods. `others` are the assignments the live nodes of the shared
/// IMEX domain advertise (this node's own included or not: `mine` is).
pub fn confirmed<'a>(
    mine: &BTreeMap<DomainUid, ChannelId>,
    others: impl IntoIterator<Item = &'a BTreeMap<DomainUid, ChannelId>> + Clone,
) -> BTreeMap<DomainUid, ChannelId> {
    mine.iter()
        .filter(|(uid, channel)| {
            others
                .clone()
                .into_iter()
                .all(|theirs| theirs.get(*uid) == Some(*channel))
        })
        .map(|(uid, channel)| (uid.clone(), *channel))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::Sharing;
    use crate::rules::fixtures::advertisement;
    use crate::rules::membership::encode_advertisement;
    use domaind_membership::Member;
    use proptest::prelude::*;
    use std::collections::BTreeSet;

    fn c(uid: &str, seniority: u64, preferred: Option<ChannelId>) -> ChannelCandidate {
        ChannelCandidate {
            uid: DomainUid(uid.into()),
            held: false,
            seniority,
            preferred,
        }
    }

    fn uid(s: &str) -> DomainUid {
        DomainUid(s.into())
    }

    #[test]
    fn newcomers_take_the_lowest_free_channels_in_seniority_order() {
        let a = assign_channels(&[c("b", 2, None), c("a", 2, None), c("z", 1, None)], 8);
        assert_eq!(a.channels[&uid("z")], 0);
        assert_eq!(a.channels[&uid("a")], 1);
        assert_eq!(a.channels[&uid("b")], 2);
    }

    #[test]
    fn the_senior_domain_keeps_a_contested_channel() {
        let a = assign_channels(&[c("new", 5, Some(1)), c("old", 1, Some(1))], 8);
        assert_eq!(a.channels[&uid("old")], 1);
        assert_eq!(
            a.channels[&uid("new")],
            0,
            "the junior moves to the lowest free"
        );
    }

    #[test]
    fn a_held_channel_never_moves_for_a_more_senior_domain_seen_late() {
        let held = ChannelCandidate {
            held: true,
            ..c("young-held", 9, Some(0))
        };
        let a = assign_channels(&[c("old", 1, Some(0)), held], 8);
        assert_eq!(a.channels[&uid("young-held")], 0);
        assert_eq!(a.channels[&uid("old")], 1);
    }

    #[test]
    fn an_exhausted_range_leaves_the_junior_unassigned() {
        let a = assign_channels(&[c("a", 1, None), c("b", 2, None), c("c", 3, None)], 2);
        assert_eq!(a.channels.len(), 2);
        assert_eq!(a.unassigned, vec![uid("c")]);
    }

    #[test]
    fn a_preference_outside_the_range_is_not_granted() {
        let a = assign_channels(&[c("a", 1, Some(9))], 4);
        assert_eq!(a.channels[&uid("a")], 0);
    }

    fn member(node: &str, keys: Vec<(String, String)>) -> (NodeId, Member) {
        (
            node.to_owned(),
            Member {
                node: node.to_owned(),
                generation: 1,
                gossip_addr: "127.0.0.1:1".parse().unwrap(),
                keys: keys.into_iter().collect(),
            },
        )
    }

    fn ad(clique: &str, joined: u64, channel: Option<ChannelId>, shared: bool) -> String {
        held_ad(clique, joined, channel, shared, false)
    }

    fn held_ad(
        clique: &str,
        joined: u64,
        channel: Option<ChannelId>,
        shared: bool,
        held: bool,
    ) -> String {
        encode_advertisement(&crate::model::Advertisement {
            clique: CliqueId(clique.into()),
            joined_at_ms: joined,
            sharing: shared.then(|| Sharing {
                channel,
                held,
                ..Sharing::default()
            }),
            ..advertisement()
        })
    }

    #[test]
    fn candidates_are_the_sharing_domains_of_our_clique_with_their_seniors_channel() {
        let live: Membership = [
            member(
                "a",
                vec![
                    ("domain/d1".into(), ad("c.0", 5, Some(3), true)),
                    ("domain/shared-imex.c.0".into(), ad("c.0", 1, None, true)),
                ],
            ),
            member("b", vec![("domain/d1".into(), ad("c.0", 2, Some(4), true))]),
            member("g", vec![("domain/d3".into(), ad("c.0", 3, Some(5), true))]),
            member(
                "h",
                vec![("domain/d3".into(), held_ad("c.0", 8, Some(6), true, true))],
            ),
            member("c", vec![("domain/d2".into(), ad("c.0", 9, None, true))]),
            member("d", vec![("domain/x".into(), ad("c.0", 1, None, false))]),
            member("e", vec![("domain/y".into(), ad("c.1", 1, Some(0), true))]),
            member("f", vec![("domain/z".into(), "not json".into())]),
        ]
        .into_iter()
        .collect();
        let found = sharing_domains(&live, &CliqueId("c.0".into()), []);
        let held_d3 = ChannelCandidate {
            held: true,
            ..c("d3", 3, Some(6))
        };
        assert_eq!(found, vec![c("d1", 2, Some(4)), c("d2", 9, None), held_d3]);
    }

    /// A node whose daemon died keeps its pods' channels reserved while it is away:
    /// a new domain never gets them.
    #[test]
    fn the_channels_held_on_a_lost_node_stay_reserved() {
        let live: Membership = [member(
            "a",
            vec![("domain/new".into(), ad("c.0", 1, None, true))],
        )]
        .into_iter()
        .collect();
        let lost_ad = crate::model::Advertisement {
            clique: CliqueId("c.0".into()),
            joined_at_ms: 5,
            sharing: Some(Sharing {
                held_channels: [(uid("old"), 0)].into(),
                ..Sharing::default()
            }),
            ..advertisement()
        };
        let lost = "b".to_owned();
        let found = sharing_domains(&live, &CliqueId("c.0".into()), [(&lost, &lost_ad)]);
        let a = assign_channels(&found, 8);
        assert_eq!(a.channels[&uid("old")], 0);
        assert_eq!(a.channels[&uid("new")], 1);
    }

    #[test]
    fn a_channel_is_confirmed_only_where_every_node_agrees() {
        let mine: BTreeMap<DomainUid, ChannelId> = [(uid("d1"), 1), (uid("d2"), 2)].into();
        let agrees = mine.clone();
        let disagrees: BTreeMap<DomainUid, ChannelId> = [(uid("d1"), 1), (uid("d3"), 2)].into();
        let ok = confirmed(&mine, [&agrees, &disagrees]);
        assert_eq!(ok, [(uid("d1"), 1)].into());
        assert_eq!(confirmed(&mine, [&agrees]), mine);
    }

    /// Nodes that each advertise one assignment can never confirm two domains on one
    /// channel: whichever node decides, against the assignments advertised.
    #[test]
    fn no_two_domains_are_confirmed_on_one_channel() {
        proptest!(|(views in proptest::collection::vec(
            proptest::collection::btree_map(0u8..4, 0u32..3, 0..4), 2..5))| {
            // Each advertised assignment is injective, as assign_channels makes it.
            let assignments: Vec<BTreeMap<DomainUid, ChannelId>> = views
                .iter()
                .map(|m| {
                    let mut seen = BTreeSet::new();
                    m.iter()
                        .filter(|(_, ch)| seen.insert(**ch))
                        .map(|(d, ch)| (uid(&format!("d{d}")), *ch))
                        .collect()
                })
                .collect();
            let mut handed: BTreeMap<ChannelId, BTreeSet<DomainUid>> = BTreeMap::new();
            for mine in &assignments {
                for (d, ch) in confirmed(mine, assignments.iter()) {
                    handed.entry(ch).or_default().insert(d);
                }
            }
            for (ch, domains) in handed {
                prop_assert!(domains.len() <= 1, "channel {ch} confirmed for {domains:?}");
            }
        });
    }
}
