//! Start-up reconciliation: when the checkpoint is missing, or damaged records cost it
//! claims, the prepared claims of this node are rebuilt from the API server, so that a
//! pod already running with a channel keeps its node in its domain. What the checkpoint
//! kept stands; only what it lost is taken from the rebuild ([`merge_rebuilt`]).
//!
//! The claims to rebuild are those allocated on this node by our driver and reserved
//! for a consumer (a pod): what the kubelet prepared, or is about to. [`rebuild`] is
//! the rule, a pure function; [`ReconcilingCheckpointStore`] is the adapter: a
//! `CheckpointStore` whose `load` answers with the rebuilt checkpoint when the file
//! store found none (or a corrupt one), so the node actor restores it as it restores
//! any checkpoint.
//!
//! One node serves one ComputeDomain at a time, so a rebuilt checkpoint holds claims
//! of one domain. Claims of several can be allocated here: a claim refused because
//! the node was busy is still allocated and reserved. The domain whose claims have CDI
//! specs on this node wins (a spec is written only once a claim was admitted), then the
//! one allocated first; the others' claims are left out, as they were refused before.
//!
//! Admin claims (`adminAccess`) join no domain: each is rebuilt whatever its domain
//! and namespace, and none counts in that choice.
//!
//! A previous boot's checkpoint is not rebuilt: containers do not survive a reboot,
//! and the kubelet prepares every claim again when it restarts the pods.

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use ::kube::Client;
use ::kube::api::{Api, ListParams};
use async_trait::async_trait;
use domaind_actors::model::{ClaimInfo, ClaimRef, Isolation, ReadinessPolicy};
use domaind_actors::ports::{
    Checkpoint, CheckpointChange, CheckpointStore, ClaimRecord, PortError, PrepareState, Recorded,
};
use k8s_openapi::api::resource::v1::ResourceClaim;
use tracing::{error, info, warn};

use super::claim::{allocated_claim, is_reserved};
use super::domains::{DomainCache, domain_ref};
use domaind_backoff::Backoff;
use domaind_checkpoint::{FileCheckpointStore, LoadOutcome};
use domaind_kube_api::api::{ApiError, bounded};
use domaind_kube_api::crd::ComputeDomain;
use domaind_kube_api::names::DOMAIN_CHANNEL;
use domaind_prepare::cdi::{CdiWriter, ClaimUid, Kind};
use domaind_prepare::claim_channels;

/// Claims seen by reconciliation, by `outcome`: `restored`, `skipped`; and `failed`
/// once for a reconciliation that could not reach the API server in time.
pub const RECONCILED_CLAIMS: &str = "domaind_reconciled_claims_total";

/// What [`rebuild`] works from.
#[derive(Debug, Clone, Copy)]
pub struct RebuildInput<'a> {
    /// Every ResourceClaim of the cluster (or at least every one on this node).
    pub claims: &'a [ResourceClaim],
    /// Every ComputeDomain known.
    pub domains: &'a [ComputeDomain],
    pub node: &'a str,
    pub driver: &'a str,
    /// For claims whose config does not say.
    pub default_readiness: ReadinessPolicy,
    /// Uids of the claims that have a CDI spec on this node.
    pub with_cdi_spec: &'a BTreeSet<String>,
    /// The CDI kind, to name the devices of claims that have a spec.
    pub cdi: &'a Kind,
}

/// A rebuilt checkpoint, and why the claims left out were.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Rebuilt {
    pub checkpoint: Checkpoint,
    /// `namespace/name (uid): reason`, for claims of this node that were left out.
    pub skipped: Vec<String>,
}

struct Candidate {
    record: ClaimRecord,
    prepared: bool,
    allocated_at: Option<String>,
}

