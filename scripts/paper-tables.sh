#!/usr/bin/env bash
# The HyFi paper's Tables 2 and 3 on this machine, and its speedup chart.
# One command:
#
#   scripts/paper-tables.sh [--runs N] [--kernels LIST] [--out DIR]
#                           [--no-build] [--no-table3] [--cpus N]
#                           [--bin-dir DIR] [--plan] [--big]
#
# Table 2 runs, round-robin (--runs rounds, default 5), every kernel in
# every configuration this machine holds and prints the median time and
# the speedup against the best straightforward sequential Rust
# (examples/baselines.rs: flat Vec<f64>, slices, i-k-j matmul, plain
# recursion), never against hyfi 1x1:
#
#   seq    examples/baselines.rs <kernel> seq
#   NxP    the hyfi example, --nodes N --procs P (N nodes of P processors)
#   MPI R  C MPI on R ranks (below)
#
# The configurations are chosen from the CPUs this machine has (nproc, or
# --cpus N): with C the largest power of two <= the CPUs,
#   fewer than 4 CPUs: 1x1, 1x2, 2x1, 2x2 (not run: it needs 4 CPUs at
#                      default settings), 4x1* (oversubscribed), MPI 2;
#   4 or more:         1x1, 1xP and Px1 for P = 2, 4, ... C, Nx(C/N) for
#                      N = 2, 4, ... C/2 (2x8, 4x4, 8x2 at 16), and MPI R
#                      for R = 2, 4, ... C.
# --plan prints the configurations and every command of one round, and
# exits. --bin-dir DIR runs prebuilt binaries (the examples, and
# jacobi_mpi, lu_mpi, matmul_mpi where present) from DIR, on a machine
# without cargo: it implies --no-build. --big takes the sizes of a 16-CPU
# machine: matmul and LU 2048, fib(44), Jacobi 2048² for 200 sweeps.
#   MPI 2  C MPI, 2 ranks over TCP: Jacobi (benches/baselines/jacobi_mpi.c),
#          LU (lu_mpi.c, rows cyclic, MPI_MAXLOC + MPI_Bcast per step) and
#          matmul (matmul_mpi.c, B broadcast, rows of A scattered and of C
#          gathered); mpirun -n 2 --mca btl tcp,self
#
# Everything runs at default settings: the script passes no option or
# environment variable of hyfi's, and warns if the environment sets one. On
# fewer than 4 CPUs, 4x1 shares them out round-robin (two nodes pinned to
# each CPU: the default placement, marked * as oversubscribed), and 2x2 is
# not run: with the default pinning a node may not run more processors than
# its share of the CPUs (the clear error hyfi gives), and the script sets
# no knob to get around it. Oversubscribed columns are printed but kept out
# of the verdicts. Nodes are separate processes on loopback, started by the
# example itself (the embedded launcher).
#
# Kernels (--kernels, comma-separated; default all):
#   jacobi-point jacobi-row        1024², 200 sweeps, eps 0
#   jacobi2048-point jacobi2048-row  2048², 50 sweeps, eps 0
#   matmul matmul-row              n = 1024, one filament per element / row of C
#   lu                             n = 1024
#   fib                            fib(40), every call a join_remote
#   quad                           x⁶ on [1, 70], tol 1.5e-3
#
# Each program times only its computation (hyfi on several nodes: the
# slowest node) and is checked: the baselines print the same `check:` line,
# and hyfi's fingerprints (Jacobi's grid_bits) must equal theirs; a failed
# run or a mismatch stops the script.
#
# Also printed: DSM traffic per Jacobi sweep on 2x1 (bytes, messages,
# notices, pushes, fetches per node, from the phase's own counters).
#
# Table 3 (unless --no-table3): the overlap of communication and
# computation, Jacobi 1024² on 2x1 with 1 and 4 pools per processor, per row
# and per point, on loopback (interleaved, --runs pairs); over a link shaped
# to 1 Gbit/s when run as root with iproute2 (scripts/shaped-link.sh),
# otherwise the script says it was not run and why.
#
# The speedup chart (SVG, drawn by this script) goes to $OUT/speedup.svg.
# Builds: cargo build --release --examples, and the MPI baselines with
# mpicc (from libopenmpi-dev), each on its own: without mpicc/mpirun, or
# where one does not build, its MPI column reads n/a and the script says so.
# A full run takes about 10-15 minutes on 2 cores.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
# shellcheck source=lib/measure.sh
source "$ROOT/scripts/lib/measure.sh"
RUNS=5
ALL=jacobi-point,jacobi-row,jacobi2048-point,jacobi2048-row,matmul,matmul-row,lu,fib,quad
KERNELS=$ALL
OUT=${OUT:-}
BUILD=1
TABLE3=1
CPUS=$(nproc)
BIN_DIR=""
PLAN=0
# Sizes (--big: the 16-CPU sizes, where the sequential code takes 1-3 s).
MAT_N=1024 FIB_N=40 JAC2048_IT=50

