//! A model of how NVIDIA's DRA driver coordinates a ComputeDomain's nodes through the
//! API server, to measure beside our daemons on the same API server
//! (`suite/scale.rs`). Our code, written from what their issues and pull requests
//! describe (#723 and #816: minutes and 409 storms at 150 nodes; #732 and #734: jitter
//! in the retries; #822 and #835: server-side apply tried, then optimistic concurrency
//! again; their controller's 2 s status sync), not from theirs; a model, so its rules
//! are all here:
//!
//! 1. **Register.** Each node GETs the shared object, adds its own entry to
//!    `status.nodes` (name, IP, clique, the lowest index free in its clique, NotReady)
//!    and PUTs the status with the resourceVersion it read. A 409 means another node
//!    wrote in between: wait [`Backoff`] (5 ms doubling per conflict, at most 1 s, the
//!    second half jittered), GET again, try again. An entry already there is not
//!    written again.
//! 2. **Watch.** Each node holds a watch on its object, as their daemons' informers
//!    do, so that every write reaches every node. The model reads nothing from it (the
//!    retry GETs): it is there for what it costs the API server. [`ModelSpec::watch`]
//!    turns it off.
//! 3. **Aggregate.** One aggregator reads the object(s) every 2 s ([`ModelSpec::poll`],
//!    first read 2 s after the start) and, once all N nodes are listed, PUTs the
//!    domain's status Ready (with the resourceVersion it read; a conflict waits for
//!    the next read). A node that leaves deletes its own entry the same way as it
//!    registered; the aggregator's next read below N writes NotReady.
//!
//! The shared object is a ComputeDomain's status (their daemons write `status.nodes`
//! of the ComputeDomain), or with [`Objects::PerClique`] one object per clique that
//! the aggregator lists (their `ComputeDomainCliques` feature). What the model leaves
//! out makes it faster than the driver it models, never slower: no IMEX daemon to
//! start, no second write per node to mark it Ready, no pod start, no informer lag
//! (the retries GET a quorum read).

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use http_body_util::BodyExt as _;
use kube::Client;
use kube::api::{Api, ApiResource, DynamicObject, PostParams};
use serde_json::{Value, json};
use tokio::time::Instant;

/// Where the nodes register.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Objects {
    /// Every node in one object: the ComputeDomain's status.
    One,
    /// One object per clique, listed by the aggregator.
    PerClique,
}

#[derive(Debug, Clone)]
pub struct ModelSpec {
    pub nodes: usize,
    pub cliques: usize,
    pub objects: Objects,
    pub poll: Duration,
    pub backoff: Backoff,
    pub watch: bool,
}

impl ModelSpec {
    pub fn new(nodes: usize, cliques: usize, objects: Objects) -> Self {
        Self {
            nodes,
            cliques,
            objects,
            poll: Duration::from_secs(2),
            backoff: Backoff::DEFAULT,
            watch: true,
        }
    }

    /// The clique (0-based) of node `index`: contiguous blocks, as the rack's.
    pub fn clique_of(&self, index: usize) -> usize {
        index * self.cliques.max(1) / self.nodes.max(1)
    }

    /// The names of the shared objects, given the run's prefix.
    pub fn object_names(&self, prefix: &str) -> Vec<String> {
        match self.objects {
            Objects::One => vec![prefix.to_owned()],
            Objects::PerClique => (0..self.cliques)
                .map(|c| format!("{prefix}-c{c}"))
                .collect(),
        }
    }

    /// Which of [`Self::object_names`] node `index` registers in.
    pub fn object_of(&self, index: usize) -> usize {
        match self.objects {
            Objects::One => 0,
            Objects::PerClique => self.clique_of(index),
        }
    }

    /// Node `index`'s entry.
    pub fn entry(&self, index: usize) -> Entry {
        Entry {
            name: node_name(index),
            ip: format!(
                "10.{}.{}.{}",
                1 + index / 65536,
                (index / 256) % 256,
                index % 256
            ),
            clique: format!("model.{}", self.clique_of(index)),
        }
    }
}

pub fn node_name(index: usize) -> String {
    format!("model-node-{:03}", index + 1)
}

