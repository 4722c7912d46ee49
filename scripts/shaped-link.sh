#!/usr/bin/env bash
# Two hyfi nodes on one host, joined by a rate-limited link.
#
# Builds two network namespaces, hyfi0 and hyfi1, joined by a veth pair
# (10.77.0.1/24 in hyfi0, 10.77.0.2/24 in hyfi1), and shapes each end's
# egress with an HTB qdisc (default 1 Gbit/s) so that a hyfi job whose two
# nodes run in the two namespaces talks over a "1 Gbit/s network" instead of
# loopback. Needs root and iproute2 (`ip`, `tc`).
#
#   scripts/shaped-link.sh up [RATE]     create (or re-create) the link; RATE as tc
#                                        takes it (1gbit, 100mbit, ...), default 1gbit
#   scripts/shaped-link.sh down          remove both namespaces (idempotent)
#   scripts/shaped-link.sh status        addresses and `tc -s qdisc` of both ends
#   scripts/shaped-link.sh check [MB]    time a bulk TCP transfer hyfi0 -> hyfi1
#                                        (default 200 MB) and print the rate
#   scripts/shaped-link.sh run RANK -- CMD ARGS...
#                                        run CMD as node RANK (0 or 1) of a 2-node job
#                                        in namespace hyfiRANK (HYFI_RANK, HYFI_NODES=2,
#                                        HYFI_COORD=10.77.0.1:PORT; HYFI_JOB/HYFI_TOKEN
#                                        pass through if set, same on both ranks)
#   scripts/shaped-link.sh job -- CMD ARGS...
#                                        run CMD as both nodes at once, one per namespace;
#                                        output lines prefixed "[node i] "; exit status is
#                                        the first non-zero one
#   scripts/shaped-link.sh jacobi-overlap [RUNS]
#                                        up, then the Jacobi overlap experiment of
#                                        BENCHMARKS.md (2x1 and 2x2, n=1024, 1 vs 4 pools per
#                                        processor, per row and per point), then down
#
# Environment: HYFI_COORD_PORT (default 7700), HYFI_LINK_RATE (default 1gbit),
# HYFI_LINK_BURST (HTB burst and cburst, default 16k), JACOBI (default
# target/release/examples/jacobi), ITERS (default 100).
#
# What HTB does and does not do: it caps the throughput at RATE, but a
# token bucket lets a message smaller than the burst through at once, so an
# isolated page fetch sees no serialization delay and no added latency (a
# real 1 Gbit/s link adds ~33 µs per 4 KiB page on the wire, plus switch and
# NIC latency). Emulating those needs netem (`rate`, `delay`), which this
# script does not use (the kernel it was written on has no sch_netem).
#
# `up` and `jacobi-overlap` remove the namespaces again on failure; `down` is
# safe to run any number of times.

set -euo pipefail

NS0=hyfi0
NS1=hyfi1
VETH0=hyfi-veth0
VETH1=hyfi-veth1
IP0=10.77.0.1
IP1=10.77.0.2
PORT=${HYFI_COORD_PORT:-7700}
RATE=${HYFI_LINK_RATE:-1gbit}
BURST=${HYFI_LINK_BURST:-16k}

die() {
    echo "shaped-link: $*" >&2
    exit 1
}

need_root_and_tools() {
    [[ $(id -u) -eq 0 ]] || die "must run as root (network namespaces and tc need CAP_NET_ADMIN)"
    command -v ip >/dev/null 2>&1 || die "'ip' not found: install iproute2"
    command -v tc >/dev/null 2>&1 || die "'tc' not found: install iproute2"
    ip netns list >/dev/null 2>&1 || die "'ip netns' does not work here (kernel without network namespaces?)"
}

ns_exists() {
    ip netns list 2>/dev/null | awk '{print $1}' | grep -qx "$1"
}

down() {
    need_root_and_tools
    local ns
    for ns in "$NS0" "$NS1"; do
        if ns_exists "$ns"; then
            # Refuse to pull the namespace from under a running job.
            local pids
            pids=$(ip netns pids "$ns" 2>/dev/null || true)
            if [[ -n $pids ]]; then
                die "namespace $ns still has processes ($pids); stop them first"
            fi
            ip netns delete "$ns"
        fi
    done
    # The veth pair goes with its namespaces; one left in the root
    # namespace by an interrupted `up` is removed here.
    if ip link show "$VETH0" >/dev/null 2>&1; then ip link delete "$VETH0"; fi
    if ip link show "$VETH1" >/dev/null 2>&1; then ip link delete "$VETH1"; fi
    return 0
}

