"""The chart installed, upgraded and uninstalled by Helm's own engine on a real cluster.

1. install: every object the chart renders exists afterwards, owned by the release, and
   the CRD from crds/ is there;
2. upgrade with changed values: the live objects changed in place, and the objects the
   new values no longer render are gone;
3. uninstall: nothing the release created is left, namespaced or cluster-scoped
   (dependents the API server's garbage collector removes included); the CRD stays, as
   Helm never deletes crds/.

The pods are scheduled nowhere (chart.NOWHERE): this checks what the API server accepts
and what Helm leaves, not the daemons, which other e2e tests run. Run through
helm-chart.sh, which makes the venv; needs KUBECONFIG. Exits non-zero with the failed
check on stderr."""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path
from collections.abc import Iterable
from typing import Any

import yaml
from chart import (
    CRD_NAME,
    DEVICE_CLASSES,
    NOWHERE,
    ObjectId,
    Release,
    manifest_objects,
    merge,
    object_id,
)
from kube import E2EError, get_json, items, kubectl, require_cluster, wait_until

BASE_VALUES: dict[str, Any] = {
    "node": {"nodeSelector": NOWHERE},
    "controller": {"nodeSelector": NOWHERE},
}
# Each change shows in a live object; five of them change what is rendered at all (rack
# mode adds RBAC rules, no leader election drops the Lease's Role and RoleBinding, the
# node's admission policy off drops the ValidatingAdmissionPolicies and their bindings,
# monitoring adds the dashboard's ConfigMap and the PrometheusRule).
UPGRADE_VALUES = merge(
    BASE_VALUES,
    {
        "logging": {"level": "debug"},
        "node": {
            "channelDevices": 4,
            "admissionPolicy": {"enabled": False},
            "seeds": {"mode": "static"},
            "imex": {"sharedName": True},
        },
        "controller": {"rackMode": {"enabled": True}, "leaderElection": {"enabled": False}},
        "monitoring": {
            "dashboard": {"enabled": True},
            "prometheusRule": {"enabled": True, "labels": {"release": "prometheus"}},
        },
    },
)
# The Prometheus Operator is not in the test cluster: a CRD of ours with the rule's
# schema (no field left open) stands for it, so the API server checks the rendered rule.
PROMETHEUS_RULE_CRD = Path(__file__).resolve().parents[1] / "fixtures" / "prometheusrule-crd.yaml"
PROMETHEUS_RULE_CRD_NAME = "prometheusrules.monitoring.coreos.com"
OPERATIONS = Path(__file__).resolve().parents[2] / "docs" / "OPERATIONS.md"
INSTANCE = "app.kubernetes.io/instance"
# Kinds a release or its dependents could leave in the namespace: the chart's own, and
# what the DaemonSet and Deployment controllers make from them.
NAMESPACED_KINDS = (
    "daemonsets,deployments,replicasets,pods,controllerrevisions,services,"
    "serviceaccounts,roles,rolebindings,configmaps,secrets,leases,prometheusrules"
)
CLUSTER_KINDS = (
    "clusterroles,clusterrolebindings,deviceclasses,"
    "validatingadmissionpolicies,validatingadmissionpolicybindings"
)
HELM_ANNOTATIONS = ("meta.helm.sh/release-name", "meta.helm.sh/release-namespace")


def log(message: str) -> None:
    print(f"helm-chart: {message}", flush=True)


def live(objects: Iterable[dict[str, Any]]) -> dict[ObjectId, dict[str, Any]]:
    """Those of `objects` that exist in the cluster, as the API returns them."""
    stubs = [
        {
            "apiVersion": o["apiVersion"],
            "kind": o["kind"],
            "metadata": {k: v for k, v in o["metadata"].items() if k in ("name", "namespace")},
        }
        for o in objects
    ]
    if not stubs:
        return {}
    with tempfile.NamedTemporaryFile("w", suffix=".yaml") as f:
        yaml.safe_dump_all(stubs, f)
        f.flush()
        found = items(["get", "-f", f.name, "--ignore-not-found"])
    return {object_id(o): o for o in found}


