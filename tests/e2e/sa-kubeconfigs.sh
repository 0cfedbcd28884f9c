#!/usr/bin/env bash
# sa-kubeconfigs.sh OUTDIR [NAMESPACE] [--duration 2h] [--set key=value ...]
# Writes OUTDIR/node.kubeconfig and OUTDIR/controller.kubeconfig: tokens of the chart's
# ServiceAccounts in NAMESPACE (default domaind-e2e), with the chart's RBAC and the node's
# admission policies applied, in the cluster of $KUBECONFIG; checks what each may and may
# not do (see sa_kubeconfigs.py). The node's token is bound to no pod, so the policies let
# it read, not write: tests mint pod-bound ones from it (tests/src/tokens.rs).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$E2E_PYTHON" "$e2e_dir/sa_kubeconfigs.py" "$@"
