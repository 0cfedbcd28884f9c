//! Our CDI specs against the CNCF container-device-interface JSON schema.
//!
//! The schema is data shared beside the repository, not part of it: the test looks in
//! `$DOMAIND_CDI_SCHEMA_DIR`, then in `shared/cdi` beside the repository or inside it,
//! and says it skipped when none has `schema.json` and `defs.json`. Our own structural
//! invariants are checked everywhere by the unit tests of `domaind_node::cdi`.

use std::fs;
use std::path::{Path, PathBuf};

use domaind_kube_api::names::DEFAULT_DRIVER_NAME;
use domaind_node::cdi::{CdiWriter, ClaimChannels, ClaimUid};
use jsonschema::{Registry, Validator};
use serde_json::{Value, json};

const SCHEMA_DIR_ENV: &str = "DOMAIND_CDI_SCHEMA_DIR";

/// Where the schema's relative `$ref: "defs.json#…"` resolves to.
const BASE: &str = "file:///cdi-schema/";

fn schema_dir() -> Option<PathBuf> {
    let crate_dir = Path::new(env!("CARGO_MANIFEST_DIR"));
    let candidates = std::env::var_os(SCHEMA_DIR_ENV)
        .map(PathBuf::from)
        .into_iter()
        .chain([
            crate_dir.join("../../shared/cdi"),
            crate_dir.join("../shared/cdi"),
        ]);
    let mut looked = Vec::new();
    for dir in candidates {
        if dir.join("schema.json").is_file() && dir.join("defs.json").is_file() {
            return Some(dir);
        }
        looked.push(dir.display().to_string());
    }
    eprintln!(
        "SKIPPED: the CDI JSON schema (schema.json and defs.json) is not in any of {looked:?}; \
         set {SCHEMA_DIR_ENV} to a directory holding them to validate our CDI specs"
    );
    None
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
fn our_specs_validate_against_the_cdi_schema() {
    let Some(dir) = schema_dir() else {
        return;
    };
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
fn the_schema_rejects_broken_specs() {
    let Some(dir) = schema_dir() else {
        return;
    };
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
