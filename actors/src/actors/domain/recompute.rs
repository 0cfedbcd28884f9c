//! The domain's pass carried out: the core (`rules::domain_core`) decides from the
//! gossip view; this sends what it decided to ImexPeers, IMEX, the claims and the
//! node, publishes the advertisement and arms the timers it asks for.

use super::*;

impl DomainActor {
    pub(super) fn recompute(&mut self, ctx: &mut Context<Self>) {
        if self.leaving {
            return;
        }
        let now = Instant::now();
        let live = match &self.live {
            Some(live) => live.clone(),
            None => Arc::new(self.ports.gossip.live()),
        };
        let Some(pass) = self.core.pass(PassInput {
            live: &live,
            holds_claims: !self.claims.is_empty(),
            writing: self.status_writer.is_some(),
            now,
            now_ms: self.ports.clock.now_ms(),
        }) else {
            return;
        };
        for (node, error) in &pass.malformed {
            metrics::counter!(BAD_ADVERTISEMENTS).increment(1);
            debug!(domain = %self.domain, %node, %error, "unreadable advertisement ignored");
        }
        for change in &pass.changes {
            self.log_change(change);
        }
        if let Some(timer) = self.retention_timer.take() {
            ctx.cancel_future(timer);
        }
        if let Some(first) = pass.expiry {
            self.retention_timer = Some(ctx.run_later(
                first.saturating_duration_since(now),
                |act, ctx| {
                    act.retention_timer = None;
                    act.schedule_recompute(ctx);
                },
            ));
        }
        self.carry_out(pass.effects, ctx);
        self.publish(ctx);
        self.carry_out(pass.report, ctx);
    }

    fn log_change(&self, change: &Change) {
        match change {
            Change::Left(node) => {
                info!(domain = %self.domain, %node, "member left the domain");
            }
            Change::Lost { node, .. } => {
                info!(domain = %self.domain, %node, "member lost: its daemon is silent in gossip");
            }
            Change::Back(node) => {
                info!(domain = %self.domain, %node, "lost member is back");
            }
            Change::Forgotten(node) => {
                info!(domain = %self.domain, %node, "lost member forgotten after {:?}", self.core.graces().retention);
            }
            Change::AdoptionEnded(node) => {
                info!(domain = %self.domain, %node, "a member the written status listed is back, or forgotten");
            }
        }
    }

    /// Carries out what the core decided, in order.
    pub(super) fn carry_out(&mut self, effects: Vec<DomainEffect>, ctx: &mut Context<Self>) {
        for effect in effects {
            match effect {
                DomainEffect::RetirePeer(node) => {
                    self.peers.remove(&node);
                }
                DomainEffect::Signal {
                    node,
                    tenure,
                    signal,
                } => self.peer(&node, tenure, ctx).do_send(signal),
                DomainEffect::QueryImex => self.imex.do_send(QueryNow),
                DomainEffect::ApplyPeers {
                    version,
                    peers,
                    claims_in_use,
                } => self.imex.do_send(ApplyPeers {
                    owner: ctx.address().recipient::<ImexReport>().downgrade(),
                    version,
                    peers,
                    claims_in_use,
                }),
                DomainEffect::ReleaseImex => self.imex.do_send(ReleaseImex),
                DomainEffect::SlotChanged(slot) => self.slot_listener.do_send(SlotChanged {
                    domain: self.domain.uid.clone(),
                    slot,
                }),
                DomainEffect::Progress(progress) => {
                    for (_, channel) in self.claims.values() {
                        channel.do_send(progress.clone());
                    }
                }
                DomainEffect::TellNode(progress) => {
                    if let Some(listener) = &self.shared_listener {
                        listener.do_send(progress);
                    }
                }
                DomainEffect::Sharing(SharingEffect::Exhausted) => {
                    metrics::counter!(CHANNELS_EXHAUSTED).increment(1);
                    warn!(domain = %self.domain, channels = self.config.channels, "no free channel for the domain: every channel of the shared IMEX domain is taken");
                }
                DomainEffect::Sharing(SharingEffect::ChannelMoved { before, now }) => {
                    metrics::counter!(CHANNEL_CONFLICTS).increment(1);
                    tracing::error!(domain = %self.domain, before, now, "the domain's confirmed channel moved while this node's pods hold the old one");
                }
                DomainEffect::ImexFailing(reason) => self.tell_imex_failing(reason),
                DomainEffect::ImexKept(reason) => self.tell(DomainEvent::ImexKept {
                    node: self.me().to_owned(),
                    reason,
                }),
                DomainEffect::AdoptionEnded { anew: true } => {
                    info!(domain = %self.domain, "IMEX started anew after the restart; advertising again");
                }
                DomainEffect::AdoptionEnded { anew: false } => {
                    info!(domain = %self.domain, "the adopted IMEX is ready for this node's peers; advertising again");
                    self.schedule_recompute(ctx);
                }
                DomainEffect::CheckAdoptionAt(at) => {
                    ctx.run_later(at.saturating_duration_since(Instant::now()), |act, ctx| {
                        act.end_adoption_wait(ctx)
                    });
                }
                DomainEffect::ReadWritten => self.read_written(ctx),
                DomainEffect::StopWriter => {
                    if self.status_writer.take().is_some() {
                        info!(domain = %self.domain, "no longer the domain's reporter");
                    }
                }
                DomainEffect::StartWriter {
                    term,
                    written,
                    adopted,
                    members,
                } => {
                    for node in &adopted {
                        warn!(domain = %self.domain, %node, "the written status lists a member nobody here saw leave: listing it lost");
                    }
                    info!(domain = %self.domain, members, term, "this node is now the domain's reporter");
                    self.start_writer(term, written.as_ref());
                }
                DomainEffect::ReportHeld { unaccounted } => {
                    debug!(domain = %self.domain, ?unaccounted, "not reporting yet: the written status lists members not seen here yet");
                }
                DomainEffect::PublishStatus(document) => {
                    if let Some(writer) = &self.status_writer {
                        writer.do_send(PublishStatus(document));
                    }
                }
                DomainEffect::Events(events) => self.tell_all(events),
                DomainEffect::PassAt(at) => self.recompute_at(at, ctx),
                DomainEffect::Pass => self.schedule_recompute(ctx),
                DomainEffect::Health(health) => self.health_listener.do_send(HealthChanged {
                    domain: self.domain.uid.clone(),
                    health,
                }),
            }
        }
    }

    /// Arms a recompute at `at` (one at a time: the earliest wins).
    pub(super) fn recompute_at(&mut self, at: Instant, ctx: &mut Context<Self>) {
        let due = self.reporter_timer.as_ref().map(|(at, _)| *at);
        if due.is_some_and(|due| due <= at) {
            return;
        }
        if let Some((_, timer)) = self.reporter_timer.take() {
            ctx.cancel_future(timer);
        }
        let timer = ctx.run_later(at.saturating_duration_since(Instant::now()), |act, ctx| {
            act.reporter_timer = None;
            act.schedule_recompute(ctx);
        });
        self.reporter_timer = Some((at, timer));
    }
}
