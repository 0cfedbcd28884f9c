//! Keeps this node's ResourceSlices as [`plan`](super::slices::plan) wants them.
//!
//! It watches the slices of our driver on this node (a field selector on
//! `spec.nodeName` and `spec.driver`), so when something deletes or edits them — a
//! kubelet that starts or restarts deletes its node's slices — it sees it at once and
//! writes them again; no periodic resync is needed. Writes are server-side applies
//! (field manager `domaind-node`, forced): creating and replacing are one call, and no
//! write can conflict. Failed writes are retried with backoff, from what the watch
//! says is there.
//!
//! The devices' taints are a second input (a `watch` of this node's taint), merged into
//! what is written: the pool says what the node offers, the taint whether the scheduler
//! should choose it now. An API server that drops the taints we write (its
//! `DRADeviceTaints` off) is told once per taint, logged and counted
//! (`domaind_device_taints_dropped_total`), and the taint is not asked for again: each
//! write would otherwise differ from what the watch then shows, and be written again.
//!
//! Slices stay when the daemon stops (a restart should not make pods unschedulable for
//! a moment). On a cluster, the kubelet removes a driver's slices itself once the
//! driver's plugin socket has been gone for a while, which is what an uninstall
//! leaves; [`delete_node_slices`] removes them at once, for `--slices-on-exit delete`.

use std::collections::BTreeMap;
use std::time::Duration;

use ::kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use ::kube::runtime::{WatchStreamExt, watcher};
use ::kube::{Client, ResourceExt};
use futures::stream::BoxStream;
use futures::{FutureExt as _, StreamExt};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::resource::v1::{DeviceTaint, ResourceSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::WATCH_ERRORS;
use super::slices::{PoolSpec, plan_tainted};
use domaind_backoff::Backoff;
use domaind_kube_api::api::{ApiError, bounded};
use domaind_kube_api::names::NODE_FIELD_MANAGER;

/// Slice writes, by `op` (`apply`, `delete`) and `outcome` (`ok`, `failed`).
pub const SLICE_WRITES: &str = "domaind_resource_slice_writes_total";
/// Slices of ours that something else deleted (and we wrote again).
pub const SLICES_LOST: &str = "domaind_resource_slices_lost_total";
/// Taints the API server dropped from our devices (its `DRADeviceTaints` off).
pub const TAINTS_DROPPED: &str = "domaind_device_taints_dropped_total";

/// The watch of this node's slices, as the publisher consumes it.
pub type SliceEvents = BoxStream<'static, Result<watcher::Event<ResourceSlice>, watcher::Error>>;

/// The field selector of `node`'s slices of `driver`.
pub fn slice_selector(node: &str, driver: &str) -> String {
    format!("spec.nodeName={node},spec.driver={driver}")
}

/// Watches `node`'s slices of `driver`, retrying with backoff.
pub fn watch_slices(client: Client, node: &str, driver: &str) -> SliceEvents {
    let api = Api::<ResourceSlice>::all(client);
    watcher(
        api,
        watcher::Config::default().fields(&slice_selector(node, driver)),
    )
    .default_backoff()
    .boxed()
}

/// Whether the Node owns the slices, once known.
#[derive(Debug, Clone)]
enum Owner {
    Unknown,
    Known(Option<OwnerReference>),
}

/// The publisher's state. [`run`](Self::run) it in a task.
pub struct SlicePublisher {
    client: Client,
    pool: watch::Receiver<PoolSpec>,
    /// The taint every device carries, if any.
    taint: watch::Receiver<Option<DeviceTaint>>,
    /// A taint the API server dropped: not asked for again.
    dropped: Option<DeviceTaint>,
    timeout: Duration,
    owner: Owner,
    /// The slices the API server has, as the watch and our own writes tell.
    view: BTreeMap<String, ResourceSlice>,
    /// Slices listed since the watch (re)started, until its list is complete.
    listing: Option<BTreeMap<String, ResourceSlice>>,
    synced: bool,
    dirty: bool,
    last_generation: i64,
}

// The client has no Debug of its own.
impl std::fmt::Debug for SlicePublisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SlicePublisher")
            .field("pool", &self.pool)
            .field("taint", &self.taint)
            .field("view", &self.view)
            .field("synced", &self.synced)
            .field("last_generation", &self.last_generation)
            .finish_non_exhaustive()
    }
}

impl SlicePublisher {
    /// Publishes what `pool` says, now and whenever it changes; no taints.
    pub fn new(client: Client, pool: watch::Receiver<PoolSpec>, timeout: Duration) -> Self {
        Self {
            client,
            pool,
            taint: watch::channel(None).1,
            dropped: None,
            timeout,
            owner: Owner::Unknown,
            view: BTreeMap::new(),
            listing: None,
            synced: false,
            dirty: true,
            last_generation: 0,
        }
    }

