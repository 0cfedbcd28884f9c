//! StatusWriter: the only writer of a domain's status from this node, and only while
//! this node is the domain's reporter. A document is written once changes have been
//! quiet for a moment, or after a maximum delay while they keep coming, so a burst
//! becomes one write; a document already written (by this node, or by a predecessor that
//! published its digest in gossip) is not written again; failed writes are retried
//! with backoff, always with the newest document.
//!
//! The phase events (`Ready`, `NotReady`) are emitted here, after the write that
//! changes the phase as written: a phase the writer held back and that recovered was
//! never shown to users, and a new reporter whose first document keeps the phase its
//! predecessor wrote has no news to tell.
//!
//! A former reporter's write can land after ours (it was in flight when the role
//! changed hands, and writes are last-writer-wins). Every writer publishes the digest
//! of what it wrote once the write is done, so the reporter sees another member's
//! digest change to one that is not its own, and writes its document again.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use domaind_backoff::Backoff;
use tokio::time::Instant;
use tracing::{debug, warn};

use crate::model::{DomainRef, NodeId, Phase};
use crate::ports::{DomainEvent, EventSink, Gossip, PortError, StatusSink};
use crate::rules::membership::status_key;
use crate::rules::status::{DomainStatus, digest};

// Successful writes are counted by the sinks, which know their backend and outcome
// (`domaind_status_writes_total`); counting here too would double every write.
pub const STATUS_WRITE_FAILURES: &str = "domaind_status_write_failures_total";
/// Writes repeated because a former reporter's write landed after ours.
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
    quiet: Duration,
    max_delay: Duration,
    pending: Option<DomainStatus>,
    /// When the oldest unwritten change arrived.
    pending_since: Option<Instant>,
    written: Option<String>,
    /// The phase of the last document written.
    written_phase: Option<Phase>,
    timer: Option<SpawnHandle>,
    writing: bool,
    backoff: Backoff,
    /// Other members' published digests as last seen; `None` before the first look.
    others_seen: Option<BTreeMap<NodeId, String>>,
    /// Someone wrote after us: write the document even though we wrote it before.
    overwritten: bool,
    /// Retired: nothing more is written; `retirees` hear when the write in flight ends.
    retired: bool,
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
    /// `written`: the status as last written, by whoever, when this node took the
    /// role: the same document is not written again, and the phase events follow on
    /// from its phase.
    pub fn new(
        domain: DomainRef,
        sink: Arc<dyn StatusSink>,
        events: Arc<dyn EventSink>,
        gossip: Arc<dyn Gossip>,
        quiet: Duration,
        max_delay: Duration,
        written: Option<&DomainStatus>,
    ) -> Self {
        Self {
            domain,
            sink,
            events,
            gossip,
            quiet,
            max_delay,
            pending: None,
            pending_since: None,
            written: written.map(digest),
            written_phase: written.map(|w| w.status),
            timer: None,
            writing: false,
            backoff: Backoff::new(Duration::from_millis(200), Duration::from_secs(10)),
            others_seen: None,
            overwritten: false,
            retired: false,
            retirees: Vec::new(),
        }
    }

    /// Whether another member published a digest, since we last looked, that is not
    /// the one we wrote: its write may have landed after ours.
    fn overwritten_since_last_look(&mut self) -> bool {
        let key = status_key(&self.domain.uid);
        let me = self.gossip.node();
        let others: BTreeMap<NodeId, String> = self
            .gossip
            .live()
            .values()
            .filter(|m| m.node != me)
            .filter_map(|m| Some((m.node.clone(), m.keys.get(&key)?.clone())))
            .collect();
        let overwritten = match (&self.others_seen, &self.written) {
            (Some(seen), Some(written)) => others
                .iter()
                .any(|(node, digest)| seen.get(node) != Some(digest) && digest != written),
            _ => false,
        };
        self.others_seen = Some(others);
        overwritten
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

    /// (Re)arms the flush: `delay` from now, but never later than `max_delay` after
    /// the oldest unwritten change.
    fn schedule(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        let now = Instant::now();
        let since = *self.pending_since.get_or_insert(now);
        let at = (now + delay).min(since + self.max_delay);
        self.timer = Some(
            ctx.run_later(at.saturating_duration_since(now), |act, ctx| {
                act.timer = None;
                act.flush(ctx);
            }),
        );
    }

    /// Whether some live member already published this digest as written.
    fn written_by_someone(&self, digest: &str) -> bool {
        let key = status_key(&self.domain.uid);
        self.gossip
            .live()
            .values()
            .any(|m| m.keys.get(&key).is_some_and(|d| d == digest))
    }

    fn flush(&mut self, ctx: &mut Context<Self>) {
        if self.writing || self.retired {
            return;
        }
        let Some(status) = self.pending.take() else {
            return;
        };
        self.pending_since = None;
        let fingerprint = digest(&status);
        if !self.overwritten && self.written.as_deref() == Some(fingerprint.as_str()) {
            return;
        }
        if !self.overwritten && self.written.is_none() && self.written_by_someone(&fingerprint) {
            debug!(domain = %self.domain, "status already written by the previous reporter");
            self.written = Some(fingerprint);
            self.written_phase = Some(status.status);
            return;
        }
        self.writing = true;
        let sink = self.sink.clone();
        let gossip = self.gossip.clone();
        let domain = self.domain.clone();
        ctx.spawn(
            async move {
                let result = sink.write(&domain, &status).await;
                if result.is_ok() {
                    gossip.set(&status_key(&domain.uid), &fingerprint).await;
                }
                (result, status, fingerprint)
            }
            .into_actor(self)
            .map(|(result, status, fingerprint): (Result<(), PortError>, DomainStatus, String), act, ctx| {
                act.writing = false;
                if act.retired {
                    act.retirees.drain(..).for_each(|retiree| {
                        let _ = retiree.send(());
                    });
                    ctx.stop();
                    return;
                }
                match result {
                    Ok(()) => {
                        act.backoff.succeed();
                        act.overwritten = false;
                        act.written = Some(fingerprint);
                        if act.written_phase != Some(status.status) {
                            act.announce_phase(&status);
                        }
                        act.written_phase = Some(status.status);
                        if act.pending.is_some() {
                            act.schedule(act.quiet, ctx);
                        }
                    }
                    Err(error) => {
                        metrics::counter!(STATUS_WRITE_FAILURES).increment(1);
                        let delay = act.backoff.fail();
                        warn!(domain = %act.domain, %error, retry_in = ?delay, "status write failed");
                        // Retry with the newest document, whichever that is.
                        act.pending.get_or_insert(status);
                        act.schedule(delay, ctx);
                    }
                }
            }),
        );
    }
}

