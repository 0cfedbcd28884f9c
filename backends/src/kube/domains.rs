//! Every ComputeDomain of the cluster, kept by a watch (kube-runtime's reflector), so
//! that resolving a claim's `domainID` and writing status cost no API call.
//!
//! The cache knows whether it has synced (its first list is complete). Before that, a
//! uid it lacks proves nothing; after it, a uid it lacks is gone or newer than the
//! watch, which the claim source tells apart with one live list.

use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

use ::kube::api::Api;
use ::kube::runtime::reflector::{self, Store};
use ::kube::runtime::{WatchStreamExt, watcher};
use ::kube::{Client, ResourceExt};
use domaind_actors::model::{DomainRef, DomainUid};
use futures::{FutureExt, StreamExt};
use tokio::sync::watch;
use tracing::warn;

use super::WATCH_ERRORS;
use domaind_kube_api::crd::ComputeDomain;

/// A read handle on the ComputeDomain cache. Cheap to clone.
#[derive(Clone)]
pub struct DomainCache {
    store: Store<ComputeDomain>,
    /// Bumped after every watch event the store took: readers that must act on a
    /// change (the status sink's other-clique rows) wait on it.
    changes: Arc<watch::Sender<u64>>,
}

impl std::fmt::Debug for DomainCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("DomainCache")
            .field("synced", &self.is_synced())
            .field("domains", &self.store.len())
            .finish()
    }
}

impl DomainCache {
    /// The cache and the watch that fills it; spawn the future (it runs until dropped).
    /// The watch retries with backoff when the API server is unreachable.
    pub fn watch(client: Client) -> (Self, impl Future<Output = ()> + Send + 'static) {
        let (store, writer) = reflector::store();
        let changes = Arc::new(watch::Sender::new(0_u64));
        let api = Api::<ComputeDomain>::all(client);
        let stream = watcher(api, watcher::Config::default())
            .default_backoff()
            // The cache needs spec, status and identity; managed fields are most of
            // an object's size and none of its meaning here.
            .modify(|cd| cd.managed_fields_mut().clear())
            .reflect(writer);
        let run = {
            let changes = changes.clone();
            async move {
                let mut stream = std::pin::pin!(stream);
                while let Some(event) = stream.next().await {
                    match event {
                        Ok(_) => changes.send_modify(|n| *n = n.wrapping_add(1)),
                        Err(error) => {
                            metrics::counter!(WATCH_ERRORS, "resource" => "computedomains")
                                .increment(1);
                            warn!(%error, "ComputeDomain watch failed; retrying with backoff");
                        }
                    }
                }
            }
        };
        (Self { store, changes }, run)
    }

    /// A cache over a store someone else fills (tests fill it from a `Writer`, then
    /// call [`DomainCache::changed`]).
    pub fn from_store(store: Store<ComputeDomain>) -> Self {
        Self {
            store,
            changes: Arc::new(watch::Sender::new(0_u64)),
        }
    }

    /// Says the store changed, as the watch does after each event.
    pub fn changed(&self) {
        self.changes.send_modify(|n| *n = n.wrapping_add(1));
    }

    /// Wakes on every change of the store after it is called.
    pub fn changes(&self) -> watch::Receiver<u64> {
        self.changes.subscribe()
    }

    /// Whether the first complete list has arrived.
    pub fn is_synced(&self) -> bool {
        self.store
            .wait_until_ready()
            .now_or_never()
            .is_some_and(|r| r.is_ok())
    }

    /// Waits until the cache has synced, for at most `limit`. Returns whether it has.
    pub async fn wait_synced(&self, limit: Duration) -> bool {
        matches!(
            tokio::time::timeout(limit, self.store.wait_until_ready()).await,
            Ok(Ok(()))
        )
    }

    /// The ComputeDomain with this uid, if the cache holds it.
    pub fn by_uid(&self, uid: &str) -> Option<Arc<ComputeDomain>> {
        self.store
            .find(|cd| cd.metadata.uid.as_deref() == Some(uid))
    }

    /// Every ComputeDomain the cache holds.
    pub fn snapshot(&self) -> Vec<Arc<ComputeDomain>> {
        self.store.state()
    }

    pub fn len(&self) -> usize {
        self.store.len()
    }

    pub fn is_empty(&self) -> bool {
        self.store.is_empty()
    }
}

/// The domain as the actors know it. `None` for an object without identity (never
/// from an API server).
pub fn domain_ref(cd: &ComputeDomain) -> Option<DomainRef> {
    Some(DomainRef {
        uid: DomainUid(cd.metadata.uid.clone()?),
        namespace: cd.metadata.namespace.clone()?,
        name: cd.metadata.name.clone()?,
        num_nodes: cd.spec.num_nodes,
    })
}