/// A node's entry in `status.nodes`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Entry {
    pub name: String,
    pub ip: String,
    pub clique: String,
}

/// `nodes` with `me` added at the lowest index its clique does not use; `None` when
/// it is already there (nothing to write).
pub fn with_entry(nodes: &[Value], me: &Entry) -> Option<Vec<Value>> {
    if nodes.iter().any(|n| n["name"] == me.name.as_str()) {
        return None;
    }
    let taken: Vec<u64> = nodes
        .iter()
        .filter(|n| n["cliqueID"] == me.clique.as_str())
        .filter_map(|n| n["index"].as_u64())
        .collect();
    let index = (0..).find(|i| !taken.contains(i)).expect("a free index");
    let mut nodes = nodes.to_vec();
    nodes.push(json!({
        "name": me.name, "ipAddress": me.ip, "cliqueID": me.clique,
        "index": index, "status": "NotReady",
    }));
    Some(nodes)
}

/// `nodes` without `name`; `None` when it is not there.
pub fn without_entry(nodes: &[Value], name: &str) -> Option<Vec<Value>> {
    let kept: Vec<Value> = nodes
        .iter()
        .filter(|n| n["name"] != name)
        .cloned()
        .collect();
    (kept.len() != nodes.len()).then_some(kept)
}

/// The wait before retrying after a conflict: `base` doubled per conflict in a row, at
/// most `cap`; the first half fixed, the second drawn, so that nodes that collided do
/// not collide again in lock step.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Backoff {
    pub base: Duration,
    pub cap: Duration,
}

impl Backoff {
    pub const DEFAULT: Self = Self {
        base: Duration::from_millis(5),
        cap: Duration::from_secs(1),
    };

    /// The wait after `conflicts` conflicts in a row (1 for the first); `draw` in [0, 1).
    pub fn delay(&self, conflicts: u32, draw: f64) -> Duration {
        let full = self
            .base
            .saturating_mul(1u32 << conflicts.saturating_sub(1).min(20))
            .min(self.cap);
        full / 2 + full.mul_f64(draw.clamp(0.0, 1.0) / 2.0)
    }
}

/// A small generator per node for the jitter: the model needs spread, not quality.
#[derive(Debug, Clone)]
pub struct Draws(u64);

impl Draws {
    pub fn new(seed: u64) -> Self {
        Self(seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1)
    }

    /// The next draw in [0, 1) (xorshift64).
    pub fn draw(&mut self) -> f64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        (self.0 >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// The number of distinct node names the objects list.
pub fn registered(objects: &[Vec<Value>]) -> usize {
    let names: std::collections::BTreeSet<&str> = objects
        .iter()
        .flatten()
        .filter_map(|n| n["name"].as_str())
        .collect();
    names.len()
}

/// NVIDIA's ComputeDomain, which `deploy/crds/` defines for us too.
fn resource() -> ApiResource {
    ApiResource {
        group: "resource.nvidia.com".into(),
        version: "v1beta1".into(),
        api_version: "resource.nvidia.com/v1beta1".into(),
        kind: "ComputeDomain".into(),
        plural: "computedomains".into(),
    }
}

fn api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), namespace, &resource())
}

fn nodes_of(object: &DynamicObject) -> Vec<Value> {
    object.data["status"]["nodes"]
        .as_array()
        .cloned()
        .unwrap_or_default()
}

/// Creates the run's shared objects: ComputeDomains with an empty status.
pub async fn create_objects(client: &Client, namespace: &str, names: &[String]) {
    for name in names {
        let object: DynamicObject = serde_json::from_value(json!({
            "apiVersion": "resource.nvidia.com/v1beta1",
            "kind": "ComputeDomain",
            "metadata": {"name": name, "namespace": namespace},
            "spec": {"numNodes": 0, "channel": {"resourceClaimTemplate": {"name": format!("{name}-channel")}}},
        }))
        .expect("a ComputeDomain");
        api(client, namespace)
            .create(&PostParams::default(), &object)
            .await
            .expect("the model's shared object");
    }
}

/// What one node's write cost.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct WriteStats {
    /// PUTs sent, the one that landed included.
    pub puts: u64,
    pub conflicts: u64,
    /// Other failures, retried the same way.
    pub errors: u64,
}

