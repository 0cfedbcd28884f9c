//! The ComputeDomain CRD: checked in under deploy/, current, and compatible with the
//! NVIDIA's driver's, so existing objects stay valid.

use std::path::Path;

use domaind_kube_api::crd::{ChannelAllocationMode, ComputeDomain, crd_yaml};
use serde_json::Value;

const DEPLOYED: &str = "../deploy/crds/computedomains.resource.nvidia.com.yaml";
/// Where NVIDIA's CRD as it ships is (`../shared/reference/`): outside data, so its
/// test runs only when asked for (`--ignored`) with this set.
const REFERENCE_DIR_ENV: &str = "DOMAIND_REFERENCE_DIR";
const NVIDIA_CRD: &str = "anchor-computedomains-crd.yaml";

fn manifest_dir() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn yaml(text: &str) -> Value {
    serde_saphyr::from_str(text).unwrap()
}

fn schema(crd: &Value) -> &Value {
    &crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
}

#[test]
fn the_deployed_crd_is_what_crdgen_prints() {
    let deployed = std::fs::read_to_string(manifest_dir().join(DEPLOYED)).unwrap();
    assert!(
        deployed == crd_yaml(),
        "deploy/crds is stale: run `cargo run --bin domaind -- crdgen > \
         deploy/crds/computedomains.resource.nvidia.com.yaml`"
    );
}

/// Every property of NVIDIA's schema is in ours with the same type, enum and
/// default; nothing ours requires is optional in NVIDIA's.
fn assert_compatible(path: &str, nvidia: &Value, ours: &Value, problems: &mut Vec<String>) {
    for key in [
        "type",
        "enum",
        "default",
        "x-kubernetes-list-type",
        "x-kubernetes-list-map-keys",
    ] {
        let (a, o) = (&nvidia[key], &ours[key]);
        let same = match (a, o) {
            // YAML gives 0 for NVIDIA's integer default, 0 for ours; compare as numbers.
            (Value::Number(a), Value::Number(o)) => a.as_f64() == o.as_f64(),
            _ => a == o,
        };
        if !a.is_null() && !same {
            problems.push(format!("{path}: {key} is {o}, NVIDIA's is {a}"));
        }
    }
    let nvidia_required: Vec<&Value> = nvidia["required"]
        .as_array()
        .map(|r| r.iter().collect())
        .unwrap_or_default();
    if let Some(required) = ours["required"].as_array() {
        for field in required {
            let defaulted = !ours["properties"][field.as_str().unwrap()]["default"].is_null();
            // A ComputeDomain without a spec names no claim template: NVIDIA's
            // controller cannot serve one either, and kube's derive requires it.
            let spec_at_root = path.is_empty() && field == "spec";
            if !nvidia_required.contains(&field) && !defaulted && !nvidia.is_null() && !spec_at_root
            {
                problems.push(format!("{path}: we require {field}, NVIDIA's does not"));
            }
        }
    }
    if let Some(properties) = nvidia["properties"].as_object() {
        for (name, nvidia_property) in properties {
            // The API server's own fields, not the CRD's.
            if path.is_empty() && ["apiVersion", "kind", "metadata"].contains(&name.as_str()) {
                continue;
            }
            let ours_property = &ours["properties"][name];
            if ours_property.is_null() {
                problems.push(format!("{path}.{name}: missing"));
                continue;
            }
            assert_compatible(
                &format!("{path}.{name}"),
                nvidia_property,
                ours_property,
                problems,
            );
        }
    }
    if nvidia["items"].is_object() {
        assert_compatible(
            &format!("{path}[]"),
            &nvidia["items"],
            &ours["items"],
            problems,
        );
    }
}

#[test]
#[ignore = "needs reference data: NVIDIA's CRD in $DOMAIND_REFERENCE_DIR (../shared/reference)"]
fn our_crd_accepts_what_nvidias_accepts() {
    let dir = std::env::var_os(REFERENCE_DIR_ENV)
        .unwrap_or_else(|| panic!("{REFERENCE_DIR_ENV} names no directory"));
    let nvidia_path = Path::new(&dir).join(NVIDIA_CRD);
    let nvidia = std::fs::read_to_string(&nvidia_path)
        .unwrap_or_else(|e| panic!("{}: {e}", nvidia_path.display()));
    let nvidia = yaml(&nvidia);
    let ours = yaml(&crd_yaml());
    assert_eq!(ours["spec"]["group"], nvidia["spec"]["group"]);
    for key in ["kind", "plural", "singular"] {
        assert_eq!(
            ours["spec"]["names"][key], nvidia["spec"]["names"][key],
            "{key}"
        );
    }
    assert_eq!(ours["spec"]["scope"], nvidia["spec"]["scope"]);
    assert_eq!(
        ours["spec"]["versions"][0]["name"],
        nvidia["spec"]["versions"][0]["name"]
    );
    assert_eq!(
        ours["spec"]["versions"][0]["subresources"],
        nvidia["spec"]["versions"][0]["subresources"]
    );
    assert_eq!(
        schema(&ours)["properties"]["spec"]["x-kubernetes-validations"][0]["rule"],
        "self == oldSelf"
    );
    let mut problems = Vec::new();
    assert_compatible("", schema(&nvidia), schema(&ours), &mut problems);
    assert!(problems.is_empty(), "{problems:#?}");
}

