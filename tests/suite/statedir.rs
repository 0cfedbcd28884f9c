//! Issue 15: a node whose state directory is full starts, serves prepares from memory,
//! says so (`/readyz`, `/state`, the metric), and writes everything once space returns.
//! The directory is a small tmpfs of the test's own (root only: CI runs as root).

use domaind_testkit::poll_until;
use std::io::Write as _;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use domaind_actors::model::{AllocationMode, ClaimRef, ReadinessPolicy};
use domaind_backends::local::{ClaimFile, ComputeDomainRef};
use domaind_node::run::NodeView;
use domaind_testbed::rack::{LocalRack, RackSpec, http_get, prepare_until_ready, short_temp_dir};

const SUBNET: u8 = domaind_loopback::E2E_STATEDIR;
const LIMIT: Duration = Duration::from_secs(60);
const CD_UID: &str = "0b7c2a8e-5d1f-4c39-9a64-e2e0c0ff5d01";

/// A tmpfs mounted over a directory for the test's life.
struct Tmpfs(PathBuf);

impl Tmpfs {
    fn mount(dir: &Path, size: &str) -> Self {
        std::fs::create_dir_all(dir).unwrap();
        let status = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size},mode=0755")])
            .arg(format!("domaind-e2e-{}", std::process::id()))
            .arg(dir)
            .status()
            .expect("mount runs");
        assert!(
            status.success(),
            "cannot mount a tmpfs on {}",
            dir.display()
        );
        Self(dir.to_owned())
    }

    /// Writes a file until the directory is full; returns it.
    fn fill(&self) -> PathBuf {
        let path = self.0.join("fill");
        let mut file = std::fs::File::create(&path).unwrap();
        let chunk = vec![0u8; 64 << 10];
        loop {
            match file.write(&chunk) {
                Ok(0) => break,
                Ok(_) => {}
                Err(error) if error.raw_os_error() == Some(28) => break,
                Err(error) => panic!("filling {}: {error}", self.0.display()),
            }
        }
        // The last pages, smaller than a chunk.
        while file.write(&[0u8; 512]).is_ok_and(|n| n > 0) {}
        path
    }
}

impl Drop for Tmpfs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn claim(rack: &LocalRack, uid: &str) -> ClaimRef {
    rack.local()
        .write_claim(&ClaimFile {
            namespace: "team-a".into(),
            name: format!("claim-{uid}"),
            uid: uid.into(),
            compute_domain: ComputeDomainRef {
                namespace: "team-a".into(),
                name: "full-disk".into(),
                uid: CD_UID.into(),
                num_nodes: 1,
                isolation: Default::default(),
            },
            allocation_mode: AllocationMode::Single,
            readiness: Some(ReadinessPolicy::Domain),
            driver: None,
            device: None,
            admin_access: false,
        })
        .unwrap();
    ClaimRef {
        uid: uid.into(),
        namespace: "team-a".into(),
        name: format!("claim-{uid}"),
    }
}

async fn prepare(rack: &LocalRack, claim: &ClaimRef) {
    prepare_until_ready(
        &rack.node(0).dra_socket(),
        claim,
        domaind_kubelet_plugin::DraVersion::V1,
        LIMIT,
    )
    .await
    .unwrap()
    .unwrap_or_else(|error| panic!("{} not prepared: {error}", claim.uid));
}

/// The HTTP and `/state` addresses from the daemon's "domaind ready" log line: on a full
/// state directory there is no run.json to read them from.
fn ready_line_addresses(log: &Path, after: usize) -> Option<(SocketAddr, SocketAddr)> {
    let text = std::fs::read_to_string(log).ok()?;
    text[after.min(text.len())..].lines().find_map(|line| {
        let value: serde_json::Value = serde_json::from_str(line).ok()?;
        let fields = value.get("fields")?;
        if fields.get("message")?.as_str()? != "domaind ready" {
            return None;
        }
        let http = fields.get("http")?.as_str()?.parse().ok()?;
        let state = fields
            .get("state")?
            .as_str()?
            .trim_start_matches("Some(")
            .trim_end_matches(')')
            .parse()
            .ok()?;
        Some((http, state))
    })
}