def expect_all_live(objects: list[dict[str, Any]], release: Release, when: str) -> None:
    wanted = {object_id(o) for o in objects}
    found = live(objects)
    missing = sorted(wanted - found.keys())
    if missing:
        raise E2EError(
            f"after {when}, rendered but not in the cluster: {', '.join(map(str, missing))}"
        )
    for oid, obj in found.items():
        notes = obj["metadata"].get("annotations") or {}
        owner = (notes.get(HELM_ANNOTATIONS[0]), notes.get(HELM_ANNOTATIONS[1]))
        if owner != (release.name, release.namespace):
            raise E2EError(f"after {when}, {oid} is not owned by the release: {owner}")


def expect_none_live(objects: list[dict[str, Any]], when: str) -> None:
    left = sorted(live(objects))
    if left:
        raise E2EError(f"after {when}, still in the cluster: {', '.join(map(str, left))}")


def expect_no_warnings(release: Release, when: str) -> None:
    """A warning is the API server accepting an object it does not fully understand (an
    unknown field it dropped, a schema format it ignores): a chart bug all the same."""
    if release.warnings:
        raise E2EError(f"the API server warned during the {when}: " + "; ".join(release.warnings))


def expect_pods_admitted(
    daemon_sets: list[dict[str, Any]], deployment: dict[str, Any], namespace: str
) -> None:
    """The workloads' pods pass admission (priority class, pod security, validation),
    though none is scheduled: the Deployment's ReplicaSet creates its pods, which stay
    Pending; no node matches the DaemonSets, so one pod of each is created as a dry
    run."""
    want = deployment["spec"]["replicas"]
    name = deployment["metadata"]["name"]
    wait_until(
        f"Deployment {name} has its {want} pods created",
        lambda: (
            get_json(["get", "deployment", name, "-n", namespace]).get("status", {}).get("replicas")
            == want
        ),
        60,
    )
    for ds in daemon_sets:
        template = ds["spec"]["template"]
        pod = {
            "apiVersion": "v1",
            "kind": "Pod",
            "metadata": {
                "generateName": "dry-run-",
                "namespace": namespace,
                **template["metadata"],
            },
            "spec": template["spec"],
        }
        done = kubectl(["create", "--dry-run=server", "-f", "-"], stdin=json.dumps(pod))
        if "Warning:" in done.stderr:
            raise E2EError(
                f"{object_id(ds)}'s pod is admitted with a warning: {done.stderr.strip()}"
            )


def container_args(obj: dict[str, Any], container: str) -> list[str]:
    for c in obj["spec"]["template"]["spec"]["containers"]:
        if c["name"] == container:
            return c.get("args", [])
    raise E2EError(f"{object_id(obj)} has no container {container}")


def expect_args(obj: dict[str, Any], container: str, present: list[str], absent: list[str]) -> None:
    args = container_args(obj, container)
    for arg in present:
        if arg not in args:
            raise E2EError(f"{object_id(obj)}: {arg} is not among the live args {args}")
    for arg in absent:
        if arg in args:
            raise E2EError(f"{object_id(obj)}: {arg} is still among the live args {args}")


def one(objects: dict[ObjectId, dict[str, Any]], kind: str, suffix: str) -> dict[str, Any]:
    found = [o for oid, o in objects.items() if oid.kind == kind and oid.name.endswith(suffix)]
    if len(found) != 1:
        raise E2EError(f"expected one {kind} named *{suffix}, found {len(found)}")
    return found[0]


def grants(role: dict[str, Any], group: str, resource: str, verb: str) -> bool:
    return any(
        group in rule.get("apiGroups", [])
        and resource in rule.get("resources", [])
        and verb in rule.get("verbs", [])
        for rule in role.get("rules", [])
    )


def allowed(namespace: str, service_account: str, verb: str, group: str, resource: str,
            name: str = "", where: str = "") -> bool:
    """The API server's own answer (a SubjectAccessReview) for the ServiceAccount: one
    that names the object exactly, as `kubectl auth can-i` cannot for a signer name
    with a slash."""
    review = {
        "apiVersion": "authorization.k8s.io/v1",
        "kind": "SubjectAccessReview",
        "spec": {
            "user": f"system:serviceaccount:{namespace}:{service_account}",
            "groups": [
                "system:serviceaccounts",
                f"system:serviceaccounts:{namespace}",
                "system:authenticated",
            ],
            "resourceAttributes": {
                "group": group,
                "resource": resource,
                "verb": verb,
                "name": name,
                "namespace": where,
            },
        },
    }
    done = kubectl(["create", "-f", "-", "-o", "json"], stdin=json.dumps(review))
    return bool(json.loads(done.stdout).get("status", {}).get("allowed", False))


