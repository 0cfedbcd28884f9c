//! The node's answer to the kubelet: [`NodePlugin`] over the node actor, the CDI
//! writer and the channel device nodes.
//!
//! Whichever channel device the scheduler picked from the node's pool, a `Single` claim
//! gets the domain's channel: pods on different nodes share memory only through the
//! same channel number. A domain with its own IMEX domain has channel 0 (one such domain
//! per node); a domain sharing the clique's IMEX domain has the channel the shared
//! domain confirmed for it, which no other domain has. An admin claim (`adminAccess`)
//! joins no domain and gets the channels it was allocated (`Single`) or every channel
//! (`All`), as [`claim_channels`] says.

pub mod cdi;
pub mod devices;

use std::ops::Range;
use std::sync::Arc;

use actix::Addr;
use async_trait::async_trait;
use domaind_actors::model::{AllocatedDevice, AllocationMode, ClaimRef};
use domaind_actors::{Complete, NodeActor, Prepare, PrepareError, Unprepare};
use tracing::{info, warn};

use crate::cdi::{CdiWriter, ClaimChannels, ClaimUid};
use crate::devices::ChannelDevices;
use domaind_kubelet_plugin::{ClaimFailure, NodePlugin, PreparedDevice};

use domaind_kube_api::names::{CHANNEL_REQUEST, DOMAIN_CHANNEL, channel_device, channel_of_device};

