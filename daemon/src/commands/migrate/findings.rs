//! What a cluster running NVIDIA's ComputeDomain stack holds that matters to a switch to
//! domaind, and what to do about each: pure functions over the objects as the API
//! server returns them (JSON), so that real objects can be fed in as they are.
//!
//! What tells NVIDIA's objects from ours, since the names are the same by design:
//! - its driver's workloads run the `k8s-dra-driver-gpu` image, or carry its chart's
//!   name (`nvidia-dra-driver-gpu`);
//! - its per-domain IMEX DaemonSets are labelled `resource.nvidia.com/computeDomain`
//!   (we make none);
//! - its claim templates for those daemons are labelled `computeDomainTarget: Daemon`,
//!   and carry its finalizer, which our controller never puts on a template;
//! - writers are named in `metadata.managedFields`: our node daemons write statuses and
//!   slices as `domaind-node`, our controller as `domaind-controller`;
//! - a claim allocated from a pool (node) whose slices domaind does not publish was
//!   allocated from the old plugin's devices.

use std::collections::BTreeSet;

use serde::Serialize;
use serde_json::Value;

use domaind_kube_api::names::{
    CONTROLLER_FIELD_MANAGER, DOMAIN_LABEL, FINALIZER, NODE_FIELD_MANAGER, TARGET_LABEL,
};

/// NVIDIA's driver's image, as its chart names it.
const NVIDIA_IMAGE: &str = "k8s-dra-driver-gpu";
/// NVIDIA's chart's name, in its workloads' labels.
const NVIDIA_CHART: &str = "dra-driver-gpu";
/// What NVIDIA's controller labels its IMEX daemons' claim templates with.
const TARGET_DAEMON: &str = "Daemon";
const DAEMON_DEVICE_CLASS: &str = "compute-domain-daemon.nvidia.com";

/// Everything the check lists, as the API server returned it.
#[derive(Debug, Default, Clone)]
pub struct Inventory {
    /// `computedomains.resource.nvidia.com`, if installed.
    pub crd: Option<Value>,
    pub compute_domains: Vec<Value>,
    pub claims: Vec<Value>,
    pub claim_templates: Vec<Value>,
    pub slices: Vec<Value>,
    pub daemon_sets: Vec<Value>,
    pub deployments: Vec<Value>,
    /// Nodes labelled `resource.nvidia.com/computeDomain`.
    pub labelled_nodes: Vec<Value>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Finding {
    /// The object's kind, e.g. `DaemonSet`.
    pub kind: String,
    /// `namespace/name`, or `name` when cluster-scoped.
    pub object: String,
    /// What was found.
    pub found: String,
    /// What to do.
    pub action: String,
    /// Whether the switch must wait for it.
    pub blocks: bool,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Report {
    pub driver: String,
    pub compute_domains: usize,
    pub blocked: bool,
    pub findings: Vec<Finding>,
}

fn str_at<'a>(value: &'a Value, pointer: &str) -> &'a str {
    value.pointer(pointer).and_then(Value::as_str).unwrap_or("")
}

fn name_of(obj: &Value) -> String {
    let name = str_at(obj, "/metadata/name");
    match str_at(obj, "/metadata/namespace") {
        "" => name.to_owned(),
        namespace => format!("{namespace}/{name}"),
    }
}

fn label<'a>(obj: &'a Value, key: &str) -> Option<&'a str> {
    obj.pointer("/metadata/labels")
        .and_then(|labels| labels.get(key))
        .and_then(Value::as_str)
}

fn has_finalizer(obj: &Value, finalizer: &str) -> bool {
    obj.pointer("/metadata/finalizers")
        .and_then(Value::as_array)
        .is_some_and(|fs| fs.iter().any(|f| f == finalizer))
}

/// The field managers that wrote `obj` (its `subresource` only, if given).
fn managers(obj: &Value, subresource: Option<&str>) -> BTreeSet<String> {
    obj.pointer("/metadata/managedFields")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|entry| match subresource {
            Some(sub) => entry["subresource"] == sub,
            None => true,
        })
        .filter_map(|entry| entry["manager"].as_str().map(str::to_owned))
        .collect()
}

