#!/usr/bin/env bash
# Side by side: hyfi's examples on 1 node x 1 and 1 node x 2 processors
# against the best sequential Rust, rayon on 2 threads and C/OpenMP on 2
# threads, for the same kernels on the same inputs. One command:
#
#   scripts/side-by-side.sh [--runs N] [--kernels LIST] [--row-n N]
#                           [--jacobi-n N] [--fib-cutoff C] [--out DIR]
#                           [--no-build] [--wait-quiet]
#
# Kernels (--kernels, comma-separated; default: the first six):
#   jacobi-point  Jacobi 1024^2, 200 sweeps, eps 0, one filament per point
#   jacobi-row    the same, one filament per row (--row-n 2048 for 2048^2)
#   matmul        C = A x B, n = 1024
#   lu            LU with partial pivoting, n = 1024
#   fib           fib(40), every call a join (no cutoff)
#   quad          adaptive quadrature of x^6 on [1, 70], tol 1.5e-3 (quad's defaults)
#   fib-cutoff    fib(40) with a cutoff (--fib-cutoff, default 25) for hyfi,
#                 rayon and OpenMP tasks
#   matmul-row    matmul with the example's --per-row (one filament per row
#                 of C), if the example has that option
#   (`--kernels all` selects all eight)
#
# Variants per kernel:
#   seq       best sequential Rust   examples/baselines.rs <kernel> seq
#   hyfi 1x1  the hyfi example       target/release/examples/<example> ... --procs 1
#   hyfi 1x2  the same               ... --procs 2
#   rayon 2   natural rayon code     examples/baselines.rs <kernel> rayon, RAYON_NUM_THREADS=2
#   OpenMP 2  gcc -O3 -fopenmp (and -ffp-contract=off: no FMA, same bits) benches/baselines/<kernel>.c, OMP_NUM_THREADS=2
#             (Jacobi, matmul, LU, and fib-cutoff as tasks; fib without a
#             cutoff and quad have no OpenMP version: one libgomp task per
#             call would be hundreds of millions of tasks)
#
# Round-robin: for each of --runs rounds (default 5), every (kernel,
# variant) runs once, in a fixed interleaved order. The table gives per
# kernel the median time of each variant and ratios of the medians; a
# second table the median [min-max] of the per-round ratios.
#
# Times: every baseline prints `time: <s>` of its computation alone; for
# hyfi the time is the example's own `hyfi...: <t> s` line (its timed
# computation, not start-up, input generation or its check). Every run is
# also checked: the baselines of a kernel must print the same `check:` line
# (same results bit for bit), and where the example prints a fingerprint
# (Jacobi's grid_bits, fib's value, quad's value_bits and intervals) it
# must equal the baselines'. A failed run, a time that cannot be found or a
# mismatch stops the script with status 1.
#
# Builds: `cargo build --release --examples` (CARGO_TARGET_DIR is honoured)
# and the C with ${CC:-gcc} -O3 -ffp-contract=off -fopenmp; without a C compiler with OpenMP
# the OpenMP columns read "n/a (no C compiler)". Environment: CC, OUT (as
# --out), QUIET_WAIT (seconds --wait-quiet waits at most, default 120),
# MAX_FOREIGN (CPUs the rest of the machine may use for it to count as
# quiet, default 0.15). The example runs use default settings: the script
# passes no HYFI_* knobs (and warns if the environment sets any).
#
# A full default run (5 rounds, six kernels) takes about 3-4 minutes on a
# 2-core machine after the build.

set -euo pipefail

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
RUNS=5
KERNELS=jacobi-point,jacobi-row,matmul,lu,fib,quad
ALL_KERNELS=jacobi-point,jacobi-row,matmul,lu,fib,quad,fib-cutoff,matmul-row
JACOBI_N=1024
ROW_N=1024
ITERS=200
MAT_N=1024
FIB_N=40
FIB_CUTOFF=25
OUT=${OUT:-}
BUILD=1
WAIT_QUIET=0

die() {
    echo "side-by-side: ERROR: $*" >&2
    exit 1
}

usage() {
    sed -n '2,/^$/p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'
    exit "${1:-0}"
}

