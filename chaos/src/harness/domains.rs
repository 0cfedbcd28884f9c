//! With `--domains N`: the sharing domains beside the run's first, each with
//! `isolation: Channel`, their claims, and what the newest observation shows of their
//! channels. The channels invariant itself is `crate::channels`, checked on every tick.

use domaind_actors::model::{ChannelId, Isolation};
use domaind_backends::local::ComputeDomainRef;

use super::{DOMAIN_NAME, Harness, NAMESPACE};
use crate::channels;

impl Harness {
    /// The domains beside the first that formation makes: a claim of each on every
    /// node, prepared at once with the first's.
    pub(super) fn begin_sharing_domains(&mut self) {
        let every: Vec<usize> = (0..self.world.nodes.len()).collect();
        for _ in 1..self.config.domains {
            self.begin_domain(&every);
        }
    }

    /// A new sharing domain with one claim on each of `nodes`, written and prepared in
    /// the background as the kubelet would; its uid.
    pub(super) fn begin_domain(&mut self, nodes: &[usize]) -> String {
        self.domains_made += 1;
        let number = self.domains_made;
        let uid = format!("{}-d{number}", self.domain.uid);
        self.sharing.insert(
            uid.clone(),
            ComputeDomainRef {
                namespace: NAMESPACE.into(),
                name: format!("{DOMAIN_NAME}-{number}"),
                uid: uid.clone(),
                num_nodes: 0,
                isolation: Isolation::Channel,
            },
        );
        for node in nodes {
            let claim = format!("claim-d{number}-{}", self.name(*node));
            self.world.claim_domains.insert(claim.clone(), uid.clone());
            self.begin_prepare(*node, &claim);
        }
        uid
    }

    /// The domains beside the first that hold claims (`crate::channels`'s live).
    pub(super) fn live_sharing_domains(&self) -> Vec<String> {
        channels::live_domains(&self.world)
            .into_iter()
            .filter(|uid| *uid != self.domain.uid)
            .map(str::to_owned)
            .collect()
    }

    /// The domain's name, for progress lines and notes.
    pub(super) fn domain_name(&self, uid: &str) -> String {
        self.sharing
            .get(uid)
            .map_or_else(|| DOMAIN_NAME.to_owned(), |d| d.name.clone())
    }

    /// The channel `uid`'s claims were handed, as the newest observation shows.
    pub(super) fn handed_channel(&self, uid: &str) -> Option<ChannelId> {
        let (_, observation) = self.last.as_ref()?;
        observation
            .nodes
            .iter()
            .filter_map(|n| n.view.as_ref())
            .flat_map(|v| &v.channels)
            .find(|h| h.domain == uid)
            .map(|h| h.channel)
    }

    /// Every domain's channel as the newest observation shows it: `name: channel`.
    pub(super) fn channels_line(&self) -> String {
        std::iter::once(self.domain.uid.clone())
            .chain(self.live_sharing_domains())
            .map(|uid| {
                let channel = self
                    .handed_channel(&uid)
                    .map_or_else(|| "-".to_owned(), |c| c.to_string());
                format!("{} channel {channel}", self.domain_name(&uid))
            })
            .collect::<Vec<_>>()
            .join(", ")
    }
}