# Runs a setup step; on failure removes whatever was made and stops.
step() {
    if ! "$@"; then
        echo "shaped-link: setup step failed: $*; cleaning up" >&2
        down
        exit 1
    fi
}

shape() { # ns dev
    local ns=$1 dev=$2
    # HTB root, one class at RATE (ceil = rate: no borrowing), everything in
    # it. burst/cburst: small, so that the link cannot run faster than RATE
    # for long (HTB still sends a whole GSO packet when the bucket is not
    # empty, and charges it afterwards); quantum set explicitly (rate/r2q
    # would exceed HTB's limit at 1 Gbit/s).
    step ip netns exec "$ns" tc qdisc replace dev "$dev" root handle 1: htb default 10
    step ip netns exec "$ns" tc class replace dev "$dev" parent 1: classid 1:10 htb \
        rate "$RATE" ceil "$RATE" burst "$BURST" cburst "$BURST" quantum 65536
}

up() {
    need_root_and_tools
    [[ $# -ge 1 ]] && RATE=$1
    down
    step ip netns add "$NS0"
    step ip netns add "$NS1"
    step ip link add "$VETH0" type veth peer name "$VETH1"
    step ip link set "$VETH0" netns "$NS0"
    step ip link set "$VETH1" netns "$NS1"
    step ip -n "$NS0" addr add "$IP0/24" dev "$VETH0"
    step ip -n "$NS1" addr add "$IP1/24" dev "$VETH1"
    step ip -n "$NS0" link set lo up
    step ip -n "$NS1" link set lo up
    step ip -n "$NS0" link set "$VETH0" up
    step ip -n "$NS1" link set "$VETH1" up
    shape "$NS0" "$VETH0"
    shape "$NS1" "$VETH1"
    # The peer's address must route over the veth.
    step ip netns exec "$NS0" ip route get "$IP1" >/dev/null
    echo "shaped-link: $NS0 ($IP0) <-> $NS1 ($IP1), HTB $RATE on both ends (burst $BURST)"
}

status() {
    need_root_and_tools
    ns_exists "$NS0" && ns_exists "$NS1" || die "link is down (run: $0 up)"
    local ns dev
    for pair in "$NS0:$VETH0" "$NS1:$VETH1"; do
        ns=${pair%%:*}
        dev=${pair#*:}
        echo "== $ns"
        ip -n "$ns" -br addr show dev "$dev"
        ip netns exec "$ns" tc -s qdisc show dev "$dev"
        ip netns exec "$ns" tc -s class show dev "$dev"
    done
}

check() {
    need_root_and_tools
    ns_exists "$NS0" && ns_exists "$NS1" || die "link is down (run: $0 up)"
    command -v perl >/dev/null 2>&1 || die "check needs perl"
    local mb=${1:-200} cport=$((PORT + 1))
    # Receiver in hyfi1: counts bytes until EOF, prints them and the seconds
    # from the first byte to EOF.
    ip netns exec "$NS1" perl -MIO::Socket::INET -MTime::HiRes=time -e '
        my $l = IO::Socket::INET->new(LocalAddr => $ARGV[0], LocalPort => $ARGV[1],
                                      Listen => 1, ReuseAddr => 1) or die "listen: $!";
        my $c = $l->accept or die "accept: $!";
        my ($n, $buf, $t0) = (0, "", undef);
        while (my $r = sysread($c, $buf, 1 << 20)) { $t0 //= time; $n += $r; }
        printf "%d %.6f\n", $n, time - $t0;
    ' "$IP1" "$cport" >/tmp/shaped-link-check.$$ &
    local rx=$!
    sleep 0.3
    ip netns exec "$NS0" perl -MIO::Socket::INET -e '
        my $s = IO::Socket::INET->new(PeerAddr => $ARGV[0], PeerPort => $ARGV[1]) or die "connect: $!";
        my $buf = "\0" x (1 << 20);
        for (1 .. $ARGV[2]) { my $off = 0; while ($off < length $buf) { $off += syswrite($s, $buf, length($buf) - $off, $off) // die "write: $!"; } }
        close $s;
    ' "$IP1" "$cport" "$mb"
    wait "$rx"
    local bytes secs
    read -r bytes secs </tmp/shaped-link-check.$$
    rm -f /tmp/shaped-link-check.$$
    awk -v b="$bytes" -v s="$secs" 'BEGIN {
        printf "shaped-link: %d MiB in %.3f s = %.1f MB/s = %.3f Gbit/s (payload)\n", b / 1048576, s, b / s / 1e6, b * 8 / s / 1e9 }'
}

# run RANK -- CMD...: one node, in its namespace. HYFI_JOB and HYFI_TOKEN
# may be preset (job does so); otherwise both ranks derive the same job id
# from the coordinator address and run without a token.
run() {
    need_root_and_tools
    local rank=${1:?rank}
    shift
    [[ ${1:-} == -- ]] && shift
    [[ $rank == 0 || $rank == 1 ]] || die "rank must be 0 or 1"
    [[ $# -ge 1 ]] || die "run: no command"
    ns_exists "$NS0" && ns_exists "$NS1" || die "link is down (run: $0 up)"
    local ns=hyfi$rank
    exec ip netns exec "$ns" env HYFI_RANK="$rank" HYFI_NODES=2 HYFI_LOCAL_RANK="$rank" HYFI_LOCAL_SIZE=2 \
        HYFI_COORD="$IP0:$PORT" "$@"
}

# job -- CMD...: both nodes at once.
job() {
    need_root_and_tools
    [[ ${1:-} == -- ]] && shift
    [[ $# -ge 1 ]] || die "job: no command"
    ns_exists "$NS0" && ns_exists "$NS1" || die "link is down (run: $0 up)"
    local token job
    token=$(od -An -N16 -tx1 /dev/urandom | tr -d ' \n')
    job=$(od -An -N4 -tu4 /dev/urandom | tr -d ' \n')
    local pids=() rank st=0 s
    for rank in 0 1; do
        (
            ip netns exec "hyfi$rank" env HYFI_RANK="$rank" HYFI_NODES=2 HYFI_LOCAL_RANK="$rank" HYFI_LOCAL_SIZE=2 \
                HYFI_COORD="$IP0:$PORT" HYFI_JOB="$job" HYFI_TOKEN="$token" "$@" 2>&1 |
                sed -u "s/^/[node $rank] /"
            exit "${PIPESTATUS[0]}"
        ) &
        pids+=($!)
    done
    # If we are interrupted, take the nodes with us.
    trap 'for p in "${pids[@]}"; do pkill -TERM -P "$p" 2>/dev/null || true; done' INT TERM
    for p in "${pids[@]}"; do
        if wait "$p"; then s=0; else s=$?; fi
        [[ $st -eq 0 ]] && st=$s
    done
    trap - INT TERM
    return "$st"
}

jacobi_overlap() {
    need_root_and_tools
    local runs=${1:-5}
    local here
    here=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
    local bin=${JACOBI:-$here/target/release/examples/jacobi}
    [[ -x $bin ]] || die "$bin not found: cargo build --release --examples"
    up
    trap 'down' EXIT
    check 100
    # Shared with dsm-sweep.sh: how one configuration is run and timed.
    # shellcheck source=scripts/dsm-sweep.sh
    DSM_SWEEP_LIB=1 source "$here/scripts/dsm-sweep.sh"
    ensure_out
    echo "shaped-link: raw outputs in $OUT"
    JOB_RUNNER="$0 job --" overlap_experiment "$runs" "shaped $RATE"
    status | grep -E "^==|Sent|rate" || true
}

cmd=${1:-}
shift || true
case $cmd in
up) up "$@" ;;
down) down ;;
status) status ;;
check) check "$@" ;;
run) run "$@" ;;
job) job "$@" ;;
jacobi-overlap) jacobi_overlap "$@" ;;
*)
    sed -n '2,/^$/p' "$0" | sed 's/^# \{0,1\}//'
    [[ -z $cmd ]] && exit 2
    die "unknown command '$cmd'"
    ;;
esac
