//! IMEX slot assignment, with no allocator.
//!
//! Every member advertises the slot it *prefers*: the one it holds, or none when it has
//! just joined. Every node computes the assignment from the advertisements it sees with
//! the same pure function:
//!
//! 1. Members are ordered by seniority: `(joined_at_ms, node name)`.
//! 2. In that order, each member with a preference in `0..max` gets it, unless a more
//!    senior member already got it.
//! 3. Then, in the same order, each member left without a slot gets the lowest free
//!    slot; when none is free it waits, unassigned (the domain is full).
//!
//! A member then advertises the slot it was assigned as its preference.
//!
//! **Agreement.** The assignment is a function of the advertisements alone, so nodes
//! that see the same advertisements compute the same assignment; gossip makes views
//! converge, so assignments do.
//!
//! **Uniqueness and range.** Both passes hand out only slots in `0..max` not yet given.
//!
//! **Stability.** A member keeps its slot unless a *more senior* member prefers the same
//! slot. In a settled domain preferences are distinct, so nobody moves; a newcomer is
//! junior (it joined later) and only ever takes a free slot; a member leaving frees
//! its slot and moves no one. A node that returns after a restart is a newcomer with a
//! preference: it gets its old slot back if that is still free.
//!
//! **No oscillation under concurrent joins.** Views may differ while gossip spreads,
//! so two juniors may briefly prefer the same slot. Take members in seniority order.
//! The most senior member never loses a conflict, so its preference changes at most
//! once (from none to a slot) and is then fixed. Once members 1..k-1 are fixed and
//! their advertisements have spread, member k only loses a conflict to one of them,
//! and its next choice avoids their (fixed) slots, so it too becomes fixed after
//! finitely many changes. By induction every preference settles, and the settled
//! preferences are distinct: a fixed point of the function. The tests below check this
//! over many random interleavings of stale views.

use std::collections::{BTreeMap, BTreeSet};

use crate::model::{NodeId, Slot};

/// What the assignment needs to know of one member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SlotCandidate {
    pub node: NodeId,
    pub joined_at_ms: u64,
    pub preferred: Option<Slot>,
}

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SlotAssignment {
    pub slots: BTreeMap<NodeId, Slot>,
    /// Members left without a slot because all `max` are taken, most senior first.
    pub unassigned: Vec<NodeId>,
}

impl SlotAssignment {
    pub fn slot_of(&self, node: &str) -> Option<Slot> {
        self.slots.get(node).copied()
    }
}

/// Assigns slots `0..max` to `candidates`; see the module documentation.
pub fn assign_slots(candidates: &[SlotCandidate], max: Slot) -> SlotAssignment {
    let mut order: Vec<&SlotCandidate> = candidates.iter().collect();
    order.sort_by(|a, b| (a.joined_at_ms, &a.node).cmp(&(b.joined_at_ms, &b.node)));
    order.dedup_by(|a, b| a.node == b.node);
    let (slots, unassigned) = grant(
        order
            .iter()
            .map(|c| (c.node.clone(), c.preferred.map(u32::from))),
        u32::from(max),
    );
    SlotAssignment {
        // Below `max`, a Slot.
        slots: slots
            .into_iter()
            .map(|(node, slot)| (node, slot as Slot))
            .collect(),
        unassigned,
    }
}

