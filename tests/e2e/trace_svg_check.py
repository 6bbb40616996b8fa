"""tests/e2e/trace_svg_check.py: tools/trace_svg.py on a real run's trace.json
(run.trace on the CPU): the SVG parses, has a lane per named lane of the
trace and one rectangle per slice in the window (each named and colored
for what it is), a time axis and a legend, and headless chromium draws it
with no console error (forward and backward ops' colors counted on the
screenshot). Two ranks: the run's trace as rank 0 and a rank 1 made from it
(pids and names moved, all-reduce buckets added on a comm lane, two of
three starting before the backward ends), stacked in one picture with the
overlap in rank 1's label. Bad steps, a file that is not a trace and a
--window with nothing in it are refused with a message. Prints
cmocka-style lines.

    python3 trace_svg_check.py RUN_DIR TRACE_SVG.py WORK_DIR
"""
import collections
import json
import os
import subprocess
import sys
import xml.etree.ElementTree as ET

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from browser import pixels, screenshot  # noqa: E402

run, tool, work = sys.argv[1], sys.argv[2], os.path.abspath(sys.argv[3])
SVG = "{http://www.w3.org/2000/svg}"
COMM = 2  # core/trace.h STOKE_TRACE_COMM
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    print(f"[       OK ] {name}" if ok else f"[  FAILED  ] {name}: {detail}")
    passed, failed = passed + bool(ok), failed + (not ok)


def draw(*args):
    return subprocess.run([sys.executable, tool, *args], capture_output=True, text=True, timeout=120)


def window(ev, first, last):
    """What trace_svg.py documents: the chosen steps' host and GPU slices, 1% margin each side."""
    spans = [(e["ts"], e["ts"] + e["dur"]) for e in ev if e.get("cat") == "step"
             and first <= int(e["name"].split()[1]) <= last]
    t0, t1 = min(a for a, _ in spans), max(b for _, b in spans)
    return t0 - 0.01 * (t1 - t0), t1 + 0.01 * (t1 - t0)


def expected(ev, t0, t1):
    """{(pid, tid): sorted slice names} of the slices that overlap [t0, t1]."""
    want = collections.defaultdict(list)
    for e in ev:
        if e["ph"] == "X" and e["ts"] <= t1 and e["ts"] + e["dur"] >= t0:
            want[(e["pid"], e["tid"])].append(e["name"])
    return {k: sorted(v) for k, v in want.items()}


def lane_names(ev):
    proc = {e["pid"]: e["args"]["name"].split(" ", 2)[2] for e in ev if e["ph"] == "M" and e["name"] == "process_name"}
    return {(e["pid"], e["tid"]): f"{proc[e['pid']]}: {e['args']['name']}" for e in ev
            if e["ph"] == "M" and e["name"] == "thread_name"}


def drawn(path):
    """{(pid, tid): (lane name, sorted slice names, [kinds])}, the tick labels, the legend, the rank labels."""
    root = ET.parse(path).getroot()
    lanes = {}
    for g in root.iter(SVG + "g"):
        if g.get("class") != "lane":
            continue
        rects = [r for r in g.iter(SVG + "rect") if r.get("class") == "slice"]
        names = sorted(r.get("data-name") for r in rects if r.find(SVG + "title") is not None)
        lanes[(int(g.get("data-pid")), int(g.get("data-tid")))] = (g.get("data-lane"), names,
                                                                    [r.get("data-kind") for r in rects])
    texts = lambda cls: [t.text for t in root.iter(SVG + "text") if t.get("class") == cls]
    return lanes, texts("tick"), texts("legend"), texts("rank"), root


