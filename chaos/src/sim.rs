//! `SimCluster`: a rack of nodes in one process, over an in-memory network.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use actix::prelude::*;
use domaind_actors::model::{
    AllocationMode, ClaimInfo, ClaimRef, CliqueId, DomainRef, DomainUid, ReadinessPolicy,
};
use domaind_actors::testing::{
    DaemonState, FakeCheckpointStore, FakeClaimSource, FakeClock, FakeEventSink, FakeImexFabric,
    FakeStatusSink, StatusWrite,
};
use domaind_actors::{
    Complete, GetSnapshot, NodeActor, NodeConfig, NodeSnapshot, Ports, Prepare, PrepareError,
    Prepared, Shutdown, Unprepare,
};
use domaind_gossip::pki::{DevCa, NodeCertRequest};
use domaind_gossip::pulse::MemoryPulses;
use domaind_gossip::transport::{FaultyTransport, NetworkFaults};
use domaind_gossip::{
    ChannelTransport, GossipConfig, GossipNode, GossipTiming, NodeName, cluster_id_for_clique,
};
use domaind_node::run::GossipPort;
use domaind_testkit::poll_every;
use tracing::info;

use crate::traffic::{CliqueTraffic, Count, CountingTransport};

/// How a simulated rack is set up.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Seeds the network's fault decisions.
    pub seed: u64,
    /// The clique of nodes started with [`SimCluster::start_node`]; others join the
    /// clique [`SimCluster::start_node_in`] names.
    pub clique: String,
    pub timing: GossipTiming,
    /// Applied to every node's configuration.
    pub node: fn(&mut NodeConfig),
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            seed: 1,
            clique: "cluster-1.0".into(),
            timing: GossipTiming::default(),
            node: |_| {},
        }
    }
}

struct SimNode {
    name: String,
    clique: String,
    addr: SocketAddr,
    actor: Option<Addr<NodeActor>>,
    gossip: Option<Arc<GossipNode>>,
    checkpoint: FakeCheckpointStore,
    events: FakeEventSink,
    generation: u64,
}

/// What the harness sees from outside: live nodes' snapshots, the IMEX daemons, the
/// status writes and the answers to prepare calls.
#[derive(Debug, Clone, Default)]
pub struct ClusterView {
    pub nodes: BTreeMap<String, NodeSnapshot>,
    pub daemons: BTreeMap<String, DaemonState>,
    pub writes: Vec<StatusWrite>,
    pub prepared: BTreeMap<String, Result<Prepared, PrepareError>>,
}

pub struct SimCluster {
    config: SimConfig,
    faults: NetworkFaults,
    transport: CountingTransport<FaultyTransport<ChannelTransport>>,
    pulses: MemoryPulses,
    by_clique: CliqueTraffic,
    fabric: FakeImexFabric,
    status: FakeStatusSink,
    claims: FakeClaimSource,
    domains: BTreeMap<String, DomainRef>,
    nodes: BTreeMap<usize, SimNode>,
    /// Signs every simulated node's certificate: gossip state is signed here as on
    /// real nodes.
    ca: DevCa,
    prepared: Arc<Mutex<BTreeMap<String, Result<Prepared, PrepareError>>>>,
    poll: Duration,
}

impl std::fmt::Debug for SimCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SimCluster")
            .field("nodes", &self.nodes.len())
            .finish_non_exhaustive()
    }
}

/// Node names sort in index order.
pub fn node_name(index: usize) -> String {
    format!("node-{index:03}")
}

fn node_ip(index: usize) -> IpAddr {
    IpAddr::from([127, 0, (index / 250) as u8 + 1, (index % 250) as u8 + 1])
}

impl SimCluster {
    pub fn new(config: SimConfig) -> Self {
        let faults = NetworkFaults::new(config.seed);
        let network = ChannelTransport::with_mtu(65_507);
        let by_clique = CliqueTraffic::default();
        Self {
            transport: CountingTransport::new(
                FaultyTransport::new(network, faults.clone()),
                by_clique.clone(),
            ),
            pulses: MemoryPulses::new()
                .with_faults(faults.clone())
                .observed_by(by_clique.pulse_observer()),
            by_clique,
            faults,
            fabric: FakeImexFabric::default(),
            status: FakeStatusSink::default(),
            claims: FakeClaimSource::default(),
            domains: BTreeMap::new(),
            nodes: BTreeMap::new(),
            ca: DevCa::generate("domaind simulation CA", time::Duration::days(1))
                .expect("a CA can be generated"),
            prepared: Arc::default(),
            poll: Duration::from_millis(200),
            config,
        }
    }

