//! This node's IMEX and its peers: reports from the IMEX process, ImexPeers' verdicts,
//! a restarted daemon's adoption wait, and the events they make.

use super::*;

impl Handler<ImexReport> for DomainActor {
    type Result = ();
    fn handle(&mut self, report: ImexReport, ctx: &mut Self::Context) {
        if let Some(asked_at) = report.asked_at {
            self.tell_links(&report.links, asked_at, ctx);
        }
        let adopted = report.adopted;
        if report.kept.is_some() && report.kept != self.imex_kept_told {
            self.imex_kept_told = report.kept.clone();
            if let Some(reason) = report.kept.clone() {
                self.tell(DomainEvent::ImexKept {
                    node: self.me().to_owned(),
                    reason,
                });
            }
        }
        if let Some(failure) = &report.failure
            && failure.episode > self.imex_episode_told
            && self.role == Role::Exclusive
        {
            self.imex_episode_told = failure.episode;
            self.tell_imex_failing(failure.reason.clone());
        }
        if self.imex_report.as_ref() != Some(&report) {
            self.imex_report = Some(report);
            self.schedule_recompute(ctx);
        }
        if self.awaiting_adoption {
            if adopted {
                self.end_adoption_wait(ctx);
            } else {
                // A new daemon: no job uses it yet, nothing to keep steady.
                self.awaiting_adoption = false;
                info!(domain = %self.domain, "IMEX started anew after the restart; advertising again");
            }
        }
    }
}

impl DomainActor {
    /// Ends the wait of a restarted daemon whose IMEX was adopted once that IMEX is
    /// ready for the peer set of the moment and serves no peer beyond it (the view has
    /// caught up with what IMEX serves), and the set has not changed for the
    /// reporter's settle: the view fills in over the first gossip rounds, and each new
    /// set is a new version the daemon is not ready for until its next answer. An
    /// advertisement published before would say not ready a moment later.
    pub(super) fn end_adoption_wait(&mut self, ctx: &mut Context<Self>) {
        if !self.awaiting_adoption {
            return;
        }
        let ready = self
            .imex_report
            .as_ref()
            .is_some_and(|r| r.ready && !r.catching_up && r.version == Some(self.peer_version));
        if !ready {
            return;
        }
        let due = self.peer_set_changed + self.config.reporter_settle;
        let now = Instant::now();
        if now >= due {
            self.awaiting_adoption = false;
            info!(domain = %self.domain, "the adopted IMEX is ready for this node's peers; advertising again");
            self.schedule_recompute(ctx);
        } else {
            ctx.run_later(due - now, |act, ctx| act.end_adoption_wait(ctx));
        }
    }

    /// Tells each lost member's ImexPeer whether its daemon is silent: no generation
    /// of it live in gossip. A restarted daemon that has not advertised yet is a lost
    /// member, but not a silent one: it is reloading the IMEX it adopted, and a link
    /// down for that moment is no sign that the node is gone. A daemon going silent
    /// makes our IMEX answer now: whether its IMEX still runs decides if it stays.
    pub(super) fn tell_lost_daemons(&mut self, live: &Membership, ctx: &mut Context<Self>) {
        self.lost_daemon_alive
            .retain(|node, _| self.roster.lost().contains_key(node));
        let lost: Vec<NodeId> = self.roster.lost().keys().cloned().collect();
        for node in lost {
            let alive = live.contains_key(&node);
            if self.lost_daemon_alive.insert(node.clone(), alive) == Some(alive) {
                continue;
            }
            self.peer(&node, ctx).do_send(PeerSignal::Gossip { alive });
            if !alive && self.role != Role::Sharing {
                self.imex.do_send(QueryNow);
            }
        }
    }

    /// Tells each peer's ImexPeer what our IMEX found of its link. A live peer hears
    /// of changes only. A silent one (lost) hears every answer, a link missing from it
    /// as down: whether it stays depends on our IMEX reaching its IMEX now.
    pub(super) fn tell_links(
        &mut self,
        links: &BTreeMap<Slot, bool>,
        asked_at: Instant,
        ctx: &mut Context<Self>,
    ) {
        let peers: Vec<(Slot, NodeId)> = self
            .peer_set
            .peers
            .iter()
            .filter(|(_, peer)| peer.node != self.me())
            .map(|(slot, peer)| (*slot, peer.node.clone()))
            .collect();
        for (slot, node) in peers {
            let silent = self.roster.lost().contains_key(&node);
            let (up, listed) = match links.get(&slot) {
                Some(up) => (*up, true),
                None if silent => (false, false),
                None => continue,
            };
            if silent || self.links.get(&node) != Some(&up) {
                self.links.insert(node.clone(), up);
                self.peer(&node, ctx)
                    .do_send(PeerSignal::ImexLink(LinkAnswer {
                        up,
                        listed,
                        asked_at,
                    }));
            }
        }
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
        let sink = self.ports.events.clone();
        let domain = self.domain.clone();
        actix::spawn(async move {
            if let Err(error) = sink.emit(&domain, event).await {
                warn!(%domain, %error, "event not recorded");
            }
        });
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
        match self.roster.verdict(&node, tenure, verdict) {
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
