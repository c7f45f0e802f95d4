#!/usr/bin/env python3
"""Draws docs/img/memory_vs_seq.svg: measured peak memory per rank against sequence length, one
line per recompute policy and storage, from the `sweep:` lines of bench_memory --sweep.

    env -u OPENBLAS_CORETYPE build/bench/bench/memory/bench_memory --sweep > sweep.txt
    python3 bench/memory/plot_memory.py sweep.txt docs/img/memory_vs_seq.svg

Python's standard library only."""
import sys

COLORS = {"none": "#d62728", "selective": "#1f77b4", "full": "#2ca02c"}
DASH = {"float": "", "bf16": "6,4"}


def read(path):
    runs = {}
    load = []
    for line in open(path):
        if line.startswith("loadavg_"):
            load.append(line.strip())
        if not line.startswith("sweep:"):
            continue
        f = line.split()
        kv = dict(zip(f[1::2], f[2::2]))
        key = (kv["policy"], kv["dtype"])
        runs.setdefault(key, []).append((int(kv["seq"]), float(kv["measured"]) / 2**20, float(kv["predicted"]) / 2**20))
    return runs, load


def svg(runs, budget_mib=None):
    w, h, left, right, top, bottom = 720, 440, 70, 190, 30, 50
    xs = [s for pts in runs.values() for s, _, _ in pts]
    ys = [m for pts in runs.values() for _, m, _ in pts]
    x0, x1 = 0, max(xs)
    y0, y1 = 0, max(ys) * 1.08
    px = lambda x: left + (x - x0) / (x1 - x0) * (w - left - right)
    py = lambda y: h - bottom - (y - y0) / (y1 - y0) * (h - top - bottom)
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" font-family="sans-serif" font-size="12">',
           f'<rect width="{w}" height="{h}" fill="white"/>',
           f'<text x="{w / 2}" y="18" text-anchor="middle" font-size="14">Measured peak per rank vs sequence length '
           f'(8 layers, d_model 512, pp 2 x cp_ring 2, ZBV)</text>']
    step = 10 ** len(str(int(y1 / 5))) / 10
    while y1 / step > 8:
        step *= 2
    y = 0.0
    while y <= y1:
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{py(y):.1f}" y2="{py(y):.1f}" stroke="#ddd"/>')
        out.append(f'<text x="{left - 6}" y="{py(y) + 4:.1f}" text-anchor="end">{y:.0f}</text>')
        y += step
    for s in sorted(set(xs)):
        out.append(f'<text x="{px(s):.1f}" y="{h - bottom + 16}" text-anchor="middle">{s}</text>')
    out.append(f'<line x1="{left}" x2="{w - right}" y1="{h - bottom}" y2="{h - bottom}" stroke="black"/>')
    out.append(f'<line x1="{left}" x2="{left}" y1="{top}" y2="{h - bottom}" stroke="black"/>')
    out.append(f'<text x="{(left + w - right) / 2}" y="{h - 12}" text-anchor="middle">sequence length (tokens)</text>')
    out.append(f'<text x="16" y="{(top + h - bottom) / 2}" text-anchor="middle" '
               f'transform="rotate(-90 16 {(top + h - bottom) / 2})">MiB (largest rank, measured)</text>')
    if budget_mib:
        out.append(f'<line x1="{left}" x2="{w - right}" y1="{py(budget_mib):.1f}" y2="{py(budget_mib):.1f}" '
                   f'stroke="black" stroke-dasharray="2,3"/>')
    legend_y = top + 10
    for (policy, dtype), pts in sorted(runs.items(), key=lambda kv: (kv[0][1], kv[0][0])):
        pts.sort()
        path = " ".join(f"{px(s):.1f},{py(m):.1f}" for s, m, _ in pts)
        dash = f' stroke-dasharray="{DASH[dtype]}"' if DASH[dtype] else ""
        out.append(f'<polyline points="{path}" fill="none" stroke="{COLORS[policy]}" stroke-width="2"{dash}/>')
        for s, m, _ in pts:
            out.append(f'<circle cx="{px(s):.1f}" cy="{py(m):.1f}" r="3" fill="{COLORS[policy]}"/>')
        lx = w - right + 15
        out.append(f'<line x1="{lx}" x2="{lx + 30}" y1="{legend_y}" y2="{legend_y}" stroke="{COLORS[policy]}" '
                   f'stroke-width="2"{dash}/>')
        out.append(f'<text x="{lx + 36}" y="{legend_y + 4}">{policy}, {dtype}</text>')
        legend_y += 20
    out.append("</svg>")
    return "\n".join(out) + "\n"


def main():
    if len(sys.argv) != 3:
        sys.exit("usage: plot_memory.py SWEEP_OUTPUT OUT.svg")
    runs, load = read(sys.argv[1])
    if not runs:
        sys.exit(f"{sys.argv[1]}: no 'sweep:' lines (run bench_memory --sweep)")
    open(sys.argv[2], "w").write(svg(runs))
    for (policy, dtype), pts in sorted(runs.items()):
        print(policy, dtype, " ".join(f"{s}:{m:.1f}MiB(pred/meas {p / m:.3f})" for s, m, p in sorted(pts)))
    for line in load:
        print(line)


if __name__ == "__main__":
    main()
