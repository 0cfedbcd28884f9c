//! The domain's pass: the gossip view turned into members, slots, the IMEX peer set,
//! this node's advertisement, readiness and the claims' progress.

use super::*;

impl DomainActor {
    pub(super) fn recompute(&mut self, ctx: &mut Context<Self>) {
        let Some(my_ad) = self.my_ad.clone() else {
            return;
        };
        if self.leaving {
            return;
        }
        let now = Instant::now();
        let live = match &self.live {
            Some(live) => live.clone(),
            None => Arc::new(self.ports.gossip.live()),
        };
        let view = domain_members(&self.domain.uid, &live, &self.config.clique);
        for (node, error) in &view.malformed {
            metrics::counter!(BAD_ADVERTISEMENTS).increment(1);
            debug!(domain = %self.domain, %node, %error, "unreadable advertisement ignored");
        }
        let own = DomainMember {
            node: self.me().to_owned(),
            generation: live.get(self.me()).map_or(0, |m| m.generation),
            ad: my_ad.clone(),
        };
        let graces = Graces {
            retention: self.config.lost_retention,
            rejoin: self.config.rejoin_grace,
        };
        let observation = self.roster.observe(
            own,
            view.members,
            |node: &str| live.get(node).map(|member| member.generation),
            now,
            graces,
        );
        for change in observation.changes {
            match change {
                Change::Left(node) => {
                    info!(domain = %self.domain, %node, "member left the domain");
                    self.peers.remove(&node);
                    self.links.remove(&node);
                }
                Change::Lost { node, .. } => {
                    info!(domain = %self.domain, %node, "member lost: its daemon is silent in gossip");
                    self.lost_daemon_alive.insert(node.clone(), true);
                }
                Change::Back(node) => {
                    info!(domain = %self.domain, %node, "lost member is back");
                }
                Change::Forgotten(node) => {
                    info!(domain = %self.domain, %node, "lost member forgotten after {:?}", graces.retention);
                    self.peers.remove(&node);
                }
                Change::AdoptionEnded(node) => {
                    info!(domain = %self.domain, %node, "a member the written status listed is back, or forgotten");
                }
            }
        }
        self.tell_lost_daemons(&live, ctx);
        let remote: Vec<(NodeId, Advertised)> = self
            .roster
            .members()
            .values()
            .filter(|member| member.node != self.me())
            .map(|member| {
                (
                    member.node.clone(),
                    Advertised {
                        generation: member.generation,
                        imex_ready: member.ad.imex_ready,
                        imex_failing: member.ad.imex_failing,
                        imex_outlives_daemon: member.ad.imex_outlives_daemon,
                    },
                )
            })
            .collect();
        for (node, advertised) in remote {
            let peer = self.peer(&node, ctx);
            peer.do_send(PeerSignal::Gossip { alive: true });
            peer.do_send(PeerSignal::Advertised(advertised));
        }
        if let Some(timer) = self.retention_timer.take() {
            ctx.cancel_future(timer);
        }
        if let Some(first) = self.roster.next_expiry(graces) {
            self.retention_timer = Some(ctx.run_later(
                first.saturating_duration_since(now),
                |act, ctx| {
                    act.retention_timer = None;
                    act.schedule_recompute(ctx);
                },
            ));
        }

        let imex_members = self.roster.imex_members();
        let assignment = assign_slots(&slot_candidates(&imex_members), self.config.max_slots);
        let my_slot = assignment.slot_of(self.me());
        let peers = desired_peers(
            &imex_members,
            &assignment,
            |node: &str| self.roster.admitted(node),
            my_slot,
            self.has_fabric(),
        );
        let drives_imex = self.role != Role::Sharing;
        match reconfigure(&self.peer_set, &peers, self.peer_version) {
            _ if !drives_imex => {}
            Reconfigure::Unchanged => {}
            Reconfigure::Release => {
                self.peer_set = peers;
                self.imex.do_send(ReleaseImex);
            }
            Reconfigure::Apply { version } => {
                self.peer_set = peers.clone();
                self.peer_version = version;
                self.peer_set_changed = Instant::now();
                self.imex.do_send(ApplyPeers {
                    owner: ctx.address().recipient::<ImexReport>().downgrade(),
                    version,
                    peers,
                    claims_in_use: self.resumed,
                });
            }
        }

        let report = self.imex_report.as_ref().map(|r| DaemonReport {
            version: r.version,
            running: r.running,
            ready: r.ready,
        });
        let mut new_ad = my_ad.clone();
        new_ad.slot = my_slot;
        new_ad.imex_ready =
            imex_ready(self.has_fabric(), report, self.peer_version, &self.peer_set);
        // Failing while the daemon is down and being restarted: once one runs again
        // it is forming, not failing, even inside its episode. That change is what
        // lets peers that dropped this node past their link grace take it back
        // (`rules::peer_health`): not ready until they list it, it could not say so
        // through its readiness.
        new_ad.imex_failing = !new_ad.imex_ready
            && self
                .imex_report
                .as_ref()
                .is_some_and(|r| r.failure.is_some() && !r.running);
        let channel = match self.role {
            Role::Exclusive => ChannelState::Unassigned,
            Role::SharedImex => {
                self.assign_channels(&live, &mut new_ad, ctx);
                ChannelState::Unassigned
            }
            Role::Sharing => self.follow_shared_imex(&mut new_ad),
        };
        if new_ad.slot != my_ad.slot {
            self.slot_listener.do_send(SlotChanged {
                domain: self.domain.uid.clone(),
                slot: my_slot,
            });
        }
        if new_ad != my_ad {
            self.my_ad = Some(new_ad.clone());
            let me = self.me().to_owned();
            self.roster.update_own(&me, new_ad);
        }
        self.publish(ctx);

        let readiness = self.roster.readiness(&assignment, self.domain.num_nodes);
        // A sharing domain's pods wait for its channel too: handed out only once every
        // node of the shared IMEX domain agrees on it.
        let channel_waits = match self.role {
            Role::Sharing => channel.waiting(self.config.channels),
            _ => None,
        };
        let local_ready = channel_waits.is_none()
            && self
                .roster
                .members()
                .get(self.me())
                .is_some_and(|me| node_ready(me, &assignment, true));
        let summary = match &channel_waits {
            Some(why) => format!("domain {}: {readiness}; {why}", self.domain),
            None => format!("domain {}: {readiness}", self.domain),
        };
        let progress = Progress {
            local_ready,
            domain_ready: readiness.is_ready() && channel_waits.is_none(),
            slot: my_slot,
            channel: channel.confirmed(),
            summary,
        };
        if self.progress.as_ref() != Some(&progress) {
            for (_, channel) in self.claims.values() {
                channel.do_send(progress.clone());
            }
            self.progress = Some(progress);
        }

        if observation.members_changed {
            self.membership_changed = Some(now);
        }
        self.assignment = assignment;
        self.report(&readiness, ctx);
        self.readiness = Some(readiness);
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
