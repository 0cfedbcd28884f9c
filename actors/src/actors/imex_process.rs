//! ImexProcess: supervises the node's one IMEX daemon through the [`Imex`] port.
//!
//! It holds the peer set the node's domain wants, starts the daemon or applies the set
//! to the running one (only the latest set: bursts coalesce), polls readiness, and
//! restarts the daemon with backoff when it exits on its own. It reports every poll to
//! the domain that owns it.
//!
//! Polls follow [`PollSchedule`]: at once after a start or an apply, then doubling,
//! up to `imex_poll.steady` (5 s) while the daemon is ready and answers the same.
//! An exit is not left to the schedule: the port tells of it (`Imex::exited`) and
//! the actor asks at once, so a crash is restarted without waiting for a poll.
//! Every question is counted in `domaind_imex_status_queries_total`.
//!
//! Restarts cannot loop fast: every failure in a row (a start refused, a daemon that
//! exited) doubles the wait up to `imex_restart_backoff_max`, and only a daemon that
//! stayed up `imex_healthy_after` resets it. A successful start does not: a daemon that
//! cannot listen on its port starts fine and exits a moment later. A start the port
//! calls permanent (no binary, no TLS credentials, a config it may not write) waits
//! the cap at once: asking again sooner gets the same answer until a person acts. Each restart is
//! logged with its cause, counted in `domaind_imex_restarts_total{cause}`, and the
//! wait is in `domaind_imex_restart_backoff_seconds`.
//!
//! Failures in a row are one *episode*: it begins with the first failure and ends when
//! a daemon has stayed up `imex_healthy_after` (a timer, not the next failure, says
//! so) or is stopped on purpose. While it lasts `domaind_imex_failing` is 1 and every
//! report carries the episode and its newest reason ([`ImexFailure`]), so that the
//! domain tells users once per episode (an event) and its peers while the daemon is
//! down (the advertisement), not once per restart.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use actix::WeakRecipient;
use actix::prelude::*;
use domaind_backoff::Backoff;
use tokio::time::Instant;
use tracing::{info, warn};

use crate::config::NodeConfig;
use crate::model::Slot;
use crate::ports::{ErrorKind, Imex, ImexStatus, PortError};
use crate::rules::imex_poll::{Answer, PollSchedule};
use crate::rules::peers::PeerSet;

/// Restarts scheduled, by `cause`: `exited` (the daemon ended on its own) or
/// `start_failed` (it could not be started).
pub const IMEX_RESTARTS: &str = "domaind_imex_restarts_total";
/// How long the next restart waits (0 while the daemon runs or nothing waits).
pub const IMEX_RESTART_BACKOFF: &str = "domaind_imex_restart_backoff_seconds";
/// Status questions asked of the daemon (each runs the status tool once or twice).
pub const IMEX_STATUS_QUERIES: &str = "domaind_imex_status_queries_total";
/// 1 while the daemon is failing: it exited or could not start, and no daemon has
/// stayed up `imex_healthy_after` since.
pub const IMEX_FAILING: &str = "domaind_imex_failing";

/// The daemon is failing: which episode (failures in a row, counted from 1 in this
/// process) and why, the newest failure's reason.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ImexFailure {
    pub episode: u64,
    pub reason: String,
}

/// What the daemon reported, for the peer set of `version`.
#[derive(Debug, Clone, PartialEq, Eq, Message)]
#[rtype(result = "()")]
pub struct ImexReport {
    /// The peer-set version the daemon runs with (none before the first start).
    pub version: Option<u64>,
    pub running: bool,
    pub ready: bool,
    pub links: BTreeMap<Slot, bool>,
    /// The daemon serves another config and was kept for the claims using it: why.
    pub kept: Option<String>,
    /// The daemon was adopted, not started by this process ([`ImexStatus::adopted`]).
    pub adopted: bool,
    /// [`ImexStatus::catching_up`].
    pub catching_up: bool,
    /// When the status question this report answers was asked (none when no question
    /// was answered: a start that failed, a status tool that failed or timed out). Whether a silent peer's IMEX still answers is judged
    /// only on questions asked after the silence began (`rules::peer_health`).
    pub asked_at: Option<Instant>,
    /// The failure episode under way, if the daemon is failing.
    pub failure: Option<ImexFailure>,
}

