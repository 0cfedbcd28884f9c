//! The node daemon's Kubernetes backend (`domaind run --backend kube`): the actors'
//! ports over the API server, and the node's ResourceSlices.
//!
//! | module | job |
//! |---|---|
//! | [`claim`] | a ResourceClaim's allocation on this node (pure) |
//! | [`claims`](KubeClaimSource) | `ClaimSource`: the claim from the API, its domain from the cache |
//! | [`claim_status`] | what each prepared device's entry in its claim's `status.devices` says, and when a claim needs a write (pure) |
//! | [`claim_status_writer`] | writes them as the node's health board changes, with backoff |
//! | [`domains`](DomainCache) | every ComputeDomain, kept by a watch |
//! | [`status`](KubeStatusSink) | `StatusSink`: server-side apply of the CD's status |
//! | [`events`](KubeEventSink) | `EventSink`: Events on the CD through kube-runtime's recorder |
//! | [`slices`] | what this node's ResourceSlices should hold, and the writes to get there (pure) |
//! | [`publisher`](SlicePublisher) | keeps them so: watches them, writes with backoff |
//! | [`taint_rule`] | when the channel devices carry the IMEX-failing taint (pure) |
//! | [`taints`](ImexTaints) | follows the node's health into that taint; its events on the Node |
//! | [`peers`] | gossip seeds: the clique-mates' addresses from their slices, watched |
//! | [`reconcile`] | rebuilds prepared claims when the checkpoint is missing or corrupt |
//! | [`stale`](KubeStaleClaimNotices) | whether a checkpointed claim's objects still exist; the event of its release |
//!
//! The API server is never on the path of gossip or IMEX: when it is unreachable or
//! slow, domains keep forming and healing, prepare answers retryable errors for claims
//! it has not seen yet (and answers from the checkpoint for those it has), status and
//! slice writes are retried with backoff, and events are dropped after a bounded wait.

pub mod claim;
pub mod claim_status;
pub mod claim_status_writer;
mod claims;
mod domains;
mod events;
pub mod peers;
mod publisher;
pub mod reconcile;
pub mod slices;
mod stale;
mod status;
pub mod taint_rule;
mod taints;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ::kube::Client;
use domaind_actors::HealthView;
use domaind_actors::model::ReadinessPolicy;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

pub use claims::KubeClaimSource;
pub use domains::{DomainCache, domain_ref};
pub use events::{KubeEventSink, domain_reference, kube_event};
pub use peers::{Peers, SeedSink};
pub use publisher::{SlicePublisher, delete_node_slices, slice_selector, watch_slices};
pub use reconcile::{ReconcileSettings, ReconcilingCheckpointStore};
pub use slices::PoolSpec;
pub use stale::{KubeStaleClaimNotices, node_reference, released_kube_event};
pub use status::{KubeStatusSink, corrector, domain_wide, status_apply_body};
pub use taint_rule::TaintTiming;
pub use taints::{
    IMEX_TAINTED, IMEX_TAINTS, ImexTaints, KubeTaintNotices, TaintNotices, TaintSubject,
    inherited_taint,
};

use crate::stale::{PreparedClaims, StaleClaimChecker};
use domaind_actors::ports::{ErrorKind, PortError};
use domaind_checkpoint::FileCheckpointStore;
use domaind_kube_api::api::ApiError;
use domaind_prepare::cdi::CdiWriter;

/// Claims refused for something wrong with them, by `reason`.
pub const BAD_CLAIMS: &str = "domaind_kube_bad_claims_total";

/// Watch failures (each retried with backoff), by `resource`.
pub const WATCH_ERRORS: &str = "domaind_kube_watch_errors_total";

