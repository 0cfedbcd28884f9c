//! The reporter role carried out: reading the written status, the status writer,
//! documents and events (`rules::reporter_role` decides).

use super::*;

impl DomainActor {
    /// Reads the status as written, for the reporter role's start.
    pub(super) fn read_written(&mut self, ctx: &mut Context<Self>) {
        let (sink, domain) = (self.ports.status.clone(), self.domain.clone());
        ctx.spawn(async move { sink.read(&domain).await }.into_actor(self).map(
            |read, act, ctx| {
                let error = read.as_ref().err().map(ToString::to_string);
                let now = Instant::now();
                match act
                    .reporter
                    .read_finished(read, now, act.config.status_takeover_grace)
                {
                    ReadOutcome::Stale => {}
                    ReadOutcome::Read => act.schedule_recompute(ctx),
                    ReadOutcome::WithoutIt => {
                        warn!(domain = %act.domain, error = error.unwrap_or_default(), "the written status cannot be read; reporting without it");
                        act.schedule_recompute(ctx);
                    }
                    ReadOutcome::Retry { at } => {
                        warn!(domain = %act.domain, error = error.unwrap_or_default(), "the written status cannot be read; trying again");
                        act.recompute_at(at, ctx);
                    }
                }
            },
        ));
    }

    /// Writes status and events, if this node is the reporter (`ReporterRole`).
    pub(super) fn report(&mut self, readiness: &Readiness, ctx: &mut Context<Self>) {
        if self.core.role() == Role::SharedImex {
            // Not a ComputeDomain: its faults are reported on the sharing domains.
            return;
        }
        let now = Instant::now();
        let live = self.core.live_names().cloned().unwrap_or_default();
        let step = self.reporter.step(ReporterInput {
            now,
            now_ms: self.ports.clock.now_ms(),
            alone: self.core.live_names().is_none_or(|names| names.len() <= 1),
            membership_changed: self.core.membership_changed(),
            named: reporter(self.core.roster().members()) == Some(self.me()),
            witnessed: self.core.roster().witnessed(),
            live: &live,
            timing: ReporterTiming {
                settle: self.config.reporter_settle,
                settle_max: self.config.reporter_settle_max,
                takeover_grace: self.config.status_takeover_grace,
            },
        });
        match step {
            ReporterStep::Settling { at } => return self.recompute_at(at, ctx),
            ReporterStep::NotReporter => {
                if self.status_writer.take().is_some() {
                    info!(domain = %self.domain, "no longer the domain's reporter");
                }
                return;
            }
            ReporterStep::ReadWritten => return self.read_written(ctx),
            ReporterStep::Reading => return,
            ReporterStep::Hold { until, unaccounted } => {
                debug!(domain = %self.domain, ?unaccounted, "not reporting yet: the written status lists members not seen here yet");
                return self.recompute_at(until, ctx);
            }
            ReporterStep::Report { adopt, start } => {
                if let Some(tenure) = start {
                    for row in &adopt {
                        warn!(domain = %self.domain, node = %row.name, "the written status lists a member nobody here saw leave: listing it lost");
                    }
                    self.core.roster_mut().adopt(adopt, now);
                    info!(domain = %self.domain, members = self.core.roster().members().len(), term = tenure.term, "this node is now the domain's reporter");
                    self.status_writer = Some(
                        StatusWriterActor::new(
                            self.domain.clone(),
                            self.ports.status.clone(),
                            self.ports.events.clone(),
                            self.ports.gossip.clone(),
                            StatusWrites::new(
                                self.config.status_quiet,
                                self.config.status_max_delay,
                                tenure.written.as_ref(),
                                tenure.term,
                            )
                            .holding_degradation(self.config.status_degradation_hold),
                        )
                        .start(),
                    );
                    if !self.core.roster().adopted().is_empty() {
                        // Their retention is timed from now.
                        self.schedule_recompute(ctx);
                    }
                }
            }
        }
        let Some(writer) = &self.status_writer else {
            return;
        };
        writer.do_send(PublishStatus(self.core.status_document(readiness)));
        if self.core.role() == Role::Sharing {
            self.announce_shared_faults();
        }

        // A held member is not announced lost: no job of it felt anything.
        let events = self.reporter.announce(Announced {
            // A held member never left, so its return is no join either.
            members: self
                .core
                .roster()
                .members()
                .keys()
                .chain(self.core.roster().held())
                .cloned()
                .collect(),
            lost: self.core.roster().unheld_lost().cloned().collect(),
        });
        if !events.is_empty() {
            let sink = self.ports.events.clone();
            let domain = self.domain.clone();
            actix::spawn(async move {
                for event in events {
                    if let Err(error) = sink.emit(&domain, event).await {
                        warn!(%domain, %error, "event not recorded");
                    }
                }
            });
        }
    }
}

impl DomainActor {
    /// A sharing domain's reporter: a fault of the shared IMEX domain outside this
    /// domain's own members is an event on this domain too, naming the node and the
    /// shared domain.
    fn announce_shared_faults(&mut self) {
        let events: Vec<DomainEvent> = self
            .core
            .shared_faults()
            .into_iter()
            .map(|(node, fault)| DomainEvent::SharedImexFault {
                node,
                fault: fault.to_string(),
                clique: self.config.clique.to_string(),
            })
            .collect();
        if events.is_empty() {
            return;
        }
        let (sink, domain) = (self.ports.events.clone(), self.domain.clone());
        actix::spawn(async move {
            for event in events {
                if let Err(error) = sink.emit(&domain, event).await {
                    warn!(%domain, %error, "event not recorded");
                }
            }
        });
    }
}