/// Ask the daemon now, whatever the schedule says: a peer's gossip went silent, and
/// whether our IMEX still reaches its IMEX decides if it stays.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct QueryNow;

/// Run the daemon with this peer set.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ApplyPeers {
    pub owner: WeakRecipient<ImexReport>,
    pub version: u64,
    pub peers: PeerSet,
    /// Prepared claims use the node's IMEX already (restored from the checkpoint):
    /// a daemon found running is theirs ([`crate::ports::Imex::claims_in_use`]).
    pub claims_in_use: bool,
}

/// The domain is gone: stop the daemon.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct ReleaseImex;

/// The node moves to another clique: the domain that drove the daemon retired, and
/// the new clique's domain numbers its peer sets afresh. The daemon runs on as it is
/// (a job's local IMEX stays up; nodes that moved together may keep their links):
/// the version it runs is forgotten, so that the next [`ApplyPeers`] is applied
/// whatever its number, and it is not stopped for want of a peer set until then. A
/// [`ReleaseImex`] (no domain in the new clique drives IMEX) ends the handover and
/// stops it.
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Handover;

/// The node is going away: stop polling and restarting; stop the daemon too if
/// `stop_daemon` (a graceful stop), or leave it be (the process died with the node).
#[derive(Debug, Message)]
#[rtype(result = "()")]
pub struct Detach {
    pub stop_daemon: bool,
}

/// Lifecycle counts, for tests and the demo.
#[derive(Debug, Clone, Default, PartialEq, Eq, MessageResponse)]
pub struct ImexLifecycle {
    pub starts: u32,
    /// Starts after the daemon exited on its own.
    pub restarts: u32,
    pub applies: u32,
    pub stops: u32,
    pub failures: u32,
    pub running: bool,
    /// Why the daemon last failed (exited on its own, or could not be started).
    pub last_failure: Option<String>,
    /// How long the restart now waiting waits, if one does.
    pub restart_delay: Option<Duration>,
    /// The failure episode under way, if the daemon is failing.
    pub failing: Option<ImexFailure>,
    /// Failures in a row (0 when not failing).
    pub failures_in_a_row: u32,
}

#[derive(Debug, Message)]
#[rtype(result = "ImexLifecycle")]
pub struct GetImexLifecycle;

pub struct ImexProcessActor {
    imex: Arc<dyn Imex>,
    schedule: PollSchedule,
    owner: Option<WeakRecipient<ImexReport>>,
    desired: Option<(u64, PeerSet)>,
    /// As the domain last said ([`ApplyPeers::claims_in_use`]).
    claims_in_use: bool,
    applied: Option<u64>,
    running: bool,
    busy: bool,
    backoff: Backoff,
    healthy_after: Duration,
    /// When the running daemon was started.
    started_at: Option<Instant>,
    not_before: Option<Instant>,
    exited_unexpectedly: bool,
    detached: bool,
    /// Between a [`Handover`] and the next owner's first [`ApplyPeers`].
    handed_over: bool,
    /// Handovers so far: a start or apply begun before one completes for nobody.
    handovers: u64,
    /// The next poll, when one is scheduled.
    next_poll: Option<SpawnHandle>,
    /// A status question is out.
    polling: bool,
    /// A poll was asked for while a question was out or a start, apply or stop ran:
    /// it goes out when that ends, since its answer may predate the change.
    poll_wanted: bool,
    /// Waits for the port to tell of the daemon's exit.
    exit_watch: Option<SpawnHandle>,
    /// Ends the failure episode once a daemon started during it has stayed up.
    healthy_timer: Option<SpawnHandle>,
    /// Failure episodes begun so far.
    episodes: u64,
    lifecycle: ImexLifecycle,
}