fn ours(manager: &str) -> bool {
    manager == NODE_FIELD_MANAGER || manager == CONTROLLER_FIELD_MANAGER
}

fn finding(kind: &str, obj: &Value, found: String, action: &str, blocks: bool) -> Finding {
    Finding {
        kind: kind.to_owned(),
        object: name_of(obj),
        found,
        action: action.to_owned(),
        blocks,
    }
}

/// The whole check.
pub fn inspect(inventory: &Inventory, driver: &str) -> Report {
    let mut findings = Vec::new();
    findings.extend(crd(inventory.crd.as_ref()));
    findings.extend(nvidia_driver(inventory));
    findings.extend(imex_daemon_sets(&inventory.daemon_sets));
    findings.extend(inventory.compute_domains.iter().filter_map(compute_domain));
    let ours = domaind_pools(&inventory.slices, driver);
    findings.extend(
        inventory
            .claims
            .iter()
            .filter_map(|c| claim(c, driver, &ours)),
    );
    findings.extend(inventory.claim_templates.iter().filter_map(claim_template));
    findings.extend(foreign_slices(&inventory.slices, driver));
    findings.extend(inventory.labelled_nodes.iter().map(|node| {
        finding(
            "Node",
            node,
            format!(
                "labelled {DOMAIN_LABEL}={} by NVIDIA's plugin (where a domain's IMEX daemon ran)",
                label(node, DOMAIN_LABEL).unwrap_or_default()
            ),
            &format!("kubectl label node {} {DOMAIN_LABEL}-", name_of(node)),
            false,
        )
    }));
    Report {
        driver: driver.to_owned(),
        compute_domains: inventory.compute_domains.len(),
        blocked: findings.iter().any(|f| f.blocks),
        findings,
    }
}

/// Our CRD has what the node daemons and the controller write; NVIDIA's has not
/// (`status.conditions`, `readyNodes`, ...), and the API server prunes what the schema
/// lacks.
fn crd(crd: Option<&Value>) -> Option<Finding> {
    let Some(crd) = crd else {
        return Some(Finding {
            kind: "CustomResourceDefinition".into(),
            object: "computedomains.resource.nvidia.com".into(),
            found: "not installed: no ComputeDomain to carry over".into(),
            action: "nothing: domaind's chart installs it".into(),
            blocks: false,
        });
    };
    let versions = crd.pointer("/spec/versions").and_then(Value::as_array);
    let storage = versions
        .into_iter()
        .flatten()
        .find(|v| v["storage"] == true)?;
    let status = storage.pointer("/schema/openAPIV3Schema/properties/status/properties");
    let has = |field: &str| status.and_then(|s| s.get(field)).is_some();
    if has("conditions") && has("readyNodes") {
        return None;
    }
    Some(finding(
        "CustomResourceDefinition",
        crd,
        "NVIDIA's schema: no status.conditions or readyNodes, which the API server would drop from domaind's status writes".into(),
        "kubectl apply --server-side -f deploy/crds/ (it only adds fields; every ComputeDomain stays)",
        true,
    ))
}

fn containers(obj: &Value) -> impl Iterator<Item = &Value> {
    ["containers", "initContainers"]
        .into_iter()
        .flat_map(move |key| {
            obj.pointer(&format!("/spec/template/spec/{key}"))
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
        })
}

