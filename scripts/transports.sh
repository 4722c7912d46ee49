#!/usr/bin/env bash
# hyfi over TCP and over MPI on one host, against C MPI, in one run:
#
#   scripts/transports.sh [--runs N] [--sizes "1024 2048"] [--iters N]
#                         [--fetch-blocks-only] [--out DIR] [--no-build]
#
# Round-robin (--runs rounds, default 5), Jacobi one filament per row,
# eps 0, on 2 nodes of 1 processor:
#
#   tcp       hyfi over TCP, its own launcher: `jacobi --nodes 2 --procs 1`
#   mpi       hyfi over MPI: `mpirun -np 2 jacobi --procs 1`
#             (HYFI_TRANSPORT's default under mpirun with the feature)
#   cmpi-shm  C MPI 2 (benches/baselines/jacobi_mpi.c), Open MPI's default
#             transports: shared memory between the two ranks
#   cmpi-tcp  C MPI 2 with `--mca btl tcp,self`
#
# Then the page-fetch latency (benches/dsm.rs, dsm_fetch) under `mpirun -np
# 2` over MPI (against a raw MPI 16 B -> 4 KiB ping-pong between the same
# two processes) and over TCP (against a raw TCP one), each the bench's own
# alternation of blocks. Everything at default settings; every hyfi run is
# checked against the sequential grid (grid_bits equal to C MPI's).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
# shellcheck source=lib/measure.sh
source "$ROOT/scripts/lib/measure.sh"

RUNS=5 SIZES="1024 2048" ITERS=200 BUILD=1 OUT=""
while (($#)); do
    case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    *) echo "transports.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
OUT=${OUT:-$(mktemp -d /tmp/hyfi-transports.XXXXXX)}
mkdir -p "$OUT"
die() { echo "transports.sh: $*" >&2; exit 1; }
command -v mpirun >/dev/null && command -v mpicc >/dev/null ||
    die "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
MPIRUN=(mpirun -np 2)
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)
export OMPI_MCA_plm_rsh_agent=false

if ((BUILD)); then
    (cd "$ROOT" && cargo build --release --features mpi --example jacobi --bench dsm 2>&1 | tail -1) >&2
fi
EX=$ROOT/target/release/examples
BENCH=$(ls -t "$ROOT"/target/release/deps/dsm-* | grep -v '\.d$' | head -1)
mpicc -O2 -ffp-contract=off -o "$OUT/jacobi_mpi" "$ROOT/benches/baselines/jacobi_mpi.c"

RESULTS=$OUT/results
: >"$RESULTS"
run() {
    local r=$1 n=$2 c=$3 log=$OUT/$n.$c.$r.log secs
    case $c in
    tcp) "$EX/jacobi" --n "$n" --iters "$ITERS" --eps 0 --per-row --nodes 2 --procs 1 >"$log" 2>&1 ;;
    mpi) "${MPIRUN[@]}" "$EX/jacobi" --n "$n" --iters "$ITERS" --eps 0 --per-row --procs 1 >"$log" 2>&1 ;;
    cmpi-shm) "${MPIRUN[@]}" "$OUT/jacobi_mpi" "$n" "$ITERS" >"$log" 2>&1 ;;
    cmpi-tcp) "${MPIRUN[@]}" --mca btl tcp,self "$OUT/jacobi_mpi" "$n" "$ITERS" >"$log" 2>&1 ;;
    esac || { tail "$log" >&2; die "$c $n failed (output: $log)"; }
    case $c in
    tcp | mpi)
        (($(grep -c 'OK: hyfi and sequential results are identical' "$log") == 2)) ||
            die "$c $n: not both nodes OK (output: $log)"
        secs=$(grep -E '^(\[node [0-9]+\] )?hyfi' "$log" | sed 's/^\[node [0-9]*\] //' |
            while read -r l; do echo "$l" | secs_in; done | sort -g | tail -1)
        ;;
    *) secs=$(grep -m1 '^time:' "$log" | awk '{ print $2 }') ;;
    esac
    [[ $secs =~ ^[0-9.eE+-]+$ ]] || die "no time in $log"
    echo "$n $c $r $secs" >>"$RESULTS"
    printf '  round %d  %5d  %-9s %8.4f s\n' "$r" "$n" "$c" "$secs" >&2
}
CONFIGS=(tcp mpi cmpi-shm cmpi-tcp)
for r in $(seq "$RUNS"); do
    for n in $SIZES; do
        for c in "${CONFIGS[@]}"; do run "$r" "$n" "$c"; done
    done
done
med() { awk -v n="$1" -v c="$2" '$1 == n && $2 == c { print $4 }' "$RESULTS" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
echo "# hyfi over TCP and MPI, one host"
echo
echo "* $(nproc) CPUs, $model; $(mpirun --version | head -1); hyfi $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- || echo ' (uncommitted changes)')"
echo "* Jacobi per row, $ITERS sweeps, 2 nodes × 1 processor; medians of $RUNS round-robin rounds (s); speed ratios are (other's time / hyfi over MPI's time)"
echo
echo "| n | hyfi TCP 2×1 | hyfi MPI 2×1 | C MPI 2 shm | C MPI 2 tcp | MPI/TCP speed | MPI vs C MPI shm speed |"
echo "|---|---|---|---|---|---|---|"
for n in $SIZES; do
    t=$(med "$n" tcp) m=$(med "$n" mpi) cs=$(med "$n" cmpi-shm) ct=$(med "$n" cmpi-tcp)
    echo "| $n² | $t | $m | $cs | $ct | $(ratio "$t" "$m") | $(ratio "$cs" "$m") |"
done
echo
echo "## Page fetch round trip (benches/dsm.rs dsm_fetch, mpirun -np 2)"
for tr in mpi tcp; do
    HYFI_TRANSPORT=$tr "${MPIRUN[@]}" -x HYFI_TRANSPORT "$BENCH" --bench dsm_fetch >"$OUT/fetch.$tr.log" 2>&1 ||
        { tail "$OUT/fetch.$tr.log" >&2; die "dsm_fetch over $tr failed"; }
    echo
    echo "over $tr:"
    echo '```'
    grep -E 'all samples|RESULT' "$OUT/fetch.$tr.log"
    echo '```'
done
echo
echo "raw outputs: $OUT"
