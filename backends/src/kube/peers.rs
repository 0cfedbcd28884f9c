//! Gossip seeds from the API server: this node's clique-mates, found in the
//! ResourceSlices they publish, and followed by a watch.
//!
//! Every node with fabric labels its slices with its clique and annotates them with its
//! gossip address ([`slices`](super::slices)). A node watches the slices of our driver
//! that carry its own clique's label (a label selector: the API server sends only
//! those, so a node never caches the fleet) and hands the addresses to gossip as seeds
//! whenever they change, so a node that appears is contacted at once. The same seeds
//! are handed over again every [`RESEED_INTERVAL`]: gossip contacts only those that
//! are not live members yet, so at steady state this costs nothing, and nodes that all
//! restart at once (each contacting the others before they listen) still find each
//! other.
//!
//! Slices carry what their own node's daemon wrote, and a slice that cannot name a
//! peer (no address, an address that does not parse, devices of another clique under
//! our label) is skipped, counted in [`DISCOVERY_SKIPPED`] and logged once; the rest
//! go on. The read needs nothing beyond what publishing slices needs already (`list`
//! and `watch` on ResourceSlices).

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use ::kube::api::Api;
use ::kube::runtime::{WatchStreamExt, watcher};
use ::kube::{Client, ResourceExt};
use domaind_gossip::GossipNode;
use futures::StreamExt;
use k8s_openapi::api::resource::v1::ResourceSlice;
use tokio::time::MissedTickBehavior;
use tokio_util::sync::CancellationToken;
use tracing::{debug, info, warn};

use super::WATCH_ERRORS;
use super::publisher::SliceEvents;
use super::slices::{CLIQUE_SLICE_LABEL, GOSSIP_ADDRESS_ANNOTATION, clique_label_value};

/// Clique-mates' slices that name no usable peer, by `reason` (`no_address`,
/// `bad_address`, `clique_mismatch`).
pub const DISCOVERY_SKIPPED: &str = "domaind_gossip_discovery_skipped_total";
/// Clique-mates whose gossip address this node knows from the API server.
pub const DISCOVERY_PEERS: &str = "domaind_gossip_discovery_peers";

/// How often the known clique-mates are handed to gossip again.
pub const RESEED_INTERVAL: Duration = Duration::from_secs(5);

/// Where seeds go: gossip, or a test's fake.
pub trait SeedSink: Send + Sync {
    /// Contacts the seeds that are not live members yet; returns how many.
    fn set_seeds(&self, seeds: Vec<SocketAddr>) -> usize;
}

impl SeedSink for GossipNode {
    fn set_seeds(&self, seeds: Vec<SocketAddr>) -> usize {
        GossipNode::set_seeds(self, seeds)
    }
}

/// Why a clique-mate's slice names no peer.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum Skip {
    NoAddress,
    BadAddress,
    CliqueMismatch,
}

impl Skip {
    pub fn reason(self) -> &'static str {
        match self {
            Self::NoAddress => "no_address",
            Self::BadAddress => "bad_address",
            Self::CliqueMismatch => "clique_mismatch",
        }
    }

    fn explain(self) -> &'static str {
        match self {
            Self::NoAddress => {
                "it has no gossip address annotation (a daemon of an older version?)"
            }
            Self::BadAddress => "its gossip address annotation is not a dialable ip:port",
            Self::CliqueMismatch => "its devices' cliqueID is not the clique its label names",
        }
    }
}

/// The peer a slice names: `None` for this node's own slices.
pub fn peer_of(
    slice: &ResourceSlice,
    node: &str,
    clique: &str,
) -> Result<Option<SocketAddr>, Skip> {
    if slice.spec.node_name.as_deref() == Some(node) {
        return Ok(None);
    }
    // The label may be a checksum, which can collide; the devices say the clique.
    let devices = slice.spec.devices.iter().flatten();
    let same_clique = devices.clone().next().is_some()
        && devices.clone().all(|device| {
            device
                .attributes
                .as_ref()
                .and_then(|a| a.get("cliqueID"))
                .and_then(|a| a.string.as_deref())
                == Some(clique)
        });
    if !same_clique {
        return Err(Skip::CliqueMismatch);
    }
    let address = slice
        .annotations()
        .get(GOSSIP_ADDRESS_ANNOTATION)
        .ok_or(Skip::NoAddress)?;
    let address: SocketAddr = address.parse().map_err(|_| Skip::BadAddress)?;
    if address.ip().is_unspecified() || address.port() == 0 {
        return Err(Skip::BadAddress);
    }
    Ok(Some(address))
}