die() {
    echo "paper-tables: ERROR: $*" >&2
    exit 1
}
usage() {
    sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}
while (($#)); do
    case $1 in
    --runs) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--runs needs a positive integer" && RUNS=$2 && shift ;;
    --kernels) KERNELS=${2:?--kernels needs a list} && shift ;;
    --out) OUT=${2:?--out needs a directory} && shift ;;
    --no-build) BUILD=0 ;;
    --no-table3) TABLE3=0 ;;
    --cpus) [[ ${2:-} =~ ^[1-9][0-9]*$ ]] || die "--cpus needs a positive integer" && CPUS=$2 && shift ;;
    --bin-dir) BIN_DIR=${2:?--bin-dir needs a directory} && BUILD=0 && shift ;;
    --plan) PLAN=1 && BUILD=0 ;;
    --big) MAT_N=2048 FIB_N=44 JAC2048_IT=200 ;;
    -h | --help) usage 0 ;;
    *) echo "paper-tables: unknown option '$1'" >&2 && usage 2 ;;
    esac
    shift
done
IFS=, read -r -a KLIST <<<"$KERNELS"
for k in "${KLIST[@]}"; do
    [[ ,$ALL, == *",$k,"* ]] || die "unknown kernel '$k' (known: $ALL)"
done

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
EX=$TARGET/release/examples
CDIR=$TARGET/paper-tables-c
if [[ -n $BIN_DIR ]]; then
    [[ -d $BIN_DIR ]] || die "--bin-dir $BIN_DIR is not a directory"
    EX=$(cd "$BIN_DIR" && pwd)
    CDIR=$EX
fi
[[ -n $OUT ]] || OUT=$(mktemp -d /tmp/hyfi-paper-tables.XXXXXX)
mkdir -p "$OUT" "$CDIR"
RESULTS=$OUT/results
: >"$RESULTS"

if ((BUILD)); then
    (cd "$ROOT" && cargo build --release --examples) >"$OUT/cargo-build.log" 2>&1 ||
        { tail -30 "$OUT/cargo-build.log" >&2; die "cargo build --release --examples failed"; }
fi
for b in baselines jacobi matmul lu fib quad; do
    ((PLAN)) || [[ -x $EX/$b ]] || die "$EX/$b is missing (build with: cargo build --release --examples)"
done
# Each MPI baseline on its own: MPI_BUILT[name]=1 once it built; what went
# wrong is in MPI_NOTE. -ffp-contract=off: no fused multiply-adds, so the
# bits match the sequential code's on every target.
MPI_NOTE=""
declare -A MPI_BUILT=()
if ((PLAN)); then
    MPI_BUILT=([jacobi_mpi]=1 [lu_mpi]=1 [matmul_mpi]=1)
elif [[ -n $BIN_DIR ]] && command -v mpirun >/dev/null; then
    for m in jacobi_mpi lu_mpi matmul_mpi; do
        if [[ -x $CDIR/$m ]]; then
            MPI_BUILT[$m]=1
        else
            MPI_NOTE="${MPI_NOTE:+$MPI_NOTE; }no $m in $BIN_DIR, its MPI column is n/a"
        fi
    done
