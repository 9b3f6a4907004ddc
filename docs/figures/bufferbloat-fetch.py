#!/usr/bin/env python3
"""Draws docs/figures/bufferbloat-fetch.svg from a `rtprobe run
configs/bufferbloat.toml --out-dir DIR` run: per congestion control, the
fetch time at a queue of 20 and of 100 packets (bar: mean, line: ± one
standard deviation, dots: p50 and p99), next to the study's means.

Plain Python 3, no plotting library:
    python3 docs/figures/bufferbloat-fetch.py /tmp/bb-run docs/figures/bufferbloat-fetch.svg
"""

import glob
import json
import math
import os
import sys

STUDY = {("reno", 20): 3.30, ("reno", 100): 9.96, ("bbr", 20): 2.47, ("bbr", 100): 1.78}
CCS = ["reno", "cubic", "bbr"]
QUEUES = [20, 100]
COLOR = {20: "#1f77b4", 100: "#d62728"}


def cells(run_dir):
    out = {}
    for path in sorted(glob.glob(os.path.join(run_dir, "*.json"))):
        name = os.path.basename(path)
        if not name.startswith("s") or "-q" not in name:
            continue
        j = json.load(open(path))
        flows = j.get("extra", {}).get("load", {}).get("flows", [])
        fetch = next((f for f in flows if f.get("kind") == "fetch"), None)
        bulk = next((f for f in flows if f.get("kind") == "tcp"), None)
        if not fetch or not fetch.get("fetch") or not bulk:
            continue
        q = int(name.split("-q")[1].split("-")[0])
        out[(bulk["cc"], q)] = fetch["fetch"]
    return out


def main():
    run_dir, out = sys.argv[1], sys.argv[2]
    data = cells(run_dir)
    top = max(
        [t.get("p99_s") or 0 for t in data.values()]
        + [(t.get("mean_s") or 0) + (t.get("sd_s") or 0) for t in data.values()]
    )
    top = math.ceil(top * 1.1 * 4) / 4 or 1
    w, h, left, right, bottom, up = 720, 440, 70, 20, 60, 70
    pw, ph = w - left - right, h - bottom - up
    y = lambda v: up + ph - v / top * ph
    s = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{h}" '
        f'font-family="sans-serif" font-size="13">',
        f'<rect width="{w}" height="{h}" fill="white"/>',
        f'<text x="{w / 2}" y="22" text-anchor="middle" font-size="15">'
        "100 KiB page fetch time behind one bulk TCP flow, 10 Mbit/s bottleneck</text>",
    ]
    steps = 5
    for i in range(steps + 1):
        v = top * i / steps
        s.append(f'<line x1="{left}" x2="{w - right}" y1="{y(v):.1f}" y2="{y(v):.1f}" stroke="#ddd"/>')
        s.append(f'<text x="{left - 6}" y="{y(v) + 4:.1f}" text-anchor="end">{v:.2f}</text>')
    s.append(
        f'<text x="16" y="{up + ph / 2}" transform="rotate(-90 16 {up + ph / 2})" '
        'text-anchor="middle">fetch time (s)</text>'
    )
    gw = pw / len(CCS)
    bw = gw / 4
    for gi, cc in enumerate(CCS):
        gx = left + gi * gw
        s.append(f'<text x="{gx + gw / 2}" y="{h - bottom + 38}" text-anchor="middle" font-size="14">{cc}</text>')
        for qi, q in enumerate(QUEUES):
            t = data.get((cc, q))
            x = gx + gw / 2 - bw - 4 + qi * (bw + 8)
            s.append(f'<text x="{x + bw / 2}" y="{h - bottom + 18}" text-anchor="middle">q={q}</text>')
            if not t or t.get("mean_s") is None:
                continue
            m, sd = t["mean_s"], t.get("sd_s") or 0
            s.append(
                f'<rect x="{x:.1f}" y="{y(m):.1f}" width="{bw:.1f}" height="{y(0) - y(m):.1f}" '
                f'fill="{COLOR[q]}" fill-opacity="0.55"/>'
            )
            cx = x + bw / 2
            s.append(
                f'<line x1="{cx:.1f}" x2="{cx:.1f}" y1="{y(max(m - sd, 0)):.1f}" '
                f'y2="{y(min(m + sd, top)):.1f}" stroke="black" stroke-width="1.5"/>'
            )
            for key, shape in (("p50_s", "circle"), ("p99_s", "tri")):
                v = t.get(key)
                if v is None:
                    continue
                if shape == "circle":
                    s.append(f'<circle cx="{cx:.1f}" cy="{y(v):.1f}" r="4" fill="white" stroke="black"/>')
                else:
                    yy = y(min(v, top))
                    s.append(
                        f'<path d="M{cx - 5:.1f},{yy + 4:.1f} L{cx + 5:.1f},{yy + 4:.1f} '
                        f'L{cx:.1f},{yy - 5:.1f} Z" fill="black"/>'
                    )
            s.append(
                f'<text x="{cx:.1f}" y="{y(0) - 4:.1f}" text-anchor="middle" font-size="11">'
                f'n={t["count"]}</text>'
            )
            st = STUDY.get((cc, q))
            label = f"{m:.2f}" + (f" (study {st:.2f})" if st else "")
            s.append(
                f'<text x="{cx:.1f}" y="{y(min(max(m + sd, t.get("p99_s") or 0), top)) - 10:.1f}" text-anchor="middle" '
                f'font-size="11">{label}</text>'
            )
    s.append(f'<line x1="{left}" x2="{w - right}" y1="{y(0)}" y2="{y(0)}" stroke="black"/>')
    lx = left + 8
    s.append(f'<rect x="{lx}" y="{up - 14}" width="12" height="10" fill="{COLOR[20]}" fill-opacity="0.55"/>')
    s.append(f'<text x="{lx + 16}" y="{up - 5}">queue 20</text>')
    s.append(f'<rect x="{lx + 90}" y="{up - 14}" width="12" height="10" fill="{COLOR[100]}" fill-opacity="0.55"/>')
    s.append(f'<text x="{lx + 106}" y="{up - 5}">queue 100</text>')
    s.append(
        f'<text x="{w / 2}" y="40" text-anchor="middle" font-size="12">bar: mean, line: ± sd, '
        "○ p50, ▲ p99; the study's means (Mininet) in brackets</text>"
    )
    s.append("</svg>")
    open(out, "w").write("\n".join(s) + "\n")


if __name__ == "__main__":
    main()
