//! Where a node's gossip seeds come from: its clique-mates in the API server
//! ([`domaind_backends::kube::peers`]), a static `--seed` list, or nowhere (a node without fabric
//! gossips with nobody).
//!
//! Static seeds that are DNS names are resolved here rather than by chitchat, which
//! takes every address a name resolves to and, while it knows fewer live nodes than
//! seeds, adds a random seed to every round: a name that resolves to a whole fleet
//! would keep each node knocking on other cliques' doors. Each name contributes at
//! most [`MAX_ADDRESSES_PER_NAME`] addresses, a different share on each node, and is
//! resolved again every [`RESOLVE_INTERVAL`] (a node that starts first finds the
//! others when they appear).

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use anyhow::bail;
use futures::future::BoxFuture;
use tokio_util::sync::CancellationToken;
use tracing::{info, warn};

use super::args::{Backend, SeedDiscovery};
use domaind_backends::kube::SeedSink;

/// Addresses taken from one name at most.
pub const MAX_ADDRESSES_PER_NAME: usize = 32;
/// How often static seed names are resolved again.
pub const RESOLVE_INTERVAL: Duration = Duration::from_secs(60);

/// Addresses a seed name resolved to beyond [`MAX_ADDRESSES_PER_NAME`], not taken.
pub const SEED_ADDRESSES_DROPPED: &str = "domaind_gossip_seed_addresses_dropped_total";
/// Seed names that did not resolve.
pub const SEED_RESOLVE_FAILURES: &str = "domaind_gossip_seed_resolve_failures_total";

/// What a node seeds from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeedPlan {
    /// The empty clique: gossip with nobody.
    Nobody,
    /// Its clique-mates in the API server.
    ApiServer,
    /// The `--seed` list.
    Static(Vec<String>),
}

/// Chooses the seeds' source; an error for a combination that cannot work.
pub fn plan(
    discovery: SeedDiscovery,
    backend: Backend,
    clique: &str,
    seeds: &[String],
) -> anyhow::Result<SeedPlan> {
    let seeds: Vec<String> = seeds
        .iter()
        .map(|s| s.trim().to_owned())
        .filter(|s| !s.is_empty())
        .collect();
    let api_server = match discovery {
        SeedDiscovery::Auto => backend == Backend::Kube && seeds.is_empty(),
        SeedDiscovery::ApiServer => {
            if backend != Backend::Kube {
                bail!("--seed-discovery api-server needs --backend kube");
            }
            if !seeds.is_empty() {
                bail!(
                    "--seed and --seed-discovery api-server exclude each other: seeds come from the API server, or from the list (--seed-discovery static)"
                );
            }
            true
        }
        SeedDiscovery::Static => false,
    };
    Ok(if clique.is_empty() {
        SeedPlan::Nobody
    } else if api_server {
        SeedPlan::ApiServer
    } else {
        SeedPlan::Static(seeds)
    })
}

/// Resolves a `host:port`; a test's fake answers in tests.
pub type Resolver =
    Arc<dyn Fn(String) -> BoxFuture<'static, std::io::Result<Vec<SocketAddr>>> + Send + Sync>;

/// The system's resolver.
pub fn system_resolver() -> Resolver {
    Arc::new(|name| Box::pin(async move { Ok(tokio::net::lookup_host(name).await?.collect()) }))
}

/// Static seeds split: addresses as given, and names to resolve.
pub fn split(seeds: &[String]) -> (Vec<SocketAddr>, Vec<String>) {
    let mut addresses = Vec::new();
    let mut names = Vec::new();
    for seed in seeds {
        match seed.parse() {
            Ok(address) => addresses.push(address),
            Err(_) => names.push(seed.clone()),
        }
    }
    (addresses, names)
}

/// At most `cap` of `resolved`, without duplicates: a window of the sorted addresses
/// that starts where `node` hashes to, so that nodes behind one name do not all pick
/// the same few. Also returns how many were left out.
pub fn cap(resolved: Vec<SocketAddr>, cap: usize, node: &str) -> (Vec<SocketAddr>, usize) {
    let all: Vec<SocketAddr> = resolved
        .into_iter()
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect();
    if all.len() <= cap {
        return (all, 0);
    }
    let start = crc32fast::hash(node.as_bytes()) as usize % all.len();
    let taken = all.iter().cycle().skip(start).take(cap).copied().collect();
    (taken, all.len() - cap)
}

