#!/usr/bin/env python3
"""tools/trace_svg.py: a picture of stoke traces (run.trace's trace.json,
Chrome trace-event format, core/trace.c) as one self-contained SVG timeline
(or an HTML page around it): a lane per thread lane of each process, ranks
stacked, slices colored by what they are, names where they fit, a time axis
in ms and a legend. Python 3 standard library only.

    python3 tools/trace_svg.py RUN/trace.json [RUN/rank1/trace.json ...] -o timeline.svg
        [--steps N | N-M]   the traced steps to show (default: the first one)
        [--window A-B]      instead: A to B ms on each trace's own clock
        [--width 1600] [--title TEXT]

Each rank has its own clock, so with --steps each file's time 0 is the
start of its first chosen step (the earliest of its host and GPU slices);
the axis reads ms from there. Under data parallel, each rank's label says
how many all-reduce buckets started before its last backward node ended.
A PNG of it, e.g. for BENCHMARKS.md:

    chromium --headless --no-sandbox --hide-scrollbars --window-size=1600,H \\
        --screenshot=timeline.png file://$PWD/timeline.svg

(H: the SVG's height, printed by this tool.)
"""
import argparse
import html
import json
import math
import os
import re
import sys

# what a slice is -> (fill color, legend text); the order is the legend's
KINDS = {
    "fwd": ("#4e79a7", "op forward"),
    "bwd": ("#f28e2b", "op backward"),
    "rec": ("#b07aa1", "op recompute"),
    "upd": ("#59a14f", "optimizer + scaler"),
    "comm": ("#e15759", "all-reduce bucket"),
    "copy": ("#76b7b2", "copy (host to device)"),
    "wait": ("#edc948", "wait"),
    "loader": ("#8cd17d", "loader: decode + augment"),
    "step": ("#d4d4d4", "step"),
    "other": ("#bab0ac", "other"),
}
LABEL_W, ROW_H, GAP, CHAR_W = 250, 18, 6, 6.1


def kind(e):
    cat = e.get("cat", "")
    if cat == "op":
        return {"forward": "fwd", "backward": "bwd", "recompute": "rec", "update": "upd"}.get(
            e.get("args", {}).get("pass"), "fwd")
    return cat if cat in KINDS else "other"


def load(path):
    try:
        with open(path) as f:
            ev = json.load(f)["traceEvents"]
    except (OSError, ValueError, KeyError, TypeError) as err:
        sys.exit(f"trace_svg: cannot read '{path}' as a Chrome trace ({{\"traceEvents\": [...]}}): {err}")
    return ev


def lanes_of(ev):
    """{(pid, tid): name}, {pid: name}, and their sort keys, from the metadata events."""
    pname, psort, tname, tsort = {}, {}, {}, {}
    for e in ev:
        if e.get("ph") != "M":
            continue
        a, key = e.get("args", {}), (e.get("pid"), e.get("tid"))
        if e["name"] == "process_name":
            pname[e["pid"]] = a.get("name", f"process {e['pid']}")
        elif e["name"] == "process_sort_index":
            psort[e["pid"]] = a.get("sort_index", e["pid"])
        elif e["name"] == "thread_name":
            tname[key] = a.get("name", f"thread {e['tid']}")
        elif e["name"] == "thread_sort_index":
            tsort[key] = a.get("sort_index", e["tid"])
    return pname, psort, tname, tsort


def step_window(ev, first, last, path):
    """[t0, t1] us spanning steps first..last (host and GPU slices) in one trace."""
    spans = [(e["ts"], e["ts"] + e.get("dur", 0)) for e in ev if e.get("ph") == "X" and e.get("cat") == "step"
             and re.fullmatch(r"step (\d+)", e.get("name", "")) and first <= int(e["name"].split()[1]) <= last]
    if not spans:
        have = sorted({int(e["name"].split()[1]) for e in ev if e.get("cat") == "step"
                       and re.fullmatch(r"step (\d+)", e.get("name", ""))})
        sys.exit(f"trace_svg: '{path}' has no slice of step {first}{'' if first == last else f'-{last}'} "
                 f"(it traced steps {have[0]}-{have[-1]})" if have else
                 f"trace_svg: '{path}' has no step slices: was it written with run.trace = FIRST-LAST?")
    return min(a for a, _ in spans), max(b for _, b in spans)


