#!/usr/bin/env bash
# hyfi-dsm measurements with the Jacobi example (BENCHMARKS.md, "hyfi-dsm").
#
#   scripts/dsm-sweep.sh bytes   [RUNS]  DSM bytes per sweep on 2x1, n = 512, 1024, 2048
#   scripts/dsm-sweep.sh overlap [RUNS]  2x1 (and 2x2 on 4+ CPUs), n = 1024: 1 vs 4 pools per processor,
#                                        one filament per row and per point, loopback
#   scripts/dsm-sweep.sh nodes   [RUNS]  2x1 (two nodes of 1 processor) vs 1x2 (one node
#                                        of 2), n = 1024, per row and per point
#   scripts/dsm-sweep.sh all     [RUNS]  the three above
#
# (The same overlap experiment over a 1 Gbit/s link between two network
# namespaces: scripts/shaped-link.sh jacobi-overlap.)
#
# Every run must print "OK:" on every node (the hyfi grid equals the
# sequential one bit for bit), or the script stops. Configurations are
# interleaved (run 1 of every configuration, then run 2, ...) so that the
# machine's slow and fast spells hit all of them; the figure of a
# configuration is the median of its runs. The two sides of a comparison
# (1 vs 4 pools; 2x1 vs 1x2) run back to back, first one then the other
# first, and their ratio is also given as the median of these pairs. A run's time is the largest
# `hyfi:` time over its nodes (timed sweeps only, no start-up, no check).
# Bytes per sweep are the DSM bytes sent during the program's phase
# (`dsm node k phase 0: ... (B B)` — all sweeps, nothing after the last
# release), summed over the nodes, divided by the sweeps.
#
# Runs disturbed by other work on the machine are repeated (see jrun).
#
# Environment: JACOBI (default target/release/examples/jacobi), ITERS
# (sweeps for overlap/nodes, default 100), OUT (directory for raw outputs,
# default a fresh one under /tmp), JOB_RUNNER (a command that runs its
# arguments as both nodes of a 2-node job, e.g. "scripts/shaped-link.sh
# job --"; unset: the example's own --nodes launcher on loopback),
# MAX_FOREIGN, ATTEMPTS and QUIET_WAIT (see wait_quiet and jrun).

set -euo pipefail

HERE=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
BIN=${JACOBI:-$HERE/target/release/examples/jacobi}
ITERS=${ITERS:-100}
OUT=${OUT:-}
# Default settings only (pinned server threads, local nodes on disjoint
# CPUs): 2x2 runs where the host has 4 CPUs for it; on fewer, a pinned 2x2
# is refused (each node's share is too small), so the overlap experiment
# runs 2x1 only: every figure here is at the defaults a user gets.
if (($(nproc) >= 4)); then OVERLAP_PROCS="1 2"; else OVERLAP_PROCS="1"; fi

# The directory for raw outputs: $OUT, or a fresh one.
ensure_out() {
    [[ -n $OUT ]] || OUT=$(mktemp -d /tmp/hyfi-dsm-sweep.XXXXXX)
    mkdir -p "$OUT"
}

median() { # numbers on stdin -> median
    sort -g | awk '{ a[NR] = $1 } END {
        if (NR == 0) { print "nan"; exit }
        if (NR % 2) print a[(NR + 1) / 2]; else print (a[NR / 2] + a[NR / 2 + 1]) / 2 }'
}

# CPU ticks (USER_HZ) the whole machine spent busy (steal included), and
# those of this shell's reaped children.
busy_ticks() {
    awk '/^cpu / { print $2 + $3 + $4 + $7 + $8 + $9 }' /proc/stat
}
child_ticks() {
    # Fields 16 and 17 of /proc/$$/stat (cutime, cstime: the top shell, not the
    # $(...) subshell this runs in), after the
    # parenthesised command name.
    sed 's/^.*) //' "/proc/$$/stat" | awk '{ print $14 + $15 }'
}

# Waits (up to QUIET_WAIT seconds, default 300) until the rest of the machine
# has used less than MAX_FOREIGN CPUs over half a second.
wait_quiet() {
    local hz deadline b0 b1 f
    hz=$(getconf CLK_TCK)
    deadline=$((SECONDS + ${QUIET_WAIT:-300}))
    while ((SECONDS < deadline)); do
        b0=$(busy_ticks)
        sleep 0.5
        b1=$(busy_ticks)
        f=$(awk -v b=$((b1 - b0)) -v hz="$hz" 'BEGIN { printf "%.3f", b / hz / 0.5 }')
        if awk -v f="$f" -v m="${MAX_FOREIGN:-0.15}" 'BEGIN { exit !(f <= m) }'; then
            return 0
        fi
        sleep 1
    done
    echo "dsm-sweep: the machine stayed busy for ${QUIET_WAIT:-300} s; running anyway" >&2
}

