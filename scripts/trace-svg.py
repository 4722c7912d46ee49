#!/usr/bin/env python3
"""Draws merged hyfi traces (HYFI_TRACE) as one SVG timeline.

    scripts/trace-svg.py OUT.svg TITLE=TRACE.json [TITLE=TRACE.json ...] [--first F] [--phases K]

One panel per trace: per node and processor, a row of segments (a
filthread running, coloured by its pool), the phase-end work (barrier,
release, post-phase: grey) and, under it, the pages in flight for that
processor (page waits: red), so that a reader sees whether other pools
computed while a page was on its way. The window is K phases (default 3)
from iteration F (default 0): from the earliest start of iteration F on
any node to the latest end of iteration F+K-1. Standard library only.

The README's picture: scripts/trace-timeline.sh runs Jacobi 1024^2 on
2x1 with 1 and 4 pools per processor and calls this script.
"""

import json
import sys
from collections import defaultdict

POOL_COLOURS = ["#4477aa", "#66ccee", "#228833", "#ccbb44", "#ee6677", "#aa3377", "#bbbbbb", "#332288"]
W, LEFT, RIGHT = 1000, 150, 20
ROW, GAP, WAITROW = 18, 6, 7


def load(path):
    with open(path) as f:
        ev = json.load(f)["traceEvents"]
    phase_ends = defaultdict(list)
    for e in ev:
        if e.get("ph") == "X" and e["name"].startswith("phase "):
            phase_ends[e["args"]["iteration"]].append((e["ts"], e["ts"] + e["dur"]))
    return ev, phase_ends


def panel(out, y0, title, path, first, k):
    ev, phases = load(path)
    if first not in phases:
        sys.exit(f"{path}: no events of iteration {first}")
    t0 = min(s for s, _ in phases[first])
    last = max(i for i in phases if i < first + k)
    t1 = max(e for _, e in phases[last])
    scale = (W - LEFT - RIGHT) / max(t1 - t0, 1e-9)
    x = lambda t: LEFT + (min(max(t, t0), t1) - t0) * scale

    procs = sorted({(e["pid"], e["tid"]) for e in ev if e.get("ph") == "X" and e["name"].startswith(("pool", "filthread"))})
    rows = {p: y0 + 28 + i * (ROW + WAITROW + GAP) for i, p in enumerate(procs)}
    out.append(f'<text x="10" y="{y0 + 16}" font-size="13" font-weight="bold">{title}</text>')
    open_waits = {}
    for e in ev:
        key = (e.get("pid"), e.get("tid"))
        if key not in rows:
            continue
        y = rows[key]
        ph, name = e.get("ph"), e.get("name", "")
        if ph == "X":
            s, f = e["ts"], e["ts"] + e["dur"]
            if f < t0 or s > t1:
                continue
            if name.startswith("pool ") or name == "filthread":
                colour = POOL_COLOURS[e["args"]["pool"] % len(POOL_COLOURS)]
                tip = f'{name}: {e["args"]["filaments"]} filaments, {e["dur"]:.1f} us'
            elif name in ("barrier", "release", "post-phase"):
                colour = "#999999"
                tip = f"{name}: {e['dur']:.1f} us"
            else:
                continue
            out.append(
                f'<rect x="{x(s):.2f}" y="{y}" width="{max(x(f) - x(s), 0.5):.2f}" height="{ROW}" '
                f'fill="{colour}"><title>{tip}</title></rect>'
            )
        elif ph == "b" and name == "page wait":
            open_waits[e["id"]] = (e, y)
        elif ph == "e" and e.get("id") in open_waits:
            b, y = open_waits.pop(e["id"])
            s, f = b["ts"], e["ts"]
            if f < t0 or s > t1:
                continue
            a = b["args"]
            out.append(
                f'<rect x="{x(s):.2f}" y="{y + ROW + 1}" width="{max(x(f) - x(s), 0.5):.2f}" height="{WAITROW - 2}" '
                f'fill="#cc3311"><title>page wait: {a["pages"]} page(s) from {a["page"]} of allocation '
                f'{a["allocation"]}, home node {a["home"]}, {f - s:.1f} us</title></rect>'
            )
    for (pid, tid), y in rows.items():
        out.append(f'<text x="{LEFT - 8}" y="{y + 13}" text-anchor="end">node {pid}, processor {tid}</text>')
    bottom = y0 + 28 + len(rows) * (ROW + WAITROW + GAP)
    ms = (t1 - t0) / 1000
    step = next(s for s in (0.1, 0.2, 0.5, 1, 2, 5, 10, 20, 50, 100, 200, 500) if ms / s <= 10)
    t = 0.0
    while t <= ms + 1e-9:
        xx = LEFT + t * 1000 * scale
        out.append(f'<line x1="{xx:.1f}" x2="{xx:.1f}" y1="{y0 + 24}" y2="{bottom}" stroke="#eee"/>')
        out.append(f'<text x="{xx:.1f}" y="{bottom + 12}" text-anchor="middle" font-size="10">{t:g} ms</text>')
        t += step
    return bottom + 22


def main():
    args = sys.argv[1:]
    opts = {"--first": 0, "--phases": 3}
    for o in opts:
        if o in args:
            i = args.index(o)
            opts[o] = int(args[i + 1])
            del args[i : i + 2]
    first, k = opts["--first"], opts["--phases"]
    if len(args) < 2:
        sys.exit(__doc__)
    out_path, panels = args[0], [a.split("=", 1) for a in args[1:]]
    body = []
    y = 0
    for title, path in panels:
        y = panel(body, y, title, path, first, k)
    legend = (
        f'<g font-size="11"><rect x="{LEFT}" y="{y}" width="10" height="10" fill="{POOL_COLOURS[0]}"/>'
        f'<text x="{LEFT + 14}" y="{y + 9}">pool 0</text>'
        f'<rect x="{LEFT + 70}" y="{y}" width="10" height="10" fill="{POOL_COLOURS[1]}"/>'
        f'<text x="{LEFT + 84}" y="{y + 9}">pool 1 (2, 3: green, yellow)</text>'
        f'<rect x="{LEFT + 270}" y="{y}" width="10" height="10" fill="#999999"/>'
        f'<text x="{LEFT + 284}" y="{y + 9}">barrier, release, post-phase</text>'
        f'<rect x="{LEFT + 470}" y="{y + 3}" width="10" height="5" fill="#cc3311"/>'
        f'<text x="{LEFT + 484}" y="{y + 9}">pages in flight for this processor (a page wait)</text></g>'
    )
    svg = (
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{y + 24}" font-family="sans-serif" font-size="11">\n'
        f'<rect width="100%" height="100%" fill="white"/>\n' + "\n".join(body) + "\n" + legend + "\n</svg>\n"
    )
    with open(out_path, "w") as f:
        f.write(svg)


if __name__ == "__main__":
    main()
