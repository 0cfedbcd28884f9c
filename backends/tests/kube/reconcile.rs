//! Start-up reconciliation: the rule (a pure function) and the checkpoint store that
//! applies it when the file has no checkpoint.

use std::collections::BTreeSet;
use std::time::Duration;

use domaind_actors::model::{AllocationMode, ReadinessPolicy};
use domaind_actors::ports::{CheckpointStore, PrepareState};
use domaind_backends::kube::reconcile::{RebuildInput, Rebuilt, merge_rebuilt, rebuild};
use domaind_backends::kube::{DomainCache, ReconcileSettings, ReconcilingCheckpointStore};
use domaind_checkpoint::{CheckpointConfig, FileCheckpointStore, LoadOutcome};
use domaind_kube_api::crd::ComputeDomain;
use domaind_prepare::cdi::{CdiWriter, ClaimChannels, ClaimUid, Kind};
use k8s_openapi::api::resource::v1::ResourceClaim;
use serde_json::{Value, json};

use crate::apiserver::{Expect, compute_domain, pair, reference_claim, synced_cache};

const NODE: &str = "gb200-rack1-n01";
const DRIVER: &str = "compute-domain.nvidia.com";
const CD_UID: &str = "5b0e7c7e-2f6a-4b1e-9d3c-0a9f3e2d1c11";
const CLAIM_UID: &str = "417f1e95-0271-4510-9e94-d58e9dfa8522";

/// The reference claim, renamed and changed by `edit`.
fn claim(uid: &str, edit: impl FnOnce(&mut Value)) -> ResourceClaim {
    let mut value = reference_claim();
    value["metadata"]["uid"] = json!(uid);
    value["metadata"]["name"] = json!(format!("claim-{uid}"));
    edit(&mut value);
    serde_json::from_value(value).unwrap()
}

fn for_domain(uid: &'static str) -> impl FnOnce(&mut Value) {
    move |c| {
        c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"]["domainID"] =
            json!(uid)
    }
}

fn kind() -> Kind {
    Kind::for_driver(DRIVER).unwrap()
}

fn run(claims: &[ResourceClaim], domains: &[ComputeDomain], with_spec: &[&str]) -> Rebuilt {
    let with_cdi_spec: BTreeSet<String> = with_spec.iter().map(|s| (*s).to_owned()).collect();
    rebuild(RebuildInput {
        claims,
        domains,
        node: NODE,
        driver: DRIVER,
        default_readiness: ReadinessPolicy::Local,
        with_cdi_spec: &with_cdi_spec,
        cdi: &kind(),
    })
}

#[test]
fn a_claim_reserved_for_a_pod_on_this_node_is_rebuilt() {
    let domains = [compute_domain("cd-ref", "training", CD_UID, 1)];
    let rebuilt = run(&[claim(CLAIM_UID, |_| {})], &domains, &[CLAIM_UID]);
    assert!(rebuilt.skipped.is_empty(), "{:?}", rebuilt.skipped);
    let record = &rebuilt.checkpoint.claims[CLAIM_UID];
    assert_eq!(record.claim.namespace, "cd-ref");
    assert_eq!(record.claim.name, format!("claim-{CLAIM_UID}"));
    assert_eq!(record.info.domain.name, "training");
    assert_eq!(record.info.domain.num_nodes, 2);
    assert_eq!(record.info.allocation_mode, AllocationMode::Single);
    assert_eq!(record.info.devices[0].device, "channel-0");
    assert_eq!(record.policy, ReadinessPolicy::Local);
    assert_eq!(record.state, PrepareState::PrepareCompleted);
    let channels = ClaimChannels::Single(0);
    let id = kind().device_id(&CdiWriter::device_name(
        &ClaimUid::new(CLAIM_UID).unwrap(),
        &channels,
    ));
    assert_eq!(record.devices, vec![id]);
    assert!(rebuilt.checkpoint.slots.is_empty());

    // Without a CDI spec it was admitted at most: prepare is not known to have answered.
    let rebuilt = run(&[claim(CLAIM_UID, |_| {})], &domains, &[]);
    let record = &rebuilt.checkpoint.claims[CLAIM_UID];
    assert_eq!(record.state, PrepareState::PrepareStarted);
    assert!(record.devices.is_empty());
}

