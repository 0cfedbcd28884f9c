#!/usr/bin/env bash
# Proves the image's runtime stage without building the image.
#
#   deploy/image/check-rootfs.sh BINARY
#
# Builds the runtime stage's root filesystem from the Debian packages the Dockerfile
# installs (deploy/image/runtime-packages, and what they depend on, unpacked with dpkg-deb),
# puts BINARY where the Dockerfile puts it, mounts it read-only, and runs in it with
# chroot, with the image's PATH and user:
#   - the loader resolves every library the binary needs from that root (a library the
#     binary comes to need that the list lacks fails here, not on a node);
#   - `domaind --version`, `run --help` and `controller --help`, as the image's non-root
#     user, on the read-only root;
#   - `domaind run` (as root, as the DaemonSet runs it) with no NVIDIA driver: it must
#     fail in one line naming NVML, libnvidia-ml.so.1, the driver root, --nvml-library and
#     --gpu-topology; and with a driver root (--driver-root) whose libnvidia-ml.so.1 is
#     not a library, the error must name that file (the daemon searched the driver root);
#   - `domaind run` with a fake topology and the built-in IMEX simulator starts (it
#     writes run.json once its sockets are open) and stops cleanly on SIGTERM.
# Prints the binary's and the root filesystem's sizes. Any failed step exits non-zero.
#
# Why not build the image itself: these machines have no container engine (the docker
# CLI is there, its daemon is not), and no container registry is reachable, so the
# Dockerfile's base images cannot be pulled. buildah from Debian's packages does run here
# as root (with --isolation chroot; there is no OCI runtime), but without the base images
# it could only wrap this same root filesystem in an image, which proves no more than
# chroot does. Why dpkg-deb rather than debootstrap: measured on a 2-core CI machine,
# `debootstrap --variant=minbase bookworm` took 73 s and 127 MB for 88 packages; these
# packages take 4 to 11 s and 15 MB (docs/BENCHMARKS.md, "Image").
#
# Needs root (chroot, mount), apt-get with Debian's package indexes reachable.
set -euo pipefail

binary=${1:?usage: check-rootfs.sh BINARY}
binary=$(realpath "$binary")
here=$(cd "$(dirname "$0")" && pwd)
repo=$(cd "$here/../.." && pwd)
packages_file="$here/runtime-packages"

fail() {
  echo "check-rootfs: $*" >&2
  exit 1
}

[[ $(id -u) == 0 ]] || fail "needs root (chroot and mount)"
[[ -x $binary ]] || fail "$binary is not an executable"

work=$(mktemp -d "${TMPDIR:-/tmp}/domaind-rootfs.XXXXXX")
root="$work/rootfs"
view="$work/view"
scratch="$work/scratch"
cleanup() {
  # A daemon left by a failed step: its timeout passes the signal on.
  if [[ -n ${daemon_job:-} ]]; then
    kill "$daemon_job" 2>/dev/null || true
    wait "$daemon_job" 2>/dev/null || true
  fi
  # Innermost first; a mount that is not there is not an error here.
  for mount in "$view/proc" "$view/tmp" "$view"; do
    if mountpoint -q "$mount" 2>/dev/null; then
      umount "$mount" 2>/dev/null || umount -l "$mount" || true
    fi
  done
  rm -rf --one-file-system "$work"
}
trap cleanup EXIT