def first_step(ev):
    nums = [int(e["name"].split()[1]) for e in ev if e.get("ph") == "X" and e.get("cat") == "step"
            and re.fullmatch(r"step (\d+)", e.get("name", ""))]
    return min(nums) if nums else None


def rows(slices):
    """Each slice's row within its lane, the first row free at its start:
    a slice nested in another goes below it, as do overlapping siblings."""
    ends, out = [], []  # per row, the end of the last slice placed there
    for s in sorted(slices, key=lambda s: (s["t0"], -s["t1"])):
        r = next((i for i, end in enumerate(ends) if end <= s["t0"] + 1e-3), len(ends))
        if r == len(ends):
            ends.append(0)
        ends[r] = s["t1"]
        out.append((s, r))
    return out


def window_buckets(ev, t0, t1):
    """(the window's all-reduce bucket slices, its backward op slices). The window's own buckets: from
    its first forward node on (the window opens on the host, where the step before may still be
    all-reducing its last bucket). gpu_suite's observe_ddp check uses it too."""
    ops = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "op" and t0 <= e["ts"] <= t1]
    first_fwd = min((e["ts"] for e in ops if e.get("args", {}).get("pass") == "forward"), default=t0)
    comm = [e for e in ev if e.get("ph") == "X" and e.get("cat") == "comm" and first_fwd <= e["ts"] <= t1]
    return comm, [e for e in ops if e.get("args", {}).get("pass") == "backward"]


def bucket_overlap(ev, t0, t1):
    """(buckets in the window, how many started before the last backward node ended), or None."""
    comm, bwd = window_buckets(ev, t0, t1)
    if not comm:
        return None
    last_bwd = max((e["ts"] + e["dur"] for e in bwd), default=-math.inf)
    return len(comm), sum(e["ts"] < last_bwd for e in comm)


def nice_step(span_ms, ticks=12):
    raw = span_ms / ticks
    p = 10 ** math.floor(math.log10(raw)) if raw > 0 else 1
    return next(m * p for m in (1, 2, 5, 10) if m * p >= raw)


def fmt_ms(x):
    return f"{x:.3f}".rstrip("0").rstrip(".") if x else "0"