#[test]
fn claims_not_in_use_here_are_left_out_saying_why() {
    let domains = [compute_domain("cd-ref", "training", CD_UID, 1)];
    let claims = [
        claim("elsewhere", |c| {
            c["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("gb200-rack1-n09")
        }),
        claim("other-driver", |c| {
            c["status"]["allocation"]["devices"]["results"][0]["driver"] = json!("gpu.nvidia.com")
        }),
        claim("pending", |c| c["status"] = json!({})),
        claim("no-pod", |c| c["status"]["reservedFor"] = json!([])),
        claim("orphan", for_domain("deleted-domain")),
        claim("garbled", |c| {
            c["status"]["allocation"]["devices"]["config"][0]["opaque"]["parameters"] = json!("x")
        }),
        claim("foreign-ns", |c| {
            c["metadata"]["namespace"] = json!("team-b")
        }),
    ];
    let rebuilt = run(&claims, &domains, &[]);
    assert!(rebuilt.checkpoint.claims.is_empty());
    let skipped = rebuilt.skipped.join("\n");
    for (claim, why) in [
        ("no-pod", "reserved for no pod"),
        ("orphan", "(uid deleted-domain) no longer exists"),
        ("garbled", "not an object"),
        ("foreign-ns", "in another namespace"),
    ] {
        assert!(
            rebuilt
                .skipped
                .iter()
                .any(|s| s.contains(&format!("({claim})")) && s.contains(why)),
            "{claim}: {skipped}"
        );
    }
    assert_eq!(
        rebuilt.skipped.len(),
        4,
        "other nodes' and drivers' claims are no news: {skipped}"
    );
}

#[test]
fn one_domain_per_node_the_one_with_cdi_specs_first() {
    let domains = [
        compute_domain("cd-ref", "first", "cd-1", 1),
        compute_domain("cd-ref", "second", "cd-2", 1),
    ];
    let at = |time: &'static str| {
        move |c: &mut Value| c["status"]["allocation"]["allocationTimestamp"] = json!(time)
    };
    let claims = [
        claim("a", |c| {
            for_domain("cd-1")(c);
            at("2026-11-22T05:00:00Z")(c);
        }),
        claim("b", |c| {
            for_domain("cd-2")(c);
            at("2026-11-22T04:00:00Z")(c);
        }),
        claim("c", |c| {
            for_domain("cd-1")(c);
            at("2026-11-22T06:00:00Z")(c);
        }),
    ];
    // cd-1's claim "a" has a spec: it was admitted; "b" was refused (busy node).
    let rebuilt = run(&claims, &domains, &["a"]);
    let kept: Vec<&str> = rebuilt
        .checkpoint
        .claims
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(kept, ["a", "c"]);
    assert_eq!(rebuilt.skipped.len(), 1);
    assert!(rebuilt.skipped[0].contains("(b): this node serves ComputeDomain uid cd-1, not cd-2"));

    // No spec anywhere: the domain allocated first.
    let rebuilt = run(&claims, &domains, &[]);
    let kept: Vec<&str> = rebuilt
        .checkpoint
        .claims
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(kept, ["b"]);
}

/// Domains that share the clique's IMEX domain may be several on one node: all of
/// them are rebuilt, with their isolation, and an exclusive domain's claims are not.
#[test]
fn every_sharing_domain_is_rebuilt_with_its_isolation() {
    let sharing = |name: &str, uid: &str| {
        let mut cd = compute_domain("cd-ref", name, uid, 1);
        cd.spec.isolation = domaind_kube_api::crd::ComputeDomainIsolation::Channel;
        cd
    };
    let domains = [
        sharing("first", "cd-1"),
        sharing("second", "cd-2"),
        compute_domain("cd-ref", "own", "cd-3", 1),
    ];
    let claims = [
        claim("a", for_domain("cd-1")),
        claim("b", for_domain("cd-2")),
        claim("c", for_domain("cd-3")),
    ];
    let rebuilt = run(&claims, &domains, &["a", "b"]);
    let kept: Vec<&str> = rebuilt
        .checkpoint
        .claims
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(kept, ["a", "b"]);
    assert!(
        rebuilt
            .checkpoint
            .claims
            .values()
            .all(|r| r.info.isolation == domaind_actors::model::Isolation::Channel)
    );
    assert_eq!(rebuilt.skipped.len(), 1, "{:?}", rebuilt.skipped);
    assert!(rebuilt.skipped[0].contains("(c)"));
}