/// The prepared claims of this node, from the API's claims and domains.
pub fn rebuild(input: RebuildInput<'_>) -> Rebuilt {
    let mut skipped = Vec::new();
    let mut by_domain: BTreeMap<String, Vec<Candidate>> = BTreeMap::new();
    let mut admin = Vec::new();
    for claim in input.claims {
        let uid = claim.metadata.uid.clone().unwrap_or_default();
        let namespace = claim.metadata.namespace.clone().unwrap_or_default();
        let name = claim.metadata.name.clone().unwrap_or_default();
        let label = format!("{namespace}/{name} ({uid})");
        let allocated = match allocated_claim(claim, input.node, input.driver) {
            Ok(allocated) => allocated,
            Err(problem) if problem.is_elsewhere() => continue,
            Err(problem) => {
                skipped.push(format!("{label}: {problem}"));
                continue;
            }
        };
        if !is_reserved(claim) {
            skipped.push(format!("{label}: reserved for no pod"));
            continue;
        }
        let cd = input
            .domains
            .iter()
            .find(|cd| cd.metadata.uid.as_deref() == Some(allocated.domain_uid.as_str()));
        let isolation = cd.map(|cd| crate::contract::isolation(cd.spec.isolation));
        let domain = cd.and_then(domain_ref);
        let Some(domain) = domain else {
            skipped.push(format!(
                "{label}: its ComputeDomain (uid {}) no longer exists",
                allocated.domain_uid
            ));
            continue;
        };
        if !allocated.admin_access && domain.namespace != namespace {
            skipped.push(format!(
                "{label}: its ComputeDomain {}/{} is in another namespace",
                domain.namespace, domain.name
            ));
            continue;
        }
        let prepared = input.with_cdi_spec.contains(&uid);
        // Only the device's name matters here, not every channel of `All`.
        let channels = claim_channels(
            allocated.allocation_mode,
            allocated.admin_access,
            DOMAIN_CHANNEL,
            &allocated.devices,
            0..0,
        );
        let devices = match (ClaimUid::new(&uid), channels) {
            (Ok(cdi_uid), Ok(channels)) if prepared => {
                vec![
                    input
                        .cdi
                        .device_id(&CdiWriter::device_name(&cdi_uid, &channels)),
                ]
            }
            _ => Vec::new(),
        };
        let record = ClaimRecord {
            claim: ClaimRef {
                uid,
                namespace,
                name,
            },
            info: ClaimInfo {
                domain,
                allocation_mode: allocated.allocation_mode,
                readiness: allocated.readiness,
                devices: allocated.devices,
                isolation: isolation.unwrap_or_default(),
                admin_access: allocated.admin_access,
            },
            policy: allocated.readiness.unwrap_or(input.default_readiness),
            state: if prepared {
                PrepareState::PrepareCompleted
            } else {
                PrepareState::PrepareStarted
            },
            devices,
            channel: None,
        };
        let allocated_at = claim
            .status
            .as_ref()
            .and_then(|s| s.allocation.as_ref())
            .and_then(|a| a.allocation_timestamp.as_ref())
            .map(|t| t.0.to_string());
        if record.info.admin_access {
            admin.push(record);
            continue;
        }
        by_domain
            .entry(record.info.domain.uid.0.clone())
            .or_default()
            .push(Candidate {
                record,
                prepared,
                allocated_at,
            });
    }

    // Most claims with a CDI spec, then the earliest allocation, then the uid: the
    // same answer every time.
    let chosen = by_domain
        .iter()
        .min_by_key(|(uid, candidates)| {
            let prepared = candidates.iter().filter(|c| c.prepared).count();
            let first = candidates
                .iter()
                .filter_map(|c| c.allocated_at.clone())
                .min()
                .unwrap_or_else(|| "~".into());
            (std::cmp::Reverse(prepared), first, (*uid).clone())
        })
        .map(|(uid, _)| uid.clone());

    // Domains sharing the clique's IMEX domain may be several on a node: with the
    // chosen one, every other of that mode is kept too. (Their channels are not in the
    // API: each is taken from gossip again, and the next prepare records it.)
    let sharing = |candidates: &[Candidate]| {
        candidates
            .iter()
            .all(|c| c.record.info.isolation == Isolation::Channel)
    };
    let chosen_shares = chosen
        .as_ref()
        .and_then(|uid| by_domain.get(uid))
        .is_some_and(|c| sharing(c));
    let mut checkpoint = Checkpoint::default();
    for (uid, candidates) in by_domain {
        let kept = Some(&uid) == chosen.as_ref() || chosen_shares && sharing(&candidates);
        for candidate in candidates {
            let record = candidate.record;
            if kept {
                checkpoint.claims.insert(record.claim.uid.clone(), record);
            } else {
                skipped.push(format!(
                    "{}/{} ({}): this node serves ComputeDomain uid {}, not {uid}",
                    record.claim.namespace,
                    record.claim.name,
                    record.claim.uid,
                    chosen.as_deref().unwrap_or_default()
                ));
            }
        }
    }
    for record in admin {
        checkpoint.claims.insert(record.claim.uid.clone(), record);
    }
    Rebuilt {
        checkpoint,
        skipped,
    }
}