impl Actor for StatusWriterActor {
    type Context = Context<Self>;
}

impl Handler<Retire> for StatusWriterActor {
    type Result = ResponseFuture<()>;

    fn handle(&mut self, _: Retire, ctx: &mut Self::Context) -> Self::Result {
        self.retired = true;
        self.pending = None;
        self.pending_since = None;
        if let Some(timer) = self.timer.take() {
            ctx.cancel_future(timer);
        }
        if !self.writing {
            ctx.stop();
            return Box::pin(async {});
        }
        let (done, written) = tokio::sync::oneshot::channel();
        self.retirees.push(done);
        Box::pin(async move {
            let _ = written.await;
        })
    }
}

impl Handler<PublishStatus> for StatusWriterActor {
    type Result = ();

    fn handle(&mut self, PublishStatus(status): PublishStatus, ctx: &mut Self::Context) {
        if self.retired {
            return;
        }
        if self.overwritten_since_last_look() {
            warn!(domain = %self.domain, "another node wrote the status after this reporter: writing it again");
            metrics::counter!(STATUS_REWRITES).increment(1);
            self.overwritten = true;
        }
        // The domain turning Ready is what users (and Domain-policy prepares) wait
        // for: write it at once rather than after the quiet period.
        let now_ready = status.status == Phase::Ready && self.written_phase != Some(Phase::Ready);
        // A Ready domain that degrades is held for the longest delay: a node loss shows
        // first as IMEX links dropping, seconds before gossip's verdict and the
        // recovery without the node. Waiting makes the whole change one write (or
        // none, when the domain comes back as it was).
        let degrading = status.status != Phase::Ready && self.written_phase == Some(Phase::Ready);
        self.pending = Some(status);
        let delay = if now_ready {
            Duration::ZERO
        } else if degrading {
            self.max_delay
        } else {
            self.quiet
        };
        self.schedule(delay, ctx);
    }
}