/// An admin claim (`adminAccess`) is rebuilt whatever its domain's namespace, and
/// weighs nothing in the one-domain choice: here it alone has a CDI spec and the
/// earliest allocation, and still the workload's domain is the one served. Merged
/// into a damaged checkpoint that kept only an admin claim, it does not stand for the
/// domain served either.
#[test]
fn admin_claims_are_rebuilt_beside_any_domain_and_choose_none() {
    let domains = [
        compute_domain("cd-ref", "served", "cd-1", 1),
        compute_domain("cd-ref", "watched", "cd-2", 1),
    ];
    let at =
        |c: &mut Value, time: &str| c["status"]["allocation"]["allocationTimestamp"] = json!(time);
    let claims = [
        claim("w", |c| {
            for_domain("cd-1")(c);
            at(c, "2026-11-22T05:00:00Z");
        }),
        claim("adm", |c| {
            for_domain("cd-2")(c);
            at(c, "2026-11-22T04:00:00Z");
            c["metadata"]["namespace"] = json!("monitoring");
            let result = &mut c["status"]["allocation"]["devices"]["results"][0];
            result["adminAccess"] = json!(true);
            result["device"] = json!("channel-3");
        }),
    ];
    let rebuilt = run(&claims, &domains, &["adm"]);
    assert!(rebuilt.skipped.is_empty(), "{:?}", rebuilt.skipped);
    let admin = &rebuilt.checkpoint.claims["adm"];
    assert!(admin.info.admin_access);
    assert_eq!(admin.info.domain.name, "watched");
    assert_eq!(admin.claim.namespace, "monitoring");
    assert_eq!(admin.state, PrepareState::PrepareCompleted);
    let id = kind().device_id(&CdiWriter::device_name(
        &ClaimUid::new("adm").unwrap(),
        &ClaimChannels::Single(3),
    ));
    assert_eq!(admin.devices, vec![id], "the channel it was allocated");
    assert!(!rebuilt.checkpoint.claims["w"].info.admin_access);

    let mut kept = domaind_actors::ports::Checkpoint::default();
    kept.claims.insert("adm".into(), admin.clone());
    let damaged = LoadOutcome::Damaged {
        claims: 1,
        damaged_records: 1,
        lost_claims: Vec::new(),
        unattributed: 1,
        details: Vec::new(),
        domains: Vec::new(),
        moved_to: None,
    };
    let (merged, added) = merge_rebuilt(kept, rebuilt.checkpoint, &damaged);
    assert_eq!(merged.claims.keys().collect::<Vec<_>>(), ["adm", "w"]);
    assert_eq!(added.len(), 1);
}

struct Files {
    root: tempfile::TempDir,
    store: FileCheckpointStore,
    cdi: CdiWriter,
}

impl Files {
    /// The store as a restarted daemon opens it: same directory, same boot.
    fn reopen(&self) -> FileCheckpointStore {
        FileCheckpointStore::open(
            CheckpointConfig::new(self.root.path().join("state"))
                .with_boot_id_path(self.root.path().join("boot_id")),
        )
        .unwrap()
    }
}

fn files() -> Files {
    let root = tempfile::tempdir().unwrap();
    let boot_id = root.path().join("boot_id");
    std::fs::write(&boot_id, "boot-1\n").unwrap();
    let store = FileCheckpointStore::open(
        CheckpointConfig::new(root.path().join("state")).with_boot_id_path(boot_id),
    )
    .unwrap();
    let cdi = CdiWriter::new(root.path().join("cdi"), DRIVER).unwrap();
    Files { root, store, cdi }
}