impl std::fmt::Debug for ImexProcessActor {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ImexProcessActor")
            .field("lifecycle", &self.lifecycle)
            .finish_non_exhaustive()
    }
}

impl ImexProcessActor {
    pub fn new(imex: Arc<dyn Imex>, config: &NodeConfig) -> Self {
        Self {
            imex,
            schedule: PollSchedule::new(config.imex_poll),
            owner: None,
            desired: None,
            claims_in_use: false,
            applied: None,
            running: false,
            busy: false,
            backoff: Backoff::new(
                config.imex_restart_backoff_min,
                config.imex_restart_backoff_max,
            ),
            healthy_after: config.imex_healthy_after,
            started_at: None,
            not_before: None,
            exited_unexpectedly: false,
            detached: false,
            handed_over: false,
            handovers: 0,
            next_poll: None,
            polling: false,
            poll_wanted: false,
            exit_watch: None,
            healthy_timer: None,
            episodes: 0,
            lifecycle: ImexLifecycle::default(),
        }
    }

    /// Moves the daemon one step towards the desired state.
    fn drive(&mut self, ctx: &mut Context<Self>) {
        if self.busy || (self.detached && !self.running) {
            return;
        }
        let Some((version, peers)) = self.desired.clone() else {
            if self.running && !self.handed_over {
                self.stop(ctx);
            }
            return;
        };
        if self.running && self.applied == Some(version) {
            return;
        }
        if let Some(at) = self.not_before {
            let now = Instant::now();
            if now < at {
                ctx.run_later(at - now, |act, ctx| act.drive(ctx));
                return;
            }
        }
        self.busy = true;
        let imex = self.imex.clone();
        let starting = !self.running;
        let claims_in_use = self.claims_in_use;
        let handovers = self.handovers;
        ctx.spawn(
            async move {
                if starting {
                    imex.claims_in_use(claims_in_use);
                    imex.start(&peers).await
                } else {
                    imex.apply(&peers).await
                }
            }
            .into_actor(self)
            .map(move |result: Result<(), PortError>, act, ctx| {
                act.busy = false;
                match result {
                    Ok(()) => {
                        act.running = true;
                        // A version of the owner before a handover means nothing to
                        // the next one, which numbers afresh.
                        act.applied = (act.handovers == handovers).then_some(version);
                        act.not_before = None;
                        if starting {
                            act.watch_exit(ctx);
                            act.started_at = Some(Instant::now());
                            act.await_health(ctx);
                            act.lifecycle.restart_delay = None;
                            metrics::gauge!(IMEX_RESTART_BACKOFF).set(0.0);
                            act.lifecycle.starts += 1;
                            if std::mem::take(&mut act.exited_unexpectedly) {
                                act.lifecycle.restarts += 1;
                                info!(version, "IMEX daemon restarted");
                            } else {
                                info!(version, peers = act.desired.as_ref().map_or(0, |d| d.1.len()), "IMEX daemon started");
                            }
                        } else {
                            act.lifecycle.applies += 1;
                        }
                        // A domain forming waits on this answer: ask at once, and
                        // again soon.
                        let delay = act.schedule.changed();
                        act.poll_in(delay, ctx);
                    }
                    Err(error) => {
                        act.lifecycle.failures += 1;
                        if starting {
                            act.schedule_restart(
                                "start_failed",
                                error.to_string(),
                                error.kind(),
                            );
                            // No poll follows a start that failed: tell the domain now.
                            act.report(false, BTreeMap::new(), (None, false, false), None);
                        } else {
                            let delay = act.backoff.fail();
                            act.not_before = Some(Instant::now() + delay);
                            warn!(%error, retry_in = ?delay, "IMEX daemon could not be reconfigured");
                        }
                        if !starting {
                            // A failed reload may mean the daemon is gone; the next
                            // poll tells.
                            act.applied = None;
                        }
                    }
                }
                act.poll_if_wanted(ctx);
                act.drive(ctx);
            }),
        );
    }