# The same reading of the list as the Dockerfile's: comments and blank lines dropped.
mapfile -t wanted < <(sed -e 's/#.*//' "$packages_file" | xargs -n1)
((${#wanted[@]} > 0)) || fail "$packages_file names no package"

started=$SECONDS
if ! apt-cache show "${wanted[0]}" >/dev/null 2>&1; then
  apt-get update -q >/dev/null
fi
# The dependency closure, as apt-get install would bring it into an empty root.
mapfile -t closure < <(
  apt-cache depends --recurse --no-recommends --no-suggests --no-conflicts --no-breaks \
    --no-replaces --no-enhances "${wanted[@]}" | grep -v '^ ' | sort -u
)
echo "packages: ${closure[*]}"
mkdir -p "$work/debs" "$root"
# apt drops privileges to _apt for downloads, which cannot write into a root-owned
# temporary directory: let it.
chmod 0755 "$work"
chown _apt "$work/debs" 2>/dev/null || true
# Indexes older than the mirror's packages name files it no longer has: refresh once.
if ! (cd "$work/debs" && apt-get download -q "${closure[@]}" >/dev/null); then
  apt-get update -q >/dev/null
  (cd "$work/debs" && apt-get download -q "${closure[@]}" >/dev/null) ||
    fail "cannot download ${closure[*]}"
fi
for deb in "$work/debs"/*.deb; do
  dpkg-deb -x "$deb" "$root"
done
rootfs_bytes=$(du -sb "$root" | cut -f1)

# No /driver-root: as in a pod without node.driverRoot.
mkdir -p "$root/usr/local/bin" "$root/tmp" "$root/proc"
install -m 0755 "$binary" "$root/usr/local/bin/domaind"
echo "root filesystem assembled in $((SECONDS - started)) s"

# The image's PATH, read from the Dockerfile so that the two cannot differ.
image_path=$(sed -n 's/^ENV PATH=//p' "$repo/Dockerfile")
[[ -n $image_path ]] || fail "no ENV PATH line in $repo/Dockerfile"

# Read-only, as the controller's pod mounts it, with a writable /tmp for the certificates
# the daemon's start needs.
mkdir -p "$view" "$scratch/tmp"
mount --bind "$root" "$view"
mount -o remount,bind,ro "$view"
mount --bind "$scratch/tmp" "$view/tmp"
chmod 1777 "$scratch/tmp"
# A container has /proc (the checkpoint reads the boot id, the IMEX simulator is this
# binary through /proc/self/exe).
mount -t proc proc "$view/proc"

chroot_bin=$(command -v chroot)
# in_image USER ARGS...: domaind's ARGS inside the root, as USER, with only the image's
# environment. Its output (stdout and stderr) goes to stdout.
in_image() {
  local user=$1
  shift
  timeout 60 env -i PATH="$image_path" "$chroot_bin" --userspec="$user" "$view" \
    /usr/local/bin/domaind "$@" 2>&1
}
expect() {
  local what=$1 needle=$2 haystack=$3
  if ! grep -qF -- "$needle" <<<"$haystack"; then
    printf '%s\n' "$haystack" | tail -n 20 >&2
    fail "$what: expected the output to contain: $needle"
  fi
}

echo "== libraries the binary needs, resolved inside the root"
# The root's own loader, not the host's: the answer is the image's.
interpreter=
for candidate in "$root"/lib64/ld-linux-*.so.* "$root"/lib/ld-linux-*.so.*; do
  if [[ -e $candidate ]]; then
    interpreter=${candidate#"$root"/}
    break
  fi
done
[[ -n $interpreter ]] || fail "no dynamic loader in the root filesystem"
listed=0
libraries=$(timeout 60 "$chroot_bin" "$view" "/$interpreter" --list /usr/local/bin/domaind 2>&1) ||
  listed=$?
printf '%s\n' "$libraries"
if ((listed != 0)) || grep -q 'not found' <<<"$libraries"; then
  fail "a library the binary needs is missing: add its package to $packages_file"
fi

nonroot=65532:65532
echo "== domaind --version (as $nonroot)"
out=$(in_image "$nonroot" --version) || fail "domaind --version failed: $out"
printf '%s\n' "$out"
expect "--version" "domaind " "$out"

echo "== domaind run --help (as $nonroot)"
out=$(in_image "$nonroot" run --help) || fail "domaind run --help failed: $out"
expect "run --help" "--driver-root" "$out"
expect "run --help" "--nvml-library" "$out"

echo "== domaind controller --help (as $nonroot)"
out=$(in_image "$nonroot" controller --help) || fail "domaind controller --help failed: $out"
expect "controller --help" "--leader-elect" "$out"

echo "== domaind run without NVML (as root)"
in_image "$nonroot" certs init --out /tmp/ca >/dev/null || fail "certs init failed"
in_image "$nonroot" certs issue --ca /tmp/ca --node node-a --out /tmp/tls >/dev/null ||
  fail "certs issue failed"
# 127.0.101.x is IMAGE_ROOTFS_CHECK in loopback/src/lib.rs, the table of loopback subnets.
run_args=(run --node-name node-a --pod-ip 127.0.101.1 --tls-dir /tmp/tls
  --state-dir /tmp/state --backend local --local-dir /tmp/local)
if out=$(in_image 0:0 "${run_args[@]}"); then
  fail "domaind run started without NVML: $out"
fi
printf '%s\n' "$out" | tail -n1
error_line=$(grep 'error:' <<<"$out" || true)
expect "run without NVML" "NVML (libnvidia-ml.so.1) is not available on this node" "$error_line"
expect "run without NVML" "nothing is mounted at /driver-root" "$error_line"
expect "run without NVML" "--nvml-library PATH" "$error_line"
expect "run without NVML" "--gpu-topology FILE" "$error_line"

echo "== domaind run with a driver root whose NVML does not load (as root)"
mkdir -p "$scratch/tmp/driver-root/usr/lib64"
echo "not a shared object" >"$scratch/tmp/driver-root/usr/lib64/libnvidia-ml.so.1"
if out=$(in_image 0:0 "${run_args[@]}" --driver-root /tmp/driver-root); then
  fail "domaind run started with a broken NVML: $out"
fi
printf '%s\n' "$out" | tail -n1
expect "run with a driver root" \
  "NVML (/tmp/driver-root/usr/lib64/libnvidia-ml.so.1) is not available on this node" "$out"

echo "== domaind run with a fake topology starts and stops (as root)"
in_image 0:0 topology simulate --node node-a --out /tmp/topology.json >/dev/null ||
  fail "topology simulate failed"
# What the driver would list; the channel nodes are not made (no driver here).
printf 'Character devices:\n  1 mem\n234 nvidia-caps-imex-channels\n' >"$scratch/tmp/devices"
started_run=$SECONDS
# Not through in_image: `$!` must be the timeout's pid, which passes signals on.
timeout 60 env -i PATH="$image_path" "$chroot_bin" --userspec=0:0 "$view" \
  /usr/local/bin/domaind run --node-name node-a --pod-ip 127.0.101.1 --gossip-port 0 \
  --http-addr 127.0.101.1:0 --state-addr 127.0.101.1:0 --tls-dir /tmp/tls --state-dir /tmp/run-state \
  --backend local --local-dir /tmp/local --gpu-topology /tmp/topology.json \
  --kubelet-plugins-dir /tmp/plugins --kubelet-registry-dir /tmp/registry \
  --cdi-dir /tmp/cdi --proc-devices /tmp/devices --channel-nodes skip \
  --imex-sim-builtin >"$work/run.log" 2>&1 &
daemon_job=$!
# run.json appears once the sockets are open: wait for it (or for the daemon's end).
run_json="$scratch/tmp/run-state/run.json"
until [[ -s $run_json ]]; do
  if ! kill -0 "$daemon_job" 2>/dev/null; then
    tail -n 20 "$work/run.log" >&2
    fail "domaind run exited before it was ready"
  fi
  ((SECONDS - started_run < 30)) || fail "domaind run was not ready within 30 s"
  sleep 0.1
done
daemon_pid=$(sed -n 's/^ *"pid": \([0-9]*\),$/\1/p' "$run_json")
[[ -n $daemon_pid ]] || fail "no pid in $run_json"
echo "ready in $((SECONDS - started_run)) s; stopping it"
kill -TERM "$daemon_pid"
status=0
wait "$daemon_job" || status=$?
daemon_job=
if ((status != 0)); then
  tail -n 20 "$work/run.log" >&2
  fail "domaind run exited with status $status on SIGTERM"
fi
grep -q 'domaind stopped' "$work/run.log" || fail "domaind run did not log its stop"

binary_bytes=$(stat -c %s "$binary")
echo "== sizes"
mib() { awk -v bytes="$1" 'BEGIN { printf "%.1f MiB", bytes / 1048576 }'; }
printf 'binary: %s bytes (%s)\n' "$binary_bytes" "$(mib "$binary_bytes")"
printf 'root filesystem (packages): %s bytes (%s)\n' "$rootfs_bytes" "$(mib "$rootfs_bytes")"
printf 'root filesystem with the binary: %s\n' "$(mib $((rootfs_bytes + binary_bytes)))"
echo "check-rootfs: all checks passed in $((SECONDS - started)) s"
