#!/usr/bin/env bash
# The end-to-end scripts' own tests (test_*.py): no cluster needed.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/env.sh"
cd "$e2e_dir"
exec "$E2E_PYTHON" -m unittest discover -s . -p 'test_*.py' "$@"