fn nvidia_driver(inventory: &Inventory) -> Vec<Finding> {
    let workloads = inventory
        .deployments
        .iter()
        .map(|o| ("Deployment", o))
        .chain(inventory.daemon_sets.iter().map(|o| ("DaemonSet", o)))
        // A domain's IMEX DaemonSet runs the driver's image too; said apart below.
        .filter(|(_, obj)| label(obj, DOMAIN_LABEL).is_none());
    workloads
        .filter_map(|(kind, obj)| {
            let image = containers(obj)
                .filter_map(|c| c["image"].as_str())
                .find(|image| image.contains(NVIDIA_IMAGE));
            let chart = ["app.kubernetes.io/name", "helm.sh/chart", "app"]
                .iter()
                .filter_map(|key| label(obj, key))
                .find(|value| value.contains(NVIDIA_CHART));
            let why = match (image, chart) {
                (Some(image), _) => format!("runs {image}"),
                (None, Some(chart)) => format!("labelled {chart}"),
                (None, None) => return None,
            };
            Some(finding(
                kind,
                obj,
                format!("NVIDIA's DRA driver ({why}): its kubelet plugin registers the same driver name as domaind's"),
                "helm uninstall its release once no multi-node workload runs (docs/OPERATIONS.md, \"Moving over from NVIDIA's driver\")",
                true,
            ))
        })
        .collect()
}

fn imex_daemon_sets(daemon_sets: &[Value]) -> Vec<Finding> {
    daemon_sets
        .iter()
        .filter_map(|ds| {
            let uid = label(ds, DOMAIN_LABEL)?;
            let stuck = if has_finalizer(ds, FINALIZER) {
                " (it holds NVIDIA's finalizer: remove it first if NVIDIA's controller is gone)"
            } else {
                ""
            };
            Some(finding(
                "DaemonSet",
                ds,
                format!("an IMEX DaemonSet NVIDIA's controller made for ComputeDomain uid {uid}: its IMEX daemons would hold IMEX's ports on the nodes domaind needs"),
                &format!("delete it once its workload is gone{stuck}"),
                true,
            ))
        })
        .collect()
}

fn compute_domain(cd: &Value) -> Option<Finding> {
    let status = cd.get("status").filter(|s| !s.is_null())?;
    let writers: Vec<String> = managers(cd, Some("status"))
        .into_iter()
        .filter(|m| !ours(m))
        .collect();
    let ours_wrote = managers(cd, Some("status")).iter().any(|m| ours(m));
    let nvidia_shape = status.get("conditions").is_none() && status.get("readyNodes").is_none();
    // Said when someone else wrote it, or it has NVIDIA's shape and none of ours did.
    let nvidias = !writers.is_empty() || (nvidia_shape && !ours_wrote);
    if !nvidias {
        return None;
    }
    let nodes = status
        .get("nodes")
        .and_then(Value::as_array)
        .map_or(0, Vec::len);
    let by = if writers.is_empty() {
        "no domaind component".to_owned()
    } else {
        writers.join(", ")
    };
    Some(finding(
        "ComputeDomain",
        cd,
        format!(
            "status {} with {nodes} node(s) written by {by} (NVIDIA's shape: no conditions or readyNodes)",
            str_at(status, "/status")
        ),
        "nothing: kept as it is; domaind's nodes write the whole status when the domain next forms",
        false,
    ))
}

/// The pools (nodes) whose slices of `driver` domaind's node daemons published.
fn domaind_pools(slices: &[Value], driver: &str) -> BTreeSet<String> {
    slices
        .iter()
        .filter(|s| str_at(s, "/spec/driver") == driver)
        .filter(|s| managers(s, None).contains(NODE_FIELD_MANAGER))
        .map(|s| str_at(s, "/spec/pool/name").to_owned())
        .collect()
}