/// The file checkpoint store, and when it finds no checkpoint (or one whose damage cost
/// claims), the claims rebuilt from the API server.
#[derive(Clone)]
pub struct ReconcilingCheckpointStore {
    file: FileCheckpointStore,
    client: Client,
    domains: DomainCache,
    node: String,
    driver: String,
    default_readiness: ReadinessPolicy,
    cdi: CdiWriter,
    api_timeout: Duration,
    limit: Duration,
}

// The client has no Debug of its own.
impl std::fmt::Debug for ReconcilingCheckpointStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReconcilingCheckpointStore")
            .field("node", &self.node)
            .field("driver", &self.driver)
            .field("limit", &self.limit)
            .finish_non_exhaustive()
    }
}

/// How the reconciliation reaches the cluster and how long it may take.
#[derive(Debug, Clone)]
pub struct ReconcileSettings {
    pub node: String,
    pub driver: String,
    pub default_readiness: ReadinessPolicy,
    /// Each API call.
    pub api_timeout: Duration,
    /// The whole reconciliation: after it, the node starts with no prepared claims.
    pub limit: Duration,
}

impl ReconcilingCheckpointStore {
    pub fn new(
        file: FileCheckpointStore,
        client: Client,
        domains: DomainCache,
        cdi: CdiWriter,
        settings: ReconcileSettings,
    ) -> Self {
        Self {
            file,
            client,
            domains,
            node: settings.node,
            driver: settings.driver,
            default_readiness: settings.default_readiness,
            cdi,
            api_timeout: settings.api_timeout,
            limit: settings.limit,
        }
    }

    async fn list_claims(&self) -> Result<Vec<ResourceClaim>, ApiError> {
        let api = Api::<ResourceClaim>::all(self.client.clone());
        let mut params = ListParams::default().limit(500);
        let mut claims = Vec::new();
        loop {
            let page = bounded("list ResourceClaims", self.api_timeout, api.list(&params)).await?;
            claims.extend(page.items);
            match page.metadata.continue_ {
                Some(token) if !token.is_empty() => params = params.continue_token(&token),
                _ => return Ok(claims),
            }
        }
    }

    /// Rebuilds from the API server, retrying until it answers.
    async fn rebuild_from_api(&self) -> Rebuilt {
        let mut retry =
            Backoff::new(Duration::from_millis(500), Duration::from_secs(10)).jittered();
        while !self.domains.wait_synced(self.api_timeout).await {
            info!("waiting for the ComputeDomain cache to rebuild prepared claims");
        }
        let claims = loop {
            match self.list_claims().await {
                Ok(claims) => break claims,
                Err(error) => {
                    let delay = retry.fail();
                    warn!(%error, retry_in = ?delay, "cannot list ResourceClaims to rebuild prepared claims");
                    tokio::time::sleep(delay).await;
                }
            }
        };
        let cdi = self.cdi.clone();
        let with_cdi_spec: BTreeSet<String> =
            tokio::task::spawn_blocking(move || cdi.list_claims())
                .await
                .ok()
                .and_then(|listed| {
                    listed
                        .map_err(
                            |error| warn!(%error, "cannot list CDI specs; rebuilding without them"),
                        )
                        .ok()
                })
                .unwrap_or_default()
                .into_iter()
                .map(|uid| uid.to_string())
                .collect();
        let domains: Vec<ComputeDomain> = self
            .domains
            .snapshot()
            .into_iter()
            .map(|cd| (*cd).clone())
            .collect();
        rebuild(RebuildInput {
            claims: &claims,
            domains: &domains,
            node: &self.node,
            driver: &self.driver,
            default_readiness: self.default_readiness,
            with_cdi_spec: &with_cdi_spec,
            cdi: self.cdi.kind(),
        })
    }
}

