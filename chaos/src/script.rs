//! Scripts: a simulated rack driven by a list of operations, checked by assertions
//! with deadlines.

use std::ops::Range;
use std::time::Duration;

use domaind_actors::model::ReadinessPolicy;

use crate::sim::{ClusterView, SimCluster};

/// An invariant over the cluster's view; `Err` says what is wrong.
pub type Check = Box<dyn Fn(&ClusterView) -> Result<(), String>>;

pub enum Operation {
    /// Starts nodes `range`.
    AddNodes(Range<usize>),
    /// Unprepares a node's claims and stops it for good.
    Remove(usize),
    /// A kubelet prepares `claim` (for domain `domain`) on `node`, retrying while the
    /// answer is retryable; the call runs in the background.
    Prepare {
        node: usize,
        claim: String,
        domain: String,
        policy: Option<ReadinessPolicy>,
    },
    /// `Prepare` on each node, claim `<domain>-<node>`, all at once.
    PrepareOnEach {
        nodes: Vec<usize>,
        domain: String,
    },
    Unprepare {
        node: usize,
        claim: String,
    },
    /// SIGKILL: no goodbye, its IMEX daemon dies too.
    Kill(usize),
    /// Starts a killed node again, with its checkpoint and a new generation.
    Restart(usize),
    /// Cuts every link between two groups of nodes.
    Partition(Vec<usize>, Vec<usize>),
    Isolate(usize),
    Heal,
    CrashImex(usize),
    /// Drops this percentage of gossip messages from now on.
    Loss(f64),
    Wait(Duration),
    /// Fails the script unless `check` holds within `within` of simulated time.
    Assert {
        within: Duration,
        what: String,
        check: Check,
    },
}

impl std::fmt::Debug for Operation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Assert { within, what, .. } => write!(f, "Assert({what}, within {within:?})"),
            Self::AddNodes(r) => write!(f, "AddNodes({r:?})"),
            Self::Remove(n) => write!(f, "Remove({n})"),
            Self::Prepare {
                node,
                claim,
                domain,
                ..
            } => write!(f, "Prepare({node}, {claim}, {domain})"),
            Self::PrepareOnEach { nodes, domain } => {
                write!(f, "PrepareOnEach({} nodes, {domain})", nodes.len())
            }
            Self::Unprepare { node, claim } => write!(f, "Unprepare({node}, {claim})"),
            Self::Kill(n) => write!(f, "Kill({n})"),
            Self::Restart(n) => write!(f, "Restart({n})"),
            Self::Partition(a, b) => write!(f, "Partition({a:?} | {b:?})"),
            Self::Isolate(n) => write!(f, "Isolate({n})"),
            Self::Heal => write!(f, "Heal"),
            Self::CrashImex(n) => write!(f, "CrashImex({n})"),
            Self::Loss(p) => write!(f, "Loss({p}%)"),
            Self::Wait(d) => write!(f, "Wait({d:?})"),
        }
    }
}

/// Shorthand for an assertion.
pub fn assert_within(within: Duration, what: &str, check: Check) -> Operation {
    Operation::Assert {
        within,
        what: what.to_owned(),
        check,
    }
}

/// How long each assertion took to hold, in order.
#[derive(Debug, Clone, Default)]
pub struct ScriptReport {
    pub assertions: Vec<(String, Duration)>,
}

impl SimCluster {
    /// Runs `script` to the end, or to the first assertion that does not hold.
    pub async fn run(&mut self, script: Vec<Operation>) -> Result<ScriptReport, String> {
        let mut report = ScriptReport::default();
        for operation in script {
            tracing::info!(?operation, "script");
            match operation {
                Operation::AddNodes(range) => {
                    for index in range {
                        self.start_node(index).await;
                    }
                }
                Operation::Remove(index) => self.remove(index).await,
                Operation::Prepare {
                    node,
                    claim,
                    domain,
                    policy,
                } => self.prepare(node, &claim, &domain, policy),
                Operation::PrepareOnEach { nodes, domain } => {
                    for node in nodes {
                        self.prepare(node, &format!("{domain}-{node}"), &domain, None);
                    }
                }
                Operation::Unprepare { node, claim } => {
                    self.unprepare(node, &claim)
                        .await
                        .map_err(|e| format!("unprepare {claim} on {node} failed: {e}"))?;
                }
                Operation::Kill(index) => self.kill(index).await,
                Operation::Restart(index) => self.start_node(index).await,
                Operation::Partition(a, b) => self.partition(&a, &b),
                Operation::Isolate(index) => self.isolate(index),
                Operation::Heal => self.heal(),
                Operation::CrashImex(index) => self.crash_imex(index),
                Operation::Loss(percent) => self.loss(percent),
                Operation::Wait(duration) => tokio::time::sleep(duration).await,
                Operation::Assert {
                    within,
                    what,
                    check,
                } => {
                    let took = self.wait_for(within, &what, check).await?;
                    report.assertions.push((what, took));
                }
            }
        }
        Ok(report)
    }
}