def same_picture(label, path, ev_by_rank, first, last):
    """The SVG against the traces it was drawn from."""
    try:
        lanes, ticks, legend, ranks, root = drawn(path)
        check(f"{label}: the SVG parses (xml.etree)", root.tag == SVG + "svg", root.tag)
    except (ET.ParseError, OSError, AttributeError) as err:
        check(f"{label}: the SVG parses (xml.etree)", False, err)
        return None
    want_lanes, want_slices = {}, {}
    for ev in ev_by_rank:
        want_lanes.update(lane_names(ev))
        want_slices.update(expected(ev, *window(ev, first, last)))
    check(f"{label}: one lane per named lane of the trace(s), named after it",
          {k: v[0] for k, v in lanes.items()} == want_lanes, ({k: v[0] for k, v in lanes.items()}, want_lanes))
    got = {k: v[1] for k, v in lanes.items() if v[1]}
    check(f"{label}: one rectangle per slice in the window, on its lane ({sum(map(len, want_slices.values()))})",
          got == want_slices, [(k, len(got.get(k, [])), len(v)) for k, v in want_slices.items()])
    kinds = collections.Counter(k for v in lanes.values() for k in v[2])
    check(f"{label}: op slices colored by pass (forward, backward, update)",
          kinds["fwd"] > 0 and kinds["bwd"] > 0 and kinds["upd"] > 0, kinds)
    check(f"{label}: a time axis in ms starting at 0", ticks[:1] == ["0"] and "ms" in ticks and len(ticks) >= 4, ticks)
    check(f"{label}: a legend of what was drawn", {"op forward", "op backward", "step"} <= set(legend), legend)
    return ranks


# ------------------------------------------------------------ one rank
ev0 = json.load(open(f"{run}/trace.json"))["traceEvents"]
steps = sorted({int(e["name"].split()[1]) for e in ev0 if e.get("cat") == "step"})
one = f"{work}/one.svg"
r = draw(f"{run}/trace.json", "-o", one)
check("trace_svg: one trace, the first traced step", r.returncode == 0 and "lanes" in r.stdout, r.stderr)
if r.returncode == 0:
    same_picture(f"step {steps[0]}", one, [ev0], steps[0], steps[0])
many = f"{work}/steps.html"
r = draw(f"{run}/trace.json", "-o", many, "--steps", f"{steps[0]}-{steps[-1]}")
check("trace_svg: every traced step, as an HTML page", r.returncode == 0, r.stderr)
if r.returncode == 0:
    page = open(many).read()
    svg_at = page.index("<svg")
    with open(f"{work}/steps.svg", "w") as f:
        f.write(page[svg_at:page.index("</svg>") + 6])
    same_picture(f"steps {steps[0]}-{steps[-1]}", f"{work}/steps.svg", [ev0], steps[0], steps[-1])

# a window in ms on the trace's clock: the last traced step's GPU slice
gpu = [e for e in ev0 if e.get("cat") == "step" and e["pid"] == 1][-1]
a, b = gpu["ts"] / 1e3, (gpu["ts"] + gpu["dur"]) / 1e3
r = draw(f"{run}/trace.json", "-o", f"{work}/window.svg", "--window", f"{a:.3f}-{b:.3f}")
if r.returncode == 0:
    got = {k: v[1] for k, v in drawn(f"{work}/window.svg")[0].items() if v[1]}
    want = expected(ev0, 1e3 * round(a, 3), 1e3 * round(b, 3))
    check("trace_svg --window: one rectangle per slice in it", got == want,
          [(k, len(got.get(k, [])), len(v)) for k, v in want.items()])
else:
    check("trace_svg --window: one rectangle per slice in it", False, r.stderr)
last = max(e["ts"] + e.get("dur", 0) for e in ev0 if e["ph"] == "X") / 1e3
r = draw(f"{run}/trace.json", "-o", f"{work}/bad.svg", "--window", f"{last + 10:.0f}-{last + 20:.0f}")
check("trace_svg --window: a window after the trace is refused, saying where the trace is",
      r.returncode != 0 and "no slice in the window" in r.stderr and "the traces span" in r.stderr, r.stderr)

# ------------------------------------------------------------ two ranks
# rank 1: the same run moved to pids 2, 3, with three buckets on a comm lane
# per step: two starting inside the backward, one after it ended
ev1 = []
for e in ev0:
    e = json.loads(json.dumps(e))
    e["pid"] += 2
    if e["ph"] == "M" and e["name"] == "process_name":
        e["args"]["name"] = e["args"]["name"].replace("rank 0", "rank 1")
    ev1.append(e)
