//! What the leader tells Prometheus about the domains it reconciles: how many are Ready,
//! NotReady with members, or idle (no member yet, or none left: NotReady in the CRD, but
//! only waiting for pods, so not worth an alert), how many member nodes each status lists Ready or NotReady (a lost node
//! stays listed NotReady until it is back or the domain is released), and how long a
//! domain took to form and to heal.
//!
//! The controller sees every change of every ComputeDomain (its watch has no predicate:
//! the nodes' status writes wake it too), so it can time transitions on its own clock,
//! from when it saw them. Times are the controller's, not the nodes': a node's clock
//! may be skewed, and the status' `lastTransitionTime` has second resolution and does
//! not move when a NotReady domain's reason changes.
//!
//! - *formed*: from the first sight of a member in a domain with none, to Ready;
//! - *healed*: from a Ready domain turning NotReady, with members, to Ready again.
//!
//! A domain first seen mid-way (a new leader) is only recorded, never timed: when it
//! started is unknown. A domain whose members all leave starts over.

use std::collections::HashMap;
use std::time::Instant;

use domaind_kube_api::crd::{ComputeDomain, Phase};
use kube::{Resource as _, ResourceExt as _};

/// What one observation of a domain shows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Sighting {
    pub ready: bool,
    pub nodes_ready: usize,
    pub nodes_not_ready: usize,
}

impl Sighting {
    pub fn of(cd: &ComputeDomain) -> Self {
        let Some(status) = cd.status.as_ref() else {
            return Self::default();
        };
        let nodes_ready = status
            .nodes
            .iter()
            .filter(|n| n.status == Phase::Ready)
            .count();
        Self {
            ready: status.status == Phase::Ready,
            nodes_ready,
            nodes_not_ready: status.nodes.len() - nodes_ready,
        }
    }

    fn has_members(&self) -> bool {
        self.nodes_ready + self.nodes_not_ready > 0
    }
}

/// Where a domain stands, as far as timing goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Stage {
    /// No member yet, or none left.
    Empty,
    /// Members, never Ready since they came: forming since then.
    Forming(Instant),
    Ready,
    /// Was Ready, lost it, members still there: healing since then.
    Healing(Instant),
    /// First seen NotReady with members: when that began is unknown.
    Unknown,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Transition {
    Formed,
    Healed,
}

impl Transition {
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Formed => "formed",
            Self::Healed => "healed",
        }
    }
}

/// Totals over the domains known, for the gauges.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct Totals {
    pub domains_ready: usize,
    pub domains_not_ready: usize,
    pub domains_idle: usize,
    pub nodes_ready: usize,
    pub nodes_not_ready: usize,
}

/// Every domain's last sighting and stage, by uid.
#[derive(Debug, Default)]
pub struct Census {
    domains: HashMap<String, (Sighting, Stage)>,
}

impl Census {
    /// Records a sighting of domain `uid` at `now`; returns the transition it completes,
    /// with its duration in seconds, if any.
    pub fn observe(
        &mut self,
        uid: &str,
        seen: Sighting,
        now: Instant,
    ) -> Option<(Transition, f64)> {
        let previous = self.domains.get(uid).map(|(_, stage)| *stage);
        let (stage, done) = match (previous, seen.ready, seen.has_members()) {
            (_, true, _) => {
                let done = match previous {
                    Some(Stage::Forming(since)) => Some((Transition::Formed, since)),
                    Some(Stage::Healing(since)) => Some((Transition::Healed, since)),
                    _ => None,
                };
                (Stage::Ready, done)
            }
            (_, false, false) => (Stage::Empty, None),
            (None, false, true) => (Stage::Unknown, None),
            (Some(Stage::Empty), false, true) => (Stage::Forming(now), None),
            (Some(Stage::Ready), false, true) => (Stage::Healing(now), None),
            (Some(stage), false, true) => (stage, None),
        };
        self.domains.insert(uid.to_owned(), (seen, stage));
        done.map(|(transition, since)| {
            (
                transition,
                now.saturating_duration_since(since).as_secs_f64(),
            )
        })
    }

    /// A domain deleted, or on its way out: no longer counted.
    pub fn forget(&mut self, uid: &str) {
        self.domains.remove(uid);
    }

    pub fn totals(&self) -> Totals {
        self.domains
            .values()
            .fold(Totals::default(), |mut totals, (seen, _)| {
                if seen.ready {
                    totals.domains_ready += 1;
                } else if seen.has_members() {
                    totals.domains_not_ready += 1;
                } else {
                    totals.domains_idle += 1;
                }
                totals.nodes_ready += seen.nodes_ready;
                totals.nodes_not_ready += seen.nodes_not_ready;
                totals
            })
    }
}

/// Records a pass's sighting of `cd` in the census and the metrics.
pub fn record(census: &mut Census, cd: &ComputeDomain, now: Instant) {
    let uid = cd.uid().unwrap_or_default();
    if cd.meta().deletion_timestamp.is_some() {
        census.forget(&uid);
    } else if let Some((transition, seconds)) = census.observe(&uid, Sighting::of(cd), now) {
        ::metrics::histogram!(
            crate::metrics::DOMAIN_READY_SECONDS,
            "transition" => transition.as_str()
        )
        .record(seconds);
    }
    set_gauges(census.totals());
}