/// The checkpoint to start with when a load may have lost claims: what it `kept`, plus
/// the `rebuilt` claims it lost. Which those are: every rebuilt claim when there was
/// no checkpoint, or when damaged records named no claim; otherwise only the claims
/// the damage cost (`lost`): a rebuilt claim the load did not lose is one this node
/// released, and stays released. Added claims must be of the domain the kept ones are
/// of (one domain per node), but for admin claims, which join none. Returns the
/// checkpoint and the claims added.
pub fn merge_rebuilt(
    kept: Checkpoint,
    rebuilt: Checkpoint,
    outcome: &LoadOutcome,
) -> (Checkpoint, Vec<ClaimRecord>) {
    let wanted = |uid: &String| match outcome {
        LoadOutcome::Missing => true,
        LoadOutcome::Damaged {
            lost_claims,
            unattributed,
            ..
        } => *unattributed > 0 || lost_claims.contains(uid),
        _ => false,
    };
    let serving = kept
        .claims
        .values()
        .find(|record| record.info.joins_domain())
        .map(|record| record.info.domain.uid.clone());
    let mut merged = kept;
    let mut added = Vec::new();
    for (uid, record) in rebuilt.claims {
        let same_domain = !record.info.joins_domain()
            || serving
                .as_ref()
                .is_none_or(|domain| *domain == record.info.domain.uid);
        if !merged.claims.contains_key(&uid) && wanted(&uid) && same_domain {
            merged.claims.insert(uid, record.clone());
            added.push(record);
        }
    }
    (merged, added)
}

#[async_trait]
impl CheckpointStore for ReconcilingCheckpointStore {
    async fn load(&self) -> Result<Checkpoint, PortError> {
        let loaded = self
            .file
            .load_with_outcome()
            .await
            .map_err(PortError::from)?;
        if !loaded.outcome.may_have_lost_claims() {
            return Ok(loaded.checkpoint);
        }
        info!(outcome = ?loaded.outcome, "the checkpoint may have lost claims; rebuilding them from the API server");
        let Ok(rebuilt) = tokio::time::timeout(self.limit, self.rebuild_from_api()).await else {
            metrics::counter!(RECONCILED_CLAIMS, "outcome" => "failed").increment(1);
            error!(
                limit = ?self.limit,
                "the API server did not answer in time: starting with the claims the checkpoint \
                 kept; pods already running on this node with other claims are not members of \
                 their ComputeDomains until prepared again"
            );
            return Ok(loaded.checkpoint);
        };
        for reason in &rebuilt.skipped {
            metrics::counter!(RECONCILED_CLAIMS, "outcome" => "skipped").increment(1);
            warn!(claim = %reason, "claim not restored");
        }
        let (merged, added) = merge_rebuilt(loaded.checkpoint, rebuilt.checkpoint, &loaded.outcome);
        metrics::counter!(RECONCILED_CLAIMS, "outcome" => "restored").increment(added.len() as u64);
        info!(
            restored = added.len(),
            skipped = rebuilt.skipped.len(),
            "prepared claims rebuilt from the API server"
        );
        if !added.is_empty() {
            let changes = added.into_iter().map(CheckpointChange::Claim).collect();
            if let Err(error) = self.file.record_changes(changes).await {
                // A restart before the next record rebuilds them again.
                warn!(%error, "the rebuilt claims were not recorded");
            }
        }
        Ok(merged)
    }

    fn record(&self, changes: Vec<CheckpointChange>) -> Recorded {
        self.file.record_changes(changes)
    }
}