async fn state(addr: SocketAddr) -> NodeView {
    let (status, body) = http_get(addr, "/state").await.unwrap();
    assert_eq!(status, 200, "{body}");
    serde_json::from_str(&body).unwrap()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs root: mounts a tmpfs (CI runs it as root)"]
async fn a_node_starts_on_a_full_state_directory_serves_from_memory_and_catches_up() {
    assert!(
        nix::unistd::geteuid().is_root(),
        "mounting a tmpfs needs root"
    );
    let tmp = short_temp_dir("dsd").unwrap();
    let domaind = domaind_e2e::binaries().domaind.clone();
    let mut spec = RackSpec::self_contained(1, domaind, tmp.path().into());
    spec.subnet = SUBNET;
    spec.log_filter = "info,domaind_gossip=warn".into();
    spec.extra_args = vec!["--log-format".into(), "json".into()];
    let mut rack = LocalRack::create(spec).unwrap();
    let state_dir = rack.node(0).state_dir();
    let disk = Tmpfs::mount(&state_dir, "2m");
    rack.start_all().unwrap();
    rack.wait_all_ready(LIMIT).unwrap();
    let before = claim(&rack, "c-before");
    prepare(&rack, &before).await;
    rack.stop(0, LIMIT).unwrap();

    // Full, and restarted: it starts, from the checkpoint it can still read.
    let fill = disk.fill();
    let log = rack.node(0).log_path();
    let log_len = std::fs::metadata(&log).unwrap().len() as usize;
    rack.start(0).unwrap();
    let (http, state_addr) = poll_until("the restarted daemon is ready", LIMIT, async || {
        ready_line_addresses(&log, log_len)
    })
    .await;
    assert!(!state_dir.join("run.json").exists());
    let view = state(state_addr).await;
    assert_eq!(view.claims, ["c-before"], "restored from the full disk");

    // New prepares are answered, and from memory once the disk refuses a write (the
    // first few fit in the journal's last, partly used page, as on any disk).
    let mut during = Vec::new();
    let view = loop {
        assert!(
            during.len() < 30,
            "30 prepares and the disk took every write"
        );
        let uid = format!("c-during-{:02}", during.len());
        prepare(&rack, &claim(&rack, &uid)).await;
        during.push(uid);
        let view = state(state_addr).await;
        if !view.checkpoint.persisted {
            break view;
        }
    };
    assert!(
        during.iter().all(|uid| view.claims.contains(uid)),
        "{view:?}"
    );
    assert!(
        view.checkpoint
            .error
            .as_deref()
            .is_some_and(|e| e.contains("No space left")),
        "{:?}",
        view.checkpoint
    );
    let (status, body) = http_get(http, "/readyz").await.unwrap();
    assert_eq!(status, 503, "{body}");
    assert!(body.contains("state directory cannot be written"), "{body}");
    let (status, _) = http_get(http, "/healthz").await.unwrap();
    assert_eq!(status, 200, "alive: a restart would lose what it holds");
    let (_, metrics) = http_get(http, "/metrics").await.unwrap();
    assert!(
        metrics.contains("domaind_checkpoint_persisted 0"),
        "{metrics}"
    );
    assert!(metrics.contains("domaind_checkpoint_write_failures_total"));

    // Space returns: everything held is written, and the node is ready again.
    std::fs::remove_file(fill).unwrap();
    poll_until("/readyz is 200 again", LIMIT, async || {
        let (status, _) = http_get(http, "/readyz").await.ok()?;
        (status == 200).then_some(())
    })
    .await;
    assert!(state(state_addr).await.checkpoint.persisted);
    let replay = domaind_checkpoint::inspect(&state_dir).unwrap().unwrap();
    let on_disk: Vec<&String> = replay.checkpoint.claims.keys().collect();
    let mut expected = vec!["c-before".to_owned()];
    expected.extend(during);
    assert_eq!(on_disk, expected.iter().collect::<Vec<_>>());
    rack.stop_all(LIMIT);
    drop(disk);
}
