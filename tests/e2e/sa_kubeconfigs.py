"""Kubeconfigs of the chart's ServiceAccounts, so that end-to-end tests run the node
daemon and the controller with the chart's RBAC rather than as cluster admin.

Renders the chart with Helm's engine, applies only its ServiceAccounts, Roles,
ClusterRoles and bindings to NAMESPACE, and its ValidatingAdmissionPolicies for the node
daemon (node.admissionPolicy), mints a token for the node daemon's and the
controller's ServiceAccount (the ones the DaemonSet and the Deployment name), and writes
OUTDIR/node.kubeconfig and OUTDIR/controller.kubeconfig: the API server and CA of
$KUBECONFIG, the token, NAMESPACE as the context's namespace (the controller's Lease
namespace when DOMAIND_LEASE_NAMESPACE is unset). Then proves them: each asks the API
server (`kubectl auth can-i`) for what its program does (daemon/src/kube/,
controller/src/) and for things it must not do, and a real request of each kind; the
policies must type-check against the API server's schemas without a warning, and refuse
a slice written with the node's token (a plain token, bound to no pod's node).

The node's token here is not bound to a pod, so with the policies on it can read but
not write: the end-to-end suite mints pod-bound tokens of the same ServiceAccount per
node (tests/src/tokens.rs).

helm-sdkpy has no `helm template`: the manifest comes from an install of the chart
(nothing scheduled, no DeviceClasses) that is uninstalled at once. OUTDIR/rbac.yaml
holds what was applied, policies included (`kubectl delete -f OUTDIR/rbac.yaml` removes it). Running it
again replaces the ServiceAccounts, so earlier tokens stop working."""

from __future__ import annotations

import argparse
import base64
import json
import os
import sys
from pathlib import Path
from typing import Any

import yaml
from chart import CHART, NOWHERE, Release, manifest_objects, merge, object_id, set_value
from kube import E2EError, get_json, kubectl, require_cluster, wait_until

RBAC_KINDS = ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")
POLICY_KINDS = ("ValidatingAdmissionPolicy", "ValidatingAdmissionPolicyBinding")
RENDER_VALUES: dict[str, Any] = {
    "node": {"nodeSelector": NOWHERE},
    "controller": {"nodeSelector": NOWHERE, "replicas": 0},
    # Cluster-scoped and named for every release alike: left to whoever applies them.
    "deviceClasses": {"create": False},
}
# Another namespace than the release's: ComputeDomains and claims live in the users'.
ELSEWHERE = "default"
CD = "computedomains.resource.nvidia.com"


def log(message: str) -> None:
    print(f"sa-kubeconfigs: {message}", file=sys.stderr, flush=True)


def release_name(namespace: str) -> str:
    """One release per namespace, so that two namespaces' cluster-scoped ClusterRoles
    and bindings (named after the release) never collide."""
    return namespace


def service_account_of(objects: list[dict[str, Any]], kind: str, component: str) -> str:
    """The ServiceAccount of the chart's one `kind` of `component` (its
    app.kubernetes.io/component label): the chart has two DaemonSets, the node daemon's
    and the IMEX runner's, which has none."""
    found = [
        o
        for o in objects
        if o["kind"] == kind
        and o["metadata"].get("labels", {}).get("app.kubernetes.io/component") == component
    ]
    if len(found) != 1:
        raise E2EError(
            f"expected one {kind} of component {component} in the rendered chart, "
            f"found {len(found)}"
        )
    name = found[0]["spec"]["template"]["spec"].get("serviceAccountName")
    if not name:
        raise E2EError(f"the chart's {kind} of {component} names no serviceAccountName")
    return name


def build_kubeconfig(
    server: str, ca_data: str, user: str, token: str, namespace: str
) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {
                "name": "cluster",
                "cluster": {"server": server, "certificate-authority-data": ca_data},
            }
        ],
        "users": [{"name": user, "user": {"token": token}}],
        "contexts": [
            {"name": user, "context": {"cluster": "cluster", "user": user, "namespace": namespace}}
        ],
        "current-context": user,
    }