/// Resolves static seed names now and keeps the resolved addresses.
#[derive(Clone)]
pub struct StaticSeeds {
    names: Vec<String>,
    node: String,
    resolver: Resolver,
    /// Names whose cap was logged already: once each.
    capped_logged: Arc<std::sync::Mutex<BTreeSet<String>>>,
}

impl std::fmt::Debug for StaticSeeds {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StaticSeeds")
            .field("names", &self.names)
            .field("node", &self.node)
            .finish_non_exhaustive()
    }
}

impl StaticSeeds {
    pub fn new(names: Vec<String>, node: impl Into<String>, resolver: Resolver) -> Self {
        Self {
            names,
            node: node.into(),
            resolver,
            capped_logged: Default::default(),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.names.is_empty()
    }

    /// Every name's addresses, each name capped. A name that does not resolve is
    /// counted and logged, and the others go on.
    pub async fn resolve(&self) -> Vec<SocketAddr> {
        let mut seeds = BTreeSet::new();
        for name in &self.names {
            let resolved = match (self.resolver)(name.clone()).await {
                Ok(resolved) => resolved,
                Err(error) => {
                    metrics::counter!(SEED_RESOLVE_FAILURES).increment(1);
                    warn!(seed = %name, %error, "gossip seed name does not resolve; trying again later");
                    continue;
                }
            };
            let (taken, dropped) = cap(resolved, MAX_ADDRESSES_PER_NAME, &self.node);
            if dropped > 0 {
                metrics::counter!(SEED_ADDRESSES_DROPPED).increment(dropped as u64);
                let first = self
                    .capped_logged
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(name.clone());
                if first {
                    warn!(
                        seed = %name,
                        resolved = taken.len() + dropped,
                        taken = taken.len(),
                        "gossip seed name resolves to more addresses than a node takes from one name; the rest are left out (any one live clique-mate is enough; a list of every daemon is what seeding from the API server avoids)"
                    );
                }
            }
            seeds.extend(taken);
        }
        seeds.into_iter().collect()
    }

    /// Resolves again every `interval` and hands the addresses to `sink`, until `stop`.
    pub async fn follow(
        self,
        sink: Arc<dyn SeedSink>,
        interval: Duration,
        stop: CancellationToken,
    ) {
        let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + interval, interval);
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tokio::select! {
                () = stop.cancelled() => return,
                _ = tick.tick() => {
                    let seeds = self.resolve().await;
                    if !seeds.is_empty() {
                        sink.set_seeds(seeds);
                    }
                }
            }
        }
    }
}

