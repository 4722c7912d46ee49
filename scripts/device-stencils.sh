#!/usr/bin/env bash
# Issue 22's checks on a machine of many CPUs, from prebuilt binaries (no
# cargo there): the diffusion stencil per row and per point against its
# own sequential loop and against C OpenMP, and the kernels that must not
# get slower (Jacobi per point and per row, LU, matmul per row) against
# their loops, round-robin.
#
#   scripts/device-stencils.sh --bin-dir DIR [--runs N] [--n N] [--steps S]
#   scripts/device-stencils.sh --make-kit DIR     (here: build and strip)
#
# --make-kit builds the release examples and the C OpenMP baselines
# (gcc -O3 -fopenmp -ffp-contract=off, as scripts/side-by-side.sh) and puts
# stripped copies in DIR. The run prints, per case, the median [min-max]
# of the per-run ratios (hyfi / the loop of the same process; C OpenMP's
# time / hyfi's for the OpenMP rows), and the CPU it ran on. Every hyfi run
# checks its result bit for bit against its loop (the example exits 1
# otherwise), and the OpenMP diffusion's grid_bits must equal hyfi's.
set -euo pipefail
BIN= RUNS=3 N=2050 STEPS=100 KIT=
while [ $# -gt 0 ]; do
  case "$1" in
    --bin-dir) BIN=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    --n) N=$2; shift 2 ;;
    --steps) STEPS=$2; shift 2 ;;
    --make-kit) KIT=$2; shift 2 ;;
    -h|--help) sed -n '2,17p' "$0"; exit 0 ;;
    *) echo "device-stencils.sh: unknown option $1" >&2; exit 2 ;;
  esac
done
ROOT=$(cd "$(dirname "$0")/.." && pwd)
if [ -n "$KIT" ]; then
  mkdir -p "$KIT"
  (cd "$ROOT" && cargo build -q --release --example diffusion --example jacobi --example lu --example matmul)
  for e in diffusion jacobi lu matmul; do strip -o "$KIT/$e" "$ROOT/target/release/examples/$e"; done
  for c in diffusion jacobi; do
    gcc -O3 -ffp-contract=off -fopenmp -o "$KIT/${c}_omp" "$ROOT/benches/baselines/$c.c"
  done
  cp "$0" "$KIT/"
  du -sh "$KIT"
  exit 0
fi
[ -n "$BIN" ] || { echo "device-stencils.sh: --bin-dir DIR is needed" >&2; exit 2; }
CPUS=$(nproc)
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
# label | command (hyfi examples print `hyfi: T s` and `sequential: S s`)
CASES=(
  "diff-row-1x1|$BIN/diffusion --n $N --steps $STEPS --per-row --procs 1"
  "diff-row-1x$CPUS|$BIN/diffusion --n $N --steps $STEPS --per-row --procs $CPUS"
  "diff-row-2x$((CPUS / 2))|$BIN/diffusion --n $N --steps $STEPS --per-row --nodes 2 --procs $((CPUS / 2))"
  "diff-row-${CPUS}x1|$BIN/diffusion --n $N --steps $STEPS --per-row --nodes $CPUS --procs 1"
  "diff-pt-1x1|$BIN/diffusion --n $N --steps $STEPS --procs 1"
  "diff-pt-1x$CPUS|$BIN/diffusion --n $N --steps $STEPS --procs $CPUS"
  "jac-pt-1024-1x1|$BIN/jacobi --n 1024 --iters 200 --eps 0 --procs 1"
  "jac-row-1024-1x1|$BIN/jacobi --n 1024 --iters 200 --eps 0 --per-row --procs 1"
  "jac-row-2048-1x1|$BIN/jacobi --n 2048 --iters 50 --eps 0 --per-row --procs 1"
  "lu-1024-1x1|$BIN/lu --n 1024 --procs 1"
  "matmul-row-1024-1x1|$BIN/matmul --n 1024 --per-row --procs 1"
)
if [ "$CPUS" -ge 8 ]; then
  CASES+=("diff-row-4x$((CPUS / 4))|$BIN/diffusion --n $N --steps $STEPS --per-row --nodes 4 --procs $((CPUS / 4))")
fi
for r in $(seq 1 "$RUNS"); do
  for c in "${CASES[@]}"; do
    label=${c%%|*} cmd=${c#*|}
    log=$($cmd 2>&1) || { echo "FAILED: $label: $cmd"; echo "$log" | tail -5; exit 1; }
    t=$(echo "$log" | grep -v '^\[node [1-9]' | grep -m1 -E '^(\[node 0\] )?hyfi[^:]*:' | sed -E 's/.*: *([0-9.]+) s.*/\1/')
    s=$(echo "$log" | grep -v '^\[node [1-9]' | grep -m1 -E '^(\[node 0\] )?sequential[^:]*:' | sed -E 's/.*: *([0-9.]+) s.*/\1/')
    echo "$t $s" >>"$OUT/$label"
    if [ "$label" = "diff-row-1x$CPUS" ]; then
      bits=$(echo "$log" | grep -m1 -o 'grid_bits=[0-9a-f]*')
      for th in "$CPUS" 1; do
        o=$(OMP_NUM_THREADS=$th OMP_PROC_BIND=true "$BIN/diffusion_omp" "$N" "$STEPS")
        echo "$o" | grep -q "$bits" || { echo "MISMATCH: OpenMP diffusion $bits"; echo "$o"; exit 1; }
        echo "$(echo "$o" | sed -n 's/^time: //p') $t" >>"$OUT/omp$th-over-hyfi-1x$CPUS"
      done
    fi
  done
  echo "round $r of $RUNS done" >&2
done
echo "CPU: $(grep -m1 'model name' /proc/cpuinfo | sed 's/.*: //'), $CPUS CPUs; n=$N steps=$STEPS; $RUNS rounds"
printf '%-26s %s\n' case "median [min-max] of per-run ratios; median times (s)"
med() { sort -g | awk '{a[NR]=$1} END {m=(NR%2)?a[(NR+1)/2]:(a[NR/2]+a[NR/2+1])/2; printf "%s %s %s\n", m, a[1], a[NR]}'; }
for f in "$OUT"/*; do
  label=$(basename "$f")
  read -r m lo hi < <(awk '{print $1/$2}' "$f" | med)
  read -r ta _ _ < <(awk '{print $1}' "$f" | med)
  read -r tb _ _ < <(awk '{print $2}' "$f" | med)
  printf '%-26s %.3f [%.3f-%.3f]   %.4f / %.4f\n' "$label" "$m" "$lo" "$hi" "$ta" "$tb"
done
echo "(hyfi rows: hyfi time / the loop's, below 1 is faster; omp rows: OpenMP time / hyfi's, above 1 means hyfi is faster)"
