"""The chart through Helm's own engine (helm-sdkpy: Helm's Go library), and what a
rendered manifest holds.

helm-sdkpy has install, upgrade and uninstall but no `helm template`: the rendered
manifest comes from the release an install or upgrade returns."""

from __future__ import annotations

import asyncio
import copy
import os
import re
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml
from kube import E2EError

CHART = Path(__file__).resolve().parents[2] / "deploy" / "helm" / "domaind"
# The chart's CRD: Helm creates what crds/ holds on install when it is missing, and
# never upgrades or deletes it.
CRD_NAME = "computedomains.resource.nvidia.com"
# Fixed by the manifests users already have, so not prefixed with the release name.
DEVICE_CLASSES = (
    "compute-domain-default-channel.nvidia.com",
    "compute-domain-daemon.nvidia.com",
)
# A node label no node carries: the chart's pods are scheduled nowhere, so nothing runs
# the image and the fake nodes other tests start are left to them.
NOWHERE = {"e2e.domaind.dev/schedule": "nowhere"}


@dataclass(frozen=True, order=True)
class ObjectId:
    """What names an object in the API: group, kind, namespace ('' when cluster-scoped)
    and name."""

    group: str
    kind: str
    namespace: str
    name: str

    def __str__(self) -> str:
        group = f".{self.group}" if self.group else ""
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{self.kind}{group} {where}{self.name}"


def object_id(obj: dict[str, Any]) -> ObjectId:
    api_version = obj.get("apiVersion", "")
    group = api_version.rsplit("/", 1)[0] if "/" in api_version else ""
    meta = obj.get("metadata") or {}
    return ObjectId(group, obj.get("kind", ""), meta.get("namespace", ""), meta.get("name", ""))


def manifest_objects(manifest: str) -> list[dict[str, Any]]:
    """The objects of a rendered manifest; documents that are only comments (a template
    whose condition is off) hold none."""
    objects = []
    for doc in yaml.safe_load_all(manifest):
        if doc is None:
            continue
        if not isinstance(doc, dict) or "kind" not in doc or "apiVersion" not in doc:
            raise E2EError(f"the rendered manifest has a document that is no object: {doc!r}")
        objects.append(doc)
    return objects


def set_value(values: dict[str, Any], assignment: str) -> dict[str, Any]:
    """`a.b.c=v` (as `helm --set`, with the value read as YAML) over a copy of
    `values`."""
    path, sep, raw = assignment.partition("=")
    if not sep or not path:
        raise E2EError(f"--set {assignment!r}: expected key.path=value")
    out = copy.deepcopy(values)
    node = out
    keys = path.split(".")
    for key in keys[:-1]:
        child = node.setdefault(key, {})
        if not isinstance(child, dict):
            raise E2EError(f"--set {assignment!r}: {key} is not a map")
        node = child
    node[keys[-1]] = yaml.safe_load(raw)
    return out


def merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    """`over` on top of `base`, maps merged key by key, as Helm merges values files."""
    out = copy.deepcopy(base)
    for key, value in over.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


class Release:
    """One release of the chart in one namespace, driven by Helm's engine."""

    def __init__(self, name: str, namespace: str):
        # Imported here so that the pure functions above need no Helm library.
        import helm_sdkpy

        self._helm = helm_sdkpy
        self.name = name
        self.namespace = namespace
        self._config = helm_sdkpy.Configuration(namespace=namespace)
        # What the API server warned about while Helm applied the chart.
        self.warnings: list[str] = []

    def install(self, values: dict[str, Any], *, take_ownership: bool = False) -> dict[str, Any]:
        # No waiting for readiness: the pods are scheduled nowhere (NOWHERE).
        return self._run(
            "install",
            self._helm.Install(self._config).run(
                self.name,
                str(CHART),
                values=values,
                create_namespace=True,
                wait=False,
                timeout=120,
                take_ownership=take_ownership,
            ),
        )

    def upgrade(self, values: dict[str, Any]) -> dict[str, Any]:
        return self._run(
            "upgrade",
            self._helm.Upgrade(self._config).run(
                self.name, str(CHART), values=values, wait=False, timeout=120
            ),
        )

    def uninstall(self) -> dict[str, Any]:
        return self._run(
            "uninstall", self._helm.Uninstall(self._config).run(self.name, wait=True, timeout=120)
        )

    def exists(self) -> bool:
        try:
            asyncio.run(self._helm.Status(self._config).run(self.name))
        except self._helm.ReleaseNotFoundError:
            return False
        return True

    def _run(self, verb: str, action: Any) -> dict[str, Any]:
        with _StderrTap() as tap:
            try:
                result = asyncio.run(action)
            except self._helm.HelmError as e:
                raise E2EError(f"helm {verb} {self.name} in {self.namespace}: {e}") from e
        self.warnings.extend(f"{verb}: {w}" for w in api_warnings(tap.text))
        return result


def api_warnings(log: str) -> list[str]:
    """The API server's warnings in what Helm's library logged (klog lines such as
    `I1124 ... warnings.go:107] "Warning: unknown field \"spec.x\""`)."""
    found = []
    for line in log.splitlines():
        match = re.search(r'"Warning: (.*)"\s*$', line)
        if match:
            found.append(match.group(1).replace('\\"', '"'))
    return found


class _StderrTap:
    """Copies what is written to file descriptor 2 while open (Helm's Go library logs
    there, below Python's sys.stderr) and passes it on when closed."""

    def __enter__(self) -> _StderrTap:
        sys.stderr.flush()
        self._file = tempfile.TemporaryFile()
        self._saved = os.dup(2)
        os.dup2(self._file.fileno(), 2)
        self.text = ""
        return self

    def __exit__(self, *exc: object) -> None:
        os.dup2(self._saved, 2)
        os.close(self._saved)
        self._file.seek(0)
        self.text = self._file.read().decode("utf-8", "replace")
        self._file.close()
        sys.stderr.write(self.text)
        sys.stderr.flush()
