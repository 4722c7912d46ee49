#!/usr/bin/env bash
# Every 16-CPU check of issues 22, 23 and 24 from one kit, in two commands
# that fit the device machine's time (../shared/device/README.md: 15
# minutes in all, its start included; 10 minutes a command; no cargo, no
# MPI there).
#
#   scripts/device-kit.sh --make DIR              (here: build the kit)
#   scripts/device-kit.sh --run DIR --part 1|2    (there; --runs N, default 3)
#   scripts/device-kit.sh --run DIR --part 1 --small --kit-mpi --runs 1
#                                                 (a rehearsal here)
#
# --make builds, into DIR (put DIR in .git/info/exclude and carry it):
#   bin/   the default build's examples, stripped (baselines, jacobi,
#          matmul, lu, fib, quad, diffusion, heat3d, mandelbrot), the C MPI baselines
#          (jacobi_mpi, lu_mpi, matmul_mpi) and the C OpenMP ones
#          (jacobi_omp, diffusion_omp);
#   mpi/   scripts/transports.sh's kit: jacobi and lu built with
#          `--features mpi`, the dsm bench, C MPI, and Open MPI's Debian
#          packages relocated (ompi-root.tgz), which both parts use;
#   MANIFEST: the commit, the toolchain, the sizes.
#
# Part 1, issue 23's table (about 6 minutes at 16 CPUs): rayon on every
#   CPU, round-robin: matmul (the i-k-j rows in parallel), LU, fib with a
#   cutoff of 25; mandelbrot on 1xC (unequal rows) against rayon, with the
#   default chunks and with HYFI_CHUNKS=1; then scripts/paper-tables.sh
#   --bin-dir DIR/bin --big --kernels jacobi2048-row,lu,matmul-row,fib,quad
#   (1x1 ... 1x16, 2x1 ... 16x1, 2x8, 4x4, 8x2, C MPI 2 ... 16) for
#   --table-runs rounds (default 1: one round took 4-4.5 minutes on the
#   device's Xeon, 2026-11-27, so three do not fit one command).
# Part 2, issues 24 and 22 (about 3 minutes):
#   scripts/transports.sh --bin-dir DIR/mpi --nodes C --kernels jacobi,lu
#   --sizes 2048 --lu-n 2048 --no-fetch (hyfi over MPI and over TCP beside
#   C MPI, one table), then scripts/device-stencils.sh --bin-dir DIR/bin
#   (the diffusion stencil per row and per point against its loop and C
#   OpenMP 16; Jacobi, LU and matmul on one core against their loops).
# Part 3, the many-node targets of issue 23 alone (310 s at 16 CPUs with
#   3 rounds, about 210 s with --runs 2, on the 2026-11-27 Xeon),
#   round-robin: LU 2048 on Cx1, 4x(C/4) and 1xC with C MPI C; Jacobi 2048
#   per row on Cx1 and 4x(C/4) with C MPI C; matmul 2048 per row on Cx1;
#   fib(44), quad and heat3d 192³ (a halo of 72 pages a side) on Cx1 and
#   1xC, and fib and quad on Cx1 once more with HYFI_HOST_STEALS=0 ("msgs":
#   every steal request a message, the build before 2026-11-28's way, in
#   the same binary) and on Cx1 and 1xC with HYFI_LATENT=1 ("latent":
#   latent joins, off by default until these rows say whether they pay).
#   The one to run first when a change to
#   the many-node path is to be checked; with --trace it then traces LU
#   1024 and fib on Cx1 into the runner's OUT (HYFI_TRACE; bring the
#   files back and run scripts/trace-rounds.py on the LU one here): where a
#   release's steps go.
#
# C is the largest power of two at most the CPUs (--cpus N to choose it
# for a rehearsal on a smaller machine; --small takes the 2-CPU sizes).
# Everything at default settings. The figures to quote are the medians
# each script prints; the CPU model is printed first.
set -euo pipefail
ROOT=$(cd "$(dirname "$0")/.." && pwd)
MAKE="" RUN="" PART="" RUNS=3 TABLE_RUNS=1 CPUS=$(nproc) SMALL=0 KIT_MPI=0 TRACE=0
die() { echo "device-kit.sh: $*" >&2; exit 1; }
while (($#)); do
    case $1 in
    --make) MAKE=${2:?--make needs a directory}; shift 2 ;;
    --run) RUN=${2:?--run needs the kit directory}; shift 2 ;;
    --part) PART=${2:?--part needs 1 or 2}; shift 2 ;;
    --runs) RUNS=${2:?--runs needs a count}; shift 2 ;;
    --table-runs) TABLE_RUNS=${2:?--table-runs needs a count}; shift 2 ;;
    --cpus) CPUS=${2:?--cpus needs a count}; shift 2 ;;
    --small) SMALL=1; shift ;;
    --kit-mpi) KIT_MPI=1; shift ;;
    --trace) TRACE=1; shift ;;
    -h | --help) sed -n '2,/^set -e/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
    *) die "unknown option $1 (see --help)" ;;
    esac