def current_cluster() -> tuple[str, str]:
    """The API server's address and CA (base64 PEM) of $KUBECONFIG's current context."""
    view = get_json(["config", "view", "--raw", "--minify"])
    cluster = view["clusters"][0]["cluster"]
    ca = cluster.get("certificate-authority-data")
    if not ca and cluster.get("certificate-authority"):
        ca = base64.b64encode(Path(cluster["certificate-authority"]).read_bytes()).decode()
    if not ca:
        raise E2EError("the current context of $KUBECONFIG has no CA to put in the kubeconfigs")
    return cluster["server"], ca


def checks(
    values: dict[str, Any], namespace: str
) -> dict[str, tuple[list[list[str]], list[list[str]]]]:
    """For each program, the `kubectl auth can-i` arguments it must be allowed and those
    it must be denied. Read from the code: node/src/kube/ (domains.rs, claims.rs,
    reconcile.rs, status.rs, publisher.rs, events.rs) and controller/src/ (lib.rs,
    reconcile.rs, leader/, rack.rs)."""
    elsewhere = ["-n", ELSEWHERE]
    everywhere = ["--all-namespaces"]
    claims = "resourceclaims.resource.k8s.io"
    # The synthetic subresource the API server checks a driver's status.devices
    # entries against (Kubernetes 1.36), named by the driver.
    ours = f"{claims}/{values['driverName']}"
    node_may = [
        ["list", CD, *everywhere],  # watcher of every ComputeDomain
        ["watch", CD, *everywhere],
        ["get", CD, *elsewhere],
        ["list", CD, *elsewhere],  # claims.rs: a namespace's domains
        ["patch", CD, "--subresource=status", *elsewhere],  # server-side apply of status
        ["get", "resourceclaims.resource.k8s.io", *elsewhere],
        ["list", "resourceclaims.resource.k8s.io", *everywhere],  # start-up reconcile
        ["patch", claims, "--subresource=status", *elsewhere],  # claim_status_writer.rs
        ["associated-node:patch", ours, "--subresource=driver", *elsewhere],
        ["list", "resourceslices.resource.k8s.io"],
        ["watch", "resourceslices.resource.k8s.io"],
        ["create", "resourceslices.resource.k8s.io"],  # apply of a new slice
        ["patch", "resourceslices.resource.k8s.io"],
        ["delete", "resourceslices.resource.k8s.io"],
        ["get", "nodes"],  # the slices' owner
        ["create", "events.events.k8s.io", *elsewhere],
        ["patch", "events.events.k8s.io", *elsewhere],
    ]
    node_must_not = [
        ["delete", "namespaces"],
        ["get", "secrets", *elsewhere],
        ["create", "pods", *elsewhere],
        ["create", CD, *elsewhere],
        ["patch", CD, *elsewhere],  # the status only
        ["delete", CD, *elsewhere],
        ["update", "nodes"],
        # Apply and delete one by one are all the daemon does to its slices and status.
        ["update", "resourceslices.resource.k8s.io"],
        ["deletecollection", "resourceslices.resource.k8s.io"],
        ["get", CD, "--subresource=status", *elsewhere],
        ["create", "resourceclaimtemplates.resource.k8s.io", *elsewhere],
        # Claims: only our driver's device status, only on the claim's own node.
        ["patch", claims, *elsewhere],
        ["update", claims, "--subresource=status", *elsewhere],
        ["patch", claims, "--subresource=binding", *elsewhere],
        ["arbitrary-node:patch", ours, "--subresource=driver", *elsewhere],
        ["associated-node:patch", f"{claims}/gpu.nvidia.com", "--subresource=driver", *elsewhere],
    ]
    controller = values["controller"]
    election = controller["leaderElection"]
    rack = controller["rackMode"]["enabled"]
    lease = f"leases.coordination.k8s.io/{election['leaseName']}"
    here = ["-n", namespace]
    controller_may = [
        ["list", CD, *everywhere],
        ["watch", CD, *everywhere],
        ["patch", CD, *elsewhere],  # its finalizer
        ["patch", CD, "--subresource=status", *elsewhere],  # its condition
        ["get", "resourceclaimtemplates.resource.k8s.io", *elsewhere],
        ["list", "resourceclaimtemplates.resource.k8s.io", *everywhere],
        ["watch", "resourceclaimtemplates.resource.k8s.io", *everywhere],
        ["create", "resourceclaimtemplates.resource.k8s.io", *elsewhere],
        ["delete", "resourceclaimtemplates.resource.k8s.io", *elsewhere],
        ["list", "resourceclaims.resource.k8s.io", *elsewhere],
        ["create", "events.events.k8s.io", *elsewhere],
        ["patch", "events.events.k8s.io", *elsewhere],
    ]
    controller_must_not = [
        ["delete", "namespaces"],
        ["get", "secrets", *here],
        ["delete", CD, *elsewhere],
        ["create", "resourceslices.resource.k8s.io"],
        ["update", "resourceclaims.resource.k8s.io", *elsewhere],
    ]
    if election["enabled"]:
        controller_may += [
            ["create", "leases.coordination.k8s.io", *here],
            ["get", lease, *here],
            ["update", lease, *here],
        ]
        controller_must_not += [
            ["create", "leases.coordination.k8s.io", *elsewhere],  # its own namespace only
            ["update", "leases.coordination.k8s.io/someone-elses", *here],
        ]
    if rack:
        controller_may += [["list", "nodes"], ["watch", "nodes"], ["create", CD, *elsewhere]]
    else:
        controller_must_not += [["list", "nodes"], ["create", CD, *elsewhere]]
    if values["tls"]["mode"] == "csr":
        # signer/mod.rs: a CSR naming an IP is checked against its Node's addresses.
        controller_may += [["get", "nodes"]]
    elif not rack:
        controller_must_not += [["get", "nodes"]]
    return {
        "node": (node_may, node_must_not),
        "controller": (controller_may, controller_must_not),
    }