/// The Kubernetes backend's metric descriptions (see `crate::describe_metrics`).
pub(crate) fn describe_metrics() {
    use metrics::{describe_counter, describe_gauge};
    describe_counter!(
        BAD_CLAIMS,
        "Claims refused, by `reason`: `uid_mismatch`, `not_allocated`, `other_driver`, \
         `other_node`, `no_config`, `bad_config`, `conflicting_configs`, `unknown_domain`, \
         `namespace_mismatch`, `mixed_admin_access`, `not_a_channel`, `spans_cliques` (an \
         `isolation: Channel` domain already in another clique)."
    );
    describe_counter!(
        WATCH_ERRORS,
        "Watch failures, each retried with backoff, by `resource`: `computedomains`, \
         `resourceslices`, `resourceslices_clique`."
    );
    describe_counter!(
        status::STATUS_WRITES,
        "Domain status documents written, by `backend` (`kube`, `local`) and `outcome`: \
         `ok`, `failed`, `gone` (the ComputeDomain was deleted; kube only)."
    );
    describe_counter!(
        status::STATUS_CORRECTIONS,
        "Corrections of a ComputeDomain's domain-wide status fields (phase, counts, \
         `Ready`) from its rows, after reporters of two NVLink cliques wrote at once, by \
         `outcome`: `ok`, `failed` (tried again on the next change). One node of the \
         domain corrects."
    );
    describe_counter!(
        claim_status_writer::CLAIM_STATUS_WRITES,
        "Claims' device status written, by `outcome`: `ok`, `failed` (retried with \
         backoff), `gone` (the claim was deleted or recreated; not retried)."
    );
    describe_counter!(
        claim_status_writer::CLAIM_STATUS_FAILURES,
        "Failed reads and writes of claims' device status, each retried with backoff, by \
         `op` (`read`, `apply`) and `kind` (`transient`, `conflict`, `permanent`)."
    );
    describe_counter!(
        events::EVENTS,
        "Kubernetes Events recorded, by `outcome`: `ok`, `failed`."
    );
    describe_counter!(
        publisher::SLICE_WRITES,
        "ResourceSlice writes, by `op` (`apply`, `delete`) and `outcome` (`ok`, `failed`)."
    );
    describe_counter!(
        publisher::SLICES_LOST,
        "This node's ResourceSlices deleted by something else (and written again)."
    );
    describe_counter!(
        publisher::TAINTS_DROPPED,
        "Device taints the API server dropped from this node's devices (its \
         `DRADeviceTaints` feature off); not written again."
    );
    describe_counter!(
        IMEX_TAINTS,
        "The IMEX-failing taint put on and taken off this node's channel devices, by \
         `change`: `applied`, `removed`."
    );
    describe_gauge!(
        IMEX_TAINTED,
        "1 while this node's channel devices carry the IMEX-failing taint."
    );
    describe_counter!(
        reconcile::RECONCILED_CLAIMS,
        "Claims seen by start-up reconciliation, by `outcome`: `restored`, `skipped`; and \
         `failed` once for a reconciliation that could not reach the API server in time."
    );
    describe_gauge!(
        peers::DISCOVERY_PEERS,
        "Clique-mates whose gossip address this node knows from the API server."
    );
    describe_counter!(
        peers::DISCOVERY_SKIPPED,
        "Clique-mates' ResourceSlices that name no usable gossip peer (skipped, logged once \
         per slice), by `reason`: `no_address`, `bad_address`, `clique_mismatch`."
    );
}

/// What the backend needs to know about this node.
#[derive(Debug, Clone)]
pub struct KubeSettings {
    pub node: String,
    pub driver: String,
    /// `<clusterUUID>.<cliqueId>`, or empty.
    pub clique: String,
    /// Channel devices in this node's ResourceSlices.
    pub channel_devices: u32,
    /// This node's gossip address, published on its slices for its clique-mates.
    pub gossip_addr: Option<SocketAddr>,
    pub default_readiness: ReadinessPolicy,
    /// Each API call.
    pub api_timeout: Duration,
    /// Start-up reconciliation, all told.
    pub reconcile_timeout: Duration,
    /// When the channel devices carry the IMEX-failing taint.
    pub imex_taint: TaintTiming,
}

/// The running backend: the ports to give the actors, and the background work (the
/// ComputeDomain watch, the slice publisher) until [`stop`](Self::stop).
pub struct KubeBackend {
    client: Client,
    settings: KubeSettings,
    pub claims: Arc<KubeClaimSource>,
    pub status: Arc<KubeStatusSink>,
    pub events: Arc<KubeEventSink>,
    pub checkpoint: Arc<ReconcilingCheckpointStore>,
    domains: DomainCache,
    pool: watch::Sender<PoolSpec>,
    /// The claim source's view of this node's clique.
    clique: watch::Sender<String>,
    stop: CancellationToken,
    tasks: Vec<JoinHandle<()>>,
    /// Seed discovery, following one clique's slices: replaced when the node moves.
    discovery: Option<(CancellationToken, JoinHandle<()>)>,
}