    fn stop(&mut self, ctx: &mut Context<Self>) {
        self.busy = true;
        let imex = self.imex.clone();
        ctx.spawn(async move { imex.stop().await }.into_actor(self).map(
            |result: Result<(), PortError>, act, ctx| {
                act.busy = false;
                act.running = false;
                act.applied = None;
                act.started_at = None;
                // Stopped on purpose: the next start is no restart and owes no wait.
                act.recovered(ctx);
                act.not_before = None;
                act.lifecycle.restart_delay = None;
                act.lifecycle.stops += 1;
                match result {
                    Ok(()) => info!("IMEX daemon stopped: this node serves no domain"),
                    Err(error) => warn!(%error, "IMEX daemon did not stop cleanly"),
                }
                act.poll_if_wanted(ctx);
                act.drive(ctx);
            },
        ));
    }

    /// Schedules the next poll `delay` from now, replacing any scheduled before.
    fn poll_in(&mut self, delay: Duration, ctx: &mut Context<Self>) {
        if let Some(handle) = self.next_poll.take() {
            ctx.cancel_future(handle);
        }
        if self.detached {
            return;
        }
        if delay.is_zero() {
            self.poll(ctx);
        } else {
            self.next_poll = Some(ctx.run_later(delay, |act, ctx| {
                act.next_poll = None;
                act.poll(ctx);
            }));
        }
    }

    fn poll_if_wanted(&mut self, ctx: &mut Context<Self>) {
        if std::mem::take(&mut self.poll_wanted) {
            self.poll(ctx);
        }
    }

    /// Asks the port to tell when the daemon exits on its own; one wait serves every
    /// daemon this actor starts, since it ends only on an exit nobody reported yet.
    fn watch_exit(&mut self, ctx: &mut Context<Self>) {
        if self.exit_watch.is_some() || self.detached {
            return;
        }
        let imex = self.imex.clone();
        let told = async move { imex.exited().await }
            .into_actor(self)
            .map(|(), act, ctx| {
                act.exit_watch = None;
                // The status query reports the exit and why; the restart follows.
                act.poll_in(Duration::ZERO, ctx);
            });
        self.exit_watch = Some(ctx.spawn(told));
    }

    fn poll(&mut self, ctx: &mut Context<Self>) {
        if self.desired.is_none() || self.detached {
            return;
        }
        if self.busy || self.polling {
            self.poll_wanted = true;
            return;
        }
        self.polling = true;
        metrics::counter!(IMEX_STATUS_QUERIES).increment(1);
        let imex = self.imex.clone();
        let asked_at = Instant::now();
        ctx.spawn(async move { imex.status().await }.into_actor(self).map(
            move |result: Result<ImexStatus, PortError>, act, ctx| {
                act.polling = false;
                // An unanswered question says nothing of any link: a slow or failed
                // status tool must not read as every link down.
                let answered_at = result.is_ok().then_some(asked_at);
                let status = match result {
                    Ok(status) => status,
                    Err(error) => {
                        // A daemon that does not answer is not ready; whether it runs
                        // is the next poll's question.
                        warn!(%error, "IMEX status query failed");
                        ImexStatus {
                            running: act.running,
                            ..ImexStatus::default()
                        }
                    }
                };
                if act.running && !status.running && act.desired.is_some() {
                    act.running = false;
                    act.applied = None;
                    act.exited_unexpectedly = true;
                    let uptime = act.started_at.take().map(|at| at.elapsed());
                    if uptime.is_some_and(|up| up >= act.healthy_after) {
                        act.recovered(ctx);
                    }
                    let why = status
                        .exited
                        .clone()
                        .unwrap_or_else(|| "exited (no reason known)".into());
                    let why = match uptime {
                        Some(up) => format!("{why}, after {:.1} s up", up.as_secs_f64()),
                        None => why,
                    };
                    act.schedule_restart("exited", why, ErrorKind::Transient);
                    act.drive(ctx);
                }
                let ready = act.running && status.ready;
                let delay = act.schedule.answered(Answer {
                    running: act.running,
                    ready,
                    links: status.links.clone(),
                });
                if act.poll_wanted && !act.busy {
                    act.poll_wanted = false;
                    act.poll_in(Duration::ZERO, ctx);
                } else {
                    act.poll_in(delay, ctx);
                }
                act.report(
                    ready,
                    status.links,
                    (status.kept, status.adopted, status.catching_up),
                    answered_at,
                );
            },
        ));
    }