posint() { [[ $2 =~ ^[1-9][0-9]*$ ]] || die "$1 needs a positive integer, got '$2'"; }

while (($#)); do
    case $1 in
    --runs) posint "$1" "${2:-}" && RUNS=$2 && shift ;;
    --kernels) KERNELS=${2:?--kernels needs a list} && shift ;;
    --row-n) posint "$1" "${2:-}" && ROW_N=$2 && shift ;;
    --jacobi-n) posint "$1" "${2:-}" && JACOBI_N=$2 && shift ;;
    --fib-cutoff) posint "$1" "${2:-}" && FIB_CUTOFF=$2 && shift ;;
    --out) OUT=${2:?--out needs a directory} && shift ;;
    --no-build) BUILD=0 ;;
    --wait-quiet) WAIT_QUIET=1 ;;
    -h | --help) usage 0 ;;
    *) echo "side-by-side: unknown option '$1'" >&2 && usage 2 ;;
    esac
    shift
done
[[ $KERNELS == all ]] && KERNELS=$ALL_KERNELS
IFS=, read -r -a KLIST <<<"$KERNELS"
for k in "${KLIST[@]}"; do
    [[ ,$ALL_KERNELS, == *",$k,"* ]] || die "unknown kernel '$k' (known: $ALL_KERNELS, all)"
done