def can_i(kubeconfig: str, args: list[str]) -> bool:
    done = kubectl(["auth", "can-i", *args], kubeconfig=kubeconfig, check=False)
    answer = done.stdout.strip()
    if answer not in ("yes", "no"):
        raise E2EError(
            f"kubectl auth can-i {' '.join(args)} with {kubeconfig}: {done.stderr.strip()}"
        )
    return answer == "yes"


def prove(kubeconfig: str, who: str, may: list[list[str]], must_not: list[list[str]]) -> None:
    denied = [a for a in may if not can_i(kubeconfig, a)]
    if denied:
        raise E2EError(f"{kubeconfig} ({who}) may not: " + "; ".join(" ".join(a) for a in denied))
    allowed = [a for a in must_not if can_i(kubeconfig, a)]
    if allowed:
        raise E2EError(
            f"{kubeconfig} ({who}) may, and must not: " + "; ".join(" ".join(a) for a in allowed)
        )


def policies_type_check(policies: list[dict[str, Any]]) -> None:
    """The API server type-checks a policy's expressions against the schemas of what it
    matches (the CRD's too) and reports what does not fit as warnings in its status."""
    for policy in (p for p in policies if p["kind"] == "ValidatingAdmissionPolicy"):
        name = policy["metadata"]["name"]

        def checked() -> dict[str, Any] | None:
            live = get_json(["get", "validatingadmissionpolicy", name])
            status = live.get("status", {})
            done = status.get("observedGeneration") == live["metadata"]["generation"]
            return status if done else None

        status = wait_until(f"the API server type-checked {name}", checked, timeout_s=60)
        warnings = status.get("typeChecking", {}).get("expressionWarnings", [])
        if warnings:
            raise E2EError(f"ValidatingAdmissionPolicy {name} does not type-check: {warnings}")


def refused_slice(kubeconfig: str, node: str) -> str:
    """What the API server answers a server-side dry run of a ResourceSlice for `node`
    written with `kubeconfig`; E2EError if it is accepted."""
    slice_ = {
        "apiVersion": "resource.k8s.io/v1",
        "kind": "ResourceSlice",
        "metadata": {"name": f"{node}-sa-kubeconfigs-probe"},
        "spec": {
            "driver": "compute-domain.nvidia.com",
            "nodeName": node,
            "pool": {"name": node, "generation": 1, "resourceSliceCount": 1},
        },
    }
    done = kubectl(
        ["create", "--dry-run=server", "-f", "-"],
        kubeconfig=kubeconfig,
        stdin=json.dumps(slice_),
        check=False,
    )
    if done.returncode == 0:
        raise E2EError(
            f"{kubeconfig}: a token bound to no node may write node {node}'s ResourceSlice: "
            "the admission policy is not in force"
        )
    return done.stderr.strip()


