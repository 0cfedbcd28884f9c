//! StatusWriter: the only writer of a domain's status from this node, and only while
//! this node is the domain's reporter (one writer per tenure, its term). When to write
//! (debounce, the hold on a degrading domain, deduplication, rewrites after another
//! node's write landed over ours, retirement) is decided by the pure state machine
//! [`crate::rules::status_writes`]; this actor runs its timer, its writes (publishing
//! each write's stamp in gossip), the retry backoff, the phase events, metrics and logs.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use domaind_backoff::Backoff;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::model::{DomainRef, NodeId, Phase};
use crate::ports::{DomainEvent, ErrorKind, EventSink, Gossip, PortError, StatusSink};
use crate::rules::membership::status_key;
use crate::rules::status::DomainStatus;
use crate::rules::status_writes::{Effect, Retirement, Stamp, StatusWrites, WriteOutcome};

// Successful writes are counted by the sinks, which know their backend and outcome
// (`domaind_status_writes_total`); counting here too would double every write.
pub const STATUS_WRITE_FAILURES: &str = "domaind_status_write_failures_total";
/// Writes repeated because another node's write landed after ours.
pub const STATUS_REWRITES: &str = "domaind_status_rewrites_total";

#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct PublishStatus(pub DomainStatus);

/// The domain left this node: what is not written yet is dropped, and the answer comes
/// once no write of this writer is in flight. The last member out writes the vacated
/// status after this; a held write (a degradation waits seconds) or one in flight
/// landing after it would make the status describe a workload that is gone.
#[derive(Debug, Clone, Message)]
#[rtype(result = "()")]
pub struct Retire;

pub struct StatusWriterActor {
    domain: DomainRef,
    sink: Arc<dyn StatusSink>,
    events: Arc<dyn EventSink>,
    gossip: Arc<dyn Gossip>,
    writes: StatusWrites,
    timer: Option<SpawnHandle>,
    backoff: Backoff,
    /// Retired with a write in flight: they hear when it ends.
    retirees: Vec<tokio::sync::oneshot::Sender<()>>,
}

impl std::fmt::Debug for StatusWriterActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StatusWriterActor")
            .field("domain", &self.domain.uid)
            .finish_non_exhaustive()
    }
}

impl StatusWriterActor {
    /// `writes`: the decisions of this tenure, from [`StatusWrites::new`] (the status
    /// as written when it began, its term).
    pub fn new(
        domain: DomainRef,
        sink: Arc<dyn StatusSink>,
        events: Arc<dyn EventSink>,
        gossip: Arc<dyn Gossip>,
        writes: StatusWrites,
    ) -> Self {
        Self {
            domain,
            sink,
            events,
            gossip,
            writes,
            timer: None,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
            retirees: Vec::new(),
        }
    }

    /// The stamps other live members publish.
    fn others_written(&self) -> BTreeMap<NodeId, Stamp> {
        let key = status_key(&self.domain.uid);
        let me = self.gossip.node();
        self.gossip
            .live()
            .values()
            .filter(|m| m.node != me)
            .filter_map(|m| Some((m.node.clone(), Stamp::decode(m.keys.get(&key)?))))
            .collect()
    }

    fn announce_phase(&self, status: &DomainStatus) {
        let message = status.message.clone();
        let event = match status.status {
            Phase::Ready => DomainEvent::Ready { message },
            Phase::NotReady => DomainEvent::NotReady { message },
        };
        let (events, domain) = (self.events.clone(), self.domain.clone());
        actix::spawn(async move {
            if let Err(error) = events.emit(&domain, event).await {
                warn!(%domain, %error, "event not recorded");
            }
        });
    }

