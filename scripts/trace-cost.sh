#!/usr/bin/env bash
# What tracing costs, measured as the issue asks (A/B alternated, medians):
#
#   scripts/trace-cost.sh BASE_EXAMPLES [--runs N] [--only off|on] [--procs P]
#
# 1. Tracing off: every hyfi kernel of scripts/side-by-side.sh at 1xP (default 1x2)
#    (Jacobi 1024^2 per point and per row, matmul and LU 1024, fib(40),
#    quad), the examples of BASE_EXAMPLES (a target/release/examples
#    directory built from the commit before tracing) against this tree's,
#    alternated within each round (the order flips every round).
# 2. Tracing on: Jacobi 1024^2 per row on 2x1 and fib(40) on 1x2, this
#    tree's examples without and with HYFI_TRACE, alternated; and the trace
#    file's size per second of run.
#
# Times are the examples' own `hyfi...: <t> s` lines (their timed
# computation). Default settings otherwise: no HYFI_* knob is set.

set -euo pipefail
ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BASE=${1:?usage: scripts/trace-cost.sh BASE_EXAMPLES [--runs N] [--only off|on]}
shift
RUNS=5
ONLY=
PROCS=2
while [[ $# -gt 0 ]]; do
  case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --only) ONLY=$2; shift 2 ;;
    --procs) PROCS=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
NEW=${CARGO_TARGET_DIR:-$ROOT/target}/release/examples
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT

# seconds of the first `hyfi...: <t> s` line (node 0's under a launcher)
secs() { grep -m1 -E '^(\[node 0\] )?hyfi[^:]*: +[0-9.]+ s' "$1" | sed -E 's/^(\[node 0\] )?hyfi[^:]*: +([0-9.]+) s.*/\2/'; }

run_one() { # label dir args... -> appends "label secs" to $TMP/times
  local label=$1 dir=$2; shift 2
  local log=$TMP/log
  if ! env "$@" > "$log" 2>&1; then cat "$log" >&2; echo "failed: $*" >&2; exit 1; fi
  local s; s=$(secs "$log")
  [[ -n $s ]] || { cat "$log" >&2; echo "no time in the output of: $*" >&2; exit 1; }
  echo "$label $s" >> "$TMP/times"
}

KERNELS=(
  "jacobi-point|jacobi --n 1024 --iters 200 --eps 0 --procs $PROCS"
  "jacobi-row|jacobi --n 1024 --iters 200 --eps 0 --per-row --procs $PROCS"
  "matmul|matmul --n 1024 --procs $PROCS"
  "lu|lu --n 1024 --procs $PROCS"
  "fib|fib --n 40 --procs $PROCS --no-seq"
  "quad|quad --procs $PROCS"
)

if [[ $ONLY != on ]]; then
  : > "$TMP/times"
  for r in $(seq 1 "$RUNS"); do
    for k in "${KERNELS[@]}"; do
      name=${k%%|*}; cmd=${k#*|}; ex=${cmd%% *}; args=${cmd#* }
      if (( r % 2 )); then order="base new"; else order="new base"; fi
      for v in $order; do
        dir=$BASE; [[ $v == new ]] && dir=$NEW
        # shellcheck disable=SC2086
        run_one "$name:$v" "$dir" "$dir/$ex" $args
      done
    done
  done
  echo "== tracing off, 1x$PROCS: this tree / the base, $RUNS alternated rounds, medians (s) =="
  python3 - "$TMP/times" <<'PY'
import sys, statistics as st
from collections import defaultdict
t = defaultdict(list)
for line in open(sys.argv[1]):
    k, s = line.split(); t[k].append(float(s))
names = sorted({k.split(':')[0] for k in t}, key=lambda n: list(t).index(n + ':base'))
print(f"{'kernel':14} {'base':>9} {'new':>9} {'new/base':>9}  per-round ratios")
for n in names:
    b, w = t[n + ':base'], t[n + ':new']
    ratios = sorted(x / y for x, y in zip(w, b))
    print(f"{n:14} {st.median(b):9.4f} {st.median(w):9.4f} {st.median(w)/st.median(b):9.3f}  "
          f"median {st.median(ratios):.3f} [{ratios[0]:.3f}-{ratios[-1]:.3f}]")
PY
fi

if [[ $ONLY != off ]]; then
  : > "$TMP/times"
  : > "$TMP/sizes"
  ON=(
    "jacobi-row-2x1|jacobi --n 1024 --iters 200 --eps 0 --per-row --nodes 2 --procs 1"
    "fib-1x2|fib --n 40 --procs 2 --no-seq"
  )
  for r in $(seq 1 "$RUNS"); do
    for k in "${ON[@]}"; do
      name=${k%%|*}; cmd=${k#*|}; ex=${cmd%% *}; args=${cmd#* }
      if (( r % 2 )); then order="off on"; else order="on off"; fi
      for v in $order; do
        if [[ $v == on ]]; then
          # shellcheck disable=SC2086
          run_one "$name:$v" "$NEW" HYFI_TRACE="$TMP/t.json" "$NEW/$ex" $args
          grep -h -E 'hyfi trace: .*MB per second' "$TMP/log" | sed -E "s/^(\[node 0\] )?/$name /" >> "$TMP/sizes"
          rm -f "$TMP"/t.json*
        else
          # shellcheck disable=SC2086
          run_one "$name:$v" "$NEW" "$NEW/$ex" $args
        fi
      done
    done
  done
  echo "== tracing on / off, $RUNS alternated rounds, medians (s) =="
  python3 - "$TMP/times" <<'PY'
import sys, statistics as st
from collections import defaultdict
t = defaultdict(list)
for line in open(sys.argv[1]):
    k, s = line.split(); t[k].append(float(s))
for n in sorted({k.split(':')[0] for k in t}):
    off, on = t[n + ':off'], t[n + ':on']
    ratios = sorted(x / y for x, y in zip(on, off))
    print(f"{n:16} off {st.median(off):.4f}  on {st.median(on):.4f}  on/off {st.median(on)/st.median(off):.3f}  "
          f"per round {st.median(ratios):.3f} [{ratios[0]:.3f}-{ratios[-1]:.3f}]")
PY
  echo "== trace files =="
  cat "$TMP/sizes"
fi