def whoami(kubeconfig: str) -> str:
    review = get_json(["auth", "whoami"], kubeconfig=kubeconfig)
    return review["status"]["userInfo"]["username"]


def run(outdir: Path, namespace: str, duration: str, assignments: list[str]) -> None:
    overrides = RENDER_VALUES
    for assignment in assignments:
        overrides = set_value(overrides, assignment)
    values = merge(yaml.safe_load((CHART / "values.yaml").read_text()), overrides)

    release = Release(release_name(namespace), namespace)
    if release.exists():
        raise E2EError(
            f"a Helm release {release.name} is installed in {namespace}; this script renders "
            "the chart as that release and would uninstall it: use another namespace"
        )
    # A rerun finds the objects the last run applied: the render's install adopts them.
    rendered = release.install(overrides, take_ownership=True)
    release.uninstall()
    objects = manifest_objects(rendered["manifest"])
    rbac = [o for o in objects if o["kind"] in RBAC_KINDS + POLICY_KINDS]
    policies = [o for o in rbac if o["kind"] in POLICY_KINDS]
    node_sa = service_account_of(objects, "DaemonSet", "node")
    controller_sa = service_account_of(objects, "Deployment", "controller")

    outdir.mkdir(parents=True, exist_ok=True)
    rbac_file = outdir / "rbac.yaml"
    rbac_file.write_text(yaml.safe_dump_all(rbac, sort_keys=False))
    kubectl(["apply", "-f", str(rbac_file)])
    log(f"applied to {namespace}: " + ", ".join(str(object_id(o)) for o in rbac))
    policies_type_check(policies)

    server, ca = current_cluster()
    may = checks(values, namespace)
    for who, sa in (("node", node_sa), ("controller", controller_sa)):
        token = kubectl(
            ["create", "token", sa, "-n", namespace, f"--duration={duration}"]
        ).stdout.strip()
        path = outdir / f"{who}.kubeconfig"
        user = f"system:serviceaccount:{namespace}:{sa}"
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            yaml.safe_dump(build_kubeconfig(server, ca, user, token, namespace), f, sort_keys=False)
        if (seen := whoami(str(path))) != user:
            raise E2EError(f"{path} authenticates as {seen}, expected {user}")
        allowed, denied = may[who]
        prove(str(path), user, allowed, denied)
        log(
            f"{path}: {user}, {len(allowed)} needed permissions granted, "
            f"{len(denied)} others denied"
        )

    # can-i asks the authorizer; these are real requests through the same tokens.
    kubectl(["get", "resourceslices.resource.k8s.io"], kubeconfig=str(outdir / "node.kubeconfig"))
    kubectl(["get", CD, "--all-namespaces"], kubeconfig=str(outdir / "controller.kubeconfig"))
    refused = kubectl(
        ["get", "secrets", "-n", namespace], kubeconfig=str(outdir / "node.kubeconfig"), check=False
    )
    if refused.returncode == 0 or "Forbidden" not in refused.stderr:
        raise E2EError(
            f"the node's token could list Secrets in {namespace}: {refused.stdout}{refused.stderr}"
        )
    log(
        "real requests: the node lists ResourceSlices, the controller ComputeDomains; "
        "Secrets are Forbidden"
    )
    if policies:
        answer = refused_slice(str(outdir / "node.kubeconfig"), "sa-kubeconfigs-probe")
        if "bound to no node" not in answer:
            raise E2EError(f"a slice of the node's plain token was refused, but not by policy: {answer}")
        log(f"admission policies in force: a plain token's slice is refused ({answer})")
    print(
        json.dumps(
            {
                "node": str(outdir / "node.kubeconfig"),
                "controller": str(outdir / "controller.kubeconfig"),
            }
        )
    )


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("outdir", type=Path)
    parser.add_argument("namespace", nargs="?", default="domaind-e2e")
    parser.add_argument(
        "--duration", default="2h", help="the tokens' lifetime (kubectl create token)"
    )
    parser.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="a chart value, as helm --set",
    )
    args = parser.parse_args()
    try:
        require_cluster()
        run(args.outdir, args.namespace, args.duration, args.set)
    except E2EError as e:
        print(f"sa-kubeconfigs: FAILED: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
