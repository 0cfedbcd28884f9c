//! The bytes received messages may hold while they wait for the gossip loop.
//!
//! The loop takes one message at a time; when a fault sets every peer pushing news at
//! once and the node is short of CPU, hundreds wait, each decoded, each up to a delta
//! that inflates to 256 KiB. A count alone bounded that at a quarter of a gigabyte; in a
//! soak, a node kill made every other daemon hold 20-30 MB for seconds. Beyond the
//! budget a message is dropped, as a datagram would be: chitchat's rounds and pushes
//! repeat whatever it carried.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

#[derive(Debug)]
pub(super) struct InboundBudget {
    limit: usize,
    queued: AtomicUsize,
}

/// A message's share of the budget, given back when the message is dropped.
#[derive(Debug)]
pub(super) struct Held {
    budget: Arc<InboundBudget>,
    bytes: usize,
}

impl InboundBudget {
    pub(super) fn new(limit: usize) -> Arc<Self> {
        Arc::new(Self {
            limit,
            queued: AtomicUsize::new(0),
        })
    }

    /// `None` when `bytes` more would pass the limit. A message alone always fits,
    /// whatever its size: one larger than the budget would otherwise never pass.
    pub(super) fn hold(self: &Arc<Self>, bytes: usize) -> Option<Held> {
        self.queued
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |queued| {
                (queued == 0 || queued.saturating_add(bytes) <= self.limit)
                    .then_some(queued.saturating_add(bytes))
            })
            .ok()?;
        Some(Held {
            budget: self.clone(),
            bytes,
        })
    }

    #[cfg(test)]
    pub(super) fn queued(&self) -> usize {
        self.queued.load(Ordering::Acquire)
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        self.budget.queued.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_are_held_up_to_the_limit_and_given_back_when_dropped() {
        let budget = InboundBudget::new(100);
        let first = budget.hold(60).expect("fits");
        let second = budget.hold(40).expect("fits exactly");
        assert!(budget.hold(1).is_none(), "the budget is spent");
        assert_eq!(budget.queued(), 100);
        drop(first);
        assert_eq!(budget.queued(), 40);
        let third = budget.hold(60).expect("fits again once the first is gone");
        drop((second, third));
        assert_eq!(budget.queued(), 0);
    }

    #[test]
    fn a_message_larger_than_the_budget_passes_alone_and_only_alone() {
        let budget = InboundBudget::new(100);
        let small = budget.hold(1).unwrap();
        assert!(budget.hold(500).is_none());
        drop(small);
        let large = budget.hold(500).expect("alone, it passes");
        assert!(budget.hold(1).is_none(), "nothing joins it");
        drop(large);
        assert_eq!(budget.queued(), 0);
    }
}
