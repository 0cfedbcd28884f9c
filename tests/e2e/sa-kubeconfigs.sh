#!/usr/bin/env bash
# sa-kubeconfigs.sh OUTDIR [NAMESPACE] [--duration 2h] [--set key=value ...]
# Writes OUTDIR/node.kubeconfig and OUTDIR/controller.kubeconfig: tokens of the chart's
# ServiceAccounts in NAMESPACE (default domaind-e2e), with the chart's RBAC applied, in
# the cluster of $KUBECONFIG; checks what each may and may not do (see sa_kubeconfigs.py).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$E2E_PYTHON" "$e2e_dir/sa_kubeconfigs.py" "$@"
