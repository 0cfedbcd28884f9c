//! Channel isolation between the actors: what the clique's shared IMEX domain tells
//! the node, and the node its sharing domains (see `rules::channels`).

use std::collections::BTreeMap;

use actix::prelude::*;

use crate::model::{ChannelId, DomainUid, NodeId};

/// The role of a domain actor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// A ComputeDomain with its own IMEX domain (`isolation: IMEXDomain`): it drives
    /// this node's IMEX daemon.
    Exclusive,
    /// The clique's shared IMEX domain: it drives this node's IMEX daemon for every
    /// sharing domain, assigns their channels and writes no status.
    SharedImex,
    /// A ComputeDomain with `isolation: Channel`: follows the shared IMEX domain and
    /// waits for its channel.
    Sharing,
}

/// The channels this node's pods hold, by domain: from the node to the shared IMEX
/// domain, which advertises them.
#[derive(Debug, Clone, Default, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct HeldChannels(pub BTreeMap<DomainUid, ChannelId>);

/// The shared IMEX domain's state on this node, from its actor to the node and on to
/// each sharing domain.
#[derive(Debug, Clone, Default, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct SharedImexProgress {
    /// This node's IMEX daemon is ready for the shared domain's current peer set.
    pub local_ready: bool,
    /// This node's IMEX daemon is down and being restarted.
    pub imex_failing: bool,
    /// Every sharing domain's channel, as this node assigns them.
    pub assigned: BTreeMap<DomainUid, ChannelId>,
    /// The channels every live node of the shared IMEX domain assigns alike: only
    /// these are handed to pods.
    pub confirmed: BTreeMap<DomainUid, ChannelId>,
    /// Domains left without a channel: the range is exhausted.
    pub exhausted: Vec<DomainUid>,
    /// Nodes of the shared IMEX domain that are faulty, and how: reported on every
    /// domain sharing it.
    pub faults: BTreeMap<NodeId, SharedFault>,
    /// This node's IMEX failure episode under way: (episode, first failure's reason).
    pub failure: Option<(u64, String)>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum SharedFault {
    /// Gossip declared the node dead.
    Lost,
    /// Its IMEX daemon is down and being restarted.
    ImexFailing,
}

impl std::fmt::Display for SharedFault {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Lost => "lost",
            Self::ImexFailing => "IMEX failing",
        })
    }
}

/// The faults new since `before`: what a sharing domain's reporter announces.
pub fn new_faults(
    before: &BTreeMap<NodeId, SharedFault>,
    now: &BTreeMap<NodeId, SharedFault>,
) -> Vec<(NodeId, SharedFault)> {
    now.iter()
        .filter(|(node, fault)| before.get(*node) != Some(*fault))
        .map(|(node, fault)| (node.clone(), *fault))
        .collect()
}

/// What a sharing domain's channel is on this node now.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ChannelState {
    /// Confirmed by every node of the shared IMEX domain: may be handed out.
    Confirmed(ChannelId),
    /// Assigned here, not yet agreed by every node.
    Assigned(ChannelId),
    /// Every channel of the range is taken by more senior domains.
    Exhausted,
    /// The shared IMEX domain has not assigned one yet.
    Unassigned,
}

impl ChannelState {
    pub fn of(uid: &DomainUid, progress: Option<&SharedImexProgress>) -> Self {
        let Some(progress) = progress else {
            return Self::Unassigned;
        };
        if let Some(channel) = progress.confirmed.get(uid) {
            Self::Confirmed(*channel)
        } else if let Some(channel) = progress.assigned.get(uid) {
            Self::Assigned(*channel)
        } else if progress.exhausted.contains(uid) {
            Self::Exhausted
        } else {
            Self::Unassigned
        }
    }

    pub fn confirmed(&self) -> Option<ChannelId> {
        match self {
            Self::Confirmed(channel) => Some(*channel),
            _ => None,
        }
    }

    /// The channel to advertise as held: assigned or confirmed.
    pub fn held(&self) -> Option<ChannelId> {
        match self {
            Self::Confirmed(channel) | Self::Assigned(channel) => Some(*channel),
            _ => None,
        }
    }

    /// Why a prepare waits, when it does.
    pub fn waiting(&self, capacity: ChannelId) -> Option<String> {
        match self {
            Self::Confirmed(_) => None,
            Self::Assigned(channel) => Some(format!(
                "channel {channel} is not yet agreed by every node of the shared IMEX domain"
            )),
            Self::Exhausted => Some(format!(
                "no free channel: all {capacity} channels of the clique's shared IMEX domain are \
                 held by other ComputeDomains (raise --channel-devices, or wait for one to end)"
            )),
            Self::Unassigned => Some("no channel assigned yet".into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn uid(s: &str) -> DomainUid {
        DomainUid(s.into())
    }

    #[test]
    fn a_channel_is_confirmed_assigned_exhausted_or_not_yet() {
        let progress = SharedImexProgress {
            assigned: [(uid("a"), 1), (uid("b"), 2)].into(),
            confirmed: [(uid("a"), 1)].into(),
            exhausted: vec![uid("c")],
            ..Default::default()
        };
        assert_eq!(
            ChannelState::of(&uid("a"), Some(&progress)),
            ChannelState::Confirmed(1)
        );
        assert_eq!(
            ChannelState::of(&uid("b"), Some(&progress)),
            ChannelState::Assigned(2)
        );
        assert_eq!(
            ChannelState::of(&uid("c"), Some(&progress)),
            ChannelState::Exhausted
        );
        assert_eq!(
            ChannelState::of(&uid("d"), Some(&progress)),
            ChannelState::Unassigned
        );
        assert_eq!(ChannelState::of(&uid("a"), None), ChannelState::Unassigned);
        assert!(
            ChannelState::Exhausted
                .waiting(8)
                .unwrap()
                .contains("all 8 channels")
        );
    }

    #[test]
    fn only_new_or_changed_faults_are_announced() {
        let before: BTreeMap<NodeId, SharedFault> = [("a".into(), SharedFault::Lost)].into();
        let now: BTreeMap<NodeId, SharedFault> = [
            ("a".into(), SharedFault::Lost),
            ("b".into(), SharedFault::ImexFailing),
        ]
        .into();
        assert_eq!(
            new_faults(&before, &now),
            vec![("b".to_owned(), SharedFault::ImexFailing)]
        );
    }
}