/// The gauges for `totals`; all zero when this replica stops leading, so that only the
/// leader's figures are non-zero.
pub fn set_gauges(totals: Totals) {
    use crate::metrics::{DOMAIN_NODES, DOMAINS};
    ::metrics::gauge!(DOMAINS, "status" => "Ready").set(totals.domains_ready as f64);
    ::metrics::gauge!(DOMAINS, "status" => "NotReady").set(totals.domains_not_ready as f64);
    ::metrics::gauge!(DOMAINS, "status" => "Idle").set(totals.domains_idle as f64);
    ::metrics::gauge!(DOMAIN_NODES, "status" => "Ready").set(totals.nodes_ready as f64);
    ::metrics::gauge!(DOMAIN_NODES, "status" => "NotReady").set(totals.nodes_not_ready as f64);
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn seen(ready: bool, nodes_ready: usize, nodes_not_ready: usize) -> Sighting {
        Sighting {
            ready,
            nodes_ready,
            nodes_not_ready,
        }
    }

    #[test]
    fn formation_is_timed_from_the_first_member_to_ready() {
        let t0 = Instant::now();
        let mut census = Census::default();
        assert_eq!(census.observe("a", seen(false, 0, 0), t0), None);
        assert_eq!(
            census.observe("a", seen(false, 0, 2), t0 + Duration::from_secs(1)),
            None
        );
        // More members and progress do not restart the clock.
        assert_eq!(
            census.observe("a", seen(false, 1, 2), t0 + Duration::from_secs(2)),
            None
        );
        assert_eq!(
            census.observe("a", seen(true, 3, 0), t0 + Duration::from_millis(3500)),
            Some((Transition::Formed, 2.5))
        );
        // Ready again is no new transition.
        assert_eq!(
            census.observe("a", seen(true, 3, 0), t0 + Duration::from_secs(9)),
            None
        );
    }

    #[test]
    fn a_heal_is_timed_from_losing_ready_to_ready_again() {
        let t0 = Instant::now();
        let mut census = Census::default();
        census.observe("a", seen(false, 0, 0), t0);
        census.observe("a", seen(false, 0, 2), t0);
        census.observe("a", seen(true, 2, 0), t0);
        assert_eq!(
            census.observe("a", seen(false, 1, 1), t0 + Duration::from_secs(10)),
            None
        );
        assert_eq!(
            census.observe("a", seen(true, 1, 0), t0 + Duration::from_secs(14)),
            Some((Transition::Healed, 4.0))
        );
    }

    #[test]
    fn a_domain_first_seen_midway_or_emptied_is_not_timed() {
        let t0 = Instant::now();
        let mut census = Census::default();
        // A new leader finds it NotReady with members: since when is unknown.
        census.observe("a", seen(false, 1, 1), t0);
        assert_eq!(census.observe("a", seen(true, 2, 0), t0), None);
        // Found Ready: nothing to time either.
        assert_eq!(census.observe("b", seen(true, 2, 0), t0), None);
        // Its members leave (the job ended): not a heal when the next job forms it.
        census.observe("b", seen(false, 0, 0), t0);
        census.observe("b", seen(false, 0, 1), t0 + Duration::from_secs(100));
        assert_eq!(
            census.observe("b", seen(true, 1, 0), t0 + Duration::from_secs(101)),
            Some((Transition::Formed, 1.0))
        );
    }

    #[test]
    fn totals_count_domains_and_listed_nodes_by_status() {
        let t0 = Instant::now();
        let mut census = Census::default();
        census.observe("a", seen(true, 18, 0), t0);
        census.observe("b", seen(false, 16, 2), t0);
        census.observe("c", seen(false, 0, 0), t0);
        assert_eq!(
            census.totals(),
            Totals {
                domains_ready: 1,
                domains_not_ready: 1,
                domains_idle: 1,
                nodes_ready: 34,
                nodes_not_ready: 2,
            }
        );
        census.forget("b");
        census.observe("a", seen(false, 17, 1), t0);
        assert_eq!(
            census.totals(),
            Totals {
                domains_ready: 0,
                domains_not_ready: 1,
                domains_idle: 1,
                nodes_ready: 17,
                nodes_not_ready: 1,
            }
        );
    }

    #[test]
    fn a_sighting_reads_the_status_the_nodes_wrote() {
        let mut cd = crate::tests::fixtures::compute_domain();
        assert_eq!(Sighting::of(&cd), Sighting::default());
        cd.status = Some(
            serde_json::from_value(serde_json::json!({
                "status": "NotReady",
                "nodes": [
                    {"name": "n1", "ipAddress": "10.0.0.1", "cliqueID": "c", "index": 0, "status": "Ready"},
                    {"name": "n2", "ipAddress": "10.0.0.2", "cliqueID": "c", "index": 1, "status": "NotReady"},
                ],
            }))
            .unwrap(),
        );
        assert_eq!(Sighting::of(&cd), seen(false, 1, 1));
    }
}
