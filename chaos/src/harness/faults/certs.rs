//! Certificate rotation: a node's certificate reissued into its TLS directory while
//! it runs; it must reload it without a restart, and the domain should not notice.

use std::time::Instant;

use crate::harness::{Harness, ROTATE_LIMIT, millis};
use crate::report::{FaultRecord, Outcome};
use crate::schedule::Step;

impl Harness {
    /// Detected when the node counts the rotation as reloaded (its `/metrics`, read on
    /// every tick meanwhile).
    pub(super) async fn cert_rotate(&mut self, step: &Step) -> FaultRecord {
        let target = step.targets[0];
        let mut record = self.record_for(step, &step.targets);
        self.metrics_for = Some(target);
        self.tick().await;
        let (rotated, refused) = self.tls_reloads(target).unwrap_or_default();
        let injected = Instant::now();
        if let Err(error) = self
            .rack
            .reissue_certificate(target, time::Duration::days(1))
        {
            self.metrics_for = None;
            self.liveness(
                Some(target),
                format!("cannot reissue its certificate: {error:#}"),
            );
            record.outcome = Outcome::NotHealed;
            return record;
        }
        // A rotation should not take the domain apart at all: its heal is when it was
        // first seen whole after the write, if it stayed whole while the daemon got
        // round to reloading.
        let mut whole_at = None;
        let mut broke = false;
        let reloaded = self
            .wait_until(ROTATE_LIMIT, |h, w, o| {
                if h.settled(w, o) {
                    whole_at.get_or_insert(o.at);
                } else if whole_at.is_some() {
                    broke = true;
                }
                o.nodes[target]
                    .tls_reloads
                    .is_some_and(|(r, _)| r > rotated)
            })
            .await;
        let refused_now = self.tls_reloads(target).map_or(refused, |(_, r)| r);
        self.metrics_for = None;
        if refused_now > refused {
            // The files are replaced one by one; a reload between two of them sees a
            // key that does not match the certificate, refuses it and keeps the old
            // one until its next look.
            record.notes.push(format!(
                "{} reload(s) refused a half-written rotation first",
                refused_now - refused
            ));
        }
        record.detect_ms = self.detection(target, injected, reloaded, |_| {
            format!(
                "did not reload its reissued certificate within {}s",
                ROTATE_LIMIT.as_secs()
            )
        });
        let mut record = self
            .heal_fault(record, injected, "a certificate rotation")
            .await;
        if record.heal_ms.is_some()
            && !broke
            && let Some(at) = whole_at
        {
            record.heal_ms = Some(millis(injected, at));
        }
        record
    }

    /// The node's reloads in the newest observation: rotated, refused.
    fn tls_reloads(&self, node: usize) -> Option<(u64, u64)> {
        self.last
            .as_ref()
            .and_then(|(_, o)| o.nodes[node].tls_reloads)
    }
}