def render(traces, width, title, window_note):
    """traces: [(label, events, t0_us, t1_us)] -> (svg text, height, lane count, slice count)."""
    span = max(t1 - t0 for _, _, t0, t1 in traces) or 1.0
    plot_w = width - LABEL_W - 20
    xs = lambda t: LABEL_W + plot_w * t / span  # t: us from the trace's own t0
    body, y = [], 58
    n_lanes = n_slices = 0
    shown = set()  # the kinds drawn: the legend's entries
    for label, ev, t0, t1 in traces:
        pname, psort, tname, tsort = lanes_of(ev)
        by_lane = {}
        for e in ev:
            if e.get("ph") != "X" or e["ts"] > t1 or e["ts"] + e.get("dur", 0) < t0:
                continue
            a, b = max(e["ts"], t0) - t0, min(e["ts"] + e.get("dur", 0), t1) - t0
            by_lane.setdefault((e["pid"], e["tid"]), []).append({"e": e, "t0": a, "t1": b})
        lanes = sorted(set(tname) | set(by_lane), key=lambda k: (psort.get(k[0], k[0]), k[0], tsort.get(k, k[1]), k[1]))
        ov = bucket_overlap(ev, t0, t1)
        head = label + (f": {ov[0]} all-reduce buckets, {ov[1]} of them started before the backward ended"
                        if ov else "")
        body.append(f'<text class="rank" x="8" y="{y + 13}">{html.escape(head)}</text>')
        y += 22
        for key in lanes:
            placed = rows(by_lane.get(key, []))
            depth = max((r for _, r in placed), default=0) + 1
            h = depth * ROW_H
            proc = pname.get(key[0], f"process {key[0]}")
            proc = re.sub(r"^rank \d+ ", "", proc)
            name = f"{proc}: {tname.get(key, f'thread {key[1]}')}"
            body.append(f'<g class="lane" data-lane="{html.escape(name)}" data-pid="{key[0]}" data-tid="{key[1]}">')
            body.append(f'<rect class="laneband" x="{LABEL_W}" y="{y}" width="{plot_w}" height="{h}" fill="#f7f7f7"/>')
            body.append(f'<text class="lanename" x="{LABEL_W - 8}" y="{y + 13}" text-anchor="end">'
                        f'{html.escape(name)}</text>')
            for s, r in placed:
                e, k = s["e"], kind(s["e"])
                x0, x1 = xs(s["t0"]), xs(s["t1"])
                w = max(x1 - x0, 1.0)
                ry = y + r * ROW_H + 1
                tip = f'{e.get("name", "")}: {e.get("dur", 0) / 1e3:.3f} ms'
                if e.get("args"):
                    tip += " " + json.dumps(e["args"])
                body.append(f'<rect class="slice" data-cat="{html.escape(e.get("cat", ""))}" data-kind="{k}" data-name="{html.escape(e.get("name", ""))}" '
                            f'x="{x0:.2f}" y="{ry}" width="{w:.2f}" height="{ROW_H - 2}" fill="{KINDS[k][0]}" '
                            f'stroke="#ffffff" stroke-width="0.5"><title>{html.escape(tip)}</title></rect>')
                text = e.get("name", "").replace("all-reduce bucket", "bucket")  # the lane says all-reduce
                fit = int((w - 6) / CHAR_W)
                if fit >= 3 and text:
                    if len(text) > fit:
                        text = text[:fit - 1] + "\u2026"
                    body.append(f'<text class="name" x="{x0 + 3:.2f}" y="{ry + 12}">{html.escape(text)}</text>')
                n_slices += 1
                shown.add(k)
            body.append("</g>")
            n_lanes += 1
            y += h + 2
        y += GAP * 2
    # time axis under the lanes, grid lines across them
    tick = nice_step(span / 1e3)
    axis = [f'<line x1="{LABEL_W}" y1="{y}" x2="{LABEL_W + plot_w}" y2="{y}" stroke="#333"/>']
    grid = []
    for i in range(int(span / 1e3 / tick) + 1):
        x = xs(i * tick * 1e3)
        grid.append(f'<line x1="{x:.2f}" y1="50" x2="{x:.2f}" y2="{y}" stroke="#000" stroke-opacity="0.08"/>')
        axis.append(f'<line x1="{x:.2f}" y1="{y}" x2="{x:.2f}" y2="{y + 5}" stroke="#333"/>'
                    f'<text class="tick" x="{x:.2f}" y="{y + 17}" text-anchor="middle">{fmt_ms(i * tick)}</text>')
    axis.append(f'<text class="tick" x="{LABEL_W - 8}" y="{y + 17}" text-anchor="end">ms</text>')
    y += 30
    legend, x = [], LABEL_W
    for k, (color, text) in KINDS.items():
        if k not in shown:
            continue
        legend.append(f'<rect class="key" x="{x}" y="{y}" width="14" height="12" fill="{color}"/>'
                      f'<text class="legend" x="{x + 18}" y="{y + 10}">{html.escape(text)}</text>')
        x += 30 + CHAR_W * len(text)
        if x > width - 160:
            x, y = LABEL_W, y + 18
    height = y + 26
    svg = (f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{height}" '
           f'viewBox="0 0 {width} {height}" font-family="DejaVu Sans, Arial, sans-serif">\n'
           '<style>text { font-size: 11px; fill: #222 } .name { font-size: 10px; fill: #111; pointer-events: none }'
           ' .rank { font-size: 13px; font-weight: bold } .title { font-size: 15px; font-weight: bold }'
           ' .note { font-size: 11px; fill: #555 }</style>\n'
           f'<rect width="{width}" height="{height}" fill="#ffffff"/>\n'
           f'<text class="title" x="8" y="20">{html.escape(title)}</text>\n'
           f'<text class="note" x="8" y="38">{html.escape(window_note)}</text>\n'
           + "\n".join(grid) + "\n" + "\n".join(body) + "\n" + "\n".join(axis) + "\n" + "\n".join(legend)
           + "\n</svg>\n")
    return svg, height, n_lanes, n_slices


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("traces", nargs="+", help="trace.json files (one per rank)")
    ap.add_argument("-o", "--out", required=True, help="the picture: .svg, or .html for a page around it")
    ap.add_argument("--steps", help="N or N-M: the traced steps to show (default: the first traced step)")
    ap.add_argument("--window", help="A-B: ms on each trace's own clock, instead of --steps")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--title", help="the picture's title")
    a = ap.parse_args()
    if a.steps and a.window:
        sys.exit("trace_svg: give --steps or --window, not both")
    traces, notes = [], []
    # each file named from the folder above the one they share: obs_ddp/trace.json, obs_ddp/rank1/trace.json
    common = os.path.commonpath([os.path.dirname(os.path.abspath(p)) for p in a.traces])
    short = [os.path.relpath(os.path.abspath(p), os.path.dirname(common)) for p in a.traces]
    for i, path in enumerate(a.traces):
        ev = load(path)
        pname = lanes_of(ev)[0]
        ranks = sorted({int(m.group(1)) for n in pname.values() for m in [re.match(r"rank (\d+)", n)] if m})
        label = f"rank {ranks[0]}" if len(ranks) == 1 else f"trace {i + 1}"
        label += f" ({short[i]})"
        if a.window:
            m = re.fullmatch(r"\s*([0-9.]+)\s*-\s*([0-9.]+)\s*", a.window)
            if not m or float(m.group(2)) <= float(m.group(1)):
                sys.exit(f"trace_svg: --window '{a.window}': give A-B in ms with A < B, e.g. 120-135")
            t0, t1 = 1e3 * float(m.group(1)), 1e3 * float(m.group(2))
            note = f"{a.window} ms on each trace's own clock; time 0 = {m.group(1)} ms"
        else:
            spec = a.steps or str(first_step(ev) or "")
            m = re.fullmatch(r"(\d+)(?:-(\d+))?", spec)
            if not m:
                sys.exit(f"trace_svg: --steps '{a.steps}': give N or N-M, e.g. 20 or 20-21" if a.steps else
                         f"trace_svg: '{path}' has no step slices: was it written with run.trace = FIRST-LAST?")
            first, last = int(m.group(1)), int(m.group(2) or m.group(1))
            if last < first:
                sys.exit(f"trace_svg: --steps '{a.steps}': the first step comes first, e.g. 20-21")
            t0, t1 = step_window(ev, first, last, path)
            pad = 0.01 * (t1 - t0)
            t0, t1 = t0 - pad, t1 + pad
            note = (f"step {spec}; time 0 = the step's start on each rank's own clock"
                    if first == last else f"steps {spec}; time 0 = the first step's start on each rank's own clock")
        traces.append((label, ev, t0, t1))
        notes.append(note)
    title = a.title or "stoke trace: " + ", ".join(t[0].split(" (")[0] for t in traces)
    svg, height, n_lanes, n_slices = render(traces, a.width, title, notes[0])
    if not n_slices:
        spans = [(min(e["ts"] for e in ev if e.get("ph") == "X") / 1e3,
                  max(e["ts"] + e.get("dur", 0) for e in ev if e.get("ph") == "X") / 1e3) for _, ev, _, _ in traces
                 if any(e.get("ph") == "X" for e in ev)]
        sys.exit(f"trace_svg: no slice in the window {a.window or a.steps}; the traces span "
                 + ", ".join(f"{x:.1f}-{y:.1f} ms" for x, y in spans))
    if a.out.endswith((".html", ".htm")):
        text = (f"<!DOCTYPE html>\n<html><head><meta charset=\"utf-8\"><title>{html.escape(title)}</title></head>"
                f"<body style=\"margin:0\">\n{svg}</body></html>\n")
    else:
        text = '<?xml version="1.0" encoding="UTF-8"?>\n' + svg
    tmp = a.out + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(text)
    os.replace(tmp, a.out)
    print(f"trace_svg: {a.out}: {a.width}x{height} px, {n_lanes} lanes, {n_slices} slices")


if __name__ == "__main__":
    main()
