//! The node's answer to the kubelet: [`NodePlugin`] over the node actor, the CDI
//! writer and the channel device nodes.
//!
//! Whichever channel device the scheduler picked from the node's pool, a `Single` claim
//! gets the domain's channel: pods on different nodes share memory only through the
//! same channel number. A domain with its own IMEX domain has channel 0 (one such domain
//! per node); a domain sharing the clique's IMEX domain has the channel the shared
//! domain confirmed for it, which no other domain has.

pub mod cdi;
pub mod devices;

use std::sync::Arc;

use actix::Addr;
use async_trait::async_trait;
use domaind_actors::model::{AllocatedDevice, ClaimRef};
use domaind_actors::{Complete, NodeActor, Prepare, PrepareError, Unprepare};
use tracing::{info, warn};

use crate::cdi::{CdiWriter, ClaimChannels, ClaimUid};
use crate::devices::ChannelDevices;
use domaind_kubelet_plugin::{ClaimFailure, NodePlugin, PreparedDevice};

use domaind_kube_api::names::{CHANNEL_REQUEST, DOMAIN_CHANNEL};

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
        let channels = ClaimChannels::for_mode(
            prepared.allocation_mode,
            prepared.channel.unwrap_or(DOMAIN_CHANNEL),
            0..self.channels.all_channels,
        );
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
                device: format!("channel-{DOMAIN_CHANNEL}"),
            }]
        } else {
            prepared.devices
        };
        info!(claim = %claim.uid, domain = %prepared.domain, slot = ?prepared.slot, channel = ?prepared.channel, "claim prepared");
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