done

if [[ -n $MAKE ]]; then
    command -v mpicc >/dev/null || die "--make needs Open MPI's compiler (apt-get install libopenmpi-dev)"
    command -v gcc >/dev/null || die "--make needs gcc (the C OpenMP baselines)"
    mkdir -p "$MAKE/bin"
    KIT=$(cd "$MAKE" && pwd)
    (cd "$ROOT" && cargo build -q --release --examples) || die "cargo build --release --examples failed"
    for e in baselines jacobi matmul lu fib quad diffusion heat3d mandelbrot; do
        strip -o "$KIT/bin/$e" "$ROOT/target/release/examples/$e"
    done
    for m in jacobi_mpi lu_mpi matmul_mpi; do
        mpicc -O3 -ffp-contract=off -fopenmp -o "$KIT/bin/$m" "$ROOT/benches/baselines/$m.c"
    done
    for c in diffusion jacobi; do
        gcc -O3 -ffp-contract=off -fopenmp -o "$KIT/bin/${c}_omp" "$ROOT/benches/baselines/$c.c"
    done
    # The examples and the bench with the mpi feature, C MPI, Open MPI.
    "$ROOT/scripts/transports.sh" --make-kit "$KIT/mpi" >&2
    {
        echo "commit $(git -C "$ROOT" rev-parse HEAD)$(git -C "$ROOT" diff --quiet || echo ' (with uncommitted changes)')"
        echo "built $(date -u +%FT%TZ) on $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')"
        echo "$(rustc -V); $(mpicc --showme:version 2>&1 | head -1)"
        du -sh "$KIT/bin" "$KIT/mpi"
    } >"$KIT/MANIFEST"
    cat "$KIT/MANIFEST"
    exit 0
fi

[[ -n $RUN ]] || die "--make DIR or --run DIR is needed (see --help)"
[[ $PART == 1 || $PART == 2 || $PART == 3 ]] || die "--part 1, 2 or 3 is needed"
KIT=$(cd "$RUN" && pwd)
# The device runner sets OUT (the folder whose files come back: 8 at most);
# paper-tables.sh would take it for its raw outputs, a file per run, and
# crowd out the caller's own. The scripts below make their own folders;
# part 3's --trace writes its traces into it.
BACK=${OUT:-}
unset OUT
[[ -x $KIT/bin/jacobi && -f $KIT/mpi/ompi-root.tgz ]] || die "$KIT is not a kit (make one with --make)"
C=1
while ((C * 2 <= CPUS)); do C=$((C * 2)); done
echo "== device-kit part $PART: $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), nproc $(nproc), C=$C, $RUNS rounds"
cat "$KIT/MANIFEST" 2>/dev/null | head -3
# The kit's Open MPI, relocated (../shared/device/README.md), unless the
# machine has its own (--kit-mpi: the kit's all the same).
if ((KIT_MPI)) || ! command -v mpirun >/dev/null; then
    tar xzf "$KIT/mpi/ompi-root.tgz" -C /tmp
    O=/tmp/ompi-root/usr
    L=$O/lib/x86_64-linux-gnu
    export OPAL_PREFIX=$O PATH=$O/bin:$PATH
    export LD_LIBRARY_PATH=$L:$L/openmpi/lib:/tmp/ompi-root/lib/x86_64-linux-gnu${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}
fi
# Median of the numbers on stdin.
median() { awk 'NF' | sort -g | awk '{ a[NR] = $1 } END { if (NR) print a[int((NR + 1) / 2)] }'; }