TARGET=${CARGO_TARGET_DIR:-$ROOT/target}
[[ $TARGET == /* ]] || TARGET=$ROOT/$TARGET
EX=$TARGET/release/examples
CDIR=$TARGET/side-by-side-c
[[ -n $OUT ]] || OUT=$(mktemp -d /tmp/hyfi-side-by-side.XXXXXX)
mkdir -p "$OUT"
RESULTS=$OUT/results
: >"$RESULTS"

# ------------------------------------------------------------ build

CC_USED=""
CC_NOTE=""
find_cc() {
    local cands=() c
    if [[ -n ${CC:-} ]]; then cands=("$CC"); else cands=(gcc cc clang); fi
    for c in "${cands[@]}"; do
        command -v "$c" >/dev/null 2>&1 || continue
        printf '#include <omp.h>\nint main(void){int t=0;\n#pragma omp parallel reduction(+:t)\nt+=1;\nreturn t<1;}\n' >"$OUT/omp-probe.c"
        if "$c" -O3 -fopenmp -o "$OUT/omp-probe" "$OUT/omp-probe.c" >"$OUT/omp-probe.log" 2>&1 &&
            "$OUT/omp-probe"; then
            CC_USED=$c
            return 0
        fi
        CC_NOTE="$c is installed but cannot build an OpenMP program ($(head -1 "$OUT/omp-probe.log"))"
    done
    [[ -n $CC_NOTE ]] || CC_NOTE="no C compiler installed (tried: ${cands[*]})"
    return 1
}

# The C baselines and their flags (-ffp-contract=off: no FMA, same bits),
# shown among the build commands and used to build them below.
C_KERNELS=(jacobi matmul lu fib)
C_FLAGS=(-O3 -ffp-contract=off -fopenmp)
BUILD_CMDS=()
if ((BUILD)); then
    BUILD_CMDS+=("(cd $ROOT && cargo build --release --examples)")
fi
if find_cc; then
    for k in "${C_KERNELS[@]}"; do
        BUILD_CMDS+=("$CC_USED ${C_FLAGS[*]} -o $CDIR/$k $ROOT/benches/baselines/$k.c")
    done
fi

echo "# hyfi side by side"
echo
echo "raw outputs: $OUT"
echo
echo "## Build commands"
echo
for c in "${BUILD_CMDS[@]}"; do echo "    $c"; done
((${#BUILD_CMDS[@]})) || echo "    (none: --no-build, and no C compiler)"
if [[ -z $CC_USED ]]; then
    echo
    echo "**NOTE: $CC_NOTE: the OpenMP columns are n/a (no C compiler).**"
    echo "side-by-side: WARNING: $CC_NOTE; OpenMP columns will be n/a" >&2
fi
echo

if ((BUILD)); then
    (cd "$ROOT" && cargo build --release --examples) >"$OUT/cargo-build.log" 2>&1 ||
        { tail -30 "$OUT/cargo-build.log" >&2; die "cargo build --release --examples failed (log: $OUT/cargo-build.log)"; }
fi
if [[ -n $CC_USED ]]; then
    mkdir -p "$CDIR"
    for k in "${C_KERNELS[@]}"; do
        "$CC_USED" "${C_FLAGS[@]}" -o "$CDIR/$k" "$ROOT/benches/baselines/$k.c" >"$OUT/cc-$k.log" 2>&1 ||
            { cat "$OUT/cc-$k.log" >&2; die "$CC_USED failed on benches/baselines/$k.c"; }
    done
fi
for b in baselines jacobi matmul lu fib quad; do
    [[ -x $EX/$b ]] || die "$EX/$b is missing (build with: cargo build --release --examples)"
done
if [[ ,$KERNELS, == *,matmul-row,* ]] && ! "$EX/matmul" --help | grep -q -- --per-row; then
    die "kernel matmul-row: this matmul example has no --per-row option"
fi

# ------------------------------------------------------------ the runs

# cmd_of KERNEL VARIANT -> the command line (words separated by spaces; no
# word contains a space), or nothing if the variant does not exist.
cmd_of() {
    local k=$1 v=$2
    case $k:$v in
    jacobi-point:seq) echo "$EX/baselines jacobi seq --n $JACOBI_N --iters $ITERS" ;;
    jacobi-point:rayon2) echo "$EX/baselines jacobi rayon --threads 2 --n $JACOBI_N --iters $ITERS" ;;
    jacobi-point:omp2) [[ -n $CC_USED ]] && echo "$CDIR/jacobi $JACOBI_N $ITERS" ;;
    jacobi-point:hyfi1) echo "$EX/jacobi --n $JACOBI_N --iters $ITERS --eps 0 --procs 1" ;;
    jacobi-point:hyfi2) echo "$EX/jacobi --n $JACOBI_N --iters $ITERS --eps 0 --procs 2" ;;
    jacobi-row:seq) echo "$EX/baselines jacobi seq --n $ROW_N --iters $ITERS" ;;
    jacobi-row:rayon2) echo "$EX/baselines jacobi rayon --threads 2 --n $ROW_N --iters $ITERS" ;;
    jacobi-row:omp2) [[ -n $CC_USED ]] && echo "$CDIR/jacobi $ROW_N $ITERS" ;;
    jacobi-row:hyfi1) echo "$EX/jacobi --n $ROW_N --iters $ITERS --eps 0 --per-row --procs 1" ;;
    jacobi-row:hyfi2) echo "$EX/jacobi --n $ROW_N --iters $ITERS --eps 0 --per-row --procs 2" ;;
    matmul:seq | lu:seq | matmul-row:seq) echo "$EX/baselines ${k%-row} seq --n $MAT_N" ;;
    matmul:rayon2 | lu:rayon2 | matmul-row:rayon2) echo "$EX/baselines ${k%-row} rayon --threads 2 --n $MAT_N" ;;
    matmul:omp2 | lu:omp2 | matmul-row:omp2) [[ -n $CC_USED ]] && echo "$CDIR/${k%-row} $MAT_N" ;;
    matmul-row:hyfi1) echo "$EX/matmul --n $MAT_N --per-row --procs 1" ;;
    matmul-row:hyfi2) echo "$EX/matmul --n $MAT_N --per-row --procs 2" ;;
    matmul:hyfi1 | lu:hyfi1) echo "$EX/$k --n $MAT_N --procs 1" ;;
    matmul:hyfi2 | lu:hyfi2) echo "$EX/$k --n $MAT_N --procs 2" ;;
    fib:seq | fib-cutoff:seq) echo "$EX/baselines fib seq --n $FIB_N" ;;
    fib:rayon2) echo "$EX/baselines fib rayon --threads 2 --n $FIB_N" ;;
    fib:hyfi1) echo "$EX/fib --n $FIB_N --procs 1" ;;
    fib:hyfi2) echo "$EX/fib --n $FIB_N --procs 2" ;;
    fib-cutoff:rayon2) echo "$EX/baselines fib rayon --threads 2 --n $FIB_N --cutoff $FIB_CUTOFF" ;;
    fib-cutoff:omp2) [[ -n $CC_USED ]] && echo "$CDIR/fib $FIB_N $FIB_CUTOFF" ;;
    fib-cutoff:hyfi1) echo "$EX/fib --n $FIB_N --cutoff $FIB_CUTOFF --procs 1" ;;
    fib-cutoff:hyfi2) echo "$EX/fib --n $FIB_N --cutoff $FIB_CUTOFF --procs 2" ;;
    quad:seq) echo "$EX/baselines quad seq" ;;
    quad:rayon2) echo "$EX/baselines quad rayon --threads 2" ;;
    quad:hyfi1) echo "$EX/quad --procs 1" ;;
    quad:hyfi2) echo "$EX/quad --procs 2" ;;
    esac
    return 0
}

VARIANTS=(seq hyfi1 hyfi2 rayon2 omp2)
env_of() {
    case $1 in
    rayon2) echo "RAYON_NUM_THREADS=2" ;;
    omp2) echo "OMP_NUM_THREADS=2" ;;
    esac
}

# shellcheck source=lib/measure.sh
source "$ROOT/scripts/lib/measure.sh"

# CPU ticks the whole machine spent busy, and those of this shell's reaped children.
busy_ticks() { awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat; }
child_ticks() { sed 's/^.*) //' "/proc/$$/stat" | awk '{ print $14 + $15 }'; }
HZ=$(getconf CLK_TCK)

wait_quiet() {
    local deadline b0 b1
    deadline=$((SECONDS + ${QUIET_WAIT:-120}))
    while ((SECONDS < deadline)); do
        b0=$(busy_ticks)
        sleep 0.5
        b1=$(busy_ticks)
        awk -v b=$((b1 - b0)) -v hz="$HZ" -v m="${MAX_FOREIGN:-0.15}" \
            'BEGIN { exit !(b / hz / 0.5 <= m) }' && return 0
        sleep 1
    done
    echo "side-by-side: the machine stayed busy for ${QUIET_WAIT:-120} s; running anyway" >&2
}

# What each kernel's baselines printed on their check line (the first one).
declare -A CHECK

# run ROUND KERNEL VARIANT: one run; appends "kernel variant round secs
# foreign example_seq" to $RESULTS.
run() {
    local r=$1 k=$2 v=$3 cmd envs log secs exseq b0 c0 t0 b1 c1 t1 foreign
    cmd=$(cmd_of "$k" "$v")
    [[ -n $cmd ]] || return 0
    envs=$(env_of "$v")
    log=$OUT/$k.$v.$r.log
    ((WAIT_QUIET)) && wait_quiet
    b0=$(busy_ticks) c0=$(child_ticks) t0=$(date +%s%N)
    local status=0
    # shellcheck disable=SC2086 # cmd and envs are lists of words
    env $envs $cmd >"$log" 2>&1 || status=$?
    if ((status != 0)); then
        tail -20 "$log" >&2
        die "run failed (exit status $status): $envs $cmd (output: $log)"
    fi
    b1=$(busy_ticks) c1=$(child_ticks) t1=$(date +%s%N)
    foreign=$(awk -v b=$((b1 - b0)) -v c=$((c1 - c0)) -v ns=$((t1 - t0)) -v hz="$HZ" \
        'BEGIN { f = (b - c) / hz / (ns / 1e9); printf "%.2f", (f < 0 ? 0 : f) }')
    exseq=-
    case $v in
    hyfi*)
        secs=$(grep -m1 '^hyfi' "$log" | secs_in || true)
        [[ -n $secs ]] || { cat "$log" >&2; die "no 'hyfi...: <seconds> s' line in the output of: $cmd (output: $log)"; }
        exseq=$(grep -m1 '^sequential' "$log" | secs_in || true)
        [[ -n $exseq ]] || exseq=-
        local key=""
        case $k in
        jacobi-*) key=$(grep -o 'grid_bits=[0-9a-f]*' "$log" | head -1 || true) ;;
        fib*) key=$(grep -m1 '^result:' "$log" | grep -o 'value=[0-9]*' || true) ;;
        quad) key=$(grep -m1 '^result:' "$log" | grep -o 'value_bits=[0-9a-f]* intervals=[0-9]*' || true) ;;
        esac
        if [[ -n $key && -n ${CHECK[$k]:-} && " ${CHECK[$k]} " != *" $key "* ]]; then
            die "$k: hyfi printed '$key', the baselines '${CHECK[$k]}' ($cmd, output: $log)"
        fi
        ;;
    *)
        secs=$(grep -m1 '^time:' "$log" | awk '{ print $2 }' || true)
        [[ $secs =~ ^[0-9.eE+-]+$ ]] || { cat "$log" >&2; die "no 'time: <seconds>' line in the output of: $cmd (output: $log)"; }
        local check
        check=$(grep -m1 '^check:' "$log" | sed 's/^check: *//' || true)
        [[ -n $check ]] || die "no 'check:' line in the output of: $cmd (output: $log)"
        if [[ -z ${CHECK[$k]:-} ]]; then
            CHECK[$k]=$check
        elif [[ ${CHECK[$k]} != "$check" ]]; then
            die "$k: $v printed 'check: $check', an earlier baseline '${CHECK[$k]}' ($cmd, output: $log)"
        fi
        ;;
    esac
    echo "$k $v $r $secs $foreign $exseq" >>"$RESULTS"
    printf '  round %d  %-12s %-7s %9.4f s  (other load %s CPUs)\n' "$r" "$k" "$v" "$secs" "$foreign" >&2
}

label_of() {
    case $1 in
    jacobi-point) echo "Jacobi ${JACOBI_N}², $ITERS sweeps, filament per point" ;;
    jacobi-row) echo "Jacobi ${ROW_N}², $ITERS sweeps, filament per row" ;;
    matmul) echo "matmul n=$MAT_N" ;;
    matmul-row) echo "matmul n=$MAT_N, filament per row" ;;
    lu) echo "LU n=$MAT_N" ;;
    fib) echo "fib($FIB_N), no cutoff" ;;
    fib-cutoff) echo "fib($FIB_N), cutoff $FIB_CUTOFF (seq: no cutoff)" ;;
    quad) echo "quad x⁶ [1, 70], tol 1.5e-3" ;;
    esac
}

