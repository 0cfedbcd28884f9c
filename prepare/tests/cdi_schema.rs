//! Our CDI specs against the CNCF container-device-interface JSON schema.
//!
//! The schema is outside data, not part of the repository: the test reads it from
//! `$DOMAIND_CDI_SCHEMA_DIR` (`../shared/cdi`: `schema.json` and `defs.json`) and is
//! ignored unless asked for (`--ignored`). Our own structural invariants are checked
//! everywhere by the unit tests of `domaind_prepare::cdi`.

use std::fs;
use std::path::{Path, PathBuf};

use domaind_kube_api::names::DEFAULT_DRIVER_NAME;
use domaind_prepare::cdi::{CdiWriter, ClaimChannels, ClaimUid};
use jsonschema::{Registry, Validator};
use serde_json::{Value, json};

const SCHEMA_DIR_ENV: &str = "DOMAIND_CDI_SCHEMA_DIR";

/// Where the schema's relative `$ref: "defs.json#…"` resolves to.
const BASE: &str = "file:///cdi-schema/";

fn schema_dir() -> PathBuf {
    let dir = std::env::var_os(SCHEMA_DIR_ENV)
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!("{SCHEMA_DIR_ENV} names no directory: set it to one holding the CDI schema")
        });
    for file in ["schema.json", "defs.json"] {
        assert!(dir.join(file).is_file(), "{} has no {file}", dir.display());
    }
    dir
}

fn read_json(path: &Path) -> Value {
    let text = fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&text).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

fn with_validator(dir: &Path, check: impl FnOnce(&Validator)) {
    let registry = Registry::new()
        .add(
            format!("{BASE}defs.json"),
            read_json(&dir.join("defs.json")),
        )
        .unwrap()
        .prepare()
        .unwrap();
    let validator = jsonschema::options()
        .with_base_uri(format!("{BASE}schema.json"))
        .with_registry(&registry)
        .build(&read_json(&dir.join("schema.json")))
        .expect("the schema compiles, with defs.json registered");
    check(&validator);
}

fn errors(validator: &Validator, instance: &Value) -> Vec<String> {
    validator
        .iter_errors(instance)
        .map(|error| format!("{error} at {}", error.instance_path()))
        .collect()
}

#[test]
#[ignore = "needs reference data: the CDI schema in $DOMAIND_CDI_SCHEMA_DIR (../shared/cdi)"]
fn our_specs_validate_against_the_cdi_schema() {
    let dir = schema_dir();
    let root = tempfile::tempdir().unwrap();
    let writer = CdiWriter::new(root.path(), DEFAULT_DRIVER_NAME).unwrap();
    let cases = [
        (
            "3f1c0a52-9d7e-4c55-8f0e-2b6a1d9e4c10",
            ClaimChannels::Single(0),
        ),
        ("claim-b", ClaimChannels::Single(2047)),
        ("claim-c", ClaimChannels::All((0..16).collect())),
    ];
    with_validator(&dir, |validator| {
        for (uid, channels) in cases {
            let claim = ClaimUid::new(uid).unwrap();
            writer.write_claim(&claim, 238, &channels).unwrap();
            let spec = read_json(&writer.spec_path(&claim));
            let problems = errors(validator, &spec);
            assert!(problems.is_empty(), "{uid}: {problems:#?}\n{spec:#}");
        }
    });
}

/// The validation above means something only if the schema, defs.json included, can
/// reject a spec.
#[test]
#[ignore = "needs reference data: the CDI schema in $DOMAIND_CDI_SCHEMA_DIR (../shared/cdi)"]
fn the_schema_rejects_broken_specs() {
    let dir = schema_dir();
    let good = json!({
        "cdiVersion": "0.5.0",
        "kind": "k8s.compute-domain.nvidia.com/claim",
        "devices": [{
            "name": "u-channel-0",
            "containerEdits": {"deviceNodes": [
                {"path": "/dev/nvidia-caps-imex-channels/channel0", "type": "c", "major": 238, "minor": 0, "permissions": "rw"}
            ]}
        }]
    });
    let mut no_edits = good.clone();
    no_edits["devices"][0]
        .as_object_mut()
        .unwrap()
        .remove("containerEdits");
    let mut no_kind = good.clone();
    no_kind.as_object_mut().unwrap().remove("kind");
    // Both only caught through defs.json.
    let mut string_major = good.clone();
    string_major["devices"][0]["containerEdits"]["deviceNodes"][0]["major"] = json!("238");
    let mut no_path = good.clone();
    no_path["devices"][0]["containerEdits"]["deviceNodes"][0]
        .as_object_mut()
        .unwrap()
        .remove("path");

    with_validator(&dir, |validator| {
        assert!(errors(validator, &good).is_empty());
        for (what, broken) in [
            ("no containerEdits", no_edits),
            ("no kind", no_kind),
            ("major as a string", string_major),
            ("device node without a path", no_path),
        ] {
            assert!(!validator.is_valid(&broken), "{what} passed the schema");
        }
    });
}