    fn apply(&mut self, effects: Vec<Effect>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                Effect::Arm(at) => self.arm(at, ctx),
                Effect::Write { status, stamp } => self.write(status, stamp, ctx),
                Effect::AlreadyWritten => {
                    debug!(domain = %self.domain, "status already written by the previous reporter");
                }
                Effect::Rewrite => {
                    warn!(domain = %self.domain, "another node wrote the status after this reporter: writing it again");
                    metrics::counter!(STATUS_REWRITES).increment(1);
                }
                Effect::Announce(status) => self.announce_phase(&status),
                // Logged and counted where the write's error is known (`write`); the
                // retry is the `Arm` that follows.
                Effect::Retry { .. } => {}
                Effect::Stop => {
                    self.retirees.drain(..).for_each(|retiree| {
                        let _ = retiree.send(());
                    });
                    ctx.stop();
                }
            }
        }
    }

    /// (Re)arms the flush timer for `at`.
    fn arm(&mut self, at: Instant, ctx: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        self.timer = Some(ctx.run_later(
            at.saturating_duration_since(Instant::now()),
            |act, ctx| {
                act.timer = None;
                act.flush(ctx);
            },
        ));
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        let key = status_key(&self.domain.uid);
        let gossip = self.gossip.clone();
        // Whether some live member already published a stamp of this digest.
        let effects = self.writes.flush(|digest| {
            gossip.live().values().any(|m| {
                m.keys
                    .get(&key)
                    .is_some_and(|v| Stamp::decode(v).digest == digest)
            })
        });
        self.apply(effects, ctx);
    }

    fn write(&mut self, status: DomainStatus, stamp: Stamp, ctx: &mut Context<Self>) {
        let sink = self.sink.clone();
        let gossip = self.gossip.clone();
        let domain = self.domain.clone();
        ctx.spawn(
            async move {
                let result = sink.write(&domain, &status).await;
                if result.is_ok() {
                    gossip.set(&status_key(&domain.uid), &stamp.encode()).await;
                }
                (result, status, stamp)
            }
            .into_actor(self)
            .map(|(result, status, stamp): (Result<(), PortError>, DomainStatus, Stamp), act, ctx| {
                let outcome = match &result {
                    Ok(()) => {
                        act.backoff.succeed();
                        WriteOutcome::Written
                    }
                    Err(error) => WriteOutcome::Failed {
                        retry_in: retry_wait(&mut act.backoff, error),
                    },
                };
                let effects = act.writes.finished(status, stamp, outcome, Instant::now());
                for effect in &effects {
                    if let (Effect::Retry { retry_in }, Err(error)) = (effect, &result) {
                        metrics::counter!(STATUS_WRITE_FAILURES).increment(1);
                        warn!(domain = %act.domain, %error, kind = %error.kind(), retry_in = ?retry_in, "status write failed");
                    }
                }
                act.apply(effects, ctx);
            }),
        );
    }
}

/// How long a failed write waits. A refusal (RBAC, validation) gets the same answer
/// until a person acts, so it waits the cap rather than climbing from the floor; a
/// conflict is retried as a timeout is, since each write reads the object afresh.
fn retry_wait(backoff: &mut Backoff, error: &PortError) -> Duration {
    match error.kind() {
        ErrorKind::Permanent => backoff.fail_at_cap(),
        ErrorKind::Transient | ErrorKind::Conflict => backoff.fail(),
    }
}

impl Actor for StatusWriterActor {
    type Context = Context<Self>;
}

impl Handler<Retire> for StatusWriterActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Retire, ctx: &mut Self::Context) -> Self::Result {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        match self.writes.retire() {
            Retirement::Now => {
                ctx.stop();
                Box::pin(async {})
            }
            Retirement::AfterWrite => {
                let (done, written) = tokio::sync::oneshot::channel();
                self.retirees.push(done);
                Box::pin(async move {
                    let _ = written.await;
                })
            }
        }
    }
}

impl Handler<PublishStatus> for StatusWriterActor {
    type Result = ();

    fn handle(&mut self, PublishStatus(status): PublishStatus, ctx: &mut Self::Context) {
        let others = self.others_written();
        let effects = self.writes.publish(status, others, Instant::now());
        self.apply(effects, ctx);
    }
}