    /// Tells the domain what the daemon last reported.
    fn report(
        &self,
        ready: bool,
        links: BTreeMap<Slot, bool>,
        (kept, adopted, catching_up): (Option<String>, bool, bool),
        asked_at: Option<Instant>,
    ) {
        if let Some(owner) = self.owner.as_ref().and_then(WeakRecipient::upgrade) {
            owner.do_send(ImexReport {
                version: self.applied,
                running: self.running,
                ready,
                links,
                kept,
                adopted,
                catching_up,
                asked_at,
                failure: self.lifecycle.failing.clone(),
            });
        }
    }

    /// Once a daemon started now has stayed up `healthy_after`, the failures are over.
    /// A daemon that exits before cancels nothing: the timer checks which start it was
    /// armed for.
    fn await_health(&mut self, ctx: &mut Context<Self>) {
        if let Some(timer) = self.healthy_timer.take() {
            ctx.cancel_future(timer);
        }
        if self.lifecycle.failing.is_none() {
            return;
        }
        let started = self.started_at;
        self.healthy_timer = Some(ctx.run_later(self.healthy_after, move |act, ctx| {
            act.healthy_timer = None;
            if act.running && act.started_at == started {
                info!(
                    up = ?act.healthy_after,
                    "IMEX daemon stayed up: no longer failing"
                );
                act.recovered(ctx);
                act.poll_in(Duration::ZERO, ctx);
            }
        }));
    }

    /// The failures in a row are over: the backoff starts again from its minimum and
    /// the episode ends.
    fn recovered(&mut self, ctx: &mut Context<Self>) {
        self.backoff.succeed();
        if let Some(timer) = self.healthy_timer.take() {
            ctx.cancel_future(timer);
        }
        if self.lifecycle.failing.take().is_some() {
            metrics::gauge!(IMEX_FAILING).set(0.0);
        }
        self.lifecycle.failures_in_a_row = 0;
    }
}

impl ImexProcessActor {
    /// The daemon failed (`cause`, for the metric; `why`, for people): the next start
    /// waits out the backoff.
    fn schedule_restart(&mut self, cause: &'static str, why: String, kind: ErrorKind) {
        let episode = match &self.lifecycle.failing {
            Some(failing) => failing.episode,
            None => {
                self.episodes += 1;
                metrics::gauge!(IMEX_FAILING).set(1.0);
                self.imex.failing(self.episodes);
                self.episodes
            }
        };
        self.lifecycle.failing = Some(ImexFailure {
            episode,
            reason: why.clone(),
        });
        let delay = match kind {
            ErrorKind::Permanent => self.backoff.fail_at_cap(),
            ErrorKind::Transient | ErrorKind::Conflict => self.backoff.fail(),
        };
        self.lifecycle.failures_in_a_row = self.backoff.failures();
        self.not_before = Some(Instant::now() + delay);
        metrics::counter!(IMEX_RESTARTS, "cause" => cause).increment(1);
        metrics::gauge!(IMEX_RESTART_BACKOFF).set(delay.as_secs_f64());
        warn!(
            cause,
            reason = %why,
            retry_in = ?delay,
            failures_in_a_row = self.backoff.failures(),
            "IMEX daemon failed; starting it again after the backoff"
        );
        self.lifecycle.last_failure = Some(why);
        self.lifecycle.restart_delay = Some(delay);
    }
}

