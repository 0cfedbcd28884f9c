//! A rack of node actors over in-memory fakes, in paused time.
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::future::Future;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use actix::prelude::*;
use domaind_actors::model::{
    AllocationMode, ClaimInfo, ClaimRef, CliqueId, DomainRef, DomainUid, Isolation, ReadinessPolicy,
};
use domaind_actors::ports::{ClaimError, Imex};
use domaind_actors::testing::{
    FakeCheckpointStore, FakeClaimSource, FakeClock, FakeEventSink, FakeGossip, FakeGossipNet,
    FakeImex, FakeImexFabric, FakeStatusSink,
};
use domaind_actors::{
    GetSnapshot, NodeActor, NodeConfig, NodeSnapshot, Ports, PrepareError, Prepared, Shutdown,
};

/// Runs `test` in an actix system on a paused, single-threaded tokio runtime.
pub fn run<F: Future<Output = ()>>(test: impl FnOnce() -> F) {
    // RUST_LOG=info shows what the actors did; silent otherwise.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    domaind_actors::testing::run_paused_actix(test);
}

pub struct TestNode {
    pub addr: Addr<NodeActor>,
    pub gossip: FakeGossip,
    pub imex: FakeImex,
    pub checkpoint: FakeCheckpointStore,
    pub events: FakeEventSink,
    /// What the node publishes of its prepared devices' health.
    pub health: domaind_actors::HealthBoard,
    pub generation: u64,
    /// Its address is `127.0.1.<index>`, the same across restarts.
    pub index: u8,
}

pub struct Rack {
    pub net: FakeGossipNet,
    pub fabric: FakeImexFabric,
    pub status: FakeStatusSink,
    pub claims: FakeClaimSource,
    pub nodes: BTreeMap<String, TestNode>,
    pub configure: fn(&mut NodeConfig),
}

pub fn domain(uid: &str, num_nodes: u32) -> DomainRef {
    DomainRef {
        uid: DomainUid(uid.into()),
        namespace: "team-a".into(),
        name: format!("cd-{uid}"),
        num_nodes,
    }
}

