#!/usr/bin/env python3
"""Where a release's all-reduce spends its time, from a merged trace.

    HYFI_TRACE=/tmp/lu.trace target/release/examples/lu --n 1024 --nodes 16 --procs 1
    scripts/trace-rounds.py /tmp/lu.trace

For a power-of-two node count (recursive doubling: at step r node p
exchanges a piece with node p ^ 2^r), each node's control sends and
receipts of at least 200 bytes are matched by order (the i-th piece node q
sent to node p is the i-th piece p received from q), and the script prints
deciles, in µs, of: a release's start to its first send; per step, the
partner's send to this node's receipt (all, and where this node was
already waiting); this node's receipt to its next send; the last piece to
the release's end; the spread of the nodes' release starts and the
collective itself (last start to last end); and which thread read the
pieces (the waiting processor, or the communication thread). The clocks of
the nodes are those the cluster layer aligned at start-up. Steps 50 to
the last 100 are counted (the start and the short last rows aside).
"""
import collections
import json
import statistics
import sys


def deciles(xs):
    return [round(v, 1) for v in statistics.quantiles(xs, n=10)] if len(xs) > 10 else xs


def main(path):
    trace = json.load(open(path))
    events = [e for e in trace["traceEvents"] if e["ph"] != "M"]
    names = {(e["pid"], e["tid"]): e["args"]["name"] for e in trace["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    nodes = max(e["pid"] for e in events) + 1
    if nodes < 2 or nodes & (nodes - 1):
        sys.exit(f"{path}: {nodes} nodes; this script reads power-of-two node counts")
    rounds = nodes.bit_length() - 1
    rel = collections.defaultdict(list)
    sends = collections.defaultdict(list)
    recvs = collections.defaultdict(list)
    for e in events:
        if e["name"] == "release":
            rel[e["pid"]].append((e["ts"], e["ts"] + e["dur"]))
        elif e["name"] in ("send", "recv") and e["args"]["class"] == "control" \
                and e["args"]["bytes"] >= 200:
            if e["name"] == "send":
                sends[(e["pid"], e["args"]["to"])].append(e["ts"])
            else:
                recvs[(e["pid"], e["args"]["from"])].append((e["ts"], names[(e["pid"], e["tid"])]))
    for v in list(sends.values()) + list(recvs.values()) + list(rel.values()):
        v.sort()
    steps = min(len(v) for v in rel.values())
    lat, waiting, gap = (collections.defaultdict(list) for _ in range(3))
    first, after, readers = [], [], collections.Counter()
    for p in range(nodes):
        starts = [s for s, _ in rel[p]]
        for j in range(50, steps - 100):
            ts, tr = [], []
            for r in range(rounds):
                q = p ^ (1 << r)
                try:
                    mine, theirs, (got, who) = sends[(p, q)][j], sends[(q, p)][j], recvs[(p, q)][j]
                except IndexError:
                    break
                ts.append(mine)
                tr.append(got)
                lat[r].append(got - theirs)
                readers[who] += 1
                if mine < theirs:
                    waiting[r].append(got - theirs)
            if len(ts) < rounds:
                continue
            k = max(0, next((i for i in range(len(starts) - 1, -1, -1) if starts[i] <= ts[0]), 0))
            first.append(ts[0] - rel[p][k][0])
            for r in range(rounds - 1):
                gap[r].append(ts[r + 1] - max(ts[r], tr[r]))
            after.append(rel[p][k][1] - max(ts[-1], tr[-1]))
    print(f"{path}: {nodes} nodes, {steps} releases; deciles in µs")
    print("  release start -> first send      ", deciles(first))
    for r in range(rounds):
        print(f"  step {r}: partner's send -> receipt", deciles(lat[r]))
        print(f"          the same, this node waiting", deciles(waiting[r]))
        if r < rounds - 1:
            print(f"          receipt -> next send      ", deciles(gap[r]))
    print("  last piece -> release end        ", deciles(after))
    spread, coll = [], []
    for k in range(50, steps - 100):
        s = [rel[p][k][0] for p in range(nodes)]
        e = [rel[p][k][1] for p in range(nodes)]
        spread.append(max(s) - min(s))
        coll.append(max(e) - max(s))
    print("  release starts' spread           ", deciles(spread))
    print("  last start -> last end           ", deciles(coll))
    total = sum(readers.values())
    print("  pieces read by", ", ".join(f"{w} {100 * n / total:.0f} %" for w, n in readers.items()))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    main(sys.argv[1])