    /// Every device also carries what `taint` says, now and whenever it changes.
    pub fn with_taint(mut self, taint: watch::Receiver<Option<DeviceTaint>>) -> Self {
        self.taint = taint;
        self.dirty = true;
        self
    }

    /// Runs until `stop` is cancelled or the watch ends.
    pub async fn run(mut self, mut events: SliceEvents, stop: CancellationToken) {
        let mut retry =
            Backoff::new(Duration::from_millis(200), Duration::from_secs(30)).jittered();
        let mut retry_at: Option<Instant> = None;
        let mut pool_open = true;
        // A publisher made without a taint has a closed one: nothing will come.
        let mut taint_open = self.taint.has_changed().is_ok();
        loop {
            // Whatever the watch already has goes in first: writes start from the
            // freshest view, and an event queued before our own write cannot undo it.
            while let Some(item) = events.next().now_or_never() {
                if !self.take(item) {
                    return;
                }
            }
            let due = retry_at.is_none_or(|at| Instant::now() >= at);
            if self.synced && self.dirty && due {
                // A stop does not wait for writes to an API server that hangs.
                let synced = tokio::select! {
                    biased;
                    () = stop.cancelled() => return,
                    synced = self.sync() => synced,
                };
                match synced {
                    Ok(()) => {
                        self.dirty = false;
                        retry_at = None;
                        retry.succeed();
                    }
                    Err(error) => {
                        let delay = retry.fail();
                        warn!(%error, retry_in = ?delay, "ResourceSlices not published");
                        retry_at = Some(Instant::now() + delay);
                    }
                }
            }
            let wake = retry_at.filter(|_| self.dirty);
            tokio::select! {
                biased;
                () = stop.cancelled() => return,
                item = events.next() => if !self.take(item) {
                    return;
                },
                changed = self.pool.changed(), if pool_open => match changed {
                    Ok(()) => self.dirty = true,
                    // The owner is gone: the pool stays as it was last set.
                    Err(_) => pool_open = false,
                },
                changed = self.taint.changed(), if taint_open => match changed {
                    Ok(()) => self.dirty = true,
                    Err(_) => taint_open = false,
                },
                () = tokio::time::sleep_until(wake.unwrap_or_else(Instant::now)), if wake.is_some() => {}
            }
        }
    }

    /// Takes one item of the watch; false when the watch has ended.
    fn take(
        &mut self,
        item: Option<Result<watcher::Event<ResourceSlice>, watcher::Error>>,
    ) -> bool {
        match item {
            Some(Ok(event)) => self.observe(event),
            Some(Err(error)) => {
                metrics::counter!(WATCH_ERRORS, "resource" => "resourceslices").increment(1);
                warn!(%error, "ResourceSlice watch failed; retrying with backoff");
            }
            None => return false,
        }
        true
    }

    fn is_ours(&self, slice: &ResourceSlice) -> bool {
        let pool = self.pool.borrow();
        slice.spec.driver == pool.driver && slice.spec.node_name.as_deref() == Some(&pool.node)
    }

    fn observe(&mut self, event: watcher::Event<ResourceSlice>) {
        match event {
            watcher::Event::Init => self.listing = Some(BTreeMap::new()),
            watcher::Event::InitApply(slice) => {
                if self.is_ours(&slice)
                    && let Some(listing) = self.listing.as_mut()
                {
                    listing.insert(slice.name_any(), slice);
                }
            }
            watcher::Event::InitDone => {
                self.view = self.listing.take().unwrap_or_default();
                self.synced = true;
                self.dirty = true;
            }
            watcher::Event::Apply(slice) => {
                if self.is_ours(&slice) {
                    self.view.insert(slice.name_any(), slice);
                    self.dirty = true;
                }
            }
            watcher::Event::Delete(slice) => {
                // Our own deletions left the view already: one still there was deleted
                // by someone else.
                if self.view.remove(&slice.name_any()).is_some() {
                    metrics::counter!(SLICES_LOST).increment(1);
                    info!(slice = %slice.name_any(), "a ResourceSlice of this node was deleted; publishing it again");
                }
                self.dirty = true;
            }
        }
    }