#[test]
fn the_contract_test_finds_a_renamed_field() {
    let ours = yaml(&crd_yaml());
    let mut broken = ours.clone();
    let nodes = &mut broken["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]["status"]
        ["properties"]["nodes"]["items"]["properties"];
    let clique = nodes["cliqueID"].take();
    nodes["cliqueId"] = clique;
    let mut problems = Vec::new();
    assert_compatible("", schema(&ours), schema(&broken), &mut problems);
    assert!(
        problems.iter().any(|p| p.contains("cliqueID: missing")),
        "{problems:#?}"
    );
}

#[test]
fn manifests_written_for_nvidias_driver_decode() {
    // As in NVIDIA's and CoreWeave's published examples.
    let minimal: ComputeDomain = serde_saphyr::from_str(
        "apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: compute-domain-0
spec:
  numNodes: 0
  channel:
    resourceClaimTemplate:
      name: compute-domain-0-rct
",
    )
    .unwrap();
    assert_eq!(
        minimal.spec.channel.resource_claim_template.name,
        "compute-domain-0-rct"
    );
    assert_eq!(
        minimal.spec.channel.allocation_mode,
        ChannelAllocationMode::Single
    );
    let with_status: ComputeDomain = serde_saphyr::from_str(
        "apiVersion: resource.nvidia.com/v1beta1
kind: ComputeDomain
metadata:
  name: s0-011-us-west-01a
  namespace: cw-nvidia-gpu-operator
  uid: e6d3a22d-12a8-47f7-b55b-fdcbcf4e35d8
  finalizers:
  - resource.nvidia.com/computeDomain
spec:
  channel:
    allocationMode: Single
    resourceClaimTemplate:
      name: imex-channel-s0-011-us-west-01a
status:
  nodes:
  - cliqueID: 5f7d1f7c-5a4e-4f4e-9d8c-1b2c3d4e5f60.32766
    index: 0
    ipAddress: 10.0.0.12
    name: s0-011-us-west-01a-node-1
  status: Ready
",
    )
    .unwrap();
    let status = with_status.status.unwrap();
    assert_eq!(status.nodes[0].index, Some(0));
    assert_eq!(
        status.nodes[0].status.to_string(),
        "NotReady",
        "the CRD's default"
    );
    assert_eq!(status.status.to_string(), "Ready");
}

/// The formats every API server since 1.0 validates for strings (go-openapi's names,
/// compared with their dashes removed as the API server does); newer servers know a
/// few more, which older ones would warn about.
const STRING_FORMATS: [&str; 24] = [
    "bsonobjectid",
    "uri",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "cidr",
    "mac",
    "uuid",
    "uuid3",
    "uuid4",
    "uuid5",
    "isbn",
    "isbn10",
    "isbn13",
    "creditcard",
    "ssn",
    "hexcolor",
    "rgbcolor",
    "byte",
    "password",
    "date",
    "duration",
    "datetime",
];

/// Every `format` under `schema` that the API server does not recognise for its
/// `type` (and so warns about on apply): integers take int32 and int64, numbers float
/// and double, strings the formats above; other types take none.
fn unrecognized_formats(path: &str, schema: &Value, found: &mut Vec<String>) {
    match schema {
        Value::Object(object) => {
            if let Some(format) = object.get("format").and_then(Value::as_str) {
                let known = match object.get("type").and_then(Value::as_str) {
                    Some("integer") => ["int32", "int64"].contains(&format),
                    Some("number") => ["float", "double"].contains(&format),
                    None | Some("string") => {
                        STRING_FORMATS.contains(&format.replace('-', "").as_str())
                    }
                    Some(_) => false,
                };
                if !known {
                    found.push(format!("{path}: {format}"));
                }
            }
            for (key, value) in object {
                unrecognized_formats(&format!("{path}.{key}"), value, found);
            }
        }
        Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                unrecognized_formats(&format!("{path}[{i}]"), item, found);
            }
        }
        _ => {}
    }
}

#[test]
fn every_format_in_the_schema_is_one_kubernetes_knows() {
    let crd = yaml(&crd_yaml());
    let mut found = Vec::new();
    for (i, version) in crd["spec"]["versions"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
    {
        unrecognized_formats(
            &format!("versions[{i}]"),
            &version["schema"]["openAPIV3Schema"],
            &mut found,
        );
    }
    assert!(found.is_empty(), "{found:#?}");

    // Unsigned integers keep their range as bounds the API server enforces.
    let status = &schema(&crd)["properties"]["status"]["properties"];
    assert_eq!(
        status["readyNodes"]["maximum"].as_f64(),
        Some(f64::from(u32::MAX))
    );
    assert_eq!(status["readyNodes"]["minimum"].as_f64(), Some(0.0));
    let index = &status["nodes"]["items"]["properties"]["index"];
    assert_eq!(index["format"], "int32");
    assert_eq!(index["maximum"].as_f64(), Some(f64::from(u16::MAX)));
}

#[test]
fn the_format_walk_finds_what_the_api_server_warns_about() {
    let schema: Value = serde_json::json!({
        "type": "object",
        "properties": {
            "a": {"type": "integer", "format": "uint32"},
            "b": {"type": "array", "items": {"type": "integer", "format": "uint16"}},
            "c": {"type": "string", "format": "date-time"},
            "d": {"type": "number", "format": "int64"},
            "e": {"type": "boolean", "format": "byte"},
            "f": {"type": "integer", "format": "int32"},
        }
    });
    let mut found = Vec::new();
    unrecognized_formats("", &schema, &mut found);
    assert_eq!(
        found,
        [
            ".properties.a: uint32",
            ".properties.b.items: uint16",
            ".properties.d: int64",
            ".properties.e: byte",
        ]
    );
}