/// One optimistic read-modify-write of `name`'s `status.nodes` with `change`, retried
/// on conflict until it lands or `change` says there is nothing to do. Bounded by
/// `limit`: a write that never lands fails the benchmark.
pub async fn write_nodes(
    client: &Client,
    namespace: &str,
    name: &str,
    backoff: Backoff,
    draws: &mut Draws,
    limit: Duration,
    change: impl Fn(&[Value]) -> Option<Vec<Value>>,
) -> WriteStats {
    let api = api(client, namespace);
    let deadline = Instant::now() + limit;
    let mut stats = WriteStats::default();
    let mut in_a_row = 0;
    loop {
        assert!(
            Instant::now() < deadline,
            "the model's write to {name} did not land within {limit:?}: {stats:?}"
        );
        let mut object = match api.get_status(name).await {
            Ok(object) => object,
            Err(_) => {
                stats.errors += 1;
                in_a_row += 1;
                tokio::time::sleep(backoff.delay(in_a_row, draws.draw())).await;
                continue;
            }
        };
        let Some(nodes) = change(&nodes_of(&object)) else {
            return stats;
        };
        object.data["status"]["nodes"] = Value::Array(nodes);
        stats.puts += 1;
        match api
            .replace_status(name, &PostParams::default(), &object)
            .await
        {
            Ok(_) => return stats,
            Err(kube::Error::Api(status)) if status.code == 409 => stats.conflicts += 1,
            Err(_) => stats.errors += 1,
        }
        in_a_row += 1;
        tokio::time::sleep(backoff.delay(in_a_row, draws.draw())).await;
    }
}

/// Holds a watch on `name` as an informer would, reading and dropping what arrives,
/// adding the bytes received to `received`, until the API server closes it (after
/// `seconds`) or the task is aborted.
pub async fn hold_watch(
    client: Client,
    namespace: String,
    name: String,
    seconds: u32,
    received: Arc<AtomicU64>,
) {
    let path = format!(
        "/apis/resource.nvidia.com/v1beta1/namespaces/{namespace}/computedomains?watch=true&fieldSelector=metadata.name%3D{name}&timeoutSeconds={seconds}"
    );
    let request = http::Request::get(path)
        .body(kube::client::Body::empty())
        .expect("a watch request");
    let Ok(response) = client.send(request).await else {
        return;
    };
    let mut body = response.into_body();
    while let Some(Ok(frame)) = body.frame().await {
        if let Some(data) = frame.data_ref() {
            received.fetch_add(data.len() as u64, Ordering::Relaxed);
        }
    }
}

/// The aggregator: reads every object each `poll` (first read one `poll` after it
/// starts) until `want` holds for the number of nodes listed, then PUTs the domain's
/// phase `phase` into the first object (a conflict waits for the next read). Returns
/// when that write landed and the reads it made.
pub async fn aggregate_until(
    client: &Client,
    namespace: &str,
    names: &[String],
    poll: Duration,
    limit: Duration,
    phase: &str,
    want: impl Fn(usize) -> bool,
) -> (Instant, u64) {
    let api = api(client, namespace);
    let deadline = Instant::now() + limit;
    let mut ticks = tokio::time::interval_at(Instant::now() + poll, poll);
    let mut reads = 0;
    let mut last_seen = 0;
    loop {
        ticks.tick().await;
        assert!(
            Instant::now() < deadline,
            "the model's aggregator saw {last_seen} nodes, never what it waits for, within {limit:?}"
        );
        let mut objects = Vec::new();
        for name in names {
            reads += 1;
            objects.push(api.get_status(name).await.expect("the shared object"));
        }
        let listed: Vec<Vec<Value>> = objects.iter().map(nodes_of).collect();
        last_seen = registered(&listed);
        if !want(last_seen) {
            continue;
        }
        let mut first = objects.swap_remove(0);
        if first.data["status"]["status"] == phase {
            return (Instant::now(), reads);
        }
        first.data["status"]["status"] = json!(phase);
        if api
            .replace_status(&names[0], &PostParams::default(), &first)
            .await
            .is_ok()
        {
            return (Instant::now(), reads);
        }
    }
}

