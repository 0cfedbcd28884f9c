//! The reporter role carried out: reading the written status, the status writer and
//! the events (`rules::domain_core` and `rules::reporter_role` decide).

use super::*;

impl DomainActor {
    /// Reads the status as written, for the reporter role's start.
    pub(super) fn read_written(&mut self, ctx: &mut Context<Self>) {
        let (sink, domain) = (self.ports.status.clone(), self.domain.clone());
        ctx.spawn(async move { sink.read(&domain).await }.into_actor(self).map(
            |read, act, ctx| {
                let error = read.as_ref().err().map(ToString::to_string);
                match act.core.read_finished(read, Instant::now()) {
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

    /// A status writer for this node's tenure `term`, from the status as `written`.
    pub(super) fn start_writer(&mut self, term: u64, written: Option<&DomainStatus>) {
        self.status_writer = Some(
            StatusWriterActor::new(
                self.domain.clone(),
                self.ports.status.clone(),
                self.ports.events.clone(),
                self.ports.gossip.clone(),
                StatusWrites::new(
                    self.config.status_quiet,
                    self.config.status_max_delay,
                    written,
                    term,
                )
                .holding_degradation(self.config.status_degradation_hold),
            )
            .start(),
        );
    }

    /// Emits `events` on the domain, in order.
    pub(super) fn tell_all(&self, events: Vec<DomainEvent>) {
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