# jrun LABEL NODES PROCS ARGS...: one run; appends "LABEL secs bytes_per_sweep
# foreign" to $OUT/results and keeps the whole output in $OUT. `foreign` is
# the CPU the rest of the machine used during the run, in CPUs (busy ticks
# not spent by the run's processes, over its wall time, steal included); a
# run with foreign > MAX_FOREIGN (default 0.15) is repeated, up to
# ATTEMPTS (default 10) times, and the last attempt kept either way. Every
# attempt first waits for a quiet machine (wait_quiet).
jrun() {
    local label=$1 nodes=$2 procs=$3
    shift 3
    local cmd
    if [[ $nodes -eq 1 ]]; then
        cmd=("$BIN" --procs "$procs" "$@")
    elif [[ -n ${JOB_RUNNER:-} ]]; then
        # shellcheck disable=SC2206
        cmd=($JOB_RUNNER "$BIN" --procs "$procs" "$@")
    else
        cmd=("$BIN" --nodes "$nodes" --procs "$procs" "$@")
    fi
    local attempt log foreign b0 c0 t0 b1 c1 t1 hz
    hz=$(getconf CLK_TCK)
    for attempt in $(seq "${ATTEMPTS:-10}"); do
        wait_quiet
        log="$OUT/$label.$(date +%s%N).log"
        b0=$(busy_ticks) c0=$(child_ticks) t0=$(date +%s%N)
        if ! "${cmd[@]}" >"$log" 2>&1; then
            echo "dsm-sweep: run failed: ${cmd[*]} (output in $log)" >&2
            tail -20 "$log" >&2
            exit 1
        fi
        b1=$(busy_ticks) c1=$(child_ticks) t1=$(date +%s%N)
        foreign=$(awk -v b=$((b1 - b0)) -v c=$((c1 - c0)) -v ns=$((t1 - t0)) -v hz="$hz" \
            'BEGIN { f = (b - c) / hz / (ns / 1e9); printf "%.3f", (f < 0 ? 0 : f) }')
        if awk -v f="$foreign" -v m="${MAX_FOREIGN:-0.15}" 'BEGIN { exit !(f <= m) }'; then
            break
        fi
        echo "dsm-sweep: $label: the rest of the machine used $foreign CPUs during the run; again" >&2
    done
    local oks
    oks=$(grep -c "OK: hyfi and sequential results are identical" "$log" || true)
    if [[ $oks -ne $nodes ]]; then
        echo "dsm-sweep: $oks of $nodes nodes printed OK: ${cmd[*]} (output in $log)" >&2
        exit 1
    fi
    local secs sweeps bytes
    secs=$(grep -o "hyfi: *[0-9.]* s" "$log" | awk '{ if ($2 > m) m = $2 } END { print m }')
    sweeps=$(grep -o "hyfi: *[0-9.]* s, [0-9]* sweeps" "$log" | head -1 | awk '{ print $4 }')
    bytes=$(grep "dsm node [0-9]* phase 0:" "$log" | sed 's/.*messages (\([0-9]*\) B).*/\1/' |
        awk -v s="$sweeps" '{ t += $1 } END { printf "%.0f", (s > 0 ? t / s : 0) }')
    echo "$label $secs $bytes $foreign" | tee -a "$OUT/results"
}

# stat LABEL COLUMN -> median of that column over LABEL's runs
stat() {
    awk -v l="$1" -v c="$2" '$1 == l { print $c }' "$OUT/results" | median
}

# paired LABEL_A LABEL_B -> median over rounds of (B's k-th run / A's k-th run),
# then its min and max: the two were run back to back in every round.
paired() {
    awk -v a="$1" -v b="$2" '$1 == a { x[++na] = $2 } $1 == b { y[++nb] = $2 }
        END { n = (na < nb ? na : nb); for (k = 1; k <= n; k++) print y[k] / x[k] }' "$OUT/results" |
        sort -g | awk '{ v[NR] = $1 } END {
            m = (NR % 2) ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
            printf "%.4f %.4f %.4f\n", m, v[1], v[NR] }'
}

runs_of() {
    awk -v l="$1" '$1 == l' "$OUT/results" | wc -l
}

bytes_experiment() {
    ensure_out
    local runs=${1:-3} n r
    echo "== bytes per sweep, 2x1, one filament per row, 20 sweeps ($runs runs each)"
    for r in $(seq "$runs"); do
        for n in 512 1024 2048; do
            jrun "bytes_n$n" 2 1 --n "$n" --iters 20 --per-row
        done
    done
    echo "-- bytes per sweep (both nodes, medians):"
    local b0=""
    for n in 512 1024 2048; do
        local b
        b=$(stat "bytes_n$n" 3)
        [[ -z $b0 ]] && b0=$b
        awk -v n="$n" -v b="$b" -v b0="$b0" -v r="$(runs_of "bytes_n$n")" 'BEGIN {
            printf "   n=%-5d %8d B/sweep  (%.2fx n=512; n ratio %.0fx; n^2 ratio %.0fx) [%d runs]\n",
                n, b, b / b0, n / 512, (n / 512) ^ 2, r }'
    done
}

