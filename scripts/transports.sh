#!/usr/bin/env bash
# hyfi over TCP and over MPI on one host, against C MPI, in one run:
#
#   scripts/transports.sh [--runs N] [--nodes K] [--kernels jacobi,lu]
#                         [--sizes "1024 2048"] [--lu-n N] [--iters N]
#                         [--no-fetch] [--out DIR] [--no-build] [--bin-dir DIR]
#   scripts/transports.sh --make-kit DIR
#
# Round-robin (--runs rounds, default 5) on K nodes of 1 processor (--nodes,
# default 2): Jacobi one filament per row, eps 0, at each --sizes, and
# (with --kernels ...,lu) LU at --lu-n (default 1024):
#
#   tcp       hyfi over TCP, its own launcher: `jacobi --nodes K --procs 1`
#   mpi       hyfi over MPI: `mpirun -np K jacobi --procs 1`
#             (HYFI_TRANSPORT's default under mpirun with the feature)
#   cmpi-shm  C MPI K (benches/baselines/jacobi_mpi.c, lu_mpi.c), Open
#             MPI's default transports: shared memory between the ranks
#   cmpi-tcp  C MPI K with `--mca btl tcp,self`
#
# More ranks than CPUs are oversubscribed (--oversubscribe), and said so.
# --bin-dir DIR runs prebuilt binaries (jacobi, lu, the dsm bench as
# `dsm`, and jacobi_mpi, lu_mpi) on a machine without cargo; it implies
# --no-build. If DIR holds `ompi-root.tgz` (Open MPI relocated, as
# ../shared/device/README.md shows), it is unpacked in /tmp and used, so
# the machine needs no MPI of its own. --make-kit DIR builds such a DIR
# here (the examples and bench with `--features mpi`, stripped; the C
# baselines; Open MPI's Debian packages, downloaded and relocated): about
# 20 MB. The 16-CPU table of issue 24, on the device machine:
# `scripts/transports.sh --bin-dir DIR --nodes 16 --kernels jacobi,lu
# --sizes 2048 --lu-n 2048 --no-fetch`.
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

RUNS=5 SIZES="1024 2048" ITERS=200 BUILD=1 OUT="" NODES=2 KERNELS=jacobi LU_N=1024 FETCH=1 BIN_DIR="" KIT=""
while (($#)); do
    case $1 in
    --runs) RUNS=$2; shift 2 ;;
    --nodes) NODES=$2; shift 2 ;;
    --kernels) KERNELS=$2; shift 2 ;;
    --sizes) SIZES=$2; shift 2 ;;
    --lu-n) LU_N=$2; shift 2 ;;
    --iters) ITERS=$2; shift 2 ;;
    --no-fetch) FETCH=0; shift ;;
    --out) OUT=$2; shift 2 ;;
    --no-build) BUILD=0; shift ;;
    --bin-dir) BIN_DIR=$(cd "$2" && pwd); BUILD=0; shift 2 ;;
    --make-kit) KIT=$2; shift 2 ;;
    *) echo "transports.sh: unknown option $1" >&2; exit 2 ;;
    esac
done
[[ $NODES =~ ^[1-9][0-9]*$ && $NODES -ge 2 ]] || { echo "transports.sh: --nodes needs 2 or more" >&2; exit 2; }
die() { echo "transports.sh: $*" >&2; exit 1; }
# The dsm bench built with the feature (cargo names the executable; the
# newest deps/dsm-* may be another build's).
dsm_bench() {
    (cd "$ROOT" && cargo build --release --features mpi --bench dsm --message-format=json 2>/dev/null) |
        grep '"executable":"[^"]*/dsm-[^"]*"' | grep '"kind":\["bench"\]' |
        sed 's/.*"executable":"\([^"]*\)".*/\1/' | tail -1
}