if [[ $PART == 1 ]]; then
    n=2048 fib=44
    ((SMALL)) && n=512 fib=32
    echo
    echo "rayon on $C threads (examples/baselines.rs), $RUNS rounds, medians in seconds:"
    declare -A T=()
    for ((r = 1; r <= RUNS; r++)); do
        for k in "matmul --n $n" "lu --n $n" "fib --n $fib --cutoff 25"; do
            # shellcheck disable=SC2086
            t=$("$KIT/bin/baselines" ${k%% *} rayon --threads "$C" ${k#* } | sed -n 's/^time: //p')
            T[$k]+="$t "
        done
    done
    for k in "matmul --n $n" "lu --n $n" "fib --n $fib --cutoff 25"; do
        printf '  rayon %-3s %-28s %s\n' "$C" "$k" "$(tr ' ' '\n' <<<"${T[$k]}" | median)"
    done
    # Within-node balancing (issue 23 item 5): unequal rows on 1xC, the
    # default chunks against one chunk per pool, each against rayon on C
    # threads in the same process.
    echo
    echo "mandelbrot $n, 1x$C, hyfi time / rayon time in the same process, $RUNS rounds, medians:"
    declare -A M=()
    for ((r = 1; r <= RUNS; r++)); do
        for ch in default 1; do
            env=()
            [[ $ch == 1 ]] && env=(HYFI_CHUNKS=1)
            m=$(env "${env[@]}" "$KIT/bin/mandelbrot" --n "$n" --reps 2 --procs "$C" |
                sed -n 's/^ratio .*hyfi\/rayon: \([0-9.]*\).*/\1/p')
            M[$ch]+="$m "
        done
    done
    for ch in default 1; do
        printf '  chunks %-8s hyfi/rayon %s\n' "$ch" "$(tr ' ' '\n' <<<"${M[$ch]}" | median)"
    done
    echo
    big=(--big)
    ((SMALL)) && big=()
    "$ROOT/scripts/paper-tables.sh" --bin-dir "$KIT/bin" "${big[@]}" --runs "$TABLE_RUNS" --cpus "$CPUS" \
        --kernels jacobi2048-row,lu,matmul-row,fib,quad --no-table3
elif [[ $PART == 3 ]]; then
    n=2048 fib=44 it=200 h=192
    ((SMALL)) && n=512 fib=32 it=50 h=64
    q=$((C / 4 > 0 ? C / 4 : 1))
    mpi=(mpirun -np "$C" --bind-to core)
    [[ $(id -u) == 0 ]] && mpi+=(--allow-run-as-root)
    jac="--n $n --iters $it --eps 0 --per-row"
    cases=(
        "lu ${C}x1|$KIT/bin/lu --n $n --nodes $C --procs 1"
        "lu 4x$q|$KIT/bin/lu --n $n --nodes 4 --procs $q"
        "lu 1x$C|$KIT/bin/lu --n $n --procs $C"
        "lu C-MPI-$C|${mpi[*]} $KIT/bin/lu_mpi $n"
        "jacobi ${C}x1|$KIT/bin/jacobi $jac --nodes $C --procs 1"
        "jacobi 4x$q|$KIT/bin/jacobi $jac --nodes 4 --procs $q"
        "jacobi C-MPI-$C|${mpi[*]} $KIT/bin/jacobi_mpi $n $it"
        "matmul ${C}x1|$KIT/bin/matmul --n $n --per-row --nodes $C --procs 1"
        "fib ${C}x1|$KIT/bin/fib --n $fib --no-seq --nodes $C --procs 1"
        "fib ${C}x1 msgs|HYFI_HOST_STEALS=0 $KIT/bin/fib --n $fib --no-seq --nodes $C --procs 1"
        "fib 1x$C|$KIT/bin/fib --n $fib --no-seq --procs $C"
        "fib ${C}x1 latent|HYFI_LATENT=1 $KIT/bin/fib --n $fib --no-seq --nodes $C --procs 1"
        "fib 1x$C latent|HYFI_LATENT=1 $KIT/bin/fib --n $fib --no-seq --procs $C"
        "quad ${C}x1|$KIT/bin/quad --no-seq --nodes $C --procs 1"
        "quad ${C}x1 msgs|HYFI_HOST_STEALS=0 $KIT/bin/quad --no-seq --nodes $C --procs 1"
        "quad 1x$C|$KIT/bin/quad --no-seq --procs $C"
        "quad ${C}x1 latent|HYFI_LATENT=1 $KIT/bin/quad --no-seq --nodes $C --procs 1"
        "quad 1x$C latent|HYFI_LATENT=1 $KIT/bin/quad --no-seq --procs $C"
        "heat3d ${C}x1|$KIT/bin/heat3d --n $h --steps 20 --nodes $C --procs 1"
        "heat3d 1x$C|$KIT/bin/heat3d --n $h --steps 20 --procs $C"
    )
    declare -A T=()
    for ((r = 1; r <= RUNS; r++)); do
        for c in "${cases[@]}"; do
            # Node 0's time (hyfi) or the C program's; a run that fails
            # or prints no time stops the part.
            out=$(eval "${c#*|}" 2>&1) || die "${c%%|*} failed: $(tail -3 <<<"$out")"
            t=$(grep -m1 -E '^(\[node 0\] )?hyfi[ :(]|^time:' <<<"$out" |
                sed -E 's/.*(hyfi[^:]*|time):[[:space:]]*([0-9.]+).*/\2/')
            [[ $t =~ ^[0-9.]+$ ]] || die "${c%%|*}: no time in its output"
            printf '  round %d  %-18s %s s\n' "$r" "${c%%|*}" "$t"
            # Where a many-node run's time went: node 0's release time and
            # the bells its peers rang it (the collective waits' change).
            grep -m1 -E '^\[node 0\] dsm node 0: ' <<<"$out" |
                sed -E 's/.*(releases [0-9.]+ ms).*/      node 0: \1/' || true
            grep -m1 -E '^\[node 0\] traffic of node 0:' <<<"$out" |
                sed -E 's/.*(peers woken [0-9]+ times).*/      node 0: \1/' || true
            # Fork-join across nodes: node 0's steals, requests, their
            # mean round trip (48 us on the 2-vCPU VM's 2x1, 47-73 us on
            # the device's 16x1 at b199b52, all as messages), and how many
            # went through shared memory and were resent as messages.
            grep -m1 -E '^\[node 0\] node +0 across nodes:' <<<"$out" |
                sed -E 's/.*across nodes: ([^)]*\)).*/      node 0: \1/' || true
            # How often the OS took a processor off its CPU while it could
            # run (the stats table's `preempted` column): a communication
            # thread woken onto a computing CPU, or the host's noise; summed
            # over the nodes' processors, and the most on one processor.
            awk '/^(\[node [0-9]+\])? *[0-9]+ \|/ { p = $(NF-1); s += p; if (p > m) m = p }
                 END { if (s) printf "      processors preempted %d times (at most %d on one)\n", s, m }' \
                <<<"$out" || true
            T[${c%%|*}]+="$t "
        done
    done
    echo
    echo "many-node checks, $C CPUs, medians of $RUNS rounds (s):"
    for c in "${cases[@]}"; do
        printf '  %-18s %s\n' "${c%%|*}" "$(tr ' ' '\n' <<<"${T[${c%%|*}]}" | median)"
    done
    if ((TRACE)); then
        # Where LU's and fib's many-node time goes, for the analysis here
        # (scripts/trace-rounds.py on the LU trace; the summary lines are
        # printed by the runs themselves): merged traces of node 0's
        # launcher, into the runner's OUT (or /tmp).
        dir=${BACK:-/tmp}
        ln=1024
        ((SMALL)) && ln=256
        for t in "lu-${C}x1.json|$KIT/bin/lu --n $ln --nodes $C --procs 1" \
            "fib-${C}x1.json|$KIT/bin/fib --n $fib --no-seq --nodes $C --procs 1"; do
            out=$(eval "HYFI_TRACE=$dir/${t%%|*} ${t#*|}" 2>&1) || die "trace ${t%%|*} failed: $(tail -3 <<<"$out")"
            echo
            echo "trace $dir/${t%%|*}:"
            grep -E 'hyfi trace:|^(\[node 0\] )?hyfi[ :(]' <<<"$out" | head -24
            # Tens of MB at 16 nodes: compressed for the trip back.
            gzip -f "$dir/${t%%|*}" 2>/dev/null || true
        done
    fi
else
    sizes=(--sizes 2048 --lu-n 2048)
    ((SMALL)) && sizes=(--sizes 514 --lu-n 256)
    "$ROOT/scripts/transports.sh" --bin-dir "$KIT/mpi" --nodes "$C" --kernels jacobi,lu \
        "${sizes[@]}" --no-fetch --runs "$RUNS"
    echo
    st=()
    ((SMALL)) && st=(--n 514 --steps 20)
    "$ROOT/scripts/device-stencils.sh" --bin-dir "$KIT/bin" --runs "$RUNS" "${st[@]}"
fi