pub fn claim_ref(uid: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

impl Default for Rack {
    fn default() -> Self {
        Self {
            net: FakeGossipNet::default(),
            fabric: FakeImexFabric::default(),
            status: FakeStatusSink::default(),
            claims: FakeClaimSource::default(),
            nodes: BTreeMap::new(),
            configure: |_| {},
        }
    }
}

impl Rack {
    /// Starts (or restarts, keeping its checkpoint) a node.
    pub fn start(&mut self, node: &str) {
        let net = self.net.clone();
        self.start_in(node, &net, CliqueId("cluster-1.0".into()));
    }

    /// Starts a node in `clique`, gossiping on `net` (one net per clique).
    pub fn start_in(&mut self, node: &str, net: &FakeGossipNet, clique: CliqueId) {
        let (checkpoint, generation, index) = match self.nodes.get(node) {
            Some(old) => (old.checkpoint.clone(), old.generation + 1, old.index),
            None => (
                FakeCheckpointStore::default(),
                1,
                self.nodes.len() as u8 + 1,
            ),
        };
        let gossip = net.join(node, generation);
        let imex = self.fabric.daemon(node);
        let events = FakeEventSink::default();
        let health = domaind_actors::HealthBoard::default();
        let mut config = NodeConfig::new(node, IpAddr::from([127, 0, 1, index]), clique);
        (self.configure)(&mut config);
        let ports = Ports {
            gossip: Arc::new(gossip.clone()),
            imex: Arc::new(imex.clone()),
            status: Arc::new(self.status.for_node(node)),
            events: Arc::new(events.clone()),
            claims: Arc::new(self.claims.clone()),
            checkpoint: Arc::new(checkpoint.clone()),
            clock: Arc::new(FakeClock::new(1_700_000_000_000)),
            health: health.clone(),
        };
        let addr = NodeActor::new(config, ports).start();
        self.nodes.insert(
            node.to_owned(),
            TestNode {
                addr,
                gossip,
                imex,
                checkpoint,
                events,
                health,
                generation,
                index,
            },
        );
    }

    /// The node dies: gossip declares it dead, its IMEX daemon dies with it.
    pub fn kill(&mut self, node: &str) {
        let n = &self.nodes[node];
        n.addr.do_send(Shutdown { stop_imex: false });
        self.net.kill(node);
        self.fabric.crash(node);
    }

    /// Only the node daemon dies (a crash, an OOM kill): its gossip goes silent, and
    /// its IMEX daemon lives on if the fabric keeps daemons
    /// ([`FakeImexFabric::keep_daemons`]), as under an IMEX runner.
    pub fn kill_daemon(&mut self, node: &str) {
        self.nodes[node].addr.do_send(Shutdown { stop_imex: false });
        self.net.kill(node);
        if !self.nodes[node].imex.outlives_node_daemon() {
            self.fabric.crash(node);
        }
    }

    pub fn claim(&self, uid: &str, domain: &DomainRef, policy: Option<ReadinessPolicy>) {
        self.claims.insert(
            uid,
            Ok(ClaimInfo {
                domain: domain.clone(),
                allocation_mode: AllocationMode::Single,
                readiness: policy,
                devices: Vec::new(),
                isolation: Default::default(),
                admin_access: false,
            }),
        );
    }

    /// A claim allocated `channel-0` of `node`'s pool.
    pub fn claim_with_device(&self, uid: &str, domain: &DomainRef, node: &str) {
        self.claims.insert(
            uid,
            Ok(ClaimInfo {
                domain: domain.clone(),
                allocation_mode: AllocationMode::Single,
                readiness: Some(ReadinessPolicy::Local),
                devices: vec![domaind_actors::model::AllocatedDevice {
                    request: "channel".into(),
                    pool: node.into(),
                    device: "channel-0".into(),
                }],
                isolation: Default::default(),
                admin_access: false,
            }),
        );
    }

    /// A claim of a domain with `isolation: Channel`.
    pub fn sharing_claim(&self, uid: &str, domain: &DomainRef, mode: AllocationMode) {
        self.claims.insert(
            uid,
            Ok(ClaimInfo {
                domain: domain.clone(),
                allocation_mode: mode,
                readiness: None,
                devices: Vec::new(),
                isolation: domaind_actors::model::Isolation::Channel,
                admin_access: false,
            }),
        );
    }

    /// A claim allocated with `adminAccess` (a monitoring pod's), naming `domain`.
    pub fn admin_claim(&self, uid: &str, domain: &DomainRef, isolation: Isolation) {
        self.claims.insert(
            uid,
            Ok(ClaimInfo {
                domain: domain.clone(),
                allocation_mode: AllocationMode::Single,
                readiness: None,
                devices: Vec::new(),
                isolation,
                admin_access: true,
            }),
        );
    }

    pub fn bad_claim(&self, uid: &str, error: ClaimError) {
        self.claims.insert(uid, Err(error));
    }

    pub async fn prepare(&self, node: &str, claim: &str) -> Result<Prepared, PrepareError> {
        prepare_on(self.nodes[node].addr.clone(), claim_ref(claim)).await
    }

    pub async fn unprepare(&self, node: &str, claim: &str) -> Result<(), PrepareError> {
        self.nodes[node]
            .addr
            .send(domaind_actors::Unprepare(claim.into()))
            .await
            .expect("node alive")
    }

    pub async fn snapshot(&self, node: &str) -> NodeSnapshot {
        self.nodes[node]
            .addr
            .send(GetSnapshot)
            .await
            .expect("node alive")
    }

    pub async fn snapshots(&self, nodes: &[&str]) -> Vec<NodeSnapshot> {
        let mut out = Vec::new();
        for node in nodes {
            out.push(self.snapshot(node).await);
        }
        out
    }

    /// Polls until `check` holds for the given nodes' snapshots, failing after `limit`
    /// of (paused) time.
    pub async fn wait_until(
        &self,
        limit: Duration,
        what: &str,
        nodes: &[&str],
        mut check: impl FnMut(&[NodeSnapshot]) -> bool,
    ) {
        domaind_testkit::poll_for(what, limit, async || {
            let snapshots = self.snapshots(nodes).await;
            if check(&snapshots) {
                Ok(())
            } else {
                Err(snapshots)
            }
        })
        .await;
    }
}

/// What the kubelet plugin does for one claim: prepare, then record the answer.
pub async fn prepare_on(node: Addr<NodeActor>, claim: ClaimRef) -> Result<Prepared, PrepareError> {
    let uid = claim.uid.clone();
    let prepared = node
        .send(domaind_actors::Prepare(claim))
        .await
        .expect("node alive")?;
    node.send(domaind_actors::Complete {
        claim_uid: uid,
        devices: Vec::new(),
        channel: prepared.channel,
    })
    .await
    .expect("node alive")?;
    Ok(prepared)
}