fn store(
    client: kube::Client,
    domains: DomainCache,
    files: &Files,
    limit: Duration,
) -> ReconcilingCheckpointStore {
    store_over(files.store.clone(), client, domains, files, limit)
}

fn store_over(
    file: FileCheckpointStore,
    client: kube::Client,
    domains: DomainCache,
    files: &Files,
    limit: Duration,
) -> ReconcilingCheckpointStore {
    ReconcilingCheckpointStore::new(
        file,
        client,
        domains,
        files.cdi.clone(),
        ReconcileSettings {
            node: NODE.into(),
            driver: DRIVER.into(),
            default_readiness: ReadinessPolicy::Domain,
            api_timeout: Duration::from_secs(10),
            limit,
        },
    )
}

fn claim_list(items: Vec<ResourceClaim>, next: Option<&str>) -> Value {
    json!({"apiVersion": "resource.k8s.io/v1", "kind": "ResourceClaimList",
           "metadata": {"resourceVersion": "50", "continue": next.unwrap_or("")},
           "items": items})
}

const CLAIMS: &str = "/apis/resource.k8s.io/v1/resourceclaims";

#[tokio::test]
async fn a_missing_checkpoint_is_rebuilt_from_every_page_of_claims_and_saved() {
    let files = files();
    files
        .cdi
        .write_claim(
            &ClaimUid::new(CLAIM_UID).unwrap(),
            511,
            &ClaimChannels::Single(0),
        )
        .unwrap();
    let (cache, _writer) = synced_cache(vec![compute_domain("cd-ref", "training", CD_UID, 1)]);
    let (client, server) = pair();
    let elsewhere = claim("elsewhere", |c| {
        c["status"]["allocation"]["devices"]["results"][0]["pool"] = json!("gb200-rack1-n09")
    });
    let script = server.play(vec![
        Expect::get(CLAIMS)
            .query("limit", "500")
            .respond(200, claim_list(vec![elsewhere], Some("page-2"))),
        Expect::get(CLAIMS)
            .query("continue", "page-2")
            .respond(200, claim_list(vec![claim(CLAIM_UID, |_| {})], None)),
    ]);
    let reconciling = store(client, cache, &files, Duration::from_secs(30));
    let checkpoint = reconciling.load().await.unwrap();
    let mut server = script.await.unwrap();
    assert_eq!(checkpoint.claims.len(), 1);
    let record = &checkpoint.claims[CLAIM_UID];
    assert_eq!(record.state, PrepareState::PrepareCompleted);
    assert_eq!(
        record.policy,
        ReadinessPolicy::Domain,
        "the daemon's default"
    );

    // Saved: the next start restores it from the file, asking the API nothing.
    assert_eq!(reconciling.load().await.unwrap(), checkpoint);
    server.assert_idle();
}

#[tokio::test]
async fn damage_that_names_no_claim_rebuilds_what_the_api_server_knows() {
    let files = files();
    std::fs::create_dir_all(files.store.path().parent().unwrap()).unwrap();
    std::fs::write(files.store.path(), b"{ not a record\n").unwrap();
    let (cache, _writer) = synced_cache(vec![compute_domain("cd-ref", "training", CD_UID, 1)]);
    let (client, server) = pair();
    let script = server.play(vec![
        Expect::get(CLAIMS).respond(200, claim_list(vec![claim(CLAIM_UID, |_| {})], None)),
    ]);
    let checkpoint = store(client, cache, &files, Duration::from_secs(30))
        .load()
        .await
        .unwrap();
    script.await.unwrap();
    assert_eq!(
        checkpoint.claims[CLAIM_UID].state,
        PrepareState::PrepareStarted
    );
}

