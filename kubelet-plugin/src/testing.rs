//! A fake node behind the kubelet plugin's servers (`testing` feature), for the gRPC
//! tests of this crate and of the binary's `kubelet-sim`. It honours `NodePlugin`'s
//! contract: a claim prepared twice answers the same, failures are permanent or
//! retryable, and a call the server gives up on is dropped, not left running. It also
//! feeds the servers its devices' health, which a test sets ([`FakeNodePlugin::set_device_health`]).

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use domaind_actors::model::ClaimRef;
use tempfile::TempDir;
use tokio::sync::watch;

use super::{
    ClaimFailure, DeviceHealthEntry, DeviceHealthFeed, KubeletPluginServer, NodePlugin,
    PluginServerConfig, PreparedDevice, RunningPluginServer,
};

/// How long a test waits for a server's answer (and `until_called` for a claim) before
/// failing instead of hanging.
pub const PATIENCE: Duration = Duration::from_secs(10);

/// `future`'s output, or a panic naming `what` after [`PATIENCE`].
pub async fn within<F: std::future::Future>(what: &str, future: F) -> F::Output {
    domaind_testkit::within(what, PATIENCE, future).await
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Prepare,
    Unprepare,
}

/// A node that answers by claim name: `fail…` fails for good, `retry…` fails for now,
/// `block…` waits until released, `wait-for-X` waits until claim X has been called, and
/// anything else succeeds with one channel device. It records every call.
#[derive(Debug)]
pub struct FakeNodePlugin {
    calls: watch::Sender<Vec<(Op, ClaimRef)>>,
    released: watch::Sender<bool>,
    /// Calls running now: a call the server gave up on must not run on.
    pub active: watch::Sender<usize>,
    device_health: watch::Sender<Arc<Vec<DeviceHealthEntry>>>,
}

/// Counts a call as active until its future ends or is dropped.
#[derive(Debug)]
struct Active(watch::Sender<usize>);

impl Active {
    fn new(active: &watch::Sender<usize>) -> Self {
        active.send_modify(|n| *n += 1);
        Self(active.clone())
    }
}

impl Drop for Active {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

impl FakeNodePlugin {
    pub fn new() -> Arc<Self> {
        Arc::new(Self {
            calls: watch::Sender::new(Vec::new()),
            released: watch::Sender::new(false),
            active: watch::Sender::new(0),
            device_health: watch::Sender::new(Arc::new(Vec::new())),
        })
    }

    /// Replaces the health [`serve`] reports for this node's devices (none at first).
    pub fn set_device_health(&self, devices: Vec<DeviceHealthEntry>) {
        self.device_health.send_replace(Arc::new(devices));
    }

    /// The feed [`serve`] gives the servers.
    pub fn device_health_feed(&self) -> DeviceHealthFeed {
        self.device_health.subscribe()
    }

    pub fn calls(&self) -> Vec<(Op, ClaimRef)> {
        self.calls.borrow().clone()
    }

    pub fn called_names(&self) -> BTreeSet<String> {
        self.calls().into_iter().map(|(_, c)| c.name).collect()
    }

    pub async fn until_called(&self, name: &str) {
        let mut calls = self.calls.subscribe();
        within(
            &format!("claim {name} to reach the node"),
            calls.wait_for(|calls| calls.iter().any(|(_, c)| c.name == name)),
        )
        .await
        .expect("the fake outlives its calls");
    }

    pub fn release(&self) {
        self.released.send_replace(true);
    }

    async fn answer(&self, op: Op, claim: &ClaimRef) -> Result<(), ClaimFailure> {
        let _active = Active::new(&self.active);
        self.calls
            .send_modify(|calls| calls.push((op, claim.clone())));
        let name = claim.name.as_str();
        if let Some(other) = name.strip_prefix("wait-for-") {
            let mut calls = self.calls.subscribe();
            let _ = calls
                .wait_for(|calls| calls.iter().any(|(_, c)| c.name == other))
                .await;
        }
        if name.starts_with("block") {
            let _ = self
                .released
                .subscribe()
                .wait_for(|released| *released)
                .await;
        }
        if name.starts_with("fail") {
            Err(ClaimFailure::permanent(format!("{name}: broken for good")))
        } else if name.starts_with("retry") {
            Err(ClaimFailure::retryable(format!("{name}: not ready yet")))
        } else {
            Ok(())
        }
    }
}

pub fn device_for(claim: &ClaimRef) -> PreparedDevice {
    PreparedDevice {
        request_names: vec!["channel".into()],
        pool_name: "node-a".into(),
        device_name: format!("channel-{}", claim.name),
        cdi_device_ids: vec![format!("k8s.compute-domain.nvidia.com/claim={}", claim.uid)],
    }
}

#[async_trait]
impl NodePlugin for FakeNodePlugin {
    async fn prepare(&self, claim: ClaimRef) -> Result<Vec<PreparedDevice>, ClaimFailure> {
        self.answer(Op::Prepare, &claim).await?;
        Ok(vec![device_for(&claim)])
    }

    async fn unprepare(&self, claim: ClaimRef) -> Result<(), ClaimFailure> {
        self.answer(Op::Unprepare, &claim).await
    }
}

pub fn claim(uid: &str, namespace: &str, name: &str) -> ClaimRef {
    ClaimRef {
        uid: uid.into(),
        namespace: namespace.into(),
        name: name.into(),
    }
}

/// Unix socket paths must fit in 108 bytes: a short directory under /tmp.
pub fn short_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("dra")
        .tempdir_in("/tmp")
        .expect("a temporary directory under /tmp")
}

/// The servers' configuration with both sockets under `dir`.
pub fn config(dir: &Path) -> PluginServerConfig {
    PluginServerConfig {
        plugins_dir: dir.join("plugins"),
        registry_dir: dir.join("registry"),
        ..PluginServerConfig::default()
    }
}

/// The real servers over unix sockets under `dir`, with `plugin` behind them and its
/// device health fed to them.
pub async fn serve(dir: &Path, plugin: &Arc<FakeNodePlugin>) -> RunningPluginServer {
    let config = PluginServerConfig {
        device_health: plugin.device_health_feed(),
        ..config(dir)
    };
    KubeletPluginServer::start(config, plugin.clone())
        .await
        .expect("the plugin servers start")
}
