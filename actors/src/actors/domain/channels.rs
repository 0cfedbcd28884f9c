//! Channel isolation carried out: the shared IMEX domain's and a sharing domain's
//! passes (`rules::channel_roles` decides).

use super::*;

impl DomainActor {
    /// The shared IMEX domain: assigns every sharing domain of the clique its channel,
    /// advertises the assignment, and tells the node what is confirmed.
    pub(super) fn assign_channels(
        &mut self,
        live: &domaind_membership::Membership,
        ad: &mut Advertisement,
        ctx: &mut Context<Self>,
    ) {
        let away = self
            .roster
            .lost()
            .iter()
            .map(|(node, lost)| (node, &lost.member.ad));
        let candidates = sharing_domains(live, &self.config.clique, away);
        let me = self.me().to_owned();
        let others: Vec<BTreeMap<crate::model::DomainUid, ChannelId>> = self
            .roster
            .members()
            .values()
            .filter(|member| member.node != me)
            .map(|member| {
                member
                    .ad
                    .sharing
                    .as_ref()
                    .map(|s| s.channels.clone())
                    .unwrap_or_default()
            })
            .collect();
        let assigned = self.shared_imex.assign(AssignInput {
            candidates: &candidates,
            capacity: self.config.channels,
            others: &others,
            lost: self.roster.lost().keys().cloned().collect(),
            failing: self
                .roster
                .members()
                .values()
                .filter(|member| member.node != me && member.ad.imex_failing)
                .map(|member| member.node.clone())
                .collect(),
            // Computed by `recompute` for this node's IMEX just before.
            local_ready: ad.imex_ready,
            imex_failing: ad.imex_failing,
            failure: self
                .imex_report
                .as_ref()
                .and_then(|r| r.failure.as_ref())
                .map(|f| (f.episode, f.reason.clone())),
            settle: self.config.channel_settle,
            now: Instant::now(),
        });
        if let Some(at) = assigned.settles_at {
            self.recompute_at(at, ctx);
        }
        ad.sharing = Some(assigned.sharing);
        if let (Some(progress), Some(listener)) = (assigned.tell, &self.shared_listener) {
            listener.do_send(progress);
        }
    }

    /// A sharing domain: follows the shared IMEX domain (`SharingRole::follow`), and
    /// counts and says what it asks.
    pub(super) fn follow_shared_imex(&mut self, ad: &mut Advertisement) -> ChannelState {
        let followed = self.sharing.follow(FollowInput {
            domain: &self.domain.uid,
            has_fabric: self.has_fabric(),
            holds_claims: !self.claims.is_empty(),
            advertised: ad.sharing.as_ref().and_then(|s| s.channel),
        });
        ad.imex_failing = followed.imex_failing;
        ad.imex_ready = followed.imex_ready;
        ad.sharing = Some(followed.sharing);
        for effect in followed.effects {
            match effect {
                SharingEffect::Exhausted => {
                    metrics::counter!(CHANNELS_EXHAUSTED).increment(1);
                    warn!(domain = %self.domain, channels = self.config.channels, "no free channel for the domain: every channel of the shared IMEX domain is taken");
                }
                SharingEffect::ChannelMoved { before, now } => {
                    metrics::counter!(CHANNEL_CONFLICTS).increment(1);
                    tracing::error!(domain = %self.domain, before, now, "the domain's confirmed channel moved while this node's pods hold the old one");
                }
            }
        }
        followed.state
    }

    /// A sharing domain's reporter: a fault of the shared IMEX domain outside this
    /// domain's own members is an event on this domain too, naming the node and the
    /// shared domain.
    pub(super) fn announce_shared_faults(&mut self) {
        let lost = self.roster.lost();
        let events: Vec<DomainEvent> = self
            .sharing
            .new_faults(|node| lost.contains_key(node))
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