elif command -v mpicc >/dev/null && command -v mpirun >/dev/null; then
    for m in jacobi_mpi lu_mpi matmul_mpi; do
        if mpicc -O3 -ffp-contract=off -fopenmp -o "$CDIR/$m" "$ROOT/benches/baselines/$m.c" >"$OUT/mpicc-$m.log" 2>&1; then
            MPI_BUILT[$m]=1
        else
            MPI_NOTE="${MPI_NOTE:+$MPI_NOTE; }mpicc failed on benches/baselines/$m.c ($(head -1 "$OUT/mpicc-$m.log")), its MPI column is n/a"
        fi
    done
else
    MPI_NOTE="no mpicc/mpirun (install openmpi-bin and libopenmpi-dev): the MPI column is n/a"
fi
[[ -z $MPI_NOTE ]] || echo "paper-tables: WARNING: $MPI_NOTE" >&2
# mpi_cmd RANKS NAME ARGS... -> the mpirun command line, or nothing if
# NAME did not build. Two ranks over TCP (the paper's setting, and the
# 2-CPU tables'); more ranks bound to cores, over shared memory and TCP as
# Open MPI chooses.
mpi_cmd() {
    local r=$1
    shift
    [[ -n ${MPI_BUILT[$1]:-} ]] || return 0
    local run=(mpirun -n "$r")
    if ((r == 2)); then run+=(--mca btl tcp,self); else run+=(--bind-to core); fi
    [[ $(id -u) == 0 ]] && run+=(--allow-run-as-root)
    echo "${run[*]} $CDIR/$*"
}

NPROC=$CPUS
# The configurations: "seq", "hNxP" (N nodes of P processors), "mpiR".
if ((NPROC < 4)); then
    CONFIGS=(seq h1x1 h1x2 h2x1 h2x2 h4x1 mpi2)
else
    C=1
    while ((C * 2 <= NPROC)); do C=$((C * 2)); done
    CONFIGS=(seq h1x1)
    for ((p = 2; p <= C; p *= 2)); do CONFIGS+=("h1x$p"); done
    for ((p = 2; p <= C; p *= 2)); do CONFIGS+=("h${p}x1"); done
    for ((nn = 2; nn < C; nn *= 2)); do CONFIGS+=("h${nn}x$((C / nn))"); done
    for ((r = 2; r <= C; r *= 2)); do CONFIGS+=("mpi$r"); done
fi
# Nodes and processors of an hNxP configuration.
nodes_of() { local c=${1#h}; [[ $1 == h* ]] && echo "${c%x*}" || echo 1; }
procs_of() { local c=${1#h}; echo "${c#*x}"; }
label_cfg() {
    case $1 in
    seq) echo "best seq" ;;
    mpi*) echo "MPI ${1#mpi}" ;;
    h*)
        local n p
        n=$(nodes_of "$1") p=$(procs_of "$1")
        if ((n * p > NPROC)); then echo "${n}×${p}*"; else echo "${n}×${p}"; fi
        ;;
    esac
}
cfg_args() {
    local n p
    n=$(nodes_of "$1") p=$(procs_of "$1")
    if ((n > 1)); then echo "--nodes $n --procs $p"; else echo "--procs $p"; fi
}

# cmd_of KERNEL CONFIG -> the command line, or nothing if it does not exist.
cmd_of() {
    local k=$1 c=$2 n=$MAT_N it=200 row="" r=${2#mpi}
    # Several processors per node need as many CPUs per node at default
    # settings (nodes of one processor may share CPUs: 4x1* on 2 CPUs).
    if [[ $c == h* ]] && (($(procs_of "$c") > 1 && $(nodes_of "$c") * $(procs_of "$c") > NPROC)); then
        return 0
    fi
    case $k in jacobi2048-*) n=2048 it=$JAC2048_IT ;; esac
    case $k in *-row) row=--per-row ;; esac
    case $k:$c in
    jacobi*:seq) echo "$EX/baselines jacobi seq --n $n --iters $it" ;;
    jacobi*:mpi*) mpi_cmd "$r" jacobi_mpi "$n" "$it" ;;
    jacobi*:h*) echo "$EX/jacobi --n $n --iters $it --eps 0 $row $(cfg_args "$c")" ;;
    matmul*:seq) echo "$EX/baselines matmul seq --n $MAT_N" ;;
    matmul*:mpi*) mpi_cmd "$r" matmul_mpi "$MAT_N" ;;
    matmul*:h*) echo "$EX/matmul --n $MAT_N $row $(cfg_args "$c")" ;;
    lu:seq) echo "$EX/baselines lu seq --n $MAT_N" ;;
    lu:mpi*) mpi_cmd "$r" lu_mpi "$MAT_N" ;;
    lu:h*) echo "$EX/lu --n $MAT_N $(cfg_args "$c")" ;;
    fib:seq) echo "$EX/baselines fib seq --n $FIB_N" ;;
    fib:h*) echo "$EX/fib --n $FIB_N --no-seq $(cfg_args "$c")" ;;
    quad:seq) echo "$EX/baselines quad seq" ;;
    quad:h*) echo "$EX/quad --no-seq $(cfg_args "$c")" ;;
    esac
    return 0
}

