use std::fs;
use std::os::unix::fs::MetadataExt;

use domaind_actors::model::AllocationMode;
use domaind_kube_api::names::DEFAULT_DRIVER_NAME;
use serde_json::Value;
use tempfile::TempDir;

use super::*;

const UID: &str = "3f1c0a52-9d7e-4c55-8f0e-2b6a1d9e4c10";
const MAJOR: u32 = 238;

fn writer() -> (TempDir, CdiWriter) {
    let root = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(root.path().join("cdi"), DEFAULT_DRIVER_NAME).unwrap();
    (root, writer)
}

fn uid(uid: &str) -> ClaimUid {
    ClaimUid::new(uid).unwrap()
}

fn read_json(writer: &CdiWriter, claim: &ClaimUid) -> Value {
    serde_json::from_slice(&fs::read(writer.spec_path(claim)).unwrap()).unwrap()
}

#[test]
fn single_injects_the_domains_channel() {
    let (_root, writer) = writer();

    let ids = writer
        .write_claim(&uid(UID), MAJOR, &ClaimChannels::Single(7))
        .unwrap();

    assert_eq!(
        ids,
        [format!(
            "k8s.compute-domain.nvidia.com/claim={UID}-channel-7"
        )]
    );
    assert_eq!(
        writer.spec_path(&uid(UID)),
        writer
            .dir()
            .join(format!("k8s.compute-domain.nvidia.com-claim_{UID}.json"))
    );
    assert_eq!(
        read_json(&writer, &uid(UID)),
        serde_json::json!({
            "cdiVersion": "0.5.0",
            "kind": "k8s.compute-domain.nvidia.com/claim",
            "devices": [{
                "name": format!("{UID}-channel-7"),
                "containerEdits": {"deviceNodes": [{
                    "path": "/dev/nvidia-caps-imex-channels/channel7",
                    "type": "c",
                    "major": MAJOR,
                    "minor": 7,
                    "permissions": "rw"
                }]}
            }]
        })
    );
}

