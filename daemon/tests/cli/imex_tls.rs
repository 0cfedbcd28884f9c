//! The demo's rack forms with IMEX's links over mutual TLS (issue 16): three `domaind
//! run` with the built-in simulator and the default `--imex-tls auto`, a domain formed
//! through the kubelet's socket, and every simulated IMEX linked to every other over
//! TLS with its node's gossip certificate. Then node-01's certificate is reissued, as a
//! certificate manager would: gossip takes it, the IMEX files follow, the daemon
//! reloads them (SIGUSR1, no restart) and the domain stays whole.

use domaind_testkit::poll_until_blocking;
use std::path::{Path, PathBuf};
use std::time::Duration;

use domaind_actors::model::{ClaimRef, ReadinessPolicy};
use domaind_backends::local::ClaimFile;
use domaind_imex::config::parse_config;
use domaind_kubelet_plugin::DraVersion;

use crate::fixtures::claim_of;
use domaind_testbed::rack::{LocalRack, RackSpec, prepare_until_ready, short_temp_dir};
use serde_json::Value;

const NODES: usize = 3;
const START_LIMIT: Duration = Duration::from_secs(30);
const LIMIT: Duration = Duration::from_secs(60);

fn claim(node: &str) -> (ClaimFile, ClaimRef) {
    claim_of(
        &format!("worker-{node}"),
        &format!("claim-{node}"),
        ("tls", "cd-tls", NODES as u32),
        ReadinessPolicy::Domain,
    )
}

/// A node's simulated IMEX, as its status tool lists it (`ctl -N -j`).
fn listing(imex_dir: &Path) -> Value {
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_domaind"))
        .args(["imex-sim", "ctl", "-c"])
        .arg(imex_dir.join("config.cfg"))
        .args(["-N", "-j", "-t", "2000"])
        .output()
        .unwrap();
    serde_json::from_slice(&output.stdout).unwrap_or(Value::Null)
}

/// Every other member linked, over TLS, and nothing refused.
fn linked_over_tls(listing: &Value, members: usize) -> bool {
    let connected = listing["nodes"].as_array().map_or(0, |nodes| {
        nodes.iter().filter(|n| n["status"] == "CONNECTED").count()
    });
    listing["ready"] == true
        && connected == members - 1
        && listing["tls"]["enabled"] == true
        && listing["tls"]["refused"] == 0
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_demos_rack_forms_with_imex_over_mutual_tls_and_follows_a_rotation() {
    let tmp = short_temp_dir("dtl").unwrap();
    let mut spec = RackSpec::self_contained(
        NODES,
        PathBuf::from(env!("CARGO_BIN_EXE_domaind")),
        tmp.path().into(),
    );
    spec.subnet = domaind_loopback::CLI_IMEX_TLS;
    spec.log_filter = "info,domaind_gossip=warn".into();
    let mut rack = LocalRack::create(spec).unwrap();
    tokio::task::block_in_place(|| {
        rack.start_all()?;
        rack.wait_all_ready(START_LIMIT)
    })
    .unwrap();
    let local = rack.local().clone();
    let mut prepares = Vec::new();
    for i in 0..NODES {
        let (file, claim) = claim(rack.node(i).name());
        local.write_claim(&file).unwrap();
        let socket = rack.node(i).dra_socket();
        prepares.push(tokio::spawn(async move {
            prepare_until_ready(&socket, &claim, DraVersion::V1, LIMIT).await
        }));
    }
    for prepare in prepares {
        prepare.await.unwrap().unwrap().unwrap();
    }
    let imex_dirs: Vec<PathBuf> = rack.nodes().iter().map(|n| n.imex_dir()).collect();

    tokio::task::block_in_place(|| {
        for dir in &imex_dirs {
            let config = parse_config(&std::fs::read_to_string(dir.join("config.cfg")).unwrap());
            assert_eq!(config["IMEX_ENABLE_AUTH_ENCRYPTION"], "1", "{config:?}");
            // Every member prepared; the last to join may still be on its way into the
            // others' peer sets.
            poll_until_blocking("every IMEX linked to every other over TLS", LIMIT, || {
                linked_over_tls(&listing(dir), NODES).then_some(())
            });
        }
        // The files are the node's gossip certificate.
        let tls_dir = rack.node(0).dir().join("tls");
        assert_eq!(
            std::fs::read(imex_dirs[0].join("imex-tls.crt")).unwrap(),
            std::fs::read(tls_dir.join("tls.crt")).unwrap()
        );

        // Every SIGUSR1 reloads the credentials, the membership's during formation too.
        let reloads_before = listing(&imex_dirs[0])["tls"]["reloads"].as_u64().unwrap();
        rack.reissue_certificate(0, time::Duration::days(1))
            .unwrap();
        let reissued = std::fs::read(tls_dir.join("tls.crt")).unwrap();
        // Gossip re-reads its files every 10 s; IMEX's follow, then its reload.
        poll_until_blocking(
            "node-01's IMEX reloads the reissued certificate",
            LIMIT,
            || {
                (std::fs::read(imex_dirs[0].join("imex-tls.crt")).is_ok_and(|c| c == reissued)
                    && listing(&imex_dirs[0])["tls"]["reloads"].as_u64() > Some(reloads_before))
                .then_some(())
            },
        );
        for dir in &imex_dirs {
            poll_until_blocking("every link back after the reload", LIMIT, || {
                linked_over_tls(&listing(dir), NODES).then_some(())
            });
        }
        assert!(rack.unexpected_exits().is_empty());
        rack.stop_all(Duration::from_secs(20));
    });
}