if [[ -n $KIT ]]; then
    command -v mpicc >/dev/null || die "--make-kit needs Open MPI's compiler (apt-get install libopenmpi-dev)"
    mkdir -p "$KIT"
    (cd "$ROOT" && cargo build --release --features mpi --example jacobi --example lu --bench dsm 2>&1 | tail -1) >&2
    for k in jacobi lu; do strip -o "$KIT/$k" "$ROOT/target/release/examples/$k"; done
    bench=$(dsm_bench)
    [[ -x $bench ]] || die "could not find the dsm bench built with --features mpi"
    strip -o "$KIT/dsm" "$bench"
    for m in jacobi_mpi lu_mpi; do
        mpicc -O3 -ffp-contract=off -o "$KIT/$m" "$ROOT/benches/baselines/$m.c"
    done
    # Open MPI as the Debian packages this machine builds against, relocated
    # (../shared/device/README.md): the device machine has no MPI.
    debs=$(mktemp -d /tmp/hyfi-ompi-debs.XXXXXX)
    (cd "$debs" && apt-get download openmpi-bin openmpi-common libopenmpi3 libpmix2 libhwloc15 \
        libevent-core-2.1-7 libevent-pthreads-2.1-7 libfabric1 libucx0 libibverbs1 \
        librdmacm1 libnl-3-200 libnl-route-3-200 libpsm2-2 libpsm-infinipath1 \
        libmunge2 libltdl7 libnuma1 libgfortran5 >/dev/null) ||
        die "apt-get download of Open MPI's packages failed (apt-get update first?)"
    mkdir -p "$debs/ompi-root"
    for f in "$debs"/*.deb; do dpkg -x "$f" "$debs/ompi-root"; done
    tar czf "$KIT/ompi-root.tgz" -C "$debs" ompi-root
    rm -rf "$debs"
    du -sh "$KIT" >&2
    echo "kit in $KIT: run scripts/transports.sh --bin-dir $KIT ... there" >&2
    exit 0
fi

OUT=${OUT:-$(mktemp -d /tmp/hyfi-transports.XXXXXX)}
mkdir -p "$OUT"
if [[ -n $BIN_DIR && -f $BIN_DIR/ompi-root.tgz ]]; then
    # The kit's Open MPI, relocated (../shared/device/README.md).
    tar xzf "$BIN_DIR/ompi-root.tgz" -C /tmp
    O=/tmp/ompi-root/usr L=/tmp/ompi-root/usr/lib/x86_64-linux-gnu
    export OPAL_PREFIX=$O PATH=$O/bin:$PATH \
        LD_LIBRARY_PATH=$L:$L/openmpi/lib:/tmp/ompi-root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
command -v mpirun >/dev/null || die "needs Open MPI (apt-get install openmpi-bin libopenmpi-dev)"
[[ -n $BIN_DIR ]] || command -v mpicc >/dev/null ||
    die "needs Open MPI's compiler (apt-get install libopenmpi-dev)"
MPIRUN=(mpirun -np "$NODES")
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)
OVER=""
if ((NODES > $(nproc))); then
    MPIRUN+=(--oversubscribe)
    OVER=" (oversubscribed: $NODES ranks on $(nproc) CPUs)"
fi
export OMPI_MCA_plm_rsh_agent=false

if ((BUILD)); then
    (cd "$ROOT" && cargo build --release --features mpi --example jacobi --example lu --bench dsm 2>&1 | tail -1) >&2
fi
if [[ -n $BIN_DIR ]]; then
    EX=$BIN_DIR BENCH=$BIN_DIR/dsm CDIR=$BIN_DIR
else
    EX=$ROOT/target/release/examples CDIR=$OUT
    BENCH=$(dsm_bench)
    [[ -x $BENCH ]] || die "could not find the dsm bench built with --features mpi"
    for m in jacobi_mpi lu_mpi; do
        mpicc -O3 -ffp-contract=off -o "$OUT/$m" "$ROOT/benches/baselines/$m.c"
    done
fi

RESULTS=$OUT/results
: >"$RESULTS"
# run ROUND KERNEL SIZE CONFIG: one run, "kernel size config round secs".
run() {
    local r=$1 k=$2 n=$3 c=$4 log=$OUT/$2.$3.$4.$1.log secs args
    case $k in
    jacobi) args=(--n "$n" --iters "$ITERS" --eps 0 --per-row) ;;
    lu) args=(--n "$n") ;;
    esac
    case $c in
    tcp) "$EX/$k" "${args[@]}" --nodes "$NODES" --procs 1 >"$log" 2>&1 ;;
    mpi) "${MPIRUN[@]}" "$EX/$k" "${args[@]}" --procs 1 >"$log" 2>&1 ;;
    cmpi-shm) "${MPIRUN[@]}" "$CDIR/${k}_mpi" "$n" $([[ $k == jacobi ]] && echo "$ITERS") >"$log" 2>&1 ;;
    cmpi-tcp) "${MPIRUN[@]}" --mca btl tcp,self "$CDIR/${k}_mpi" "$n" $([[ $k == jacobi ]] && echo "$ITERS") >"$log" 2>&1 ;;
    esac || { tail "$log" >&2; die "$k $n $c failed (output: $log)"; }
    case $c in
    tcp | mpi)
        (($(grep -cE '^(\[node [0-9]+\] )?OK' "$log") == NODES)) ||
            die "$k $n $c: not every node printed OK (output: $log)"
        secs=$(grep -E '^(\[node [0-9]+\] )?hyfi' "$log" | sed 's/^\[node [0-9]*\] //' |
            while read -r l; do echo "$l" | secs_in; done | sort -g | tail -1)
        ;;
    *) secs=$(grep -m1 '^time:' "$log" | awk '{ print $2 }') ;;
    esac
    [[ $secs =~ ^[0-9.eE+-]+$ ]] || die "no time in $log"
    echo "$k $n $c $r $secs" >>"$RESULTS"
    printf '  round %d  %-6s %5d  %-9s %8.4f s\n' "$r" "$k" "$n" "$c" "$secs" >&2
}
CONFIGS=(tcp mpi cmpi-shm cmpi-tcp)
CASES=()
for k in ${KERNELS//,/ }; do
    case $k in
    jacobi) for n in $SIZES; do CASES+=("jacobi $n"); done ;;
    lu) CASES+=("lu $LU_N") ;;
    *) die "unknown kernel $k (jacobi, lu)" ;;
    esac
done
for r in $(seq "$RUNS"); do
    for kc in "${CASES[@]}"; do
        for c in "${CONFIGS[@]}"; do run "$r" $kc "$c"; done
    done
done
med() { awk -v k="$1" -v n="$2" -v c="$3" '$1 == k && $2 == n && $3 == c { print $5 }' "$RESULTS" | median; }
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo)
echo "# hyfi over TCP and MPI, one host"
echo
echo "* $(nproc) CPUs, $model; $(mpirun --version | head -1); hyfi $(git -C "$ROOT" rev-parse --short HEAD)$(git -C "$ROOT" diff --quiet HEAD -- || echo ' (uncommitted changes)')"
echo "* $NODES nodes × 1 processor$OVER; Jacobi per row, $ITERS sweeps; medians of $RUNS round-robin rounds (s); speed ratios are (other's time / hyfi over MPI's time)"
echo
echo "| kernel | hyfi TCP ${NODES}×1 | hyfi MPI ${NODES}×1 | C MPI $NODES shm | C MPI $NODES tcp | MPI/TCP speed | MPI vs C MPI shm speed |"
echo "|---|---|---|---|---|---|---|"
for kc in "${CASES[@]}"; do
    read -r k n <<<"$kc"
    t=$(med "$k" "$n" tcp) m=$(med "$k" "$n" mpi) cs=$(med "$k" "$n" cmpi-shm) ct=$(med "$k" "$n" cmpi-tcp)
    label="Jacobi $n²"
    [[ $k == lu ]] && label="LU $n"
    echo "| $label | $t | $m | $cs | $ct | $(ratio "$t" "$m") | $(ratio "$cs" "$m") |"
done
if ((FETCH)); then
echo
echo "## Page fetch round trip (benches/dsm.rs dsm_fetch, mpirun -np 2)"
MPIRUN=(mpirun -np 2)
[[ $(id -u) == 0 ]] && MPIRUN+=(--allow-run-as-root)
for tr in mpi tcp; do
    HYFI_TRANSPORT=$tr "${MPIRUN[@]}" -x HYFI_TRANSPORT "$BENCH" --bench dsm_fetch >"$OUT/fetch.$tr.log" 2>&1 ||
        { tail "$OUT/fetch.$tr.log" >&2; die "dsm_fetch over $tr failed"; }
    echo
    echo "over $tr:"
    echo '```'
    grep -E 'all samples|RESULT' "$OUT/fetch.$tr.log"
    echo '```'
done
fi
echo
echo "raw outputs: $OUT"
