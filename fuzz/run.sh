#!/usr/bin/env bash
# fuzz/run.sh SECONDS [TARGET...]: builds the fuzz targets with cargo-afl (AFL++ on the
# stable toolchain; installed if missing) and runs each in turn for SECONDS from its seed corpus
# (fuzz/corpus/TARGET). Fails on any crash, and on any hang that still hangs when run
# again alone (a hang under a loaded machine's noise is reported, not failed on).
# Prints each target's executions, edges found and crashes; crash inputs are kept in
# $FUZZ_OUT/TARGET/default/crashes.
#
# fuzz/run.sh --build: only installs cargo-afl and builds (CI builds in the background).
#
# cargo-afl's flags (instrumentation, one codegen unit, its opt-level) reach only code
# that runs in the targets: `--target` keeps them off build scripts and proc macros. No
# debug info (a crash input is debugged through its regression test). Together they
# build in 40% of the CPU time; figures in docs/BENCHMARKS.md ("Fuzzing").
#
# Variables: FUZZ_TARGET_DIR (the build, target/fuzz), FUZZ_OUT (AFL's output,
# $FUZZ_TARGET_DIR/out), AFL_OPT_LEVEL (the targets' opt-level; 0 here, which builds
# in half the CPU time of 1; for a long run set 1, whose targets run about 1.7x faster).
set -euo pipefail
cd "$(dirname "$0")/.."

seconds=${1:?usage: fuzz/run.sh SECONDS [TARGET...] | fuzz/run.sh --build}
shift
if [ "$#" -gt 0 ]; then
  targets=("$@")
else
  targets=(frame signed_state pulse authority journal claim_file claim_params csr)
fi

# The version the afl crate (Cargo.lock) pairs with: its runtime is built for it.
afl_version=0.18.2
if ! cargo afl --version 2>/dev/null | grep -q "$afl_version"; then
  cargo install --locked cargo-afl --version "$afl_version"
fi

export CARGO_TARGET_DIR="${FUZZ_TARGET_DIR:-$PWD/target/fuzz}"
export AFL_OPT_LEVEL="${AFL_OPT_LEVEL:-0}" CARGO_INCREMENTAL=0 CARGO_PROFILE_DEV_DEBUG=0
out="${FUZZ_OUT:-$CARGO_TARGET_DIR/out}"
host=$(rustc -vV | sed -n 's/^host: //p')
start=$SECONDS
cargo afl build --locked -p domaind-fuzz --features afl --bins --target "$host"
echo "fuzz: targets built in $((SECONDS - start)) s"
[ "$seconds" != "--build" ] || exit 0

# No CPU to bind to on a shared machine, no crash reporter to wait for: run anyway.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1 AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1
failed=0
for target in "${targets[@]}"; do
  bin="$CARGO_TARGET_DIR/$host/debug/$target"
  rm -rf "${out:?}/$target"
  mkdir -p "$out/$target"
  # -t 1000+: a seed slower than a second is skipped, not fatal.
  cargo afl fuzz -V "$seconds" -t 1000+ -i "fuzz/corpus/$target" -o "$out/$target" "$bin" \
    >"$out/$target.log" 2>&1 || { tail -n 20 "$out/$target.log"; failed=1; continue; }
  stats="$out/$target/default/fuzzer_stats"
  stat() { sed -n "s/^$1 *: *//p" "$stats"; }
  crashes=$(find "$out/$target/default/crashes" -type f -name 'id:*' | wc -l)
  hangs=0
  for hang in "$out/$target/default/hangs"/id:*; do
    [ -e "$hang" ] || continue
    rc=0
    timeout 10 "$bin" <"$hang" >/dev/null 2>&1 || rc=$?
    [ "$rc" -ne 124 ] || hangs=$((hangs + 1))
  done
  printf 'fuzz: %-13s %10s execs  %5s edges (map %s)  %s crashes  %s hangs (%s reported)\n' \
    "$target" "$(stat execs_done)" "$(stat edges_found)" "$(stat bitmap_cvg)" \
    "$crashes" "$hangs" "$(stat saved_hangs)"
  if [ "$crashes" -gt 0 ] || [ "$hangs" -gt 0 ]; then
    ls "$out/$target/default/crashes" "$out/$target/default/hangs"
    failed=1
  fi
done
[ "$failed" -eq 0 ] || { echo "fuzz: crashes or hangs found (inputs under $out)" >&2; exit 1; }
echo "fuzz: no crash in ${#targets[@]} targets, $((SECONDS - start)) s with the build"