label_of() {
    case $1 in
    jacobi-point) echo "Jacobi 1024², 200 sweeps, per point" ;;
    jacobi-row) echo "Jacobi 1024², 200 sweeps, per row" ;;
    jacobi2048-point) echo "Jacobi 2048², $JAC2048_IT sweeps, per point" ;;
    jacobi2048-row) echo "Jacobi 2048², $JAC2048_IT sweeps, per row" ;;
    matmul) echo "matmul $MAT_N, per element" ;;
    matmul-row) echo "matmul $MAT_N, per row" ;;
    lu) echo "LU $MAT_N" ;;
    fib) echo "fib($FIB_N)" ;;
    quad) echo "quad x⁶" ;;
    esac
}

declare -A CHECK
# run ROUND KERNEL CONFIG [EXTRA_ARGS]: one run, "kernel config round secs" to $RESULTS.
run() {
    local r=$1 k=$2 c=$3 extra=${4:-} tag=${5:-$3} cmd log secs status=0
    cmd=$(cmd_of "$k" "$c")
    [[ -n $cmd ]] || return 0
    cmd+=" $extra"
    log=$OUT/$k.$tag.$r.log
    # shellcheck disable=SC2086 # a list of words
    $cmd >"$log" 2>&1 || status=$?
    ((status == 0)) || { tail -20 "$log" >&2; die "run failed (exit status $status): $cmd (output: $log)"; }
    case $c in
    h*)
        # The slowest node's own timing line.
        secs=$(grep -E '^(\[node [0-9]+\] )?hyfi' "$log" | sed 's/^\[node [0-9]*\] //' |
            while read -r l; do echo "$l" | secs_in; done | sort -g | tail -1)
        local oks
        oks=$(grep -cE '^(\[node [0-9]+\] )?OK' "$log" || true)
        ((oks >= $(nodes_of "$c"))) || die "$k $c: not every node printed OK (output: $log)"
        if [[ $k == jacobi* && -n ${CHECK[$k]:-} ]]; then
            local key
            key=$(grep -o 'grid_bits=[0-9a-f]*' "$log" | sort -u)
            [[ " ${CHECK[$k]} " == *" $key "* ]] || die "$k $c: hyfi printed '$key', the baselines '${CHECK[$k]}' (output: $log)"
        fi
        ;;
    *)
        secs=$(grep -m1 '^time:' "$log" | awk '{ print $2 }')
        local check
        check=$(grep -m1 '^check:' "$log" | sed 's/^check: *//')
        [[ -n $check ]] || die "no 'check:' line from: $cmd (output: $log)"
        if [[ -z ${CHECK[$k]:-} ]]; then
            CHECK[$k]=$check
        elif [[ ${CHECK[$k]} != "$check" ]]; then
            die "$k: $c printed 'check: $check', the sequential code '${CHECK[$k]}' (output: $log)"
        fi
        ;;
    esac
    [[ $secs =~ ^[0-9.eE+-]+$ ]] || { cat "$log" >&2; die "no time in the output of: $cmd (output: $log)"; }
    echo "$k $tag $r $secs" >>"$RESULTS"
    printf '  round %d  %-17s %-6s %9.4f s\n' "$r" "$k" "$tag" "$secs" >&2
}
med() { awk -v k="$1" -v c="$2" '$1 == k && $2 == c { print $4 }' "$RESULTS" | median; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "# hyfi: the paper's Tables 2 and 3 on this machine"
echo
echo "raw outputs: $OUT"
echo
model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
echo "* nproc $(nproc)$( ((CPUS == $(nproc))) || echo " (configurations chosen for --cpus $CPUS)"); ${model:-CPU ?}; $(uname -sr); $(rustc -V 2>/dev/null || echo 'rustc ?'); $(mpirun --version 2>/dev/null | head -1 || echo 'no mpirun')"
echo "* hyfi commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)'); load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
hyfi_env=$(env | grep '^HYFI_' || true)
[[ -z $hyfi_env ]] || echo "* **WARNING: the environment sets $(echo "$hyfi_env" | tr '\n' ' ')— not default settings**"
[[ -z $MPI_NOTE ]] || echo "* **NOTE: $MPI_NOTE.**"
echo

if ((PLAN)); then
    echo "## Plan: $NPROC CPUs, configurations: $(for c in "${CONFIGS[@]}"; do printf '%s, ' "$(label_cfg "$c")"; done | sed 's/, $//')"
    echo
    for k in "${KLIST[@]}"; do
        for c in "${CONFIGS[@]}"; do
            cmd=$(cmd_of "$k" "$c")
            echo "$k $(label_cfg "$c"): ${cmd:-(not run)}"
        done
    done
    exit 0
fi

start=$SECONDS
for r in $(seq "$RUNS"); do
    for k in "${KLIST[@]}"; do
        for c in "${CONFIGS[@]}"; do run "$r" "$k" "$c"; done
    done
done

echo "## Table 2: time (median of $RUNS rounds, s) and speedup against the best sequential code"
echo
hdr="| kernel |"
sep="|---|"
for c in "${CONFIGS[@]}"; do hdr+=" $(label_cfg "$c") |"; sep+="---|"; done
for c in "${CONFIGS[@]:1}"; do hdr+=" speedup $(label_cfg "$c") |"; sep+="---|"; done
echo "$hdr"
echo "$sep"
: >"$OUT/speedups"
for k in "${KLIST[@]}"; do
    row="| $(label_of "$k") |"
    declare -A M=()
    for c in "${CONFIGS[@]}"; do
        M[$c]=$(med "$k" "$c")
        if [[ -n ${M[$c]} ]]; then row+=" $(printf '%.3f' "${M[$c]}") |"; else row+=" — |"; fi
    done
    for c in "${CONFIGS[@]:1}"; do
        s=$(ratio "${M[seq]}" "${M[$c]}" || true)
        row+=" ${s:-—} |"
        [[ -z $s ]] || echo "$k $c $s" >>"$OUT/speedups"
    done
    echo "$row"
done
echo
if ((NPROC < 4)); then
    echo "\* oversubscribed on this $NPROC-CPU machine: 4 nodes pinned two to a CPU (the default placement). 2×2 not run: it needs 4 CPUs at default settings. MPI 2: C MPI, 2 ranks, TCP."
else
    echo "MPI 2: C MPI, 2 ranks, TCP; MPI R > 2: R ranks bound to cores (--bind-to core), shared memory and TCP as Open MPI chooses."
fi
echo

echo "## Against issue 11's targets (2×1, medians of this run)"
echo
verdict() { awk -v x="$1" -v t="$2" -v op="$3" 'BEGIN { if (op == ">=") print (x >= t ? "met" : "MISSED"); else print (x <= t ? "met" : "MISSED") }'; }
echo "| target | figure | verdict |"
echo "|---|---|---|"
for k in "${KLIST[@]}"; do
    t21=$(med "$k" h2x1) tseq=$(med "$k" seq) tmpi=$(med "$k" mpi2) t12=$(med "$k" h1x2)
    case $k in
    jacobi*)
        if [[ -n $tmpi ]]; then
            s=$(ratio "$tmpi" "$t21")
            echo "| $(label_of "$k"): 2×1 speed ≥ 0.9× MPI 2 | $s× (MPI $(printf '%.3f' "$tmpi") s, 2×1 $(printf '%.3f' "$t21") s) | $(verdict "$s" 0.9 ">=") |"
        fi
        ;;
    matmul* | lu)
        s=$(ratio "$tseq" "$t21")
        echo "| $(label_of "$k"): 2×1 ≥ 1.6× best seq | $s× | $(verdict "$s" 1.6 ">=") |"
        if [[ $k == lu && -n $tmpi ]]; then
            # No target: what C MPI gets from the same algorithm here.
            echo "| $(label_of "$k"): C MPI 2 for reference (no target) | MPI $(ratio "$tseq" "$tmpi")× best seq; hyfi 2×1 at $(ratio "$tmpi" "$t21")× MPI's speed | — |"
        fi
        ;;
    fib | quad)
        s=$(ratio "$tseq" "$t21")
        echo "| $(label_of "$k"): 2×1 ≥ 1.85× best seq | $s× | $(verdict "$s" 1.85 ">=") |"
        w=$(ratio "$t21" "$t12")
        echo "| $(label_of "$k"): 2×1 within 5% of 1×2 | 2×1 / 1×2 = $w | $(verdict "$w" 1.05 "<=") |"
        ;;
    esac
