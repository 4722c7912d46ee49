#!/usr/bin/env bash
# How long a 2x1 job takes to end when one node goes wrong (issue 12):
# examples/faults.rs under the embedded launcher, default settings, each
# fault run $RUNS times; prints the median wall time from start to the
# launcher's exit, and the no-fault run for comparison (the whole job).
#
#   scripts/failure-times.sh            # RUNS=5
set -euo pipefail
cd "$(dirname "$0")/.."
RUNS=${RUNS:-5}
cargo build --release --quiet --example faults
exe=target/release/examples/faults
median() { sort -g | awk '{a[NR]=$1} END {print a[int((NR+1)/2)]}'; }
printf "%-18s %10s %8s\n" fault "median s" "exit"
for fault in none panic-filament panic-post panic-main error-return extra-alloc distributed-alone post-diverges exit stop; do
  times=()
  code=0
  for _ in $(seq "$RUNS"); do
    s=$(date +%s.%N)
    set +e
    timeout 300 "$exe" --nodes 2 --procs 1 --fault "$fault" >/dev/null 2>&1
    code=$?
    set -e
    e=$(date +%s.%N)
    times+=("$(echo "$e - $s" | bc)")
  done
  printf "%-18s %10.3f %8s\n" "$fault" "$(printf '%s\n' "${times[@]}" | median)" "$code"
done
