//! Channel: one per prepared claim. Answers prepare calls once the claim's readiness
//! policy holds, or, at the deadline, with a retryable error that says what it waits
//! for. Several calls for one claim wait together and get the same answer.

use std::time::Duration;

use actix::prelude::*;
use tokio::sync::{oneshot, watch};

use crate::model::{ChannelId, ReadinessPolicy, Slot};
use crate::outcome::{PrepareError, Prepared};
use crate::ports::ClaimRecord;

/// The domain's progress, as a channel needs it.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct Progress {
    /// This node's IMEX is ready for the current peer set.
    pub local_ready: bool,
    pub domain_ready: bool,
    pub slot: Option<Slot>,
    /// Channel isolation: the domain's confirmed channel (else the domain's channel is
    /// the default one).
    pub channel: Option<ChannelId>,
    /// "domain ns/cd (uid): 3/18 nodes ready".
    pub summary: String,
}

#[derive(Debug, Message)]
#[rtype(result = "Result<Prepared, PrepareError>")]
pub struct WaitReady;

pub struct ChannelActor {
    record: ClaimRecord,
    node: String,
    deadline: Duration,
    progress: Option<Progress>,
    waiters: Vec<oneshot::Sender<Result<Prepared, PrepareError>>>,
    /// What a waiting call reports if its deadline passes, kept current.
    waiting_for: watch::Sender<String>,
}

impl std::fmt::Debug for ChannelActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChannelActor")
            .field("claim", &self.record.claim.uid)
            .finish_non_exhaustive()
    }
}

impl ChannelActor {
    pub fn new(record: ClaimRecord, node: String, deadline: Duration) -> Self {
        let channel = Self {
            record,
            node,
            deadline,
            progress: None,
            waiters: Vec::new(),
            waiting_for: watch::channel(String::new()).0,
        };
        channel.waiting_for.send_replace(channel.describe_wait());
        channel
    }

    fn answer(&self) -> Option<Prepared> {
        let progress = self.progress.as_ref()?;
        let holds = match self.record.policy {
            ReadinessPolicy::Local => progress.local_ready,
            ReadinessPolicy::Domain => progress.domain_ready,
        };
        holds.then(|| Prepared {
            claim_uid: self.record.claim.uid.clone(),
            domain: self.record.info.domain.clone(),
            node: self.node.clone(),
            allocation_mode: self.record.info.allocation_mode,
            slot: progress.slot,
            channel: progress.channel,
            devices: self.record.info.devices.clone(),
            admin_access: false,
        })
    }

    fn describe_wait(&self) -> String {
        let what = match self.record.policy {
            ReadinessPolicy::Local => "this node's IMEX daemon",
            ReadinessPolicy::Domain => "every node of the domain",
        };
        let summary = self.progress.as_ref().map_or_else(
            || format!("domain {}: joining", self.record.info.domain),
            |p| p.summary.clone(),
        );
        format!(
            "not ready yet, waiting for {what} (readiness {:?}): {summary}",
            self.record.policy
        )
    }
}

impl Actor for ChannelActor {
    type Context = Context<Self>;
}

impl Handler<Progress> for ChannelActor {
    type Result = ();

    fn handle(&mut self, progress: Progress, _: &mut Self::Context) {
        self.progress = Some(progress);
        self.waiting_for.send_replace(self.describe_wait());
        if let Some(prepared) = self.answer() {
            for waiter in self.waiters.drain(..) {
                let _ = waiter.send(Ok(prepared.clone()));
            }
        }
    }
}

impl Handler<WaitReady> for ChannelActor {
    type Result = ResponseFuture<Result<Prepared, PrepareError>>;

    fn handle(&mut self, _: WaitReady, _: &mut Self::Context) -> Self::Result {
        if let Some(prepared) = self.answer() {
            return Box::pin(async move { Ok(prepared) });
        }
        let (tx, rx) = oneshot::channel();
        self.waiters.retain(|w| !w.is_closed());
        self.waiters.push(tx);
        let deadline = self.deadline;
        let waiting_for = self.waiting_for.subscribe();
        Box::pin(async move {
            match tokio::time::timeout(deadline, rx).await {
                Ok(Ok(answer)) => answer,
                Ok(Err(_)) => Err(PrepareError::Transient(
                    "the claim's domain was restarted on this node; call again".into(),
                )),
                Err(_) => Err(PrepareError::NotReady(waiting_for.borrow().clone())),
            }
        })
    }
}