    /// How often `wait_for` looks (simulated time): finer for measurements.
    pub fn set_poll_interval(&mut self, poll: Duration) {
        self.poll = poll;
    }

    pub fn faults(&self) -> &NetworkFaults {
        &self.faults
    }

    pub fn fabric(&self) -> &FakeImexFabric {
        &self.fabric
    }

    pub fn status(&self) -> &FakeStatusSink {
        &self.status
    }

    /// Messages and bytes sent on the in-memory network so far: chitchat's messages
    /// and pulses.
    pub fn traffic(&self) -> (u64, u64) {
        let total = self.by_clique.total();
        (total.messages, total.bytes)
    }

    /// Gossip sent between two nodes of `clique` so far.
    pub fn traffic_within(&self, clique: &str) -> Count {
        self.by_clique.within(clique)
    }

    /// Gossip sent from a node of one clique to a node of another so far.
    pub fn traffic_across_cliques(&self) -> Count {
        self.by_clique.across()
    }

    pub fn clique_of(&self, index: usize) -> Option<&str> {
        self.nodes.get(&index).map(|n| n.clique.as_str())
    }

    /// The nodes node `index`'s gossip lists as live members (itself included), or
    /// `None` while it is down.
    pub fn gossip_members(&self, index: usize) -> Option<BTreeSet<String>> {
        let gossip = self.nodes.get(&index)?.gossip.as_ref()?;
        Some(gossip.live_nodes().into_keys().collect())
    }

    pub fn events_of(&self, index: usize) -> Vec<(DomainRef, domaind_actors::ports::DomainEvent)> {
        self.nodes
            .get(&index)
            .map(|n| n.events.events())
            .unwrap_or_default()
    }

    pub fn live_nodes(&self) -> Vec<usize> {
        self.nodes
            .iter()
            .filter(|(_, n)| n.actor.is_some())
            .map(|(i, _)| *i)
            .collect()
    }

    /// Declares a ComputeDomain claims can refer to.
    pub fn domain(&mut self, uid: &str, num_nodes: u32) -> DomainRef {
        let domain = DomainRef {
            uid: DomainUid(uid.into()),
            namespace: "sim".into(),
            name: format!("cd-{uid}"),
            num_nodes,
        };
        self.domains.insert(uid.to_owned(), domain.clone());
        domain
    }

    /// Starts node `index` (or restarts it with its checkpoint, its clique and a new
    /// generation). A new node joins the configured clique.
    pub async fn start_node(&mut self, index: usize) {
        let clique = match self.nodes.get(&index) {
            Some(old) => old.clique.clone(),
            None => self.config.clique.clone(),
        };
        self.start_node_in(index, &clique).await;
    }