// The client has no Debug of its own.
impl std::fmt::Debug for KubeBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeBackend")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl KubeBackend {
    /// Starts the ComputeDomain watch and the slice publisher (tokio tasks) and makes
    /// the ports. `file` is the checkpoint store that reconciliation wraps; `health` is
    /// the node's health board, which taints the slices while IMEX keeps failing.
    pub fn start(
        client: Client,
        settings: KubeSettings,
        file: FileCheckpointStore,
        cdi: CdiWriter,
        health: watch::Receiver<Arc<HealthView>>,
    ) -> Self {
        let stop = CancellationToken::new();
        let (domains, watch_domains) = DomainCache::watch(client.clone());
        let watching = {
            let stop = stop.clone();
            tokio::spawn(async move {
                tokio::select! {
                    () = stop.cancelled() => {}
                    () = watch_domains => {}
                }
            })
        };
        let (pool, pool_rx) = watch::channel(PoolSpec {
            node: settings.node.clone(),
            driver: settings.driver.clone(),
            clique: settings.clique.clone(),
            channels: settings.channel_devices,
            gossip_addr: settings.gossip_addr,
        });
        let publishing = tokio::spawn(publish(
            client.clone(),
            settings.clone(),
            pool_rx,
            health,
            stop.clone(),
        ));
        let clique = watch::Sender::new(settings.clique.clone());
        let status = KubeStatusSink::new(client.clone(), domains.clone(), settings.api_timeout)
            .for_node(settings.node.clone(), clique.subscribe());
        let correcting = tokio::spawn(status.clone().keep_domain_fields(stop.clone()));
        let checkpoint = ReconcilingCheckpointStore::new(
            file,
            client.clone(),
            domains.clone(),
            cdi,
            ReconcileSettings {
                node: settings.node.clone(),
                driver: settings.driver.clone(),
                default_readiness: settings.default_readiness,
                api_timeout: settings.api_timeout,
                limit: settings.reconcile_timeout,
            },
        );
        Self {
            claims: Arc::new(
                KubeClaimSource::new(
                    client.clone(),
                    domains.clone(),
                    settings.node.clone(),
                    settings.driver.clone(),
                    settings.api_timeout,
                )
                .in_clique(clique.subscribe()),
            ),
            status: Arc::new(status.clone()),
            events: Arc::new(KubeEventSink::new(
                client.clone(),
                settings.node.clone(),
                settings.api_timeout,
            )),
            checkpoint: Arc::new(checkpoint),
            domains,
            client,
            settings,
            pool,
            clique,
            stop,
            tasks: vec![watching, publishing, correcting],
            discovery: None,
        }
    }

    /// The stale-claim check of this node's claims against the API server, with
    /// events on the Node.
    pub fn stale_claims(&self, node: Arc<dyn PreparedClaims>) -> StaleClaimChecker {
        StaleClaimChecker::new(
            Arc::new(KubeClaimSource::new(
                self.client.clone(),
                self.domains.clone(),
                self.settings.node.clone(),
                self.settings.driver.clone(),
                self.settings.api_timeout,
            )),
            node,
            Arc::new(KubeStaleClaimNotices::new(
                self.client.clone(),
                self.settings.node.clone(),
                self.settings.api_timeout,
            )),
        )
    }

    /// Follows this node's clique-mates in the API server and hands their gossip
    /// addresses to `sink` (see [`peers`]), until [`stop`](Self::stop) or a
    /// [`move_clique`](Self::move_clique). Nothing for the empty clique: a node without
    /// fabric gossips with nobody.
    pub fn discover_seeds(&mut self, sink: Arc<dyn SeedSink>) {
        let Some(events) = peers::watch_clique_slices(
            self.client.clone(),
            &self.settings.driver,
            &self.settings.clique,
        ) else {
            info!("no clique: no gossip seeds to discover");
            return;
        };
        info!(
            selector = peers::clique_selector(&self.settings.clique).unwrap_or_default(),
            "gossip seeds: following this clique's ResourceSlices"
        );
        let stop = self.stop.child_token();
        let task = tokio::spawn(peers::follow(
            events,
            Peers::new(self.settings.node.clone(), self.settings.clique.clone()),
            sink,
            peers::RESEED_INTERVAL,
            stop.clone(),
        ));
        self.discovery = Some((stop, task));
    }

    /// Writes each prepared device's health into its claim's `status.devices` as
    /// `views` (the node's health board) change, until [`stop`](Self::stop).
    pub fn write_claim_status(&mut self, views: watch::Receiver<Arc<HealthView>>) {
        let api = Arc::new(claim_status_writer::KubeClaimStatus::new(
            self.client.clone(),
            self.settings.driver.clone(),
            self.settings.api_timeout,
        ));
        let book = claim_status::Book::new(
            self.settings.driver.clone(),
            claim_status_writer::SETTLE,
            claim_status_writer::DETAILS_HOLD,
            claim_status_writer::backoff(),
        );
        self.tasks.push(tokio::spawn(claim_status_writer::run(
            api,
            book,
            views,
            self.stop.clone(),
        )));
    }

    /// The node's fabric registered in another clique: its slices are rewritten with
    /// `clique` and `gossip_addr` (at a new pool generation), claims are checked
    /// against it, and seed discovery, when `seeds` is given (the new clique's gossip),
    /// follows the new clique's slices instead of the old one's.
    pub async fn move_clique(
        &mut self,
        clique: &str,
        gossip_addr: SocketAddr,
        seeds: Option<Arc<dyn SeedSink>>,
    ) {
        if let Some((stop, task)) = self.discovery.take() {
            stop.cancel();
            let _ = task.await;
        }
        self.settings.clique = clique.to_owned();
        self.settings.gossip_addr = Some(gossip_addr);
        self.clique.send_replace(clique.to_owned());
        self.pool.send_if_modified(|pool| {
            let changed = pool.clique != clique || pool.gossip_addr != Some(gossip_addr);
            pool.clique = clique.to_owned();
            pool.gossip_addr = Some(gossip_addr);
            changed
        });
        info!(clique, %gossip_addr, "this node's ResourceSlices are published in its new clique");
        if let Some(sink) = seeds {
            self.discover_seeds(sink);
        }
    }

    /// Stops the watch and the publisher; with `delete_slices`, then deletes this
    /// node's slices (nothing republishes them any more).
    pub async fn stop(self, delete_slices: bool) {
        self.stop.cancel();
        for task in self
            .tasks
            .into_iter()
            .chain(self.discovery.map(|(_, task)| task))
        {
            let _ = task.await;
        }
        if delete_slices {
            match delete_node_slices(
                self.client,
                &self.settings.node,
                &self.settings.driver,
                self.settings.api_timeout,
            )
            .await
            {
                Ok(deleted) => info!(deleted, "deleted this node's ResourceSlices"),
                Err(error) => warn!(%error, "this node's ResourceSlices were not deleted"),
            }
        }
    }
}