/// Runs `nodes` writers at once, each with its own client, and waits for them all:
/// when the last landed and what they cost together.
pub async fn all_at_once<F, Fut>(clients: &[Client], start: F) -> (Instant, WriteStats)
where
    F: Fn(usize, Client) -> Fut,
    Fut: std::future::Future<Output = WriteStats> + Send + 'static,
{
    let tasks: Vec<_> = clients
        .iter()
        .enumerate()
        .map(|(i, client)| tokio::spawn(start(i, client.clone())))
        .collect();
    let mut total = WriteStats::default();
    for stats in futures::future::join_all(tasks).await {
        let stats = stats.expect("a model node's task");
        total.puts += stats.puts;
        total.conflicts += stats.conflicts;
        total.errors += stats.errors;
    }
    (Instant::now(), total)
}

/// Ends every watch task.
pub async fn end_watches(watches: Vec<tokio::task::JoinHandle<()>>) {
    for watch in &watches {
        watch.abort();
    }
    for watch in watches {
        let _ = watch.await;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec() -> ModelSpec {
        ModelSpec::new(6, 2, Objects::One)
    }

    #[test]
    fn a_node_takes_the_lowest_index_free_in_its_clique_once() {
        let spec = spec();
        let mut nodes: Vec<Value> = Vec::new();
        for i in [0, 3, 1] {
            nodes = with_entry(&nodes, &spec.entry(i)).unwrap();
        }
        let indices: Vec<(String, u64)> = nodes
            .iter()
            .map(|n| {
                (
                    n["name"].as_str().unwrap().to_owned(),
                    n["index"].as_u64().unwrap(),
                )
            })
            .collect();
        assert_eq!(
            indices,
            [
                ("model-node-001".to_owned(), 0),
                ("model-node-004".to_owned(), 0),
                ("model-node-002".to_owned(), 1),
            ]
        );
        assert_eq!(with_entry(&nodes, &spec.entry(3)), None, "already there");
        assert_eq!(nodes[0]["status"], "NotReady");

        let fewer = without_entry(&nodes, "model-node-001").unwrap();
        assert_eq!(registered(std::slice::from_ref(&fewer)), 2);
        assert_eq!(without_entry(&fewer, "model-node-001"), None);
        // The gap is filled again.
        let back = with_entry(&fewer, &spec.entry(0)).unwrap();
        assert_eq!(back[2]["index"], 0);
    }

    #[test]
    fn objects_one_or_one_per_clique() {
        let one = spec();
        assert_eq!(one.object_names("run"), ["run"]);
        assert_eq!((one.object_of(0), one.object_of(5)), (0, 0));
        let per = ModelSpec::new(6, 2, Objects::PerClique);
        assert_eq!(per.object_names("run"), ["run-c0", "run-c1"]);
        assert_eq!((per.object_of(2), per.object_of(3)), (0, 1));
        assert_eq!(per.entry(4).clique, "model.1");
        assert_eq!(
            registered(&[
                with_entry(&[], &per.entry(0)).unwrap(),
                with_entry(&[], &per.entry(4)).unwrap()
            ]),
            2
        );
    }

    #[test]
    fn the_backoff_doubles_to_its_cap_and_jitters_the_second_half() {
        let backoff = Backoff::DEFAULT;
        assert_eq!(backoff.delay(1, 0.0), Duration::from_micros(2500));
        assert_eq!(backoff.delay(1, 0.5), Duration::from_micros(3750));
        assert_eq!(backoff.delay(3, 0.0), Duration::from_millis(10));
        assert_eq!(backoff.delay(30, 0.0), Duration::from_millis(500));
        assert_eq!(backoff.delay(30, 1.0), Duration::from_secs(1));
        let mut draws = Draws::new(7);
        let drawn: Vec<f64> = (0..1000).map(|_| draws.draw()).collect();
        assert!(drawn.iter().all(|d| (0.0..1.0).contains(d)));
        let mean = drawn.iter().sum::<f64>() / 1000.0;
        assert!((0.4..0.6).contains(&mean), "{mean}");
        assert_ne!(Draws::new(1).draw(), Draws::new(2).draw());
    }
}