echo "## Run commands (each run once per round, in this order; $RUNS rounds)"
echo
for k in "${KLIST[@]}"; do
    for v in "${VARIANTS[@]}"; do
        c=$(cmd_of "$k" "$v")
        [[ -n $c ]] || continue
        e=$(env_of "$v")
        echo "    ${e:+$e }${c//$ROOT\//}"
    done
done
echo

echo "## Machine"
echo
model=$(awk -F': *' '/^model name/ { print $2; exit }' /proc/cpuinfo 2>/dev/null || true)
echo "* nproc: $(nproc); CPU: ${model:-unknown}; $(awk '/MemTotal/ { printf "%.0f GiB RAM", $2 / 1048576 }' /proc/meminfo 2>/dev/null || true)"
if [[ -n $CC_USED ]]; then cc_version=$("$CC_USED" --version | head -1); else cc_version="no C compiler"; fi
echo "* $(uname -sr); $(rustc -V 2>/dev/null || echo 'rustc ?'); $cc_version"
echo "* hyfi commit $(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo '?')$(git -C "$ROOT" diff --quiet HEAD -- 2>/dev/null || echo ' (with uncommitted changes)')"
echo "* load average at start: $(cut -d' ' -f1-3 /proc/loadavg)"
hyfi_env=$(env | grep '^HYFI_' || true)
if [[ -n $hyfi_env ]]; then
    echo "* **WARNING: the environment sets $(echo "$hyfi_env" | tr '\n' ' ')— the hyfi runs are not at default settings**"