#[test]
fn all_injects_every_listed_channel_once() {
    let (_root, writer) = writer();
    let channels = ClaimChannels::for_mode(AllocationMode::All, 7, [2, 0, 1, 2]);
    assert_eq!(channels.mode(), AllocationMode::All);

    let ids = writer.write_claim(&uid(UID), MAJOR, &channels).unwrap();

    assert_eq!(
        ids,
        [format!(
            "k8s.compute-domain.nvidia.com/claim={UID}-all-channels"
        )]
    );
    let json = read_json(&writer, &uid(UID));
    let nodes = json["devices"][0]["containerEdits"]["deviceNodes"]
        .as_array()
        .unwrap();
    let paths_and_minors: Vec<(&str, u64)> = nodes
        .iter()
        .map(|node| {
            assert_eq!(node["major"], MAJOR);
            (
                node["path"].as_str().unwrap(),
                node["minor"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        paths_and_minors,
        [
            ("/dev/nvidia-caps-imex-channels/channel0", 0),
            ("/dev/nvidia-caps-imex-channels/channel1", 1),
            ("/dev/nvidia-caps-imex-channels/channel2", 2),
        ]
    );
}

#[test]
fn single_ignores_the_list_of_all_channels() {
    let channels = ClaimChannels::for_mode(AllocationMode::Single, 5, [0, 1, 2]);
    assert_eq!(channels, ClaimChannels::Single(5));
    assert_eq!(channels.mode(), AllocationMode::Single);
}

#[test]
fn all_without_channels_is_refused_and_writes_nothing() {
    let (_root, writer) = writer();
    let error = writer
        .write_claim(&uid(UID), MAJOR, &ClaimChannels::All(Vec::new()))
        .unwrap_err();
    assert!(matches!(error, CdiError::NoChannels { .. }), "{error:?}");
    assert!(error.to_string().contains(UID), "{error}");
    assert!(!writer.spec_path(&uid(UID)).exists());
}

#[test]
fn impossible_device_numbers_are_refused() {
    let (_root, writer) = writer();
    for (major, channel) in [(4096, 0), (MAJOR, 1 << 20)] {
        let error = writer
            .write_claim(&uid(UID), major, &ClaimChannels::Single(channel))
            .unwrap_err();
        assert!(matches!(error, CdiError::InvalidSpec { .. }), "{error:?}");
    }
    assert!(writer.list_claims().unwrap().is_empty());
}

#[test]
fn the_written_file_round_trips() {
    let (_root, writer) = writer();
    let channels = ClaimChannels::All(vec![0, 3]);
    writer.write_claim(&uid(UID), MAJOR, &channels).unwrap();

    let read: Spec =
        serde_json::from_slice(&fs::read(writer.spec_path(&uid(UID))).unwrap()).unwrap();

    assert_eq!(read, writer.spec(&uid(UID), MAJOR, &channels).unwrap());
    let mode = fs::metadata(writer.spec_path(&uid(UID))).unwrap().mode();
    assert_eq!(mode & 0o644, 0o644, "the runtime must read it: {mode:o}");
}

#[test]
fn rewriting_the_same_claim_is_idempotent() {
    let (_root, writer) = writer();
    let claim = uid(UID);
    let first = writer
        .write_claim(&claim, MAJOR, &ClaimChannels::Single(1))
        .unwrap();
    let inode = fs::metadata(writer.spec_path(&claim)).unwrap().ino();

    let again = writer
        .write_claim(&claim, MAJOR, &ClaimChannels::Single(1))
        .unwrap();

    assert_eq!(again, first);
    assert_eq!(
        fs::metadata(writer.spec_path(&claim)).unwrap().ino(),
        inode,
        "an identical spec was replaced"
    );

    // A different answer for the same claim replaces the file whole.
    let changed = writer
        .write_claim(&claim, MAJOR, &ClaimChannels::Single(2))
        .unwrap();
    assert_eq!(
        changed,
        [format!(
            "k8s.compute-domain.nvidia.com/claim={UID}-channel-2"
        )]
    );
    assert_eq!(
        read_json(&writer, &claim)["devices"][0]["name"],
        format!("{UID}-channel-2")
    );
    assert_eq!(writer.list_claims().unwrap(), [claim]);
}

#[test]
fn unprepare_removes_the_spec_and_a_missing_one_is_fine() {
    let (_root, writer) = writer();
    let claim = uid(UID);
    let other = uid("other-claim");
    writer
        .write_claim(&claim, MAJOR, &ClaimChannels::Single(0))
        .unwrap();
    writer
        .write_claim(&other, MAJOR, &ClaimChannels::Single(0))
        .unwrap();

    assert!(writer.remove_claim(&claim).unwrap());
    assert!(!writer.spec_path(&claim).exists());
    assert!(!writer.remove_claim(&claim).unwrap());
    assert_eq!(writer.list_claims().unwrap(), [other]);

    // Before the directory exists at all.
    let (_root, fresh) = self::writer();
    assert!(!fresh.remove_claim(&claim).unwrap());
}

#[test]
fn listing_finds_our_claims_only() {
    let (_root, writer) = writer();
    assert!(writer.list_claims().unwrap().is_empty(), "no directory yet");
    for claim in ["b-claim", "a-claim", UID] {
        writer
            .write_claim(&uid(claim), MAJOR, &ClaimChannels::Single(0))
            .unwrap();
    }
    let dir = writer.dir();
    fs::write(dir.join("k8s.gpu.nvidia.com-claim_x.json"), b"{}").unwrap();
    fs::write(dir.join("nvidia.yaml"), b"").unwrap();
    fs::write(
        dir.join("k8s.compute-domain.nvidia.com-claim_bad uid.json"),
        b"",
    )
    .unwrap();
    fs::write(
        dir.join(".k8s.compute-domain.nvidia.com-claim_c-claim.json.Ab12Cd.tmp"),
        b"{",
    )
    .unwrap();
    fs::create_dir(dir.join("k8s.compute-domain.nvidia.com-claim_d-claim.json")).unwrap();

    assert_eq!(
        writer.list_claims().unwrap(),
        [uid(UID), uid("a-claim"), uid("b-claim")]
    );
}

#[test]
fn stale_temp_files_of_ours_are_removed_and_others_kept() {
    let (_root, writer) = writer();
    writer
        .write_claim(&uid("a-claim"), MAJOR, &ClaimChannels::Single(0))
        .unwrap();
    let dir = writer.dir();
    let ours = ".k8s.compute-domain.nvidia.com-claim_c-claim.json.Ab12Cd.tmp";
    let theirs = [
        ".k8s.gpu.nvidia.com-claim_c.json.Ab12Cd.tmp",
        ".k8s.compute-domain.nvidia.com-claim_c-claim.json.tmp",
        "k8s.compute-domain.nvidia.com-claim_c-claim.json.Ab12Cd.tmp",
    ];
    for name in std::iter::once(ours).chain(theirs) {
        fs::write(dir.join(name), b"{").unwrap();
    }

    assert_eq!(writer.remove_stale_temp_files().unwrap(), [ours]);

    for name in theirs {
        assert!(dir.join(name).exists(), "{name} was removed");
    }
    assert_eq!(writer.list_claims().unwrap(), [uid("a-claim")]);
}

#[test]
fn a_custom_driver_name_changes_vendor_kind_and_file_names() {
    let root = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(root.path(), "imex.example.org").unwrap();
    let ids = writer
        .write_claim(&uid(UID), MAJOR, &ClaimChannels::Single(0))
        .unwrap();
    assert_eq!(ids, [format!("k8s.imex.example.org/claim={UID}-channel-0")]);
    assert!(
        root.path()
            .join(format!("k8s.imex.example.org-claim_{UID}.json"))
            .is_file()
    );
    assert!(CdiWriter::new(root.path(), "Not A Driver").is_err());
}

#[test]
fn bad_claim_uids_never_reach_the_file_system() {
    for bad in ["", "../../etc/cron.d/x", "a/b", ".x", "x y", "x\n"] {
        let error = bad.parse::<ClaimUid>().unwrap_err();
        assert!(
            matches!(error, CdiError::InvalidClaimUid { .. }),
            "{bad:?}: {error:?}"
        );
    }
}

// Our structural invariants, checked on the JSON as written, by rules spelled out here
// rather than by `Spec::check`: they run everywhere, with or without the CNCF schema.

fn is_cdi_device_name(name: &str) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || "_.:-".contains(c);
    name.chars().all(ok)
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn is_cdi_vendor_or_class(name: &str, dots: bool) -> bool {
    let ok = |c: char| c.is_ascii_alphanumeric() || "_-".contains(c) || (dots && c == '.');
    name.chars().all(ok)
        && name.starts_with(|c: char| c.is_ascii_alphabetic())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
}

fn version_tuple(version: &str) -> (u32, u32, u32) {
    let parts: Vec<u32> = version.split('.').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "{version}");
    (parts[0], parts[1], parts[2])
}

fn assert_invariants(json: &Value, file_name: &str) {
    let object = json.as_object().unwrap();
    for key in object.keys() {
        assert!(
            ["cdiVersion", "kind", "devices", "containerEdits"].contains(&key.as_str()),
            "unexpected top-level field {key}"
        );
    }
    let version = version_tuple(json["cdiVersion"].as_str().unwrap());
    assert!(version >= (0, 3, 0), "older than any registry reads");

    let kind = json["kind"].as_str().unwrap();
    let (vendor, class) = kind.split_once('/').unwrap();
    // A dot in the class needs 0.6.0; we promise 0.5.0.
    assert!(is_cdi_vendor_or_class(vendor, true), "vendor {vendor}");
    assert!(is_cdi_vendor_or_class(class, false), "class {class}");
    let claim = file_name
        .strip_prefix(&format!("{vendor}-{class}_"))
        .and_then(|rest| rest.strip_suffix(".json"))
        .unwrap_or_else(|| panic!("{file_name} is not <vendor>-<class>_<claim>.json"));
    assert!(is_cdi_device_name(claim), "claim part {claim:?}");

    let devices = json["devices"].as_array().unwrap();
    assert!(!devices.is_empty());
    for device in devices {
        let name = device["name"].as_str().unwrap();
        assert!(is_cdi_device_name(name), "device name {name:?}");
        if !name.starts_with(|c: char| c.is_ascii_alphabetic()) {
            assert!(version >= (0, 5, 0), "{name} starts with a digit");
        }
        let nodes = device["containerEdits"]["deviceNodes"].as_array().unwrap();
        assert!(!nodes.is_empty());
        for node in nodes {
            let path = node["path"].as_str().unwrap();
            assert!(path.starts_with("/dev/"), "path {path}");
            assert!(
                !path.contains("/../") && !path.contains("//"),
                "path {path}"
            );
            assert_eq!(node["type"], "c");
            let major = node["major"].as_u64().unwrap();
            let minor = node["minor"].as_u64().unwrap();
            assert!(major > 0 && major < 4096, "major {major}");
            assert!(minor < 1 << 20, "minor {minor}");
            assert_eq!(
                path,
                format!("/dev/nvidia-caps-imex-channels/channel{minor}")
            );
            let permissions = node["permissions"].as_str().unwrap();
            assert!(
                !permissions.is_empty() && permissions.chars().all(|c| "rwm".contains(c)),
                "permissions {permissions}"
            );
        }
    }
}

#[test]
fn written_specs_keep_our_structural_invariants() {
    let (_root, writer) = writer();
    let cases = [
        (
            "0a1b2c3d-0000-4000-8000-000000000000",
            ClaimChannels::Single(0),
        ),
        ("Zz-claim", ClaimChannels::Single(2047)),
        ("a:b.c_d", ClaimChannels::All((0..64).collect())),
    ];
    for (claim, channels) in cases {
        let claim = uid(claim);
        let ids = writer.write_claim(&claim, MAJOR, &channels).unwrap();
        let json = read_json(&writer, &claim);
        let file_name = writer.kind().spec_file_name(&claim);
        assert_invariants(&json, &file_name);

        let device = json["devices"][0]["name"].as_str().unwrap();
        assert!(device.starts_with(claim.as_str()), "{device}");
        assert_eq!(
            ids,
            [format!("{}={device}", json["kind"].as_str().unwrap())]
        );
    }
}