done
echo

echo "## DSM traffic per Jacobi sweep on 2×1 (last round; per node, from the phase's counters)"
echo
echo "| kernel | node | bytes/sweep | messages/sweep | notices/sweep | pages pushed/sweep | pages fetched/sweep | boundary rows that must move (B) |"
echo "|---|---|---|---|---|---|---|---|"
for k in "${KLIST[@]}"; do
    [[ $k == jacobi* ]] || continue
    n=1024 it=200
    [[ $k == jacobi2048-* ]] && n=2048 it=$JAC2048_IT
    log=$OUT/$k.h2x1.$RUNS.log
    grep -E 'dsm node [0-9]+ phase 0:' "$log" | sed 's/^\[node [0-9]*\] //' | while read -r l; do
        node=$(echo "$l" | awk '{ print $3 }')
        bytes=$(echo "$l" | grep -o 'messages ([0-9]* B)' | grep -o '[0-9]*')
        msgs=$(echo "$l" | grep -o '[0-9]* messages' | awk '{ print $1 }')
        notices=$(echo "$l" | grep -o 'notices [0-9]*' | awk '{ print $2 }')
        pushed=$(echo "$l" | grep -o 'pushed [0-9]*' | awk '{ print $2 }')
        fetched=$(echo "$l" | grep -o 'fetched [0-9]*' | awk '{ print $2 }')
        awk -v k="$(label_of "$k")" -v node="$node" -v b="$bytes" -v m="$msgs" -v no="$notices" \
            -v pu="$pushed" -v f="$fetched" -v it="$it" -v row=$((n * 8)) \
            'BEGIN { printf "| %s | %s | %.0f | %.2f | %.2f | %.2f | %.2f | %d (bytes/sweep ÷ this: %.3f) |\n", k, node, b / it, m / it, no / it, pu / it, f / it, row, b / it / row }'
    done