# overlap_experiment RUNS TITLE (also used by shaped-link.sh)
overlap_experiment() {
    ensure_out
    local runs=${1:-5} title=${2:-loopback} r procs grain pools order
    local tag=${title// /_}
    echo "== overlap, $title: n=1024, $ITERS sweeps, 2x1$( [[ $OVERLAP_PROCS == *2* ]] && echo " and 2x2"), 1 vs 4 pools/proc ($runs runs each)"
    for r in $(seq "$runs"); do
        # 1 and 4 pools back to back, alternating which goes first.
        if ((r % 2)); then order="1 4"; else order="4 1"; fi
        for procs in $OVERLAP_PROCS; do
            for grain in row point; do
                for pools in $order; do
                    local g=()
                    [[ $grain == row ]] && g=(--per-row)
                    jrun "ovl_${tag}_2x${procs}_${grain}_p${pools}" 2 "$procs" --n 1024 \
                        --iters "$ITERS" --pools-per-proc "$pools" "${g[@]}"
                done
            done
        done
    done
    echo "-- overlap, $title: median seconds of the timed sweeps over the runs, and the"
    echo "   improvement 1 - t4/t1 from the medians and as the median of the paired runs [range]:"
    for procs in $OVERLAP_PROCS; do
        for grain in row point; do
            local l1="ovl_${tag}_2x${procs}_${grain}_p1" l4="ovl_${tag}_2x${procs}_${grain}_p4"
            awk -v c="2x$procs" -v g="$grain" -v t1="$(stat "$l1" 2)" -v t4="$(stat "$l4" 2)" \
                -v p="$(paired "$l1" "$l4")" -v r="$(runs_of "$l1")" 'BEGIN {
                split(p, q, " ")
                printf "   %s per %-5s 1 pool %.4f s   4 pools %.4f s   improvement %+.1f%% (medians), %+.1f%% paired [%+.1f%%, %+.1f%%] [%d runs]\n",
                    c, g, t1, t4, (1 - t4 / t1) * 100, (1 - q[1]) * 100, (1 - q[3]) * 100, (1 - q[2]) * 100, r }'
        done
    done
}

nodes_experiment() {
    ensure_out
    local runs=${1:-5} r grain
    echo "== 2x1 vs 1x2: n=1024, $ITERS sweeps, 1 pool/proc ($runs runs each)"
    for r in $(seq "$runs"); do
        for grain in row point; do
            local g=()
            [[ $grain == row ]] && g=(--per-row)
            if ((r % 2)); then
                jrun "nodes_2x1_$grain" 2 1 --n 1024 --iters "$ITERS" "${g[@]}"
                jrun "nodes_1x2_$grain" 1 2 --n 1024 --iters "$ITERS" "${g[@]}"
            else
                jrun "nodes_1x2_$grain" 1 2 --n 1024 --iters "$ITERS" "${g[@]}"
                jrun "nodes_2x1_$grain" 2 1 --n 1024 --iters "$ITERS" "${g[@]}"
            fi
        done
    done
    echo "-- 2x1 vs 1x2: median seconds; ratio 2x1/1x2 from the medians, and paired [range]:"
    for grain in row point; do
        awk -v g="$grain" -v a="$(stat "nodes_2x1_$grain" 2)" -v b="$(stat "nodes_1x2_$grain" 2)" \
            -v p="$(paired "nodes_1x2_$grain" "nodes_2x1_$grain")" \
            -v r="$(runs_of "nodes_2x1_$grain")" 'BEGIN {
            split(p, q, " ")
            printf "   per %-5s 2x1 %.4f s   1x2 %.4f s   ratio %.2f (medians), %.2f paired [%.2f, %.2f] [%d runs]\n",
                g, a, b, a / b, q[1], q[2], q[3], r }'
    done
}

# Sourced by shaped-link.sh for the functions only.
if [[ -n ${DSM_SWEEP_LIB:-} ]]; then
    return 0
fi

[[ -x $BIN ]] || { echo "dsm-sweep: $BIN not found: cargo build --release --examples" >&2; exit 1; }
what=${1:-all}
runs=${2:-}
if [[ $what == bytes || $what == overlap || $what == nodes || $what == all ]]; then
    ensure_out
    echo "dsm-sweep: raw outputs in $OUT; $(nproc) CPUs; load $(cut -d' ' -f1-3 /proc/loadavg)"
fi
case $what in
bytes) bytes_experiment "${runs:-3}" ;;
overlap) overlap_experiment "${runs:-5}" loopback ;;
nodes) nodes_experiment "${runs:-5}" ;;
all)
    bytes_experiment "${runs:-3}"
    overlap_experiment "${runs:-5}" loopback
    nodes_experiment "${runs:-5}"
    ;;
*)
    sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
    exit 2
    ;;
esac