def expect_ca_key_private(objects: dict[ObjectId, dict[str, Any]], namespace: str) -> None:
    """tls.mode csr (the default): the controller may read the gossip CA Secret and sign
    for our signer; no node daemon may read the Secret, approve or sign: it may only ask."""
    node = one(objects, "ServiceAccount", "-node")["metadata"]["name"]
    controller = one(objects, "ServiceAccount", "-controller")["metadata"]["name"]
    secret = ("", "secrets", "domaind-gossip-ca", namespace)
    signer = ("certificates.k8s.io", "signers", "domaind.github.io/gossip-node", "")
    other_signer = ("certificates.k8s.io", "signers", "kubernetes.io/kube-apiserver-client", "")
    csrs = ("certificates.k8s.io", "certificatesigningrequests", "", "")
    nodes = ("", "nodes", "", "")
    wanted = [
        (controller, "get", secret, True),
        # A CSR naming an IP is signed only for its Node's own addresses.
        (controller, "get", nodes, True),
        (controller, "approve", signer, True),
        (controller, "sign", signer, True),
        (controller, "approve", other_signer, False),
        (controller, "sign", other_signer, False),
        (node, "get", secret, False),
        (node, "list", ("", "secrets", "", namespace), False),
        (node, "approve", signer, False),
        (node, "sign", signer, False),
        (node, "create", csrs, True),
        (node, "update", ("certificates.k8s.io", "certificatesigningrequests", "", ""), False),
    ]
    wrong = [
        f"{sa} {verb} {what}: {'no' if want else 'yes'}"
        for sa, verb, what, want in wanted
        if allowed(namespace, sa, verb, *what) != want
    ]
    if wrong:
        raise E2EError(f"the gossip CA's RBAC is not as the chart means it: {wrong}")
    log(
        "tls.mode csr: the controller may read the gossip CA Secret and approve and sign "
        "for domaind.github.io/gossip-node only, and get Nodes (the IPs a CSR names); node "
        "daemons may not read Secrets, approve or sign, only create CSRs "
        "(SubjectAccessReviews)"
    )


def by_label(kinds: str, selector: str, namespace: str | None) -> list[str]:
    where = ["-n", namespace] if namespace else []
    found = items(["get", kinds, *where, "-l", selector])
    return [f"{o['kind']} {o['metadata']['name']}" for o in found]


def adoptable_device_classes(release: Release) -> list[dict[str, Any]]:
    """DeviceClasses of the chart's names that exist already, saved to be put back after
    the uninstall. Another test may have applied deploy/deviceclasses.yaml (same names,
    same selectors): Helm adopts those (take_ownership), which the chart must allow, and
    deletes them on uninstall. One of another Helm release is an error: adopting it
    would break that release."""
    saved = []
    for name in DEVICE_CLASSES:
        found = items(["get", "deviceclass", name, "--ignore-not-found"])
        if not found:
            continue
        obj = found[0]
        meta = obj["metadata"]
        notes = meta.get("annotations") or {}
        owner = notes.get(HELM_ANNOTATIONS[0])
        if owner is not None:
            if (owner, notes.get(HELM_ANNOTATIONS[1])) == (release.name, release.namespace):
                continue  # left by an earlier run of this test: no one else's
            raise E2EError(
                f"DeviceClass {name} belongs to Helm release {owner} in namespace "
                f"{notes.get(HELM_ANNOTATIONS[1])}; uninstall it before this test"
            )
        saved.append(
            {
                "apiVersion": obj["apiVersion"],
                "kind": obj["kind"],
                "metadata": {
                    "name": meta["name"],
                    **({"labels": meta["labels"]} if meta.get("labels") else {}),
                    **({"annotations": notes} if notes else {}),
                },
                "spec": obj["spec"],
            }
        )
    return saved