/// Issue 15: one flipped byte costs one claim, and the API server gives it back; a
/// claim the API server still lists but the checkpoint did not lose (this node released
/// it) stays released.
#[tokio::test]
async fn a_damaged_record_costs_only_its_claim_which_is_rebuilt() {
    const KEPT: &str = "0a7f1e95-0271-4510-9e94-d58e9dfa0001";
    const DAMAGED: &str = "0a7f1e95-0271-4510-9e94-d58e9dfa0002";
    const RELEASED: &str = "0a7f1e95-0271-4510-9e94-d58e9dfa0003";
    let files = files();
    let domains = vec![compute_domain("cd-ref", "training", CD_UID, 1)];

    // A first start with no checkpoint records both claims the API server lists.
    let (cache, _writer) = synced_cache(domains.clone());
    let (client, server) = pair();
    let script = server.play(vec![Expect::get(CLAIMS).respond(
        200,
        claim_list(vec![claim(KEPT, |_| {}), claim(DAMAGED, |_| {})], None),
    )]);
    let first = store(client, cache, &files, Duration::from_secs(30));
    assert_eq!(first.load().await.unwrap().claims.len(), 2);
    script.await.unwrap();
    drop(first);

    // One byte of DAMAGED's record flips on disk.
    let path = files.store.path().to_owned();
    let text = std::fs::read_to_string(&path).unwrap();
    let line_start = text.find(&format!("\"uid\":\"{DAMAGED}\"")).unwrap();
    let at = line_start + text[line_start..].find("claim-").unwrap();
    let mut bytes = text.into_bytes();
    bytes[at] ^= 0x20;
    std::fs::write(&path, &bytes).unwrap();

    // The restart keeps KEPT, rebuilds DAMAGED, and leaves RELEASED alone.
    let (cache, _writer) = synced_cache(domains);
    let (client, server) = pair();
    let script = server.play(vec![Expect::get(CLAIMS).respond(
        200,
        claim_list(
            vec![
                claim(KEPT, |_| {}),
                claim(DAMAGED, |_| {}),
                claim(RELEASED, |_| {}),
            ],
            None,
        ),
    )]);
    let reopened = files.reopen();
    let restarted = store_over(
        reopened.clone(),
        client,
        cache,
        &files,
        Duration::from_secs(30),
    );
    let checkpoint = restarted.load().await.unwrap();
    script.await.unwrap();
    let uids: Vec<&str> = checkpoint.claims.keys().map(String::as_str).collect();
    assert_eq!(uids, [KEPT, DAMAGED]);
    let Some(LoadOutcome::Damaged {
        damaged_records,
        lost_claims,
        moved_to,
        ..
    }) = reopened.last_load_outcome()
    else {
        panic!("{:?}", reopened.last_load_outcome());
    };
    assert_eq!(
        (damaged_records, lost_claims),
        (1, vec![DAMAGED.to_owned()])
    );
    assert!(
        std::fs::read(moved_to.unwrap()).unwrap().len() > 100,
        "the damaged record is kept"
    );
    // The rebuilt claim is recorded: the journal reads back whole, without damage.
    let replay = domaind_checkpoint::inspect(path.parent().unwrap())
        .unwrap()
        .unwrap();
    assert!(replay.damaged.is_empty());
    let on_disk: Vec<&str> = replay
        .checkpoint
        .claims
        .keys()
        .map(String::as_str)
        .collect();
    assert_eq!(on_disk, [KEPT, DAMAGED]);
}

#[tokio::test(start_paused = true)]
async fn an_unreachable_api_server_gives_up_at_the_limit_with_no_claims() {
    let files = files();
    let (cache, _writer) = synced_cache(vec![]);
    let (client, server) = pair();
    // Each list hangs to the API timeout (10 s) and is retried; at 30 s the node
    // starts without prepared claims rather than not at all.
    let script = server.play(vec![
        Expect::get(CLAIMS).hang(),
        Expect::get(CLAIMS).hang(),
        Expect::get(CLAIMS).hang(),
    ]);
    let started = tokio::time::Instant::now();
    let checkpoint = store(client, cache, &files, Duration::from_secs(30))
        .load()
        .await
        .unwrap();
    assert!(checkpoint.claims.is_empty());
    assert_eq!(started.elapsed(), Duration::from_secs(30));
    let mut server = script.await.unwrap();
    server.assert_idle();
}
