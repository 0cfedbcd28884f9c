//! The faults of a cluster run, each injected, held, ended and healed, with its
//! detection and heal measured (what each means: [`super::report`]).

use std::time::Instant;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams};

use super::checks::{
    Counting, Persistent, counted_by_others, held_by_another, not_kept, ready_in_status,
};
use super::harness::{ClusterRun, DETECT_LIMIT, set_cordon};
use super::observe::ClusterObservation;
use crate::invariants::{Invariant, Violation};
use crate::report::{FaultRecord, Outcome};
use crate::schedule::{FaultKind, Step};

/// The note of a fault whose detection never held.
const NOT_NOTICED: &str = "not noticed";

fn ms(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_millis() as u64
}

/// Whether the domain stopped counting `node` among its Ready members: in the status,
/// or for another member.
fn dropped(obs: &ClusterObservation, domain: &str, node: &str, nodes: &[String]) -> bool {
    !ready_in_status(obs, node)
        || counted_by_others(obs, domain, node, nodes, Counting::LiveOnly).any(|counted| !counted)
}

/// Whether no part of the domain counts `node` any more: not Ready in the status, and
/// no other member's daemon has it as a live member.
fn gone_from_domain(obs: &ClusterObservation, domain: &str, node: &str, nodes: &[String]) -> bool {
    !ready_in_status(obs, node)
        && !counted_by_others(obs, domain, node, nodes, Counting::LiveOnly).any(|counted| counted)
}

impl ClusterRun {
    pub(super) async fn inject(&mut self, step: &Step) -> FaultRecord {
        let outcome = match step.kind {
            FaultKind::DaemonDelete => self.daemon_delete(step).await,
            FaultKind::ImexCrash => self.imex_crash(step).await,
            FaultKind::Drain => self.drain(step).await,
            FaultKind::PodDelete => self.pod_delete(step).await,
            FaultKind::ControllerRestart => self.controller_restart(step).await,
            FaultKind::Upgrade => self.upgrade(step).await,
            other => Err(format!(
                "{other} is a fault of loopback racks, not of cluster runs"
            )),
        };
        match outcome {
            Ok(record) => record,
            Err(reason) => {
                self.liveness(format!("{} could not be injected: {reason}", step.kind));
                let mut record = self.record_for(step, Outcome::NotHealed);
                record.notes.push(reason);
                record
            }
        }
    }

    fn target(&self, step: &Step) -> String {
        self.workload.nodes[step.targets[0]].clone()
    }

    fn domain_uid(&self) -> String {
        self.last
            .as_ref()
            .and_then(|o| o.domain.as_ref())
            .map(|d| d.uid.clone())
            .unwrap_or_default()
    }

    /// Observes from the fault's end until the domain is whole and `ready` holds (and
    /// with `needs_detection`, `detect` held once), recording when `detect` first held.
    #[allow(clippy::too_many_arguments)]
    async fn measure(
        &mut self,
        record: &mut FaultRecord,
        injected: Instant,
        ended: Instant,
        mut detected: Option<Instant>,
        needs_detection: bool,
        mut detect: impl FnMut(&Self, &ClusterObservation) -> bool,
        mut ready: impl FnMut(&Self, &ClusterObservation) -> bool,
    ) {
        let limit = self.config.heal_limit;
        let healed = self
            .wait_until(limit, |run, o| {
                if detected.is_none() && detect(run, o) {
                    detected = Some(o.at);
                }
                (detected.is_some() || !needs_detection)
                    && ready(run, o)
                    && run.unwhole(o).is_empty()
            })
            .await;
        record.detect_ms = detected.map(|at| ms(injected, at));
        if detected.is_none() {
            record.notes.push(NOT_NOTICED.into());
        }
        match healed {
            Some(at) => {
                record.heal_ms = Some(ms(ended, at));
                record.outcome = Outcome::Healed;
            }
            None => {
                record.outcome = Outcome::NotHealed;
                self.not_whole(&format!("not whole within {limit:?} of the fault's end"));
            }
        }
    }