    /// Starts node `index` in `clique`: its gossip cluster is that clique's, and it seeds
    /// from up to three live nodes of the same clique, as a daemon whose seeds are
    /// scoped to its clique does. A node with the empty clique (no fabric) seeds from
    /// nobody.
    pub async fn start_node_in(&mut self, index: usize, clique: &str) {
        let name = node_name(index);
        let addr = SocketAddr::new(node_ip(index), 7946);
        let (checkpoint, generation) = match self.nodes.get(&index) {
            Some(old) => (old.checkpoint.clone(), old.generation + 1),
            None => (FakeCheckpointStore::default(), 1),
        };
        let seeds: Vec<String> = self
            .nodes
            .iter()
            .filter(|(i, n)| {
                !clique.is_empty() && **i != index && n.clique == clique && n.gossip.is_some()
            })
            .take(3)
            .map(|(_, n)| n.addr.to_string())
            .collect();
        let mut gossip_config = GossipConfig::new(
            NodeName::new(&name).expect("valid node name"),
            addr,
            cluster_id_for_clique(clique),
        );
        gossip_config.generation = generation;
        gossip_config.seeds = seeds;
        gossip_config.timing = self.config.timing.clone();
        let node = NodeName::new(&name).expect("valid node name");
        let credentials = self
            .ca
            .issue(&NodeCertRequest::new(node.clone(), time::Duration::days(1)))
            .expect("a node certificate can be issued")
            .credentials(&node)
            .expect("its credentials load")
            .fixed();
        self.by_clique.assign(addr, clique);
        let gossip = Arc::new(
            GossipNode::start(gossip_config, &self.transport, &self.pulses, credentials)
                .await
                .expect("the in-memory address is free"),
        );
        let mut node_config = NodeConfig::new(&name, node_ip(index), CliqueId(clique.to_owned()));
        (self.config.node)(&mut node_config);
        let events = FakeEventSink::default();
        let ports = Ports {
            gossip: Arc::new(GossipPort(gossip.clone())),
            imex: Arc::new(self.fabric.daemon(&name)),
            status: Arc::new(self.status.for_node(&name)),
            events: Arc::new(events.clone()),
            claims: Arc::new(self.claims.clone()),
            checkpoint: Arc::new(checkpoint.clone()),
            clock: Arc::new(FakeClock::new(1_700_000_000_000)),
            health: domaind_actors::HealthBoard::default(),
        };
        let actor = NodeActor::new(node_config, ports).start();
        info!(node = %name, generation, "simulated node started");
        self.nodes.insert(
            index,
            SimNode {
                name,
                clique: clique.to_owned(),
                addr,
                actor: Some(actor),
                gossip: Some(gossip),
                checkpoint,
                events,
                generation,
            },
        );
    }

    /// The node dies: no goodbye, its IMEX daemon dies with it.
    pub async fn kill(&mut self, index: usize) {
        let Some(node) = self.nodes.get_mut(&index) else {
            return;
        };
        if let Some(actor) = node.actor.take() {
            actor.do_send(Shutdown { stop_imex: false });
        }
        if let Some(gossip) = node.gossip.take() {
            let _ = gossip.stop().await;
        }
        self.pulses.close(node.addr);
        self.fabric.crash(&node.name);
        info!(node = %node.name, "simulated node killed");
    }

    /// The node leaves for good: its claims are unprepared first.
    pub async fn remove(&mut self, index: usize) {
        let Some(node) = self.nodes.get(&index) else {
            return;
        };
        if let Some(actor) = node.actor.clone() {
            let claims = actor
                .send(GetSnapshot)
                .await
                .map(|s| s.claims)
                .unwrap_or_default();
            for claim in claims {
                let _ = actor.send(Unprepare(claim)).await;
            }
            actor.do_send(Shutdown { stop_imex: true });
        }
        // Let the deletions gossip before the node goes quiet.
        tokio::time::sleep(self.config.timing.pulse.interval * 10).await;
        self.kill(index).await;
        self.nodes.remove(&index);
    }

