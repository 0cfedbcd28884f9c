//! This node's IMEX and its peers carried out: reports from the IMEX process and
//! ImexPeers' verdicts go to the core (`rules::domain_core`), and the events they make
//! go out.

use super::*;

impl Handler<ImexReport> for DomainActor {
    type Result = ();
    fn handle(&mut self, report: ImexReport, ctx: &mut Self::Context) {
        let effects = self.core.imex_reported(report, Instant::now());
        self.carry_out(effects, ctx);
    }
}

impl DomainActor {
    /// Asks the core whether a restarted daemon's wait for its adopted IMEX is over.
    pub(super) fn end_adoption_wait(&mut self, ctx: &mut Context<Self>) {
        let effects = self.core.end_adoption_wait(Instant::now());
        self.carry_out(effects.into_iter().collect(), ctx);
    }

    /// A Warning event on the domain: this node's IMEX daemon is failing, and why.
    pub(super) fn tell_imex_failing(&self, reason: String) {
        warn!(domain = %self.domain, %reason, "this node's IMEX daemon is failing; the domain is told");
        self.tell(DomainEvent::ImexFailing {
            node: self.me().to_owned(),
            reason,
        });
    }

    pub(super) fn tell(&self, event: DomainEvent) {
        self.tell_all(vec![event]);
    }
}

impl Handler<PeerVerdict> for DomainActor {
    type Result = ();
    fn handle(&mut self, msg: PeerVerdict, ctx: &mut Self::Context) {
        let PeerVerdict {
            node,
            verdict,
            tenure,
        } = msg;
        match self.core.verdict(&node, tenure, verdict) {
            VerdictOutcome::Retired => {
                debug!(domain = %self.domain, %node, ?verdict, "verdict of a retired IMEX peer ignored");
                return;
            }
            VerdictOutcome::Dropped(cause) => {
                info!(domain = %self.domain, %node, ?cause, "dropping peer from the IMEX peer set");
            }
            VerdictOutcome::Readmitted => {
                info!(domain = %self.domain, %node, "re-admitting peer to the IMEX peer set");
            }
        }
        self.schedule_recompute(ctx);
    }
}
