#!/usr/bin/env python3
"""Draws a tessel timeline (tessel train --trace FILE, docs/trace.md) as a PNG.

One band per rank: spans stacked by nesting depth (top-level at the top),
coloured by category, the allocator's MiB as a line under each band. A
picture for a document or a bug report; to explore a trace, open it in
ui.perfetto.dev or chrome://tracing instead.

    python tools/trace_png.py trace.json trace.png [--step N] [--max-depth D] [--width-in W]

Needs matplotlib (tools/python_venv.sh's environment: pip install matplotlib).
"""
import argparse
import json
import sys

COLOURS = {
    "op": "#9ecae1",
    "backward": "#fdae6b",
    "comm": "#e6550d",
    "wait": "#d62728",
    "step": "#bdbdbd",
    "optimizer": "#31a354",
    "pipeline": "#756bb1",
    "kernel": "#6baed6",
}


def depths(spans):
    """Nesting depth of each span of one track (spans: dicts with t0, t1)."""
    spans.sort(key=lambda s: (s["t0"], -s["t1"]))
    open_ends = []
    for s in spans:
        while open_ends and open_ends[-1] <= s["t0"]:
            open_ends.pop()
        s["depth"] = len(open_ends)
        open_ends.append(s["t1"])
    return spans


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("trace")
    ap.add_argument("png")
    ap.add_argument("--step", type=int, default=0, help="draw only this step (its 'step N' span on rank 0); 0: all")
    ap.add_argument("--max-depth", type=int, default=3, help="nesting levels drawn per rank")
    ap.add_argument("--width-in", type=float, default=14.0)
    a = ap.parse_args()
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
        from matplotlib.patches import Patch
    except ImportError:
        sys.exit("trace_png: needs matplotlib (pip install matplotlib)")

    doc = json.load(open(a.trace))
    events = doc["traceEvents"]
    ranks = sorted({e["pid"] for e in events})
    lo, hi = None, None
    if a.step:
        for e in events:
            if e.get("ph") == "X" and e["name"] == f"step {a.step}" and e["pid"] == ranks[0]:
                lo, hi = float(e["ts"]), float(e["ts"]) + float(e["dur"])
        if lo is None:
            sys.exit(f"trace_png: no 'step {a.step}' span in {a.trace}")
    tracks, memory = {}, {}
    for e in events:
        if e.get("ph") == "X":
            t0, t1 = float(e["ts"]), float(e["ts"]) + float(e["dur"])
            if lo is not None and (t1 < lo or t0 > hi):
                continue
            tracks.setdefault(e["pid"], []).append({"t0": t0, "t1": t1, "name": e["name"], "cat": e.get("cat", ""), "args": e.get("args", {})})
        elif e.get("ph") == "C" and "allocated MiB" in e.get("args", {}):
            t = float(e["ts"])
            if lo is None or lo <= t <= hi:
                memory.setdefault(e["pid"], []).append((t, e["args"]["allocated MiB"]))
    if lo is None:
        lo = min(s["t0"] for t in tracks.values() for s in t)
        hi = max(s["t1"] for t in tracks.values() for s in t)
    band = a.max_depth + 1.6  # span rows, then the memory line
    fig, ax = plt.subplots(figsize=(a.width_in, 0.55 * band * len(ranks) + 1.2))
    for i, r in enumerate(ranks):
        base = (len(ranks) - 1 - i) * band
        for s in depths(tracks.get(r, [])):
            if s["depth"] >= a.max_depth:
                continue
            t0, t1 = max(s["t0"], lo), min(s["t1"], hi)
            y = base + 1.4 + (a.max_depth - 1 - s["depth"])
            ax.add_patch(plt.Rectangle(((t0 - lo) / 1e3, y), (t1 - t0) / 1e3, 0.9, facecolor=COLOURS.get(s["cat"], "#cccccc"), edgecolor="white", lw=0.5))
            if (t1 - t0) / (hi - lo) > 0.045:
                label = s["name"]
                if "micro_batch" in s["args"]:
                    label += f" mb{s['args']['micro_batch']}"
                ax.text((t0 + t1) / 2e3 - lo / 1e3, y + 0.45, label, ha="center", va="center", fontsize=7, clip_on=True)
        pts = memory.get(r, [])
        if pts:
            top = max(m for _, m in pts) or 1.0
            ax.plot([(t - lo) / 1e3 for t, _ in pts], [base + 0.2 + 1.0 * m / top for _, m in pts], color="black", lw=0.8)
            ax.text(0, base + 1.25, f"allocated (max {top:.1f} MiB)", fontsize=6, va="center")
        ax.text(-0.01 * (hi - lo) / 1e3, base + band / 2, f"rank {r}", ha="right", va="center", fontsize=9)
    ax.set_xlim(0, (hi - lo) / 1e3)
    ax.set_ylim(0, band * len(ranks))
    ax.set_yticks([])
    ax.set_xlabel("ms" + (f" (step {a.step})" if a.step else ""))
    ax.legend(handles=[Patch(color=c, label=k) for k, c in COLOURS.items()], loc="upper center",
              bbox_to_anchor=(0.5, -0.12), ncol=len(COLOURS), fontsize=8, frameon=False)
    title = doc.get("tessel", {})
    ax.set_title(f"{title.get('model', '')} on {title.get('mesh', '')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(a.png, dpi=110)


if __name__ == "__main__":
    main()