/// The rule slots and channels share: in the order given, each preference in
/// `0..capacity` is granted unless an earlier one got it; then each left without a
/// value gets the lowest free one, or none when all are taken (returned, in order).
pub(crate) fn grant<K: Ord + Clone>(
    ordered: impl Iterator<Item = (K, Option<u32>)> + Clone,
    capacity: u32,
) -> (BTreeMap<K, u32>, Vec<K>) {
    let mut taken = BTreeSet::new();
    let mut granted = BTreeMap::new();
    for (key, preferred) in ordered.clone() {
        if let Some(value) = preferred
            && value < capacity
            && taken.insert(value)
        {
            granted.insert(key, value);
        }
    }
    let mut free = (0..capacity).filter(|v| !taken.contains(v));
    let mut left = Vec::new();
    for (key, _) in ordered {
        if granted.contains_key(&key) {
            continue;
        }
        match free.next() {
            Some(value) => {
                granted.insert(key, value);
            }
            None => left.push(key),
        }
    }
    (granted, left)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn c(node: &str, joined: u64, preferred: Option<Slot>) -> SlotCandidate {
        SlotCandidate {
            node: node.into(),
            joined_at_ms: joined,
            preferred,
        }
    }

    #[test]
    fn newcomers_take_the_lowest_free_slots_in_seniority_order() {
        let a = assign_slots(&[c("b", 2, None), c("a", 2, None), c("c", 1, None)], 18);
        assert_eq!(a.slot_of("c"), Some(0));
        assert_eq!(a.slot_of("a"), Some(1));
        assert_eq!(a.slot_of("b"), Some(2));
    }

    #[test]
    fn preferences_are_kept_and_the_senior_wins_a_conflict() {
        let a = assign_slots(
            &[c("x", 1, Some(5)), c("y", 2, Some(5)), c("z", 3, Some(0))],
            18,
        );
        assert_eq!(a.slot_of("x"), Some(5));
        assert_eq!(a.slot_of("z"), Some(0));
        assert_eq!(
            a.slot_of("y"),
            Some(1),
            "the junior moves to the lowest free slot"
        );
    }

    #[test]
    fn a_preference_out_of_range_is_ignored() {
        let a = assign_slots(&[c("x", 1, Some(40))], 18);
        assert_eq!(a.slot_of("x"), Some(0));
    }

    #[test]
    fn a_full_domain_leaves_the_juniors_waiting() {
        let a = assign_slots(&[c("a", 1, None), c("b", 2, None), c("c", 3, None)], 2);
        assert_eq!(a.slots.len(), 2);
        assert_eq!(a.unassigned, vec!["c".to_string()]);
    }

    #[test]
    fn a_leaving_member_moves_no_one_and_a_newcomer_takes_its_slot() {
        let settled = [c("a", 1, Some(0)), c("b", 2, Some(1)), c("c", 3, Some(2))];
        let without_b: Vec<_> = settled.iter().filter(|m| m.node != "b").cloned().collect();
        let a = assign_slots(&without_b, 18);
        assert_eq!((a.slot_of("a"), a.slot_of("c")), (Some(0), Some(2)));
        let mut with_d = without_b.clone();
        with_d.push(c("d", 4, None));
        assert_eq!(assign_slots(&with_d, 18).slot_of("d"), Some(1));
    }

    #[test]
    fn a_returning_node_gets_its_old_slot_if_still_free() {
        let mut members = vec![c("a", 1, Some(0)), c("c", 3, Some(2))];
        members.push(c("b", 9, Some(1)));
        assert_eq!(assign_slots(&members, 18).slot_of("b"), Some(1));
        // Taken meanwhile by d: b, now junior, does not displace it.
        let members = vec![c("a", 1, Some(0)), c("d", 4, Some(1)), c("b", 9, Some(1))];
        let a = assign_slots(&members, 18);
        assert_eq!(a.slot_of("d"), Some(1));
        assert_eq!(a.slot_of("b"), Some(2));
    }

    /// One node's view: what it last saw of each member's preference.
    type View = BTreeMap<usize, Option<Slot>>;

    /// Runs the protocol: at each step one node reads a possibly stale view (each
    /// other member's preference as of some earlier step) and updates its own
    /// preference. Ends with rounds of fresh views until a fixed point.
    fn run(joined: &[u64], steps: &[(usize, u64)], max: Slot) -> (Vec<Option<Slot>>, usize) {
        let n = joined.len();
        let mut history: Vec<Vec<Option<Slot>>> = vec![vec![None; n]];
        let candidates = |prefs: &View| -> Vec<SlotCandidate> {
            prefs
                .iter()
                .map(|(&i, &p)| c(&format!("n{i:03}"), joined[i], p))
                .collect()
        };
        for &(node, staleness_seed) in steps {
            let node = node % n;
            let now = history.last().unwrap().clone();
            let mut view = View::new();
            for j in 0..n {
                // Each other member as of a random earlier step (its own, current).
                let back = if j == node {
                    0
                } else {
                    (staleness_seed.wrapping_mul(31).wrapping_add(j as u64) as usize)
                        % history.len()
                };
                view.insert(j, history[history.len() - 1 - back][j]);
            }
            let assigned = assign_slots(&candidates(&view), max).slot_of(&format!("n{node:03}"));
            let mut next = now;
            next[node] = assigned;
            history.push(next);
        }
        // Fresh views from here on: count synchronous rounds to the fixed point.
        let mut prefs = history.last().unwrap().clone();
        for round in 0..=n + 1 {
            let view: View = prefs.iter().copied().enumerate().collect();
            let a = assign_slots(&candidates(&view), max);
            let next: Vec<_> = (0..n).map(|i| a.slot_of(&format!("n{i:03}"))).collect();
            if next == prefs {
                return (prefs, round);
            }
            prefs = next;
        }
        panic!("no fixed point after {} fresh rounds: oscillation", n + 2);
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(512))]

        #[test]
        fn concurrent_joins_settle_on_a_valid_assignment(
            joined in proptest::collection::vec(0u64..5, 1..40),
            steps in proptest::collection::vec((0usize..64, any::<u64>()), 0..200),
            max in 1u16..=20,
        ) {
            let (settled, _) = run(&joined, &steps, max);
            let assigned: Vec<Slot> = settled.iter().flatten().copied().collect();
            let distinct: BTreeSet<Slot> = assigned.iter().copied().collect();
            prop_assert_eq!(distinct.len(), assigned.len(), "duplicate slots: {:?}", settled);
            prop_assert!(assigned.iter().all(|s| *s < max));
            prop_assert_eq!(assigned.len(), joined.len().min(max as usize), "a free slot went unused");
        }

        #[test]
        fn settled_slots_survive_junior_joins_and_leaves(
            n in 1usize..18,
            leave in 0usize..18,
            joiners in 0usize..6,
        ) {
            let settled: Vec<SlotCandidate> = (0..n)
                .map(|i| c(&format!("m{i:02}"), i as u64, Some(i as Slot)))
                .collect();
            let mut next: Vec<SlotCandidate> = settled.iter().filter(|m| m.node != format!("m{leave:02}")).cloned().collect();
            for j in 0..joiners {
                next.push(c(&format!("new{j}"), 100 + j as u64, None));
            }
            let a = assign_slots(&next, 18);
            for m in &next {
                if let Some(p) = m.preferred {
                    prop_assert_eq!(a.slot_of(&m.node), Some(p), "{} moved", m.node);
                }
            }
        }
    }
}