    /// Calls prepare for `claim` on `node` as a kubelet would: again after each
    /// retryable error, for up to `attempts` calls. The last answer is kept.
    pub fn prepare(
        &mut self,
        index: usize,
        claim: &str,
        domain: &str,
        policy: Option<ReadinessPolicy>,
    ) {
        let domain = self
            .domains
            .get(domain)
            .cloned()
            .unwrap_or_else(|| panic!("unknown domain {domain}"));
        self.claims.insert(
            claim,
            Ok(ClaimInfo {
                domain,
                allocation_mode: AllocationMode::Single,
                readiness: policy,
                devices: Vec::new(),
                isolation: Default::default(),
                admin_access: false,
            }),
        );
        let actor = self.nodes[&index].actor.clone().expect("node alive");
        let claim_ref = ClaimRef {
            uid: claim.into(),
            namespace: "sim".into(),
            name: format!("claim-{claim}"),
        };
        let prepared = self.prepared.clone();
        let claim = claim.to_owned();
        actix::spawn(async move {
            for _ in 0..30 {
                let Ok(mut answer) = actor.send(Prepare(claim_ref.clone())).await else {
                    return;
                };
                // As the kubelet plugin does: the answer is recorded before it is given.
                if answer.is_ok() {
                    let complete = Complete {
                        claim_uid: claim.clone(),
                        devices: Vec::new(),
                        channel: None,
                    };
                    match actor.send(complete).await {
                        Ok(Ok(())) => {}
                        Ok(Err(error)) => answer = Err(error),
                        Err(_) => return,
                    }
                }
                let retry = answer.as_ref().err().is_some_and(PrepareError::retryable);
                prepared
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .insert(claim.clone(), answer);
                if !retry {
                    return;
                }
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
        });
    }

    pub async fn unprepare(&mut self, index: usize, claim: &str) -> Result<(), PrepareError> {
        let actor = self.nodes[&index].actor.clone().expect("node alive");
        self.prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(claim);
        actor
            .send(Unprepare(claim.into()))
            .await
            .expect("node alive")
    }

    /// Cuts every link between the two groups, in gossip and between IMEX daemons.
    pub fn partition(&mut self, a: &[usize], b: &[usize]) {
        for i in a {
            for j in b {
                self.faults.cut(self.nodes[i].addr, self.nodes[j].addr);
                self.fabric.cut(&node_name(*i), &node_name(*j));
            }
        }
    }

    pub fn isolate(&mut self, index: usize) {
        let others: Vec<usize> = self.nodes.keys().copied().filter(|i| *i != index).collect();
        self.partition(&[index], &others);
    }

    pub fn heal(&mut self) {
        self.faults.heal();
        self.fabric.heal();
    }

    pub fn crash_imex(&mut self, index: usize) {
        self.fabric.crash(&node_name(index));
    }

    /// Drops `percent` % of gossip messages.
    pub fn loss(&mut self, percent: f64) {
        self.faults.set_loss(percent / 100.0);
    }

    pub async fn view(&self) -> ClusterView {
        self.view_among(None).await
    }

    /// The view of `among`'s nodes only (or of every node): in a large simulation,
    /// asking every node for its snapshot at each poll costs more than the gossip.
    async fn view_among(&self, among: Option<&[usize]>) -> ClusterView {
        let mut view = ClusterView::default();
        let nodes = self
            .nodes
            .iter()
            .filter(|(i, _)| among.is_none_or(|among| among.contains(i)))
            .map(|(_, n)| n);
        for node in nodes {
            if let Some(actor) = &node.actor
                && let Ok(snapshot) = actor.send(GetSnapshot).await
            {
                view.nodes.insert(node.name.clone(), snapshot);
            }
            if let Some(daemon) = self.fabric.state_of(&node.name) {
                view.daemons.insert(node.name.clone(), daemon);
            }
        }
        view.writes = self.status.writes();
        view.prepared = self
            .prepared
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        view
    }

    /// Polls the view until `check` passes, for at most `within` of simulated time.
    /// Returns how long it took.
    pub async fn wait_for(
        &self,
        within: Duration,
        what: &str,
        check: impl Fn(&ClusterView) -> Result<(), String>,
    ) -> Result<Duration, String> {
        self.wait_for_among(None, within, what, check).await
    }

    /// As [`SimCluster::wait_for`], with a view of `among`'s nodes only.
    pub async fn wait_for_nodes(
        &self,
        among: &[usize],
        within: Duration,
        what: &str,
        check: impl Fn(&ClusterView) -> Result<(), String>,
    ) -> Result<Duration, String> {
        self.wait_for_among(Some(among), within, what, check).await
    }

    async fn wait_for_among(
        &self,
        among: Option<&[usize]>,
        within: Duration,
        what: &str,
        check: impl Fn(&ClusterView) -> Result<(), String>,
    ) -> Result<Duration, String> {
        let start = tokio::time::Instant::now();
        poll_every(self.poll, within, async || {
            check(&self.view_among(among).await)
        })
        .await
        .map(|()| start.elapsed())
        .map_err(|why| format!("{what}: not true after {within:?}: {why}"))
    }
}

/// Runs `body` in an actix system on a paused, single-threaded tokio runtime: the
/// simulation's clock only moves when every task waits.
pub fn run_simulation<T>(body: impl std::future::Future<Output = T>) -> T {
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("a tokio runtime")
    });
    system.block_on(body)
}
