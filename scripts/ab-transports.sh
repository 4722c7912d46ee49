#!/usr/bin/env bash
# A/B of two builds of the examples on 2 nodes × 1 processor over TCP and
# over MPI, beside C MPI 2 over shared memory, alternated within each round:
#
#   scripts/ab-transports.sh --a DIR --b DIR [--runs N]
#
# DIR holds release examples built with `--features mpi`
# (target/release/examples). Kernels: Jacobi 1024² and 2048² (200 sweeps,
# eps 0, one filament per row) and LU 512 and 1024. A run's time is its
# slower node's; the table gives each configuration's median [min-max].
# Needs Open MPI (mpicc, mpirun).
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
die() { echo "ab-transports: $*" >&2; exit 1; }
A= B= RUNS=5
while (($#)); do
    case $1 in
    --a) A=$2; shift 2 ;;
    --b) B=$2; shift 2 ;;
    --runs) RUNS=$2; shift 2 ;;
    *) die "unknown argument $1 (see the header of $0)" ;;
    esac
done
[[ -x $A/lu && -x $B/lu ]] || die "--a and --b must each hold the lu and jacobi examples"
command -v mpicc >/dev/null || die "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
export OMPI_ALLOW_RUN_AS_ROOT=1 OMPI_ALLOW_RUN_AS_ROOT_CONFIRM=1
OUT=$(mktemp -d)
trap 'rm -rf "$OUT"' EXIT
for m in jacobi_mpi lu_mpi; do
    mpicc -O3 -ffp-contract=off -o "$OUT/$m" "$ROOT/benches/baselines/$m.c"
done
slowest() { grep -E '^(\[node [0-9]+\] )?hyfi' | sed 's/^\[node [0-9]*\] //' | awk '{ print $2 }' | sort -g | tail -1; }
CASES=("jacobi 1024" "jacobi 2048" "lu 512" "lu 1024")
CONFIGS=(a-tcp b-tcp a-mpi b-mpi cmpi-shm)
: >"$OUT/results"
for r in $(seq "$RUNS"); do
    for kc in "${CASES[@]}"; do
        read -r k n <<<"$kc"
        case $k in
        jacobi) args=(--n "$n" --iters 200 --eps 0 --per-row) cargs=("$n" 200) ;;
        lu) args=(--n "$n") cargs=("$n") ;;
        esac
        for c in "${CONFIGS[@]}"; do
            case $c in
            a-tcp) s=$("$A/$k" "${args[@]}" --nodes 2 --procs 1 2>&1 | slowest) ;;
            b-tcp) s=$("$B/$k" "${args[@]}" --nodes 2 --procs 1 2>&1 | slowest) ;;
            a-mpi) s=$(mpirun -np 2 "$A/$k" "${args[@]}" --procs 1 2>&1 | slowest) ;;
            b-mpi) s=$(mpirun -np 2 "$B/$k" "${args[@]}" --procs 1 2>&1 | slowest) ;;
            cmpi-shm) s=$(mpirun -np 2 "$OUT/${k}_mpi" "${cargs[@]}" 2>&1 | grep -m1 '^time:' | awk '{ print $2 }') ;;
            esac
            [[ $s =~ ^[0-9.eE+-]+$ ]] || die "$k $n $c: no time"
            echo "$k $n $c $r $s" >>"$OUT/results"
        done
    done
    echo "round $r done" >&2
done
echo "# $(nproc) CPUs, $(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo); A = $A, B = $B; $RUNS rounds"
for kc in "${CASES[@]}"; do
    read -r k n <<<"$kc"
    for c in "${CONFIGS[@]}"; do
        awk -v k="$k" -v n="$n" -v c="$c" '$1 == k && $2 == n && $3 == c { print $5 }' "$OUT/results" | sort -g |
            awk -v l="$k $n" -v c="$c" '{ a[NR] = $1 } END { printf "%-12s %-9s %.4f [%.4f-%.4f]\n", l, c, a[int((NR + 1) / 2)], a[1], a[NR] }'
    done
done