ev1.append({"ph": "M", "pid": 3, "tid": COMM, "name": "thread_name", "args": {"name": "comm stream (all-reduce buckets)"}})
for s in steps:
    gpu = next(e for e in ev0 if e.get("cat") == "step" and e["pid"] == 1 and e["name"] == f"step {s}")
    bwd = [e for e in ev0 if e.get("args", {}).get("pass") == "backward"
           and gpu["ts"] <= e["ts"] <= gpu["ts"] + gpu["dur"]]
    end = max(e["ts"] + e["dur"] for e in bwd)
    for i, at in enumerate([bwd[0]["ts"], bwd[len(bwd) // 2]["ts"], end + 1]):
        ev1.append({"ph": "X", "pid": 3, "tid": COMM, "ts": at, "dur": 0.05 * gpu["dur"],
                    "name": f"all-reduce bucket {i + 1}", "cat": "comm", "args": {"bytes": 1 << 20}})
os.makedirs(f"{work}/rank1", exist_ok=True)
with open(f"{work}/rank1/trace.json", "w") as f:
    json.dump({"traceEvents": ev1}, f)
two = f"{work}/two.svg"
r = draw(f"{run}/trace.json", f"{work}/rank1/trace.json", "-o", two)
check("trace_svg: two ranks in one picture", r.returncode == 0, r.stderr)
if r.returncode == 0:
    ranks = same_picture("two ranks", two, [ev0, ev1], steps[0], steps[0]) or []
    check("two ranks: rank 0 then rank 1, rank 1 with its buckets' overlap of the backward",
          len(ranks) == 2 and ranks[0].startswith("rank 0") and "bucket" not in ranks[0]
          and ranks[1].startswith("rank 1") and ranks[1].endswith("3 all-reduce buckets, 2 of them started before "
                                                                  "the backward ended"), ranks)

# ------------------------------------------------------------ in a browser
for label, svg, colors in (("one rank", one, {"forward": (0x4e, 0x79, 0xa7), "backward": (0xf2, 0x8e, 0x2b)}),
                           ("two ranks", two, {"forward": (0x4e, 0x79, 0xa7), "backward": (0xf2, 0x8e, 0x2b),
                                               "comm": (0xe1, 0x57, 0x59)})):
    if not os.path.exists(svg):
        continue
    shot = svg[:-4] + ".png"
    rc, log, errors = screenshot(svg, shot, "1600,700")
    if rc is None:
        check(f"{label} in a browser", False, "no chromium (tools/setup.sh installs Debian's)")
        continue
    check(f"{label} in a browser: chromium rendered a screenshot", rc == 0 and os.path.exists(shot), (rc, log[-800:]))
    check(f"{label} in a browser: no console error, no failed load", not errors, errors[:3])
    if os.path.exists(shot):
        w, h, ch, px = pixels(shot)
        seen = collections.Counter()
        for i in range(0, len(px), ch):
            for name, (cr, cg, cb) in colors.items():
                seen[name] += abs(px[i] - cr) + abs(px[i + 1] - cg) + abs(px[i + 2] - cb) < 12
        check(f"{label} in a browser: the slices are drawn ({', '.join(colors)} pixels)",
              all(seen[n] > 200 for n in colors), dict(seen))

# ------------------------------------------------------------ bad input
r = draw(f"{run}/trace.json", "-o", f"{work}/bad.svg", "--steps", "9999")
check("trace_svg: a step outside the trace is refused, naming the file and the traced steps",
      r.returncode != 0 and f"{run}/trace.json" in r.stderr and "no slice of step 9999" in r.stderr
      and f"traced steps {steps[0]}-{steps[-1]}" in r.stderr and not os.path.exists(f"{work}/bad.svg"), r.stderr)
with open(f"{work}/not_a_trace.json", "w") as f:
    f.write("{\"traceEvents\": [")
r = draw(f"{work}/not_a_trace.json", "-o", f"{work}/bad.svg")
check("trace_svg: a file that is not a trace is refused, naming it", r.returncode != 0
      and "not_a_trace.json" in r.stderr and "Chrome trace" in r.stderr, r.stderr)

print(f"[  PASSED  ] {passed} test(s).")
if failed:
    print(f"[  FAILED  ] {failed} test(s), listed above")
sys.exit(1 if failed else 0)
