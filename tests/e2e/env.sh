# Sourced by the end-to-end scripts: a venv with requirements.txt under the build dir,
# made once and remade when requirements.txt changes. Sets E2E_PYTHON.
# Env: PYTHON (the interpreter to build the venv from; default python3),
# E2E_VENV (default ${CARGO_TARGET_DIR:-target}/e2e-venv).

e2e_dir="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
e2e_root="$(cd "$e2e_dir/../.." && pwd)"
e2e_target="${CARGO_TARGET_DIR:-$e2e_root/target}"
E2E_VENV="${E2E_VENV:-$e2e_target/e2e-venv}"
e2e_stamp="$E2E_VENV/.requirements.sha256"
e2e_want="$(sha256sum "$e2e_dir/requirements.txt" | cut -d' ' -f1)"

if [[ ! -x "$E2E_VENV/bin/python" || "$(cat "$e2e_stamp" 2>/dev/null)" != "$e2e_want" ]]; then
  py="${PYTHON:-python3}"
  if ! "$py" -c 'import sys; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
    echo "e2e: $py is missing or older than 3.10; set PYTHON to a CPython 3.10+ interpreter" >&2
    exit 1
  fi
  echo "e2e: making the venv $E2E_VENV" >&2
  rm -rf "$E2E_VENV"
  if ! "$py" -m venv "$E2E_VENV" >&2; then
    echo "e2e: '$py -m venv' failed (on Debian: apt-get install python3-venv)" >&2
    exit 1
  fi
  "$E2E_VENV/bin/python" -m pip install --quiet --disable-pip-version-check \
    --ignore-requires-python -r "$e2e_dir/requirements.txt" >&2
  echo "$e2e_want" >"$e2e_stamp"
fi
E2E_PYTHON="$E2E_VENV/bin/python"
# No __pycache__ in the source tree.
export PYTHONDONTWRITEBYTECODE=1