impl Actor for ImexProcessActor {
    type Context = Context<Self>;

    // Nothing to ask before a domain wants a daemon: the first start schedules the
    // polls. A supervisor restart keeps our fields but drops every future we had
    // spawned, so a restarted actor watches and asks again, and drives what was cut.
    fn started(&mut self, ctx: &mut Self::Context) {
        self.busy = false;
        self.polling = false;
        self.next_poll = None;
        self.exit_watch = None;
        self.healthy_timer = None;
        if self.detached {
            return;
        }
        if self.running {
            self.watch_exit(ctx);
            self.await_health(ctx);
        }
        if self.desired.is_some() {
            let delay = self.schedule.changed();
            self.poll_in(delay, ctx);
        }
        self.drive(ctx);
    }
}

impl Handler<ApplyPeers> for ImexProcessActor {
    type Result = ();

    fn handle(&mut self, msg: ApplyPeers, ctx: &mut Self::Context) {
        self.owner = Some(msg.owner);
        self.desired = Some((msg.version, msg.peers));
        self.claims_in_use = msg.claims_in_use;
        let handed_over = std::mem::take(&mut self.handed_over);
        self.drive(ctx);
        if handed_over {
            // Nothing was asked during the handover: what the daemon did meanwhile
            // (an exit) is learnt now.
            let delay = self.schedule.changed();
            self.poll_in(delay, ctx);
        }
    }
}

impl Handler<QueryNow> for ImexProcessActor {
    type Result = ();

    fn handle(&mut self, _: QueryNow, ctx: &mut Self::Context) {
        self.schedule.watch();
        // A question already out may predate what prompted this one: `poll` asks
        // again once it is answered.
        self.poll(ctx);
    }
}

impl Handler<ReleaseImex> for ImexProcessActor {
    type Result = ();

    fn handle(&mut self, _: ReleaseImex, ctx: &mut Self::Context) {
        self.owner = None;
        self.desired = None;
        self.handed_over = false;
        self.drive(ctx);
    }
}

impl Handler<Handover> for ImexProcessActor {
    type Result = ();

    fn handle(&mut self, _: Handover, ctx: &mut Self::Context) {
        info!(
            running = self.running,
            "IMEX daemon handed over to the new clique's domain: kept running as it is"
        );
        self.owner = None;
        self.desired = None;
        self.applied = None;
        self.handed_over = true;
        self.handovers += 1;
        if let Some(handle) = self.next_poll.take() {
            ctx.cancel_future(handle);
        }
    }
}

impl Handler<Detach> for ImexProcessActor {
    type Result = ();

    // Not ctx.stop(): the supervisor would restart us while anyone holds our address.
    // Detached, with no timer left, we stop once the last address is dropped.
    fn handle(&mut self, Detach { stop_daemon }: Detach, ctx: &mut Self::Context) {
        self.detached = true;
        self.handed_over = false;
        for handle in [
            self.next_poll.take(),
            self.exit_watch.take(),
            self.healthy_timer.take(),
        ]
        .into_iter()
        .flatten()
        {
            ctx.cancel_future(handle);
        }
        self.owner = None;
        self.desired = None;
        if stop_daemon {
            self.drive(ctx);
        }
    }
}

impl Handler<GetImexLifecycle> for ImexProcessActor {
    type Result = ImexLifecycle;

    fn handle(&mut self, _: GetImexLifecycle, _: &mut Self::Context) -> ImexLifecycle {
        ImexLifecycle {
            running: self.running,
            ..self.lifecycle.clone()
        }
    }
}
