#!/usr/bin/env bash
# A/B of hyfi examples against their own in-process sequential baseline,
# for two builds of the examples, alternated round by round:
#
#   scripts/ab-ratios.sh --a DIR --b DIR [--runs N] [--cases FILE|-]
#
# DIR holds the release examples (target/release/examples). Each case is
# one line: a label, then the example and its arguments, e.g.
#
#   diff-row-1026-1x1  diffusion --n 1026 --steps 100 --per-row --procs 1
#
# Every run prints node 0's `hyfi...: T s` and `sequential...: S s`; the
# ratio T/S is the hyfi time over the loop's, both from the same process,
# so the machine's noise between runs cancels. For each case and build the
# table gives the median [min-max] of the per-run ratios (and the speed
# S/T). Default settings: the examples start their own nodes, pinned.
set -euo pipefail
A= B= RUNS=5 CASES=-
while [ $# -gt 0 ]; do
  case "$1" in
    --a) A=$2; shift 2 ;;
    --b) B=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --cases) CASES=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "ab-ratios.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
[ -n "$A" ] && [ -n "$B" ] || { echo "ab-ratios.sh: --a DIR and --b DIR are needed" >&2; exit 2; }
mapfile -t LINES < <(if [ "$CASES" = - ]; then cat; else cat "$CASES"; fi | grep -v '^\s*#' | grep -v '^\s*$')
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for r in $(seq 1 "$RUNS"); do
  for line in "${LINES[@]}"; do
    read -r label ex args <<<"$line"
    for side in A B; do
      dir=$A; [ $side = B ] && dir=$B
      # shellcheck disable=SC2086
      log=$(RUST_BACKTRACE=0 timeout 300 "$dir/$ex" $args 2>&1) || { echo "FAILED: $side $label" >&2; echo "$log" | tail -5 >&2; continue; }
      t=$(echo "$log" | grep -v '^\[node [1-9]' | grep -m1 -E '^(\[node 0\] )?hyfi[^:]*:' | sed -E 's/.*: *([0-9.]+) s.*/\1/')
      s=$(echo "$log" | grep -v '^\[node [1-9]' | grep -m1 -E '^(\[node 0\] )?sequential[^:]*:' | sed -E 's/.*: *([0-9.]+) s.*/\1/')
      echo "$t $s" >>"$OUT/$label.$side"
    done
  done
  echo "round $r done" >&2
done
printf '%-24s %-28s %-28s\n' case "A: hyfi/loop median [min-max]" "B: hyfi/loop median [min-max]"
for line in "${LINES[@]}"; do
  read -r label _ <<<"$line"
  row=$(printf '%-24s' "$label")
  for side in A B; do
    f="$OUT/$label.$side"
    if [ -s "$f" ]; then
      cell=$(awk '{print $1/$2}' "$f" | sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%.3f [%.3f-%.3f] (%.2fx)", m, a[1], a[NR], 1/m}')
      if [ -n "${TIMES:-}" ]; then
        cell="$cell $(awk '{print $1}' "$f" | sort -g | awk '{a[NR]=$1} END {printf "hyfi %.4f", (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}') $(awk '{print $2}' "$f" | sort -g | awk '{a[NR]=$1} END {printf "loop %.4f", (NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2}')"
      fi
    else
      cell="-"
    fi
    row="$row $(printf '%-28s' "$cell")"
  done
  echo "$row"
done