fn claim(claim: &Value, driver: &str, domaind_pools: &BTreeSet<String>) -> Option<Finding> {
    let results: Vec<&Value> = claim
        .pointer("/status/allocation/devices/results")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter(|r| r["driver"] == driver)
        .collect();
    if results.is_empty() {
        return None;
    }
    let devices: Vec<String> = results
        .iter()
        .map(|r| format!("{}/{}", str_at(r, "/pool"), str_at(r, "/device")))
        .collect();
    let daemon = results
        .iter()
        .any(|r| str_at(r, "/device").starts_with("daemon"))
        || claim
            .pointer("/spec/devices/requests")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .any(|r| str_at(r, "/exactly/deviceClassName") == DAEMON_DEVICE_CLASS);
    let old_plugin = daemon
        || results
            .iter()
            .any(|r| !domaind_pools.contains(str_at(r, "/pool")));
    if !old_plugin {
        return None;
    }
    let pods: Vec<&str> = claim
        .pointer("/status/reservedFor")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(|r| r["name"].as_str())
        .collect();
    let devices = devices.join(", ");
    Some(if daemon {
        finding(
            "ResourceClaim",
            claim,
            format!("an IMEX daemon's claim of NVIDIA's controller ({devices})"),
            "nothing: it goes with its DaemonSet's pods; delete it if it stays (remove NVIDIA's finalizer first)",
            false,
        )
    } else if pods.is_empty() {
        finding(
            "ResourceClaim",
            claim,
            format!(
                "allocated from devices domaind does not publish ({devices}), reserved for no pod"
            ),
            "delete it, or let its owner release it",
            false,
        )
    } else {
        finding(
            "ResourceClaim",
            claim,
            format!(
                "allocated by NVIDIA's plugin ({devices}) and reserved for pod(s) {}: their IMEX domain is NVIDIA's and ends with its daemons",
                pods.join(", ")
            ),
            "let the workload finish, or delete it, before uninstalling NVIDIA's driver",
            true,
        )
    })
}

fn claim_template(template: &Value) -> Option<Finding> {
    let target = label(template, TARGET_LABEL);
    if target == Some(TARGET_DAEMON) {
        return Some(finding(
            "ResourceClaimTemplate",
            template,
            "NVIDIA's controller's template for a domain's IMEX daemons".into(),
            "delete it once NVIDIA's controller is gone (remove its finalizer first)",
            false,
        ));
    }
    if has_finalizer(template, FINALIZER) {
        return Some(finding(
            "ResourceClaimTemplate",
            template,
            format!(
                "a workload template with NVIDIA's finalizer {FINALIZER}, which domaind's controller never removes from a template"
            ),
            "kubectl patch resourceclaimtemplate -n NS NAME --type=merge -p '{\"metadata\":{\"finalizers\":null}}', or deleting its ComputeDomain hangs",
            false,
        ));
    }
    None
}

fn foreign_slices(slices: &[Value], driver: &str) -> Vec<Finding> {
    slices
        .iter()
        .filter(|s| str_at(s, "/spec/driver") == driver)
        .filter(|s| !managers(s, None).contains(NODE_FIELD_MANAGER))
        .map(|s| {
            let devices = s
                .pointer("/spec/devices")
                .and_then(Value::as_array)
                .map_or(0, Vec::len);
            finding(
                "ResourceSlice",
                s,
                format!(
                    "{devices} device(s) of {driver} on node {} not published by domaind",
                    str_at(s, "/spec/nodeName")
                ),
                "nothing: the kubelet wipes them once the old plugin has been gone a while; or delete them",
                false,
            )
        })
        .collect()
}

/// The report as text: one block per finding, blocking ones first.
pub fn render_text(report: &Report) -> String {
    let mut out = format!(
        "domaind migrate --check: driver {}, {} ComputeDomain(s), {} finding(s)\n",
        report.driver,
        report.compute_domains,
        report.findings.len()
    );
    let mut findings: Vec<&Finding> = report.findings.iter().collect();
    findings.sort_by_key(|f| !f.blocks);
    for f in findings {
        let mark = if f.blocks { "BLOCKS" } else { "note" };
        out.push_str(&format!(
            "\n[{mark}] {} {}\n  found: {}\n  do:    {}\n",
            f.kind, f.object, f.found, f.action
        ));
    }
    out.push_str(if report.blocked {
        "\nThe switch must wait: resolve the BLOCKS findings above.\n"
    } else {
        "\nNothing blocks the switch.\n"
    });
    out
}

#[cfg(test)]
mod tests;