/// The slice publisher, and the taint it merges in. The taint a process before this
/// one left is read first, so that the first write keeps it rather than lifting it
/// until IMEX fails again.
async fn publish(
    client: Client,
    settings: KubeSettings,
    pool: watch::Receiver<PoolSpec>,
    health: watch::Receiver<Arc<HealthView>>,
    stop: CancellationToken,
) {
    let inherited = tokio::select! {
        () = stop.cancelled() => return,
        taint = inherited_taint(client.clone(), &settings.node, &settings.driver, settings.api_timeout) => taint,
    };
    let (taints, taint) = ImexTaints::new(
        TaintSubject {
            node: settings.node.clone(),
            driver: settings.driver.clone(),
            channels: settings.channel_devices,
        },
        settings.imex_taint,
        health,
        inherited,
        Arc::new(KubeTaintNotices::new(
            client.clone(),
            settings.node.clone(),
            settings.api_timeout,
        )),
    );
    let publisher = SlicePublisher::new(client.clone(), pool, settings.api_timeout)
        .with_taint(taint)
        .run(
            watch_slices(client, &settings.node, &settings.driver),
            stop.clone(),
        );
    tokio::join!(taints.run(stop), publisher);
}

/// The core's view of a failed API call: what asking again can do about it, with the
/// call's error (and kube's beneath it) kept as the source.
pub fn port_error(error: ApiError) -> PortError {
    PortError::from_source(api_error_kind(&error), error)
}

fn api_error_kind(error: &ApiError) -> ErrorKind {
    if error.is_conflict() {
        ErrorKind::Conflict
    } else if error.is_transient() {
        ErrorKind::Transient
    } else {
        ErrorKind::Permanent
    }
}