    fn begin(&self, step: &Step, injected: Instant) -> FaultRecord {
        let mut record = self.record_for(step, Outcome::NotHealed);
        record.injected_at_ms = Some(self.since_phase_ms(injected));
        record
    }

    /// The daemon's pod deleted; the DaemonSet's new one must take the node's claims
    /// back from its checkpoint. Where IMEX outlives the daemon (a runner keeps it),
    /// the node must stay in the domain throughout and keep the same IMEX.
    async fn daemon_delete(&mut self, step: &Step) -> Result<FaultRecord, String> {
        let node = self.target(step);
        let before = self
            .last
            .as_ref()
            .and_then(|o| o.daemons.get(&node))
            .and_then(|d| d.instance.clone())
            .map(|i| i.id);
        let outlives = self.outlives(&node).await?;
        let imex = self.imex_of(&node).await?;
        self.replacing.insert(node.clone());
        let injected = Instant::now();
        if let Err(error) = self.access.delete_daemon(&node).await {
            self.replacing.remove(&node);
            return Err(format!("{error:#}"));
        }
        let mut record = self.begin(step, injected);
        let domain = self.domain_uid();
        let nodes = self.workload.nodes.clone();
        let grace = self.config.grace;
        let mut kept = Persistent::default();
        let mut breaches: Vec<Violation> = Vec::new();
        let target = node.clone();
        self.measure(
            &mut record,
            injected,
            injected,
            None,
            false,
            |_, o| {
                if outlives {
                    held_by_another(o, &domain, &node)
                } else {
                    dropped(o, &domain, &node, &nodes)
                }
            },
            |_, o| {
                if outlives {
                    let found = not_kept(o, &domain, &target, &nodes);
                    breaches.extend(kept.confirm(found, o.at, grace));
                }
                o.daemons
                    .get(&target)
                    .and_then(|d| d.instance.as_ref())
                    .is_some_and(|i| Some(&i.id) != before.as_ref())
            },
        )
        .await;
        self.record_breaches(breaches);
        if outlives {
            self.check_imex_kept(&node, imex, "the deletion of its daemon")
                .await;
        }
        Ok(record)
    }

    /// The node DaemonSet's rolling update: every daemon replaced in turn while the
    /// domain is live. Where IMEX outlives the daemons, no node may leave the domain
    /// and every IMEX must be the one that ran before; detection is not expected.
    async fn upgrade(&mut self, step: &Step) -> Result<FaultRecord, String> {
        let targets: Vec<String> = step
            .targets
            .iter()
            .map(|t| self.workload.nodes[*t].clone())
            .collect();
        let mut outlives = Vec::new();
        let mut imex = Vec::new();
        for node in &targets {
            if self.outlives(node).await? {
                outlives.push(node.clone());
            }
            imex.push(self.imex_of(node).await?);
        }
        self.replacing.extend(targets.iter().cloned());
        let injected = Instant::now();
        if let Err(error) = self.access.roll_daemons(&targets).await {
            for node in &targets {
                self.replacing.remove(node);
            }
            return Err(format!("{error:#}"));
        }
        let mut record = self.begin(step, injected);
        let domain = self.domain_uid();
        let nodes = self.workload.nodes.clone();
        let grace = self.config.grace;
        let limit = self
            .config
            .heal_limit
            .max(DETECT_LIMIT * targets.len() as u32);
        let mut kept = Persistent::default();
        let mut breaches: Vec<Violation> = Vec::new();
        let deadline = Instant::now() + limit;
        let mut rolled = None;
        let mut held = std::collections::BTreeSet::new();
        while rolled.is_none() && Instant::now() < deadline && !self.interrupted() {
            let obs = self.tick().await;
            held.extend(
                targets
                    .iter()
                    .filter(|node| held_by_another(&obs, &domain, node))
                    .cloned(),
            );
            for node in &outlives {
                let found = not_kept(&obs, &domain, node, &nodes);
                breaches.extend(kept.confirm(found, obs.at, grace));
            }
            match self.access.rolled().await {
                Ok(true) => rolled = Some(Instant::now()),
                Ok(false) => self.pause().await,
                Err(error) => {
                    self.record_breaches(breaches);
                    return Err(format!("the rolling update: {error:#}"));
                }
            }
        }
        self.record_breaches(breaches);
        let Some(ended) = rolled else {
            self.liveness(format!(
                "the daemons' rolling update was not done within {limit:?}"
            ));
            return Ok(record);
        };
        record.notes.push(format!(
            "{} daemons replaced in turn in {} ms; held by a peer meanwhile: {}",
            targets.len(),
            ms(injected, ended),
            if held.is_empty() {
                "none".to_owned()
            } else {
                held.into_iter().collect::<Vec<_>>().join(", ")
            }
        ));
        self.measure(
            &mut record,
            injected,
            ended,
            None,
            false,
            |_, _| false,
            |_, _| true,
        )
        .await;
        // An upgrade has nothing to detect: its note says who held whom.
        record.notes.retain(|note| note != NOT_NOTICED);
        for (node, before) in targets.iter().zip(imex) {
            if outlives.contains(node) {
                self.check_imex_kept(node, before, "the rolling update")
                    .await;
            }
        }
        for node in &targets {
            self.replacing.remove(node);
        }
        Ok(record)
    }