fi
echo

start=$SECONDS
for r in $(seq "$RUNS"); do
    for k in "${KLIST[@]}"; do
        for v in "${VARIANTS[@]}"; do
            run "$r" "$k" "$v"
        done
    done
done
elapsed=$((SECONDS - start))

# ------------------------------------------------------------ the tables

# med KERNEL VARIANT [COLUMN] -> median over the rounds (empty if no runs)
med() {
    awk -v k="$1" -v v="$2" -v c="${3:-4}" '$1 == k && $2 == v && $c != "-" { print $c }' "$RESULTS" |
        median
}

# Median [min-max] over rounds of VARIANT_A / VARIANT_B of one kernel.
paired() {
    awk -v k="$1" -v a="$2" -v b="$3" '$1 == k && $2 == a { x[$3] = $4 } $1 == k && $2 == b { y[$3] = $4 }
        END { for (r in x) if (r in y && y[r] > 0) print x[r] / y[r] }' "$RESULTS" |
        sort -g | awk '{ v[NR] = $1 } END {
            if (NR == 0) { exit }
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.2f [%.2f–%.2f]\n", m, v[1], v[NR] }'
}

na_cell() { # VARIANT -> what an empty cell says
    if [[ $1 == omp2 && -z $CC_USED ]]; then echo "n/a (no C compiler)"; else echo "—"; fi
}
fmt_t() { [[ -n $1 ]] && printf '%.3f' "$1"; }
ratio() { [[ -n $1 && -n $2 ]] && awk -v a="$1" -v b="$2" 'BEGIN { printf "%.2f", a / b }'; }