def restore(saved: list[dict[str, Any]]) -> None:
    """Puts back the DeviceClasses adopted for the test. A failure here is reported but
    does not hide the failure that may have brought us here."""
    for obj in saved:
        done = kubectl(["create", "-f", "-"], stdin=json.dumps(obj), check=False)
        if done.returncode != 0:
            print(
                f"helm-chart: could not put back DeviceClass {obj['metadata']['name']}: "
                f"{done.stderr.strip()}",
                file=sys.stderr,
            )
    if saved:
        log("DeviceClasses that were there before are back")


def clear_leftovers(release: Release) -> None:
    """What an earlier run that was killed may have left, so that this run starts clean."""
    if release.exists():
        log(f"uninstalling release {release.name} left by an earlier run")
        release.uninstall()
    if items(["get", "namespace", release.namespace, "--ignore-not-found"]):
        log(f"deleting namespace {release.namespace} left by an earlier run")
        kubectl(["delete", "namespace", release.namespace, "--wait=false"])
        wait_until(
            f"namespace {release.namespace} deleted",
            lambda: not items(["get", "namespace", release.namespace, "--ignore-not-found"]),
            120,
        )
    left = by_label(CLUSTER_KINDS, f"{INSTANCE}={release.name}", None)
    if left:
        log(f"deleting cluster-scoped objects left by an earlier run: {', '.join(left)}")
        kubectl(["delete", CLUSTER_KINDS, "-l", f"{INSTANCE}={release.name}"])


def install_prometheus_rule_crd() -> bool:
    """Our PrometheusRule CRD, established; whether this run made it (and so deletes it)."""
    if items(["get", "crd", PROMETHEUS_RULE_CRD_NAME, "--ignore-not-found"]):
        return False
    kubectl(["apply", "--server-side", "-f", str(PROMETHEUS_RULE_CRD)])
    kubectl(
        ["wait", "--for=condition=Established", f"crd/{PROMETHEUS_RULE_CRD_NAME}", "--timeout=60s"]
    )
    return True


def github_anchors(markdown: str) -> set[str]:
    """The anchors GitHub gives the headings of `markdown`."""
    anchors = set()
    for line in markdown.splitlines():
        if line.startswith("#"):
            text = line.lstrip("#").strip().lower()
            anchors.add(
                "".join(c for c in text if c.isalnum() or c in "-_ ").replace(" ", "-")
            )
    return anchors


def expect_monitoring(objects: dict[ObjectId, dict[str, Any]]) -> None:
    """monitoring.*.enabled: the dashboard's ConfigMap carries the sidecar's label and a
    dashboard; the PrometheusRule, as the API server stored it, has every alert's
    summary, description and a runbook link to an anchor of docs/OPERATIONS.md."""
    cm = one(objects, "ConfigMap", "-dashboard")
    if (cm["metadata"].get("labels") or {}).get("grafana_dashboard") != "1":
        raise E2EError(f"the dashboard ConfigMap lacks the sidecar's label: {cm['metadata']}")
    dashboard = json.loads(cm["data"]["domaind.json"])
    if not dashboard.get("panels"):
        raise E2EError("the dashboard ConfigMap holds a dashboard without panels")
    rule = one(objects, "PrometheusRule", "")
    if (rule["metadata"].get("labels") or {}).get("release") != "prometheus":
        raise E2EError("monitoring.prometheusRule.labels are not on the PrometheusRule")
    anchors = github_anchors(OPERATIONS.read_text())
    alerts = [r for g in rule["spec"]["groups"] for r in g["rules"] if "alert" in r]
    if len(alerts) < 5:
        raise E2EError(f"expected the five alerts, the rule holds {len(alerts)}")
    for alert in alerts:
        notes = alert.get("annotations") or {}
        missing = [k for k in ("summary", "description", "runbook_url") if not notes.get(k)]
        if missing:
            raise E2EError(f"alert {alert['alert']} lacks {missing}")
        anchor = notes["runbook_url"].rpartition("#")[2]
        if anchor not in anchors:
            raise E2EError(f"alert {alert['alert']}: docs/OPERATIONS.md has no #{anchor}")
        if "{{ $" in alert["expr"] or "{{ ." in alert["expr"]:
            raise E2EError(f"alert {alert['alert']}: an unrendered template in {alert['expr']}")


