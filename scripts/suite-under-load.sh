#!/usr/bin/env bash
# The README's test command run RUNS times in a row while a release build
# loops beside it in a second clone (the "tests pass on a loaded machine"
# check). Prints one line per run: exit code, tests passed and failed,
# seconds, load average.
#
#   scripts/suite-under-load.sh          # RUNS=5, clone in $TMPDIR
set -uo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
repo=$(pwd)
other=$(mktemp -d "${TMPDIR:-/tmp}/hyfi-load.XXXXXX")
git clone -q "$repo" "$other/clone"
stop="$other/stop"
# Job control: the builder gets a process group of its own, so that its
# cargo and rustc processes stop with it.
set -m
(
  cd "$other/clone"
  while [ ! -f "$stop" ]; do
    CARGO_TARGET_DIR="$other/target" cargo clean -q 2>/dev/null
    CARGO_TARGET_DIR="$other/target" cargo build -q --release --workspace >/dev/null 2>&1
  done
) &
builder=$!
set +m
cleanup() {
  touch "$stop"
  # The builder's whole process group: the loop, cargo and rustc.
  kill -TERM -- "-$builder" 2>/dev/null
  wait 2>/dev/null
  for _ in 1 2 3 4 5; do
    rm -rf "$other" 2>/dev/null && break
    sleep 1
  done
}
trap cleanup EXIT
for i in $(seq "$RUNS"); do
  s=$(date +%s)
  log="$other/run-$i.log"
  cargo test --workspace --release --no-fail-fast >"$log" 2>&1
  rc=$?
  pass=$(grep "test result" "$log" | awk '{s+=$4} END {print s}')
  fail=$(grep "test result" "$log" | awk '{s+=$6} END {print s}')
  echo "run $i: rc=$rc passed=$pass failed=$fail secs=$(( $(date +%s) - s )) load=$(cut -d' ' -f1-3 /proc/loadavg)"
  if [ "$rc" -ne 0 ]; then
    grep -E "^test .* FAILED" "$log"
    # Kept: the clone's directory goes at exit.
    keep="${TMPDIR:-/tmp}/hyfi-suite-failed-$(date +%s)-$i.log"
    cp "$log" "$keep" && echo "  the run's output: $keep"
  fi
done