    async fn outlives(&mut self, node: &str) -> Result<bool, String> {
        self.access
            .imex_outlives_daemon(node)
            .await
            .map_err(|error| format!("{error:#}"))
    }

    async fn imex_of(&mut self, node: &str) -> Result<Option<Vec<u32>>, String> {
        self.access
            .imex_pids(node)
            .await
            .map_err(|error| format!("{error:#}"))
    }

    /// After a fault on `node`'s daemon alone (`what`): the same IMEX must run as
    /// before (`before`, where the access sees pids), adopted, not replaced.
    async fn check_imex_kept(&mut self, node: &str, before: Option<Vec<u32>>, what: &str) {
        let Some(before) = before.filter(|b| !b.is_empty()) else {
            return;
        };
        match self.access.imex_pids(node).await {
            Ok(Some(after)) if after == before => {}
            Ok(after) => self.record(Violation::new(
                Invariant::Crash,
                Some(node),
                format!(
                    "its IMEX daemon did not outlive {what}: pid {before:?} before, {after:?} \
                     after"
                ),
            )),
            Err(error) => self.liveness(format!(
                "cannot see {node}'s IMEX daemon after {what}: {error:#}"
            )),
        }
    }

    fn record_breaches(&mut self, breaches: Vec<Violation>) {
        let mut seen = std::collections::BTreeSet::new();
        for breach in breaches {
            if seen.insert(breach.clone()) {
                self.record(breach);
            }
        }
    }

    /// The IMEX daemon killed in the node daemon's pod; the node daemon must start a
    /// new one.
    async fn imex_crash(&mut self, step: &Step) -> Result<FaultRecord, String> {
        let node = self.target(step);
        let starts = self
            .last
            .as_ref()
            .and_then(|o| o.view(&node))
            .map(|v| v.imex.starts)
            .ok_or_else(|| format!("{node}'s /state cannot be read"))?;
        let injected = Instant::now();
        let pids = self
            .access
            .stop_imex(&node)
            .await
            .map_err(|error| format!("{error:#}"))?;
        let mut record = self.begin(step, injected);
        record.notes.push(format!("killed IMEX pid {pids:?}"));
        self.measure(
            &mut record,
            injected,
            injected,
            None,
            true,
            |_, o| o.view(&node).is_some_and(|v| v.imex.starts > starts),
            |_, _| true,
        )
        .await;
        Ok(record)
    }