def run(release: Release, keep: bool) -> dict[str, float]:
    timings: dict[str, float] = {}

    def timed(step: str, fn: Any, *args: Any, **kw: Any) -> Any:
        start = time.monotonic()
        result = fn(*args, **kw)
        timings[step] = time.monotonic() - start
        return result

    clear_leftovers(release)
    crd_before = bool(items(["get", "crd", CRD_NAME, "--ignore-not-found"]))
    made_rule_crd = install_prometheus_rule_crd()
    adopted = adoptable_device_classes(release)
    if adopted:
        log(
            "DeviceClasses exist already, not from a Helm release: the release adopts "
            "them and they are put back after the uninstall ("
            + ", ".join(o["metadata"]["name"] for o in adopted)
            + ")"
        )

    installed = False
    try:
        # 1. install
        rel1 = timed("install", release.install, BASE_VALUES, take_ownership=bool(adopted))
        installed = True
        expect_no_warnings(release, "install")
        objects1 = manifest_objects(rel1["manifest"])
        log(f"installed revision {rel1['version']}: {len(objects1)} objects rendered")
        expect_all_live(objects1, release, "install")
        kinds = {object_id(o).kind for o in objects1}
        for kind in (
            "DaemonSet",
            "Deployment",
            "ServiceAccount",
            "ClusterRole",
            "DeviceClass",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
        ):
            if kind not in kinds:
                raise E2EError(
                    f"the chart rendered no {kind} with values {json.dumps(BASE_VALUES)}"
                )
        crd = get_json(["get", "crd", CRD_NAME])
        established = any(
            c["type"] == "Established" and c["status"] == "True"
            for c in crd.get("status", {}).get("conditions", [])
        )
        if not established:
            raise E2EError(f"CRD {CRD_NAME} is not Established after the install")
        log(
            f"every rendered object is in the cluster, owned by the release, the pods pass "
            f"admission; CRD {CRD_NAME} "
            + (
                "was there already (Helm leaves an existing CRD alone)"
                if crd_before
                else "created from crds/"
            )
        )

        live1 = live(objects1)
        ds = one(live1, "DaemonSet", "-node")
        ds_uid = ds["metadata"]["uid"]
        # Off until every node runs a release whose gossip takes the shared name.
        expect_args(ds, "domaind", [], ["--imex-shared-name"])
        runner = one(live1, "DaemonSet", "-imex-runner")
        if runner["spec"]["updateStrategy"]["type"] != "OnDelete":
            raise E2EError("the IMEX runner's DaemonSet must update only on delete")
        expect_pods_admitted(
            [ds, runner], one(live1, "Deployment", "-controller"), release.namespace
        )
        expect_ca_key_private(live1, release.namespace)

        # 2. upgrade
        rel2 = timed("upgrade", release.upgrade, UPGRADE_VALUES)
        expect_no_warnings(release, "upgrade")
        objects2 = manifest_objects(rel2["manifest"])
        if rel2["version"] != 2:
            raise E2EError(f"the upgrade made revision {rel2['version']}, expected 2")
        expect_all_live(objects2, release, "upgrade")
        live2 = live(objects2)
        ds = one(live2, "DaemonSet", "-node")
        if ds["metadata"]["uid"] != ds_uid:
            raise E2EError("the upgrade recreated the DaemonSet rather than updating it")
        expect_args(
            ds,
            "domaind",
            [
                "--log=debug",
                "--channel-devices=4",
                "--seed-discovery=static",
                "--imex-shared-name",
            ],
            ["--log=info", "--channel-devices=8", "--seed-discovery=api-server"],
        )
        # Static seeds with no list: the headless Service over every daemon, which the
        # default (seeds from the API server) does without.
        if any(object_id(o).kind == "Service" for o in objects1):
            raise E2EError("the default values rendered a Service: seeds come from the API server")
        one(live2, "Service", "-gossip")
        if any(object_id(o).kind == "PrometheusRule" for o in objects1):
            raise E2EError("the default values rendered a PrometheusRule: monitoring is opt-in")
        expect_monitoring(live2)
        deployment = one(live2, "Deployment", "-controller")
        expect_args(
            deployment,
            "controller",
            ["--rack-mode", "--leader-elect=false"],
            ["--leader-elect=true"],
        )
        role = one(live2, "ClusterRole", "-controller")
        if not grants(role, "", "nodes", "watch") or not grants(
            role, "resource.nvidia.com", "computedomains", "create"
        ):
            raise E2EError(f"rack mode's rules are not in the live ClusterRole: {role['rules']}")
        dropped = [o for o in objects1 if object_id(o) not in {object_id(p) for p in objects2}]
        dropped_kinds = sorted({object_id(o).kind for o in dropped})
        meant = ["RoleBinding", "Role", "ValidatingAdmissionPolicy"]
        meant += ["ValidatingAdmissionPolicyBinding"]
        if dropped_kinds != sorted(meant):
            raise E2EError(
                "the upgrade's values were meant to drop the Lease's Role and RoleBinding and "
                f"the node's admission policies and bindings; dropped kinds: {dropped_kinds}"
            )
        expect_none_live(dropped, "upgrade")
        log(
            "upgraded to revision 2: DaemonSet args (--log=debug, --channel-devices=4, "
            "--seed-discovery=static) and the gossip Service, "
            "controller args and ClusterRole (rack mode) changed in place; the dashboard "
            "ConfigMap and the PrometheusRule (accepted by the API server, every runbook "
            "anchor in docs/OPERATIONS.md) added; dropped: "
            + ", ".join(str(object_id(o)) for o in dropped)
        )

        # 3. uninstall
        if keep:
            log(f"--keep: release {release.name} left in namespace {release.namespace}")
            return timings
        timed("uninstall", release.uninstall)
        installed = False
        expect_none_live(objects1 + objects2, "uninstall")
        # The garbage collector removes the dependents (ReplicaSets, their pods,
        # ControllerRevisions) after the uninstall returns.
        selector = f"{INSTANCE}={release.name}"
        wait_until(
            f"no object labelled {selector} left in namespace {release.namespace} "
            f"(left: {by_label(NAMESPACED_KINDS, selector, release.namespace)})",
            lambda: not by_label(NAMESPACED_KINDS, selector, release.namespace),
            60,
        )
        left = by_label(CLUSTER_KINDS, selector, None)
        if left:
            raise E2EError(f"after uninstall, cluster-scoped objects left: {', '.join(left)}")
        history = by_label("secrets", f"owner=helm,name={release.name}", release.namespace)
        if history:
            raise E2EError(f"after uninstall, Helm's release records are left: {history}")
        if not items(["get", "crd", CRD_NAME, "--ignore-not-found"]):
            raise E2EError(f"CRD {CRD_NAME} is gone after the uninstall; Helm keeps crds/")
        log(
            "uninstalled: no object of either revision, no dependent, no cluster-scoped "
            f"object, no release record left; CRD {CRD_NAME} kept (Helm never deletes "
            "crds/: deleting it deletes every ComputeDomain, an operator's decision)"
        )
    finally:
        if installed and not keep:
            log("cleaning up after the failure: uninstalling")
            try:
                release.uninstall()
            except E2EError as e:
                log(f"cleanup: {e}")
        if not keep:
            restore(adopted)
            if made_rule_crd:
                kubectl(["delete", "crd", PROMETHEUS_RULE_CRD_NAME, "--ignore-not-found"])
            # Helm creates the namespace (create_namespace) but never deletes it.
            kubectl(
                ["delete", "namespace", release.namespace, "--ignore-not-found", "--wait=false"],
                check=False,
            )
    return timings


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", default="helm-e2e", help="created and deleted by the test")
    parser.add_argument(
        "--release",
        default="helm-e2e",
        help="release name; its cluster-scoped objects are named after it",
    )
    parser.add_argument(
        "--keep", action="store_true", help="stop before the uninstall and keep the release"
    )
    args = parser.parse_args()
    start = time.monotonic()
    try:
        require_cluster()
        timings = run(Release(args.release, args.namespace), args.keep)
    except E2EError as e:
        print(f"helm-chart: FAILED: {e}", file=sys.stderr)
        return 1
    steps = ", ".join(f"{k} {v:.1f} s" for k, v in timings.items())
    log(f"OK in {time.monotonic() - start:.1f} s ({steps})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