done
echo

if ((TABLE3)); then
    echo "## Table 3: overlap, Jacobi 1024² on 2×1, 1 vs 4 pools per processor"
    echo
    for r in $(seq "$RUNS"); do
        for k in jacobi-row jacobi-point; do
            if ((r % 2)); then order="1 4"; else order="4 1"; fi
            for p in $order; do run "$r" "$k" h2x1 "--pools-per-proc $p" "pools$p"; done
        done
    done
    echo "Loopback (medians of $RUNS interleaved pairs; improvement = 1 − t(4 pools) / t(1 pool)):"
    echo
    echo "| grain | 1 pool (s) | 4 pools (s) | improvement |"
    echo "|---|---|---|---|"
    for k in jacobi-row jacobi-point; do
        a=$(med "$k" pools1) b=$(med "$k" pools4)
        echo "| $(label_of "$k") | $(printf '%.4f' "$a") | $(printf '%.4f' "$b") | $(awk -v a="$a" -v b="$b" 'BEGIN { printf "%+.1f %%", (1 - b / a) * 100 }') |"
    done
    echo
    if [[ $(id -u) == 0 ]] && command -v ip >/dev/null && command -v tc >/dev/null; then
        echo "Link shaped to 1 Gbit/s (scripts/shaped-link.sh jacobi-overlap $RUNS; its own summary):"
        echo
        echo '```'
        JACOBI=$EX/jacobi ITERS=200 "$ROOT/scripts/shaped-link.sh" jacobi-overlap "$RUNS" 2>&1 | tail -12 || echo "(shaped-link.sh failed; see above)"
        echo '```'
    else
        echo "Shaped link: not run (needs root, ip and tc from iproute2, for network namespaces)."
    fi
    echo