/// The clique-mates known, folded from the watch's events. Pure: the watch and the
/// hand-over are [`follow`]'s.
#[derive(Debug)]
pub struct Peers {
    node: String,
    clique: String,
    /// Each slice that names a peer, by name (a node with many devices has several).
    slices: BTreeMap<String, SocketAddr>,
    /// Slices listed since the watch (re)started, until its list is complete.
    listing: Option<BTreeMap<String, SocketAddr>>,
    /// Slices skipped and logged already, so that each is logged once.
    logged: BTreeSet<(String, Skip)>,
}

impl Peers {
    pub fn new(node: impl Into<String>, clique: impl Into<String>) -> Self {
        Self {
            node: node.into(),
            clique: clique.into(),
            slices: BTreeMap::new(),
            listing: None,
            logged: BTreeSet::new(),
        }
    }

    /// The distinct gossip addresses known, in order.
    pub fn seeds(&self) -> Vec<SocketAddr> {
        self.slices
            .values()
            .copied()
            .collect::<BTreeSet<_>>()
            .into_iter()
            .collect()
    }

    /// Takes one event of the watch; true when the seeds changed.
    pub fn apply(&mut self, event: watcher::Event<ResourceSlice>) -> bool {
        let before = self.seeds();
        match event {
            watcher::Event::Init => self.listing = Some(BTreeMap::new()),
            watcher::Event::InitApply(slice) => {
                let name = slice.name_any();
                if let Some(address) = self.judge(&slice)
                    && let Some(listing) = self.listing.as_mut()
                {
                    listing.insert(name, address);
                }
            }
            watcher::Event::InitDone => {
                self.slices = self.listing.take().unwrap_or_default();
                // Slices gone while the watch was down are forgotten, logged or not.
                let listed = &self.slices;
                self.logged.retain(|(name, _)| listed.contains_key(name));
            }
            watcher::Event::Apply(slice) => {
                let name = slice.name_any();
                match self.judge(&slice) {
                    Some(address) => {
                        self.slices.insert(name, address);
                    }
                    None => {
                        self.slices.remove(&name);
                    }
                }
            }
            watcher::Event::Delete(slice) => {
                let name = slice.name_any();
                self.slices.remove(&name);
                self.logged.retain(|(logged, _)| *logged != name);
            }
        }
        self.seeds() != before
    }

    /// The peer of one slice, with a count and, the first time, a log line for one that
    /// names none.
    fn judge(&mut self, slice: &ResourceSlice) -> Option<SocketAddr> {
        let name = slice.name_any();
        match peer_of(slice, &self.node, &self.clique) {
            Ok(peer) => {
                self.logged.retain(|(logged, _)| *logged != name);
                peer
            }
            Err(skip) => {
                metrics::counter!(DISCOVERY_SKIPPED, "reason" => skip.reason()).increment(1);
                if self.logged.insert((name.clone(), skip)) {
                    warn!(
                        slice = %name,
                        node = slice.spec.node_name.as_deref().unwrap_or_default(),
                        reason = skip.reason(),
                        "a clique-mate's ResourceSlice names no gossip peer and is skipped: {} (counted in {DISCOVERY_SKIPPED}; logged once per slice)",
                        skip.explain()
                    );
                }
                None
            }
        }
    }
}

/// The label selector of `clique`'s slices; `None` for the empty clique.
pub fn clique_selector(clique: &str) -> Option<String> {
    clique_label_value(clique).map(|value| format!("{CLIQUE_SLICE_LABEL}={value}"))
}

/// Watches the slices of `driver` labelled with `clique`, retrying with backoff;
/// `None` for the empty clique, which has no peers.
pub fn watch_clique_slices(client: Client, driver: &str, clique: &str) -> Option<SliceEvents> {
    let labels = clique_selector(clique)?;
    let api = Api::<ResourceSlice>::all(client);
    let config = watcher::Config::default()
        .labels(&labels)
        .fields(&format!("spec.driver={driver}"));
    Some(watcher(api, config).default_backoff().boxed())
}