    async fn owner(&mut self) -> Result<Option<OwnerReference>, ApiError> {
        if let Owner::Known(owner) = &self.owner {
            return Ok(owner.clone());
        }
        let node = self.pool.borrow().node.clone();
        let api = Api::<Node>::all(self.client.clone());
        let owner = match bounded(format!("get Node {node}"), self.timeout, api.get(&node)).await {
            Ok(found) => found.metadata.uid.map(|uid| OwnerReference {
                api_version: "v1".into(),
                kind: "Node".into(),
                name: node,
                uid,
                controller: Some(true),
                block_owner_deletion: None,
            }),
            // Slices without an owner work; they only outlive a deleted Node object.
            Err(
                error @ ApiError::Status {
                    code: 403 | 404, ..
                },
            ) => {
                warn!(%error, "ResourceSlices are published without the Node as owner");
                None
            }
            Err(error) => return Err(error),
        };
        self.owner = Owner::Known(owner.clone());
        Ok(owner)
    }

    async fn sync(&mut self) -> Result<(), ApiError> {
        let owner = self.owner().await?;
        let pool = self.pool.borrow().clone();
        let taints: Vec<DeviceTaint> = self
            .taint
            .borrow()
            .clone()
            .filter(|taint| self.dropped.as_ref() != Some(taint))
            .into_iter()
            .collect();
        let observed: Vec<ResourceSlice> = self.view.values().cloned().collect();
        let plan = plan_tainted(
            &pool,
            &taints,
            owner.as_ref(),
            &observed,
            self.last_generation,
        );
        if plan.is_empty() {
            // Remembered for a wipe: the pool comes back at the generation it had.
            self.last_generation = plan.generation;
            return Ok(());
        }
        info!(
            generation = plan.generation,
            apply = plan.apply.len(),
            delete = plan.delete.len(),
            "publishing ResourceSlices"
        );
        let api = Api::<ResourceSlice>::all(self.client.clone());
        let params = PatchParams::apply(NODE_FIELD_MANAGER).force();
        for slice in &plan.apply {
            let name = slice.name_any();
            let applied = bounded(
                format!("apply ResourceSlice {name}"),
                self.timeout,
                api.patch(&name, &params, &Patch::Apply(slice)),
            )
            .await;
            count("apply", applied.is_ok());
            let applied = applied?;
            if let Some(taint) = taints.first()
                && untainted(&applied)
            {
                metrics::counter!(TAINTS_DROPPED).increment(1);
                warn!(
                    slice = %name,
                    key = %taint.key,
                    "the API server dropped the devices' taints (is DRADeviceTaints on?); \
                     the scheduler will not see them, and they are not written again"
                );
                self.dropped = Some(taint.clone());
            }
            self.view.insert(name, applied);
        }
        self.last_generation = plan.generation;
        for name in &plan.delete {
            let deleted = bounded(
                format!("delete ResourceSlice {name}"),
                self.timeout,
                api.delete(name, &DeleteParams::default()),
            )
            .await;
            match deleted {
                Ok(_) => count("delete", true),
                Err(error) if error.is_not_found() => {}
                Err(error) => {
                    count("delete", false);
                    return Err(error);
                }
            }
            self.view.remove(name);
        }
        debug!(generation = plan.generation, "ResourceSlices published");
        Ok(())
    }
}

/// Whether a slice we wrote with taints came back with a device without any.
fn untainted(slice: &ResourceSlice) -> bool {
    slice
        .spec
        .devices
        .iter()
        .flatten()
        .any(|device| device.taints.as_ref().is_none_or(Vec::is_empty))
}

fn count(op: &'static str, ok: bool) {
    let outcome = if ok { "ok" } else { "failed" };
    metrics::counter!(SLICE_WRITES, "op" => op, "outcome" => outcome).increment(1);
}

/// Deletes every slice of `driver` on `node`. Returns how many there were.
pub async fn delete_node_slices(
    client: Client,
    node: &str,
    driver: &str,
    timeout: Duration,
) -> Result<usize, ApiError> {
    let api = Api::<ResourceSlice>::all(client);
    let listed = bounded(
        format!("list ResourceSlices of {node}"),
        timeout,
        api.list(&ListParams::default().fields(&slice_selector(node, driver))),
    )
    .await?;
    let mut deleted = 0;
    for slice in listed.items {
        // Field selectors are honoured by every API server we know; checking costs
        // nothing and a deleted stranger's slice would cost a lot.
        if slice.spec.driver != driver || slice.spec.node_name.as_deref() != Some(node) {
            continue;
        }
        let name = slice.name_any();
        match bounded(
            format!("delete ResourceSlice {name}"),
            timeout,
            api.delete(&name, &DeleteParams::default()),
        )
        .await
        {
            Ok(_) => {
                count("delete", true);
                deleted += 1;
            }
            Err(error) if error.is_not_found() => {}
            Err(error) => {
                count("delete", false);
                return Err(error);
            }
        }
    }
    Ok(deleted)
}