fi

# ------------------------------------------------------------ the chart
svg=$OUT/speedup.svg
awk -v ncpu="$NPROC" -v title="hyfi speedup over the best sequential code ($NPROC CPUs; * oversubscribed)" '
    { k[NR] = $1; c[NR] = $2; s[NR] = $3; if (!($1 in seen)) { seen[$1] = 1; ks[++nk] = $1 }
      if (!($2 in cseen)) { cseen[$2] = 1; cs[++nc] = $2 } if ($3 > max) max = $3 }
    END {
        if (max < 2) max = 2; max = int(max + 0.999)
        bw = 14; gw = nc * bw + 20; W = 80 + nk * gw + 160; H = 380; y0 = 320; sc = 260 / max
        ncol = split("#4e79a7 #f28e2b #e15759 #76b7b2 #59a14f #edc948 #b07aa1 #ff9da7 #9c755f #bab0ac #1b9e77 #d95f02 #7570b3 #e7298a #66a61e #e6ab02 #a6761d", col, " ")
        for (b = ncol + 1; b <= nc; b++) col[b] = col[(b - 1) % ncol + 1]
        for (b = 1; b <= nc; b++) {
            l = cs[b]
            if (l ~ /^mpi/) l = "MPI " substr(l, 4); else if (l ~ /^h/) l = substr(l, 2)
            if (l ~ /x/) { split(l, np, "x"); if (np[1] * np[2] > ncpu) l = l "*" }
            lab[cs[b]] = l
        }
        printf "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%d\" height=\"%d\" font-family=\"sans-serif\" font-size=\"11\">\n", W, H
        printf "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n<text x=\"%d\" y=\"18\" font-size=\"14\">%s</text>\n", 10, title
        for (v = 0; v <= max; v++) {
            y = y0 - v * sc
            printf "<line x1=\"60\" x2=\"%d\" y1=\"%.1f\" y2=\"%.1f\" stroke=\"%s\"/><text x=\"50\" y=\"%.1f\" text-anchor=\"end\">%d</text>\n", 80 + nk * gw, y, y, (v == 1 ? "#888" : "#ddd"), y + 4, v
        }
        for (i = 1; i <= NR; i++) {
            for (a = 1; a <= nk; a++) if (ks[a] == k[i]) g = a
            for (b = 1; b <= nc; b++) if (cs[b] == c[i]) j = b
            x = 80 + (g - 1) * gw + (j - 1) * bw; h = s[i] * sc
            printf "<rect x=\"%d\" y=\"%.1f\" width=\"%d\" height=\"%.1f\" fill=\"%s\"><title>%s %s: %.2f</title></rect>\n", x, y0 - h, bw - 2, h, col[j], k[i], lab[c[i]], s[i]
        }
        for (a = 1; a <= nk; a++)
            printf "<text transform=\"translate(%d,%d) rotate(30)\">%s</text>\n", 80 + (a - 1) * gw, y0 + 14, ks[a]
        for (b = 1; b <= nc; b++)
            printf "<rect x=\"%d\" y=\"%d\" width=\"12\" height=\"12\" fill=\"%s\"/><text x=\"%d\" y=\"%d\">%s</text>\n", W - 140, 30 + b * 18, col[b], W - 122, 40 + b * 18, lab[cs[b]]
        print "</svg>"
    }' "$OUT/speedups" >"$svg"
echo "Speedup chart: $svg ($(($(wc -c <"$svg") / 1024)) KiB, SVG); $((SECONDS - start)) s of runs."