/// Hands the clique-mates of `events` to `sink`: on every change, and again every
/// `reseed`. Runs until `stop` is cancelled or the watch ends.
pub async fn follow(
    mut events: SliceEvents,
    mut peers: Peers,
    sink: Arc<dyn SeedSink>,
    reseed: Duration,
    stop: CancellationToken,
) {
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + reseed, reseed);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            biased;
            () = stop.cancelled() => return,
            item = events.next() => match item {
                None => return,
                Some(Err(error)) => {
                    metrics::counter!(WATCH_ERRORS, "resource" => "resourceslices_clique").increment(1);
                    warn!(%error, "clique-mates' ResourceSlice watch failed; retrying with backoff (gossip keeps the peers it has)");
                }
                Some(Ok(event)) => {
                    if peers.apply(event) {
                        let seeds = peers.seeds();
                        metrics::gauge!(DISCOVERY_PEERS).set(seeds.len() as f64);
                        info!(clique_mates = seeds.len(), seeds = ?seeds, "gossip seeds from the API server changed");
                        sink.set_seeds(seeds);
                    }
                }
            },
            _ = tick.tick() => {
                let seeds = peers.seeds();
                if !seeds.is_empty() {
                    let contacted = sink.set_seeds(seeds);
                    if contacted > 0 {
                        debug!(contacted, "clique-mates not yet gossiping with us contacted again");
                    }
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use k8s_openapi::api::resource::v1::{Device, DeviceAttribute, ResourceSliceSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use metrics_util::debugging::{DebugValue, DebuggingRecorder};
    use tokio::sync::mpsc;
    use tokio_stream::wrappers::UnboundedReceiverStream;

    use super::*;

    const CLIQUE: &str = "8c6d1a2f-1b1e-4d59-9b8b-3a3f8f7c2a10.1";

    fn slice(node: &str, clique: &str, address: Option<&str>) -> ResourceSlice {
        let device = Device {
            name: "channel-0".into(),
            attributes: Some(BTreeMap::from([(
                "cliqueID".to_owned(),
                DeviceAttribute {
                    string: Some(clique.into()),
                    ..DeviceAttribute::default()
                },
            )])),
            ..Device::default()
        };
        ResourceSlice {
            metadata: ObjectMeta {
                name: Some(format!("{node}-compute-domain.nvidia.com-0")),
                annotations: address.map(|a| {
                    BTreeMap::from([(GOSSIP_ADDRESS_ANNOTATION.to_owned(), a.to_owned())])
                }),
                ..ObjectMeta::default()
            },
            spec: ResourceSliceSpec {
                node_name: Some(node.into()),
                devices: Some(vec![device]),
                ..ResourceSliceSpec::default()
            },
        }
    }

    fn addr(s: &str) -> SocketAddr {
        s.parse().unwrap()
    }

    #[test]
    fn a_slice_names_its_nodes_gossip_address_or_why_not() {
        let ok = slice("n2", CLIQUE, Some("10.0.0.2:7946"));
        assert_eq!(peer_of(&ok, "n1", CLIQUE), Ok(Some(addr("10.0.0.2:7946"))));
        assert_eq!(peer_of(&ok, "n2", CLIQUE), Ok(None), "our own");
        let cases = [
            (slice("n2", CLIQUE, None), Skip::NoAddress),
            (slice("n2", CLIQUE, Some("n2:7946")), Skip::BadAddress),
            (slice("n2", CLIQUE, Some("0.0.0.0:7946")), Skip::BadAddress),
            (slice("n2", CLIQUE, Some("10.0.0.2:0")), Skip::BadAddress),
            (
                slice("n2", "other.1", Some("10.0.0.2:7946")),
                Skip::CliqueMismatch,
            ),
        ];
        for (slice, skip) in cases {
            assert_eq!(peer_of(&slice, "n1", CLIQUE), Err(skip), "{slice:?}");
        }
    }

    #[test]
    fn the_seeds_follow_the_watch() {
        let mut peers = Peers::new("n1", CLIQUE);
        assert!(!peers.apply(watcher::Event::Init));
        assert!(!peers.apply(watcher::Event::InitApply(slice(
            "n1",
            CLIQUE,
            Some("10.0.0.1:7946")
        ))));
        assert!(!peers.apply(watcher::Event::InitApply(slice(
            "n2",
            CLIQUE,
            Some("10.0.0.2:7946")
        ))));
        assert!(
            peers.seeds().is_empty(),
            "nothing before the list is complete"
        );
        assert!(peers.apply(watcher::Event::InitDone));
        assert_eq!(peers.seeds(), [addr("10.0.0.2:7946")]);

        // A node that appears, then moves, then goes.
        assert!(peers.apply(watcher::Event::Apply(slice(
            "n3",
            CLIQUE,
            Some("10.0.0.3:7946")
        ))));
        assert!(!peers.apply(watcher::Event::Apply(slice(
            "n3",
            CLIQUE,
            Some("10.0.0.3:7946")
        ))));
        assert!(peers.apply(watcher::Event::Apply(slice(
            "n3",
            CLIQUE,
            Some("10.0.0.4:7946")
        ))));
        assert_eq!(
            peers.seeds(),
            [addr("10.0.0.2:7946"), addr("10.0.0.4:7946")]
        );
        assert!(peers.apply(watcher::Event::Delete(slice("n3", CLIQUE, None))));
        // A slice that turns bad names no peer any more.
        assert!(peers.apply(watcher::Event::Apply(slice("n2", CLIQUE, Some("garbage")))));
        assert!(peers.seeds().is_empty());

        // A relist replaces everything.
        peers.apply(watcher::Event::Init);
        peers.apply(watcher::Event::InitApply(slice(
            "n5",
            CLIQUE,
            Some("10.0.0.5:7946"),
        )));
        assert!(peers.apply(watcher::Event::InitDone));
        assert_eq!(peers.seeds(), [addr("10.0.0.5:7946")]);
    }

    /// The counter `name` with `reason`, as recorded by `recorder`.
    fn skipped(recorder: &DebuggingRecorder, reason: &str) -> u64 {
        recorder
            .snapshotter()
            .snapshot()
            .into_vec()
            .into_iter()
            .filter(|(key, ..)| {
                key.key().name() == DISCOVERY_SKIPPED
                    && key.key().labels().any(|l| l.value() == reason)
            })
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => n,
                _ => 0,
            })
            .sum()
    }

    #[test]
    fn a_bad_slice_is_skipped_counted_and_logged_once_the_rest_carry_on() {
        let recorder = DebuggingRecorder::new();
        let _local = metrics::set_default_local_recorder(&recorder);
        let mut peers = Peers::new("n1", CLIQUE);
        for _ in 0..3 {
            peers.apply(watcher::Event::Apply(slice(
                "n2",
                CLIQUE,
                Some("not an address"),
            )));
        }
        peers.apply(watcher::Event::Apply(slice(
            "n3",
            CLIQUE,
            Some("10.0.0.3:7946"),
        )));
        assert_eq!(peers.seeds(), [addr("10.0.0.3:7946")]);
        assert_eq!(skipped(&recorder, "bad_address"), 3, "each seen, counted");
        assert_eq!(peers.logged.len(), 1, "logged once");
        // Fixed, then broken again: news again.
        peers.apply(watcher::Event::Apply(slice(
            "n2",
            CLIQUE,
            Some("10.0.0.2:7946"),
        )));
        assert!(peers.logged.is_empty());
        peers.apply(watcher::Event::Delete(slice("n2", CLIQUE, None)));
        assert_eq!(peers.seeds(), [addr("10.0.0.3:7946")]);
    }

    #[test]
    fn the_empty_clique_watches_nothing() {
        assert_eq!(clique_selector(""), None);
        assert_eq!(
            clique_selector(CLIQUE).unwrap(),
            format!("{CLIQUE_SLICE_LABEL}={CLIQUE}")
        );
    }

    /// Records what it was handed, in order; contacts every seed it is given, as
    /// gossip does while none of them is a member yet.
    #[derive(Default)]
    struct FakeSink(Mutex<Vec<Vec<SocketAddr>>>);

    impl SeedSink for FakeSink {
        fn set_seeds(&self, seeds: Vec<SocketAddr>) -> usize {
            let n = seeds.len();
            self.0.lock().unwrap().push(seeds);
            n
        }
    }

    impl FakeSink {
        fn calls(&self) -> Vec<Vec<SocketAddr>> {
            self.0.lock().unwrap().clone()
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_new_clique_mate_is_seeded_at_once_and_all_again_every_interval() {
        let (tx, rx) = mpsc::unbounded_channel();
        let sink = Arc::new(FakeSink::default());
        let stop = CancellationToken::new();
        let task = tokio::spawn(follow(
            UnboundedReceiverStream::new(rx).boxed(),
            Peers::new("n1", CLIQUE),
            sink.clone(),
            RESEED_INTERVAL,
            stop.clone(),
        ));
        for event in [
            watcher::Event::Init,
            watcher::Event::InitApply(slice("n2", CLIQUE, Some("10.0.0.2:7946"))),
            watcher::Event::InitDone,
        ] {
            tx.send(Ok(event)).unwrap();
        }
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(sink.calls(), [vec![addr("10.0.0.2:7946")]]);

        tx.send(Ok(watcher::Event::Apply(slice(
            "n3",
            CLIQUE,
            Some("10.0.0.3:7946"),
        ))))
        .unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        let both = vec![addr("10.0.0.2:7946"), addr("10.0.0.3:7946")];
        assert_eq!(
            sink.calls().last(),
            Some(&both),
            "at once, not at the next tick"
        );
        assert_eq!(sink.calls().len(), 2);

        // The whole clique restarts: nobody answered; the next tick tries again.
        tokio::time::sleep(RESEED_INTERVAL).await;
        assert_eq!(sink.calls().len(), 3);
        assert_eq!(sink.calls().last(), Some(&both));

        // A watch error changes nothing; the task carries on.
        tx.send(Err(watcher::Error::NoResourceVersion)).unwrap();
        tokio::time::sleep(Duration::from_millis(1)).await;
        assert_eq!(sink.calls().len(), 3);

        stop.cancel();
        task.await.unwrap();
    }
}