echo "## Results: medians of $RUNS rounds (seconds) and ratios of the medians"
echo
echo "| kernel | best seq Rust | hyfi 1×1 | hyfi 1×2 | rayon 2 | OpenMP 2 | 1×1 / seq | 1×2 / seq | 1×2 / OpenMP 2 | 1×2 / rayon 2 | example's own seq |"
echo "|---|---|---|---|---|---|---|---|---|---|---|"
for k in "${KLIST[@]}"; do
    declare -A M=()
    for v in "${VARIANTS[@]}"; do M[$v]=$(med "$k" "$v"); done
    exseq=$(med "$k" hyfi1 6)
    row="| $(label_of "$k") |"
    for v in "${VARIANTS[@]}"; do
        c=$(fmt_t "${M[$v]}" || true)
        row+=" ${c:-$(na_cell "$v")} |"
    done
    for pair in "hyfi1 seq" "hyfi2 seq" "hyfi2 omp2" "hyfi2 rayon2"; do
        read -r a b <<<"$pair"
        c=$(ratio "${M[$a]}" "${M[$b]}" || true)
        row+=" ${c:-$(na_cell "$b")} |"
    done
    row+=" $(fmt_t "$exseq" || echo —) |"
    echo "$row"
done
echo
echo "Median [min–max] of the per-round ratios (each round ran every variant once):"
echo
echo "| kernel | 1×1 / seq | 1×2 / seq | 1×2 / OpenMP 2 | 1×2 / rayon 2 | 1×1 / 1×2 (hyfi speedup) | median other load (CPUs) |"
echo "|---|---|---|---|---|---|---|"
for k in "${KLIST[@]}"; do
    row="| $(label_of "$k") |"
    for pair in "hyfi1 seq" "hyfi2 seq" "hyfi2 omp2" "hyfi2 rayon2" "hyfi1 hyfi2"; do
        read -r a b <<<"$pair"
        c=$(paired "$k" "$a" "$b")
        row+=" ${c:-$(na_cell "$b")} |"
    done
    load=$(awk -v k="$k" '$1 == k { print $5 }' "$RESULTS" | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }')
    row+=" ${load:-—} |"
    echo "$row"
done
echo
echo "seq: examples/baselines.rs (flat Vec<f64>, slices; matmul i-k-j; LU row-oriented with row swaps;"
echo "plain recursion for fib and quad). rayon 2: the same code with par_chunks_mut / rayon::join on a"
if [[ -n $CC_USED ]]; then
    echo "2-thread pool. OpenMP 2: benches/baselines/*.c, $CC_USED -O3 -fopenmp, OMP_NUM_THREADS=2 (\"—\": no"
    echo "OpenMP version of the kernel)."
else
    echo "2-thread pool. OpenMP 2: not run, $CC_NOTE."
fi
echo "hyfi: the repository's examples at their defaults, the time they print for their hyfi run."
echo "\"example's own seq\": the sequential reference the hyfi example times itself (from its 1×1 run)."
echo "\"other load\": CPUs the rest of the machine used during a run (busy ticks not spent by the run)."
echo
echo "All runs: $RESULTS (kernel variant round seconds other_load example_seq); $elapsed s of runs."