    /// Cordoned and the run's pods evicted; the domain must drop the node; uncordoned
    /// after the hold, the pod comes back and the domain must be whole again.
    async fn drain(&mut self, step: &Step) -> Result<FaultRecord, String> {
        let node = self.target(step);
        let namespace = self.workload.namespace.clone();
        set_cordon(&self.client, &node, Some(&namespace))
            .await
            .map_err(|error| format!("{error:#}"))?;
        let injected = Instant::now();
        let pods = Api::<Pod>::namespaced(self.client.clone(), &namespace);
        let on_node: Vec<String> = self
            .last
            .as_ref()
            .map(|o| o.pods_on(&node).map(|p| p.name.clone()).collect())
            .unwrap_or_default();
        let mut record = self.begin(step, injected);
        for pod in &on_node {
            if let Err(error) = pods.evict(pod, &EvictParams::default()).await {
                record.notes.push(format!("eviction of {pod}: {error}"));
            }
        }
        let domain = self.domain_uid();
        let nodes = self.workload.nodes.clone();
        let hold = step.hold;
        let mut detected = None;
        let limit = DETECT_LIMIT.max(hold);
        self.wait_until(limit, |_, o| {
            if detected.is_none() && gone_from_domain(o, &domain, &node, &nodes) {
                detected = Some(o.at);
            }
            detected.is_some() && o.at.saturating_duration_since(injected) >= hold
        })
        .await;
        if detected.is_none() {
            self.record(crate::invariants::Violation::new(
                crate::invariants::Invariant::Liveness,
                Some(&node),
                format!("drained, yet the domain still counted it {limit:?} later"),
            ));
        }
        set_cordon(&self.client, &node, None)
            .await
            .map_err(|error| format!("{error:#}"))?;
        let ended = Instant::now();
        record
            .notes
            .push(format!("cordoned for {} ms", ms(injected, ended)));
        self.measure(
            &mut record,
            injected,
            ended,
            detected,
            false,
            |_, _| false,
            |_, o| !o.cordoned.contains(&node),
        )
        .await;
        Ok(record)
    }

    /// A workload pod deleted; its node's daemon must release its claim, and the
    /// replacement must serve there.
    async fn pod_delete(&mut self, step: &Step) -> Result<FaultRecord, String> {
        let node = self.target(step);
        let (pod, claim_uid) = self
            .last
            .as_ref()
            .and_then(|o| {
                let pod = o.pods_on(&node).find(|p| p.serving())?;
                let uid = o.claim_uid(pod.claim.as_deref()?)?.to_owned();
                Some((pod.clone(), uid))
            })
            .ok_or_else(|| format!("no pod of the run serves on {node}"))?;
        let injected = Instant::now();
        Api::<Pod>::namespaced(self.client.clone(), &self.workload.namespace)
            .delete(&pod.name, &DeleteParams::default())
            .await
            .map_err(|error| format!("cannot delete pod {}: {error}", pod.name))?;
        let mut record = self.begin(step, injected);
        record.notes.push(format!("deleted pod {}", pod.name));
        self.measure(
            &mut record,
            injected,
            injected,
            None,
            true,
            |_, o| {
                o.view(&node)
                    .is_some_and(|v| !v.claims.contains(&claim_uid))
            },
            |_, o| o.pods_on(&node).any(|p| p.serving() && p.uid != pod.uid),
        )
        .await;
        Ok(record)
    }

    /// The controller's pods deleted; a new one must take the Lease.
    async fn controller_restart(&mut self, step: &Step) -> Result<FaultRecord, String> {
        self.controller_restarting = true;
        let injected = Instant::now();
        let old = match self.access.restart_controller().await {
            Ok(old) => old,
            Err(error) => {
                self.controller_restarting = false;
                return Err(format!("{error:#}"));
            }
        };
        let mut record = self.begin(step, injected);
        record.notes.push(format!("restarted {}", old.join(", ")));
        let fresh = |o: &ClusterObservation| -> bool {
            o.controllers
                .as_ref()
                .is_ok_and(|running| running.iter().any(|c| !old.contains(c)))
        };
        self.measure(
            &mut record,
            injected,
            injected,
            None,
            true,
            |_, o| fresh(o),
            // Without leader election there is no Lease to take: a new controller is all.
            |_, o| {
                if o.lease_exists {
                    o.lease_holder.as_ref().is_some_and(|h| !old.contains(h))
                } else {
                    fresh(o)
                }
            },
        )
        .await;
        self.controller_restarting = false;
        Ok(record)
    }
}
