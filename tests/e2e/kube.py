"""kubectl, as the end-to-end scripts call it: every failure is an E2EError that says
which command failed and what the API server answered."""

from __future__ import annotations

import json
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from typing import Any


class E2EError(Exception):
    """A check that failed; the message is what the script prints."""


def kubectl(
    args: Sequence[str],
    *,
    kubeconfig: str | None = None,
    stdin: str | None = None,
    check: bool = True,
) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ)
    if kubeconfig is not None:
        env["KUBECONFIG"] = kubeconfig
    try:
        done = subprocess.run(
            ["kubectl", *args],
            input=stdin,
            capture_output=True,
            text=True,
            env=env,
            timeout=120,
        )
    except FileNotFoundError as e:
        raise E2EError('kubectl is not on PATH (eval "$(shared/kube/up.sh)" puts it there)') from e
    except subprocess.TimeoutExpired as e:
        raise E2EError(f"kubectl {' '.join(args)}: no answer in 120 s") from e
    if check and done.returncode != 0:
        raise E2EError(f"kubectl {' '.join(args)} failed: {done.stderr.strip()}")
    return done


def get_json(args: Sequence[str], **kw: Any) -> Any:
    return json.loads(kubectl([*args, "-o", "json"], **kw).stdout)


def items(args: Sequence[str], **kw: Any) -> list[dict[str, Any]]:
    """The objects a `kubectl get` finds; a single object comes back as a list of one."""
    out = kubectl([*args, "-o", "json"], **kw).stdout.strip()
    if not out:
        return []
    found = json.loads(out)
    return found.get("items", []) if found.get("kind", "").endswith("List") else [found]


def wait_until(what: str, done: Callable[[], Any], timeout_s: float, poll_s: float = 0.2) -> Any:
    """Polls `done` until it returns something truthy; E2EError naming `what` and the
    last answer after `timeout_s`. The API server does some work after a call returns
    (garbage collection of dependents, namespace finalization): this waits for a
    condition, never for a fixed time."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = done()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise E2EError(f"{what}: not so after {timeout_s:.0f} s")
        time.sleep(poll_s)


def require_cluster() -> None:
    if not os.environ.get("KUBECONFIG"):
        raise E2EError(
            'KUBECONFIG is not set: start the cluster first, e.g. eval "$(../shared/kube/up.sh)"'
        )
    ready = kubectl(["get", "--raw", "/readyz"], check=False)
    if ready.returncode != 0 or ready.stdout.strip() != "ok":
        raise E2EError(
            f"the API server in {os.environ['KUBECONFIG']} is not ready: "
            f"{(ready.stderr or ready.stdout).strip()}"
        )