/// Logs the plan once, at start.
pub fn announce(plan: &SeedPlan) {
    match plan {
        SeedPlan::Nobody => info!("no clique (no fabric): gossiping with nobody, no seeds"),
        SeedPlan::ApiServer => info!("gossip seeds: this clique's nodes, from the API server"),
        SeedPlan::Static(seeds) => info!(?seeds, "gossip seeds: a static list"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Mutex;

    use metrics_util::debugging::{DebugValue, DebuggingRecorder};

    use super::*;

    fn strings(seeds: &[&str]) -> Vec<String> {
        seeds.iter().map(|s| (*s).to_owned()).collect()
    }

    #[test]
    fn the_plan_follows_the_backend_the_flags_and_the_clique() {
        use Backend::{Kube, Local};
        use SeedDiscovery::{ApiServer, Auto, Static};
        let listed = strings(&["10.0.0.1:7946"]);
        let c = "uuid.1";
        assert_eq!(plan(Auto, Kube, c, &[]).unwrap(), SeedPlan::ApiServer);
        assert_eq!(
            plan(Auto, Kube, c, &listed).unwrap(),
            SeedPlan::Static(listed.clone())
        );
        assert_eq!(
            plan(Auto, Local, c, &listed).unwrap(),
            SeedPlan::Static(listed.clone())
        );
        assert_eq!(
            plan(Static, Kube, c, &[]).unwrap(),
            SeedPlan::Static(vec![])
        );
        assert_eq!(plan(ApiServer, Kube, c, &[]).unwrap(), SeedPlan::ApiServer);
        assert!(plan(ApiServer, Local, c, &[]).is_err());
        assert!(plan(ApiServer, Kube, c, &listed).is_err());
        // No fabric: nobody, whatever was asked.
        for discovery in [Auto, ApiServer, Static] {
            assert_eq!(plan(discovery, Kube, "", &[]).unwrap(), SeedPlan::Nobody);
        }
        assert_eq!(plan(Static, Local, "", &listed).unwrap(), SeedPlan::Nobody);
        // An empty DOMAIND_SEEDS is no seed.
        assert_eq!(
            plan(Auto, Kube, c, &strings(&[""])).unwrap(),
            SeedPlan::ApiServer
        );
    }

    #[test]
    fn addresses_are_kept_and_names_resolved() {
        let (addresses, names) = split(&strings(&["10.0.0.1:7946", "seeds.example:7946"]));
        assert_eq!(addresses, ["10.0.0.1:7946".parse::<SocketAddr>().unwrap()]);
        assert_eq!(names, ["seeds.example:7946"]);
    }

    fn fleet(n: usize) -> Vec<SocketAddr> {
        (0..n)
            .map(|i| SocketAddr::from(([10, 0, (i / 250) as u8, (i % 250) as u8 + 1], 7946)))
            .collect()
    }

    #[test]
    fn a_name_of_hundreds_gives_each_node_its_own_capped_share() {
        let (few, dropped) = cap(fleet(5), 32, "n1");
        assert_eq!((few.len(), dropped), (5, 0));
        let (a, dropped) = cap(fleet(1000), 32, "node-a");
        assert_eq!((a.len(), dropped), (32, 968));
        assert_eq!(a.iter().collect::<BTreeSet<_>>().len(), 32, "distinct");
        let (b, _) = cap(fleet(1000), 32, "node-b");
        assert_ne!(a, b, "nodes take different shares");
        assert_eq!(
            cap(fleet(1000), 32, "node-a").0,
            a,
            "the same node the same share"
        );
    }

    fn fake_resolver(answers: Vec<(&'static str, std::io::Result<Vec<SocketAddr>>)>) -> Resolver {
        let answers = Arc::new(Mutex::new(answers));
        Arc::new(move |name| {
            let answers = answers.clone();
            Box::pin(async move {
                let answers = answers.lock().unwrap();
                match answers.iter().find(|(n, _)| *n == name) {
                    Some((_, Ok(addresses))) => Ok(addresses.clone()),
                    Some((_, Err(error))) => {
                        Err(std::io::Error::new(error.kind(), error.to_string()))
                    }
                    None => Err(std::io::Error::other("unknown name")),
                }
            })
        })
    }

    type Snapshot = Vec<(
        metrics_util::CompositeKey,
        Option<metrics::Unit>,
        Option<metrics::SharedString>,
        DebugValue,
    )>;

    /// A snapshot drains the counters: read them all from one.
    fn counter(snapshot: &Snapshot, name: &str) -> u64 {
        snapshot
            .iter()
            .filter(|(key, ..)| key.key().name() == name)
            .map(|(.., value)| match value {
                DebugValue::Counter(n) => *n,
                _ => 0,
            })
            .sum()
    }

    #[tokio::test]
    async fn a_huge_name_is_capped_and_a_dead_name_does_not_stop_the_others() {
        let recorder = DebuggingRecorder::new();
        let _local = metrics::set_default_local_recorder(&recorder);
        let seeds = StaticSeeds::new(
            strings(&["fleet:7946", "gone:7946", "rack:7946"]),
            "node-a",
            fake_resolver(vec![
                ("fleet:7946", Ok(fleet(500))),
                ("gone:7946", Err(std::io::Error::other("NXDOMAIN"))),
                ("rack:7946", Ok(vec!["192.168.0.1:7946".parse().unwrap()])),
            ]),
        );
        let resolved = seeds.resolve().await;
        assert_eq!(resolved.len(), MAX_ADDRESSES_PER_NAME + 1);
        assert!(resolved.contains(&"192.168.0.1:7946".parse().unwrap()));
        let snapshot = recorder.snapshotter().snapshot().into_vec();
        assert_eq!(counter(&snapshot, SEED_ADDRESSES_DROPPED), 500 - 32);
        assert_eq!(counter(&snapshot, SEED_RESOLVE_FAILURES), 1);
        assert_eq!(seeds.capped_logged.lock().unwrap().len(), 1);
        // Resolving again logs nothing new.
        seeds.resolve().await;
        assert_eq!(seeds.capped_logged.lock().unwrap().len(), 1);
    }
}
