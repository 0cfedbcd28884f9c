#!/usr/bin/env bash
# The chart installed, upgraded and uninstalled by Helm's own engine in the cluster of
# $KUBECONFIG (see helm_chart.py). Options: --namespace NS --release NAME --keep.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
exec "$E2E_PYTHON" "$e2e_dir/helm_chart.py" "$@"
