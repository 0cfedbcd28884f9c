//! Faults on the network, through the rack's iptables chain: one node cut off, and
//! packet loss between every pair. Without network control they are skipped, and the
//! record says why.

use std::net::IpAddr;
use std::time::Instant;

use super::skipped;
use crate::harness::Harness;
use crate::invariants::missing_members;
use crate::netfault::NetFaults;
use crate::report::{FaultRecord, Outcome};
use crate::schedule::Step;

impl Harness {
    /// Cuts the target off; detected when the survivors dropped it; healed after the
    /// hold.
    pub(super) async fn partition(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        let IpAddr::V4(ip) = self.world.nodes[target].ip else {
            record.outcome = Outcome::Skipped("not an IPv4 address".into());
            return record;
        };
        let injected = Instant::now();
        if let Err(error) = self.net_fault(|net| net.partition(ip)) {
            return skipped(record, error);
        }
        record.detect_ms = self.detect_drop(target, injected, "cut off").await;
        self.hold(step.hold, |_, _, _| false).await;
        let ended = Instant::now();
        self.heal_network(Some(target));
        self.heal_fault(record, ended, "the partition healed").await
    }

    /// Drops a share of the packets for the hold. Nothing is left to detect; a member
    /// dropped meanwhile is noted.
    pub(super) async fn loss(&mut self, step: &Step) -> FaultRecord {
        let percent = step.loss_percent.unwrap_or(10);
        let mut record = self.record_for(step, &[]);
        if let Err(error) = self.net_fault(|net| net.loss(percent)) {
            return skipped(record, error);
        }
        let mut dropped: Vec<(String, String)> = Vec::new();
        self.hold(step.hold, |_, w, o| {
            for pair in missing_members(w, o) {
                if !dropped.contains(&pair) {
                    dropped.push(pair);
                }
            }
            false
        })
        .await;
        let ended = Instant::now();
        self.heal_network(None);
        record
            .notes
            .push(format!("{percent}% loss for {} ms", step.hold.as_millis()));
        if !dropped.is_empty() {
            // Not an invariant (no node is wrongly admitted), but the design promises
            // no false removal under 10% loss: worth seeing.
            record.notes.push(format!(
                "members dropped under loss (observer, dropped): {dropped:?}"
            ));
        }
        self.heal_fault(record, ended, "the loss stopped").await
    }

    /// Applies a network fault, or says why there is no network control.
    fn net_fault(
        &mut self,
        fault: impl FnOnce(&mut NetFaults) -> anyhow::Result<()>,
    ) -> anyhow::Result<()> {
        match &mut self.net {
            Ok(net) => fault(net),
            Err(reason) => Err(anyhow::anyhow!("{reason}")),
        }
    }

    fn heal_network(&mut self, node: Option<usize>) {
        let healed = match &mut self.net {
            Ok(net) => net.heal(),
            Err(_) => Ok(()),
        };
        if let Err(error) = healed {
            self.liveness(node, format!("cannot remove the network fault: {error:#}"));
        }
    }
}
