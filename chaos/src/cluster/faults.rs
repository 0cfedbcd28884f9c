//! The faults of a cluster run, each injected, held, ended and healed, with its
//! detection and heal measured (what each means: [`super::report`]).

use std::time::Instant;

use domaind_kube_api::crd::Phase as CrdPhase;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, EvictParams};

use super::harness::{ClusterRun, DETECT_LIMIT, set_cordon};
use super::observe::ClusterObservation;
use crate::report::{FaultRecord, Outcome};
use crate::schedule::{FaultKind, Step};

fn ms(from: Instant, to: Instant) -> u64 {
    to.saturating_duration_since(from).as_millis() as u64
}

/// Whether the status lists `node` Ready.
fn ready_in_status(obs: &ClusterObservation, node: &str) -> bool {
    obs.domain
        .as_ref()
        .and_then(|d| d.status.as_ref())
        .is_some_and(|s| {
            s.nodes
                .iter()
                .any(|n| n.name == node && n.status == CrdPhase::Ready)
        })
}

/// Whether each other member's daemon (that answers) counts `node` a live member.
fn counted_by_others<'a>(
    obs: &'a ClusterObservation,
    domain: &'a str,
    node: &'a str,
    nodes: &'a [String],
) -> impl Iterator<Item = bool> + 'a {
    nodes
        .iter()
        .filter(move |o| *o != node)
        .filter_map(move |other| {
            let seen = obs.view(other)?.domains.iter().find(|d| d.uid == domain)?;
            Some(seen.members.iter().any(|m| m == node) && !seen.lost.iter().any(|m| m == node))
        })
}

/// Whether the domain stopped counting `node` among its Ready members: in the status,
/// or for another member.
fn dropped(obs: &ClusterObservation, domain: &str, node: &str, nodes: &[String]) -> bool {
    !ready_in_status(obs, node)
        || counted_by_others(obs, domain, node, nodes).any(|counted| !counted)
}

/// Whether no part of the domain counts `node` any more: not Ready in the status, and
/// no other member's daemon has it as a live member.
fn gone_from_domain(obs: &ClusterObservation, domain: &str, node: &str, nodes: &[String]) -> bool {
    !ready_in_status(obs, node)
        && !counted_by_others(obs, domain, node, nodes).any(|counted| counted)
}

impl ClusterRun {
    pub(super) async fn inject(&mut self, step: &Step) -> FaultRecord {
        let outcome = match step.kind {
            FaultKind::DaemonDelete => self.daemon_delete(step).await,
            FaultKind::ImexCrash => self.imex_crash(step).await,
            FaultKind::Drain => self.drain(step).await,
            FaultKind::PodDelete => self.pod_delete(step).await,
            FaultKind::ControllerRestart => self.controller_restart(step).await,
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
            record.notes.push("not noticed".into());
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
    /// back from its checkpoint.
    async fn daemon_delete(&mut self, step: &Step) -> Result<FaultRecord, String> {
        let node = self.target(step);
        let before = self
            .last
            .as_ref()
            .and_then(|o| o.daemons.get(&node))
            .and_then(|d| d.instance.clone())
            .map(|i| i.id);
        self.replacing.insert(node.clone());
        let injected = Instant::now();
        if let Err(error) = self.access.delete_daemon(&node).await {
            self.replacing.remove(&node);
            return Err(format!("{error:#}"));
        }
        let mut record = self.begin(step, injected);
        let domain = self.domain_uid();
        let nodes = self.workload.nodes.clone();
        self.measure(
            &mut record,
            injected,
            injected,
            None,
            false,
            |_, o| dropped(o, &domain, &node, &nodes),
            |_, o| {
                o.daemons
                    .get(&node)
                    .and_then(|d| d.instance.as_ref())
                    .is_some_and(|i| Some(&i.id) != before.as_ref())
            },
        )
        .await;
        Ok(record)
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
