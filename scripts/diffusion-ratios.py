#!/usr/bin/env python3
"""Issue 22's diffusion cases: hyfi's time over the in-process sequential
loop's, per point and per row, at 1026^2 (200 steps) and 2050^2 (50 steps),
on 1x1, 1x2 and 2x1, RUNS rounds, medians and ranges.

    python3 scripts/diffusion-ratios.py RUNS target/release/examples/diffusion

Both times come from the same process (the example times both), so code
placement of the binary moves them together only as far as the loops sit
alike; quote the build with the figures.
"""
import subprocess,re,statistics,sys
runs=int(sys.argv[1]); exe=sys.argv[2]
cases=[]
for n,steps in ((1026,200),(2050,50)):
    for mode in ('--per-row',''):
        for cfg in (('--procs','1'),('--procs','2'),('--nodes','2','--procs','1')):
            cases.append([ '--n',str(n),'--steps',str(steps)]+([mode] if mode else [])+list(cfg))
res={}
for r in range(runs):
    for c in cases:
        out=subprocess.run([exe]+c,capture_output=True,text=True).stdout
        h=re.search(r'(?:\[node 0\] )?hyfi:\s+([0-9.]+) s',out); s=re.search(r'(?:\[node 0\] )?sequential:\s+([0-9.]+) s',out)
        res.setdefault(' '.join(c),[]).append(float(h.group(1))/float(s.group(1)))
for k,v in res.items(): print(f"{statistics.median(v):.3f}  speed {1/statistics.median(v):.2f}x  [{min(v):.3f}-{max(v):.3f}]  {k}")