/// The channels a claim's containers get: the domain's channel (`Single`) or every one
/// of `all` (`All`). An admin claim joins no domain, so it has no domain's channel: in
/// `Single` mode it gets the channel devices it was allocated (`channel-<N>`: channel
/// N), one or several, whichever other claims hold them; a device that is no channel
/// is an error (the claim sources refuse such claims first).
pub fn claim_channels(
    mode: AllocationMode,
    admin: bool,
    domain_channel: u32,
    devices: &[AllocatedDevice],
    all: Range<u32>,
) -> Result<ClaimChannels, String> {
    if !admin || mode == AllocationMode::All {
        return Ok(ClaimChannels::for_mode(mode, domain_channel, all));
    }
    let mut channels = devices
        .iter()
        .map(|d| {
            channel_of_device(&d.device).ok_or_else(|| {
                format!(
                    "admin claim allocated device {}, which is not a channel device",
                    d.device
                )
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    channels.sort_unstable();
    channels.dedup();
    match channels[..] {
        [] => Err("admin claim allocated no channel device".into()),
        [one] => Ok(ClaimChannels::Single(one)),
        _ => Ok(ClaimChannels::All(channels)),
    }
}

/// How a claim's channels reach its containers.
#[derive(Debug, Clone)]
pub struct ChannelInjection {
    /// The major of `nvidia-caps-imex-channels`, for the CDI spec.
    pub major: u32,
    /// Makes the device nodes on the host; `None` where the driver or an administrator
    /// makes them (and on machines without the driver: the demo, tests).
    pub nodes: Option<ChannelDevices>,
    /// How many channels an `All` claim gets: channels 0 to this minus one.
    pub all_channels: u32,
}

/// [`NodePlugin`] for a running node.
#[derive(Debug, Clone)]
pub struct PrepareService {
    node: Addr<NodeActor>,
    node_name: String,
    cdi: CdiWriter,
    channels: Arc<ChannelInjection>,
}

impl PrepareService {
    pub fn new(
        node: Addr<NodeActor>,
        node_name: impl Into<String>,
        cdi: CdiWriter,
        channels: ChannelInjection,
    ) -> Self {
        Self {
            node,
            node_name: node_name.into(),
            cdi,
            channels: Arc::new(channels),
        }
    }

    /// Makes the channels' nodes and writes the claim's CDI spec; returns its ids.
    async fn inject(&self, uid: ClaimUid, channels: ClaimChannels) -> Result<Vec<String>, String> {
        let (cdi, injection) = (self.cdi.clone(), self.channels.clone());
        tokio::task::spawn_blocking(move || {
            if let Some(nodes) = &injection.nodes {
                let wanted = match &channels {
                    ClaimChannels::Single(channel) => vec![*channel],
                    ClaimChannels::All(all) => all.clone(),
                };
                for channel in wanted {
                    nodes.ensure(channel).map_err(|e| e.to_string())?;
                }
            }
            cdi.write_claim(&uid, injection.major, &channels)
                .map_err(|e| e.to_string())
        })
        .await
        .map_err(|e| format!("preparing the claim's devices failed: {e}"))?
    }
}

fn failure(error: PrepareError) -> ClaimFailure {
    if error.retryable() {
        ClaimFailure::retryable(error.to_string())
    } else {
        ClaimFailure::permanent(error.to_string())
    }
}

fn node_gone() -> ClaimFailure {
    ClaimFailure::retryable("the node is shutting down; call again once it is back")
}

#[async_trait]
impl NodePlugin for PrepareService {
    async fn prepare(&self, claim: ClaimRef) -> Result<Vec<PreparedDevice>, ClaimFailure> {
        let uid = ClaimUid::new(&claim.uid).map_err(|e| ClaimFailure::permanent(e.to_string()))?;
        let prepared = self
            .node
            .send(Prepare(claim.clone()))
            .await
            .map_err(|_| node_gone())?
            .map_err(failure)?;
        let channels = claim_channels(
            prepared.allocation_mode,
            prepared.admin_access,
            prepared.channel.unwrap_or(DOMAIN_CHANNEL),
            &prepared.devices,
            0..self.channels.all_channels,
        )
        .map_err(ClaimFailure::permanent)?;
        let ids = self.inject(uid, channels).await.map_err(|message| {
            warn!(claim = %claim.uid, %message, "claim's devices not prepared");
            ClaimFailure::retryable(message)
        })?;
        // Recorded as completed, with its devices, before the answer: an answered
        // prepare survives a restart.
        self.node
            .send(Complete {
                claim_uid: claim.uid.clone(),
                devices: ids.clone(),
                channel: prepared.channel,
            })
            .await
            .map_err(|_| node_gone())?
            .map_err(failure)?;
        let allocated = if prepared.devices.is_empty() {
            // Claims checkpointed before allocations were recorded.
            vec![AllocatedDevice {
                request: CHANNEL_REQUEST.into(),
                pool: self.node_name.clone(),
                device: channel_device(DOMAIN_CHANNEL),
            }]
        } else {
            prepared.devices
        };
        info!(claim = %claim.uid, domain = %prepared.domain, slot = ?prepared.slot, channel = ?prepared.channel, admin_access = prepared.admin_access, "claim prepared");
        Ok(allocated
            .into_iter()
            .map(|device| PreparedDevice {
                request_names: vec![device.request],
                pool_name: device.pool,
                device_name: device.device,
                cdi_device_ids: ids.clone(),
            })
            .collect())
    }

    async fn unprepare(&self, claim: ClaimRef) -> Result<(), ClaimFailure> {
        self.node
            .send(Unprepare(claim.uid.clone()))
            .await
            .map_err(|_| node_gone())?
            .map_err(failure)?;
        // A uid that could never have had a spec has none to remove.
        let Ok(uid) = ClaimUid::new(&claim.uid) else {
            return Ok(());
        };
        let cdi = self.cdi.clone();
        let removed = tokio::task::spawn_blocking(move || cdi.remove_claim(&uid))
            .await
            .map_err(|e| ClaimFailure::retryable(format!("removing the CDI spec failed: {e}")))?
            .map_err(|e| ClaimFailure::retryable(e.to_string()))?;
        info!(claim = %claim.uid, cdi_spec_removed = removed, "claim unprepared");
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn devices(names: &[&str]) -> Vec<AllocatedDevice> {
        names
            .iter()
            .map(|name| AllocatedDevice {
                request: CHANNEL_REQUEST.into(),
                pool: "node-a".into(),
                device: (*name).into(),
            })
            .collect()
    }

    #[test]
    fn a_member_gets_its_domains_channel_whichever_device_it_was_allocated() {
        let allocated = devices(&["channel-5"]);
        for admin in [false, true] {
            assert_eq!(
                claim_channels(AllocationMode::All, admin, 3, &allocated, 0..4),
                Ok(ClaimChannels::All(vec![0, 1, 2, 3])),
                "All is every channel, admin or not"
            );
        }
        assert_eq!(
            claim_channels(AllocationMode::Single, false, 3, &allocated, 0..4),
            Ok(ClaimChannels::Single(3))
        );
    }

    #[test]
    fn an_admin_claim_gets_the_channels_it_was_allocated() {
        assert_eq!(
            claim_channels(
                AllocationMode::Single,
                true,
                3,
                &devices(&["channel-5"]),
                0..8
            ),
            Ok(ClaimChannels::Single(5))
        );
        assert_eq!(
            claim_channels(
                AllocationMode::Single,
                true,
                0,
                &devices(&["channel-6", "channel-1", "channel-6"]),
                0..8
            ),
            Ok(ClaimChannels::All(vec![1, 6]))
        );
        let error = claim_channels(AllocationMode::Single, true, 0, &devices(&["gpu-0"]), 0..8)
            .unwrap_err();
        assert!(error.contains("gpu-0"), "{error}");
        assert!(claim_channels(AllocationMode::Single, true, 0, &[], 0..8).is_err());
    }
}
