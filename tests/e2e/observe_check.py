"""tests/e2e/observe_check.py: what a run writes to be looked at, checked
from outside: the TensorBoard event file (tfevents.py, and TensorBoard's
own reader where it is installed) against metrics.jsonl, and report.html
(well formed, self-contained, every plot with data). Prints cmocka-style
lines; exits non-zero on a failure.

    python3 observe_check.py RUN_DIR

TRACE=FIRST-LAST names the traced steps (10-14 if unset). Under
run.cuda_graph = true (GRAPH=1: required) the traced steps must have run eagerly with every
node timed, and every other step but the first replayed the graph
(the summary's cuda_graph_replays). SAME_AS=OTHER_RUN_DIR: the run's
checkpoint (weights, optimizer state, loss scale) and its logged losses
must equal that run's, bitwise (SAME_TOL=x: within x relative, by norm).
SPEED=0 leaves out the graph-speed check (the step times are printed).
"""
import configparser
import glob
import html.parser
import json
import math
import os
import re
import statistics
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tfevents  # noqa: E402

run = sys.argv[1]
passed = failed = 0


def check(name, ok, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"[       OK ] {name}")
    else:
        failed += 1
        print(f"[  FAILED  ] {name}: {detail}")


rows = [json.loads(l) for l in open(f"{run}/metrics.jsonl")]
steps = [r for r in rows if "loss" in r]
evals = [r for r in rows if "eval_loss" in r and "summary" not in r]
summary = [r for r in rows if "summary" in r][-1]

# ------------------------------------------------------------ TensorBoard
files = glob.glob(f"{run}/events.out.tfevents.*")
check("tensorboard: one event file in the run folder", len(files) == 1, files)
try:
    evs = list(tfevents.events(files[0]))
    check("tensorboard: every record's masked CRC-32C checks", True)
except (ValueError, IndexError) as e:
    evs = []
    check("tensorboard: every record's masked CRC-32C checks", False, e)
if evs:
    check("tensorboard: the first event is the file version", evs[0]["file_version"] == "brain.Event:2", evs[0])
    scalar = {}
    for ev in evs[1:]:
        for tag, x in ev["scalars"].items():
            scalar[(ev["step"], tag)] = x

    # metrics.jsonl prints these with fixed decimals, the others with %.6g;
    # the event file holds float32 (about 7 digits)
    printed = {"samples_per_s": 0.05, "host_ms": 5e-5, "data_wait_ms": 5e-5}

    def same(tag, key, src):
        bad = []
        for r in src:
            want, got = r.get(key), scalar.get((r["step"], tag))
            if want is None:
                if got is not None:
                    bad.append((r["step"], "not measured, yet", got))
            elif got is None or abs(got - want) > 6e-6 * abs(want) + printed.get(key, 0):
                bad.append((r["step"], want, got))
        check(f"tensorboard: {tag} equals metrics.jsonl's {key} at {len(src)} steps", not bad and src, bad[:3])

    for tag, key in [("train/loss", "loss"), ("train/lr", "lr"), ("perf/samples_per_s", "samples_per_s"),
                     ("perf/step_time_ms", "step_time_ms"), ("perf/step_time_ms_p95", "step_time_ms_p95"),
                     ("perf/data_wait_ms", "data_wait_ms"), ("perf/host_ms", "host_ms"), ("perf/mfu", "mfu"),
                     ("gpu/power_w", "gpu_power_w"), ("gpu/power_capped", "gpu_power_capped"),
                     ("gpu/sm_clock_mhz", "gpu_sm_clock_mhz")]:
        same(tag, key, steps)
    if evals:
        same("eval/loss", "eval_loss", evals)
        same("eval/accuracy", "eval_accuracy", evals)
    else:
        print("(no evaluation in this run: eval/* not checked)")
# ------------------------------------------------------------ the data wait: the first step's apart
first_row = [r for r in steps if r.get("step") == 1]
fw, tw = summary.get("data_wait_first_s"), summary.get("data_wait_s")
check("summary: the first step's data wait is part of the total",
      fw is not None and tw is not None and 0 <= fw <= tw + 1e-4, (fw, tw))
if first_row:  # step 1 logged alone: its row's wait is the first step's
    check("summary: the first step's data wait is step 1's row's",
          abs(1e3 * fw - first_row[0]["data_wait_ms"]) < 0.1, (fw, first_row[0]["data_wait_ms"]))
# ------------------------------------------------------------ GPU power (NVML's counters)
power = [r.get("gpu_power_w") for r in steps]
if summary.get("gpu_power_w_mean") is None:
    check("power: not measured (no NVML), so no row has a figure", all(p is None for p in power), power[:3])
else:
    lim, cap = summary.get("gpu_power_limit_w"), summary.get("gpu_power_capped")
    mhz, top = summary.get("gpu_sm_clock_mhz_mean"), summary.get("gpu_sm_clock_mhz_max")
    measured = [r for r in steps[1:] if r.get("gpu_power_w") is not None]
    # a row's figure covers at least a second (the counters move in 0.1-0.2 s steps): one every few rows
    first = steps.index(measured[0]) if measured else len(steps)
    check("power: the first logged interval only starts the counters; later rows have figures, each a board's "
          "draw (a second's counter steps can put one 30% over the limit), every row from the first figure on "
          "an SM clock",
          power[0] is None and measured and
          all(20 < r["gpu_power_w"] and (lim is None or r["gpu_power_w"] <= 1.3 * lim) and
              r.get("gpu_power_capped") is not None for r in measured) and
          all(r.get("gpu_sm_clock_mhz") is not None for r in steps[first:]),
          [(r["step"], r.get("gpu_power_w"), r.get("gpu_sm_clock_mhz")) for r in steps[:6]])
    check("power: the mean is a board's draw, within its limit's reach (the counter's mean can sit a hair over)",
          20 < summary["gpu_power_w_mean"] and (lim is None or summary["gpu_power_w_mean"] <= 1.05 * lim),
          (summary["gpu_power_w_mean"], lim))
    check("power: the capped share is a share, the clock within its maximum",
          (cap is None or 0 <= cap <= 1) and (mhz is None or top is None or 0 < mhz <= top), (cap, mhz, top))
    print(f"(power: {summary['gpu_power_w_mean']:.0f} W of {lim} W, capped {cap}, SM clock {mhz} of {top} MHz)")
try:
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    acc = EventAccumulator(run)
    acc.Reload()
    got = [(s.step, s.value) for s in acc.Scalars("train/loss")]
    want = [(r["step"], r["loss"]) for r in steps]
    check("tensorboard's own EventAccumulator reads train/loss",
          len(got) == len(want) and all(a == c and abs(b - d) <= 1e-5 * abs(d) for (a, b), (c, d) in zip(got, want)),
          (got[:3], want[:3]))
except ImportError:
    print("(TensorBoard is not installed here: checked with tfevents.py alone)")

# ------------------------------------------------------------ report.html


class Page(html.parser.HTMLParser):
    void = {"meta", "br", "img", "input", "link", "hr", "rect", "line", "path", "circle", "polyline"}

    def __init__(self):
        super().__init__()
        self.stack, self.errors, self.figures, self.urls, self.scripts, self.text = [], [], {}, [], 0, []
        self.title = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        for k, v in a.items():
            if k in ("src", "href") or (v and ("http://" in v or "https://" in v) and k != "xmlns"):
                self.urls.append((tag, k, v))
        if tag == "script":
            self.scripts += 1
        if tag == "svg":
            self.figures_pending = int(a.get("data-points", "0"))
        if tag not in self.void:
            self.stack.append(tag)

    def handle_startendtag(self, tag, attrs):
        self.handle_starttag(tag, attrs)
        if tag not in self.void:
            self.stack.pop()

    def handle_endtag(self, tag):
        if tag in self.void:
            return
        if not self.stack or self.stack[-1] != tag:
            self.errors.append(f"</{tag}> closes <{self.stack[-1] if self.stack else None}>")
            return
        self.stack.pop()

    def handle_data(self, data):
        if self.stack and self.stack[-1] == "title" and "svg" in self.stack:
            self.figures[data] = self.figures_pending
        self.text.append(data)


path = f"{run}/report.html"
check("report: report.html written", os.path.exists(path), path)
if os.path.exists(path):
    p = Page()
    p.feed(open(path, encoding="utf-8").read())
    p.close()
    check("report: well formed (every tag closed in order)", not p.errors and p.stack == [], (p.errors[:3], p.stack))
    check("report: self-contained (no URL, no script)", not p.urls and not p.scripts, p.urls[:3])
    for fig in ["loss", "samples/s", "step time", "host time per step", "learning rate", "memory by kind"]:
        check(f"report: the '{fig}' plot has data", p.figures.get(fig, 0) > 0, p.figures)
    n_loss = len(steps) + len(evals)
    check("report: the loss plot has every logged step and evaluation", p.figures.get("loss") == n_loss,
          (p.figures.get("loss"), n_loss))
    text = "".join(p.text)
    m = re.search(r"step time p50\s*([0-9.]+) ms", text)
    check("report: the summary's figures and the resolved config are on the page",
          m and abs(float(m.group(1)) - summary["step_time_ms_p50"]) < 6e-4 and "[optimizer]" in text
          and "plan:" in text, (m and m.group(1), summary["step_time_ms_p50"]))

def graph_checks(cfg, ev, gpu, first, last):
    """run.cuda_graph = true: traced steps eager (and saying so), the others replays."""
    note = "traced steps run eagerly, outside the CUDA graph"
    check("trace (cuda_graph): each traced step's GPU slice says it ran eagerly, outside the graph",
          gpu and all(note in str(e["args"].get("cuda_graph", "")) for e in gpu), [e["args"] for e in gpu[:2]])
    check("trace (cuda_graph): the GPU process's label says so", any(
        e["ph"] == "M" and e["name"] == "process_labels" and e["pid"] % 2 == 1 and note in e["args"]["labels"]
        for e in ev))
    acc = int(cfg.get("run", "accumulate", fallback="1").split()[0])
    n, traced = summary["steps"], last - first + 1
    # every micro-batch kind runs eagerly at its first use (step 1), traced or not; the rest replay
    want = acc * (n - traced - (0 if first <= 1 else 1))
    check(f"summary (cuda_graph): every micro-batch outside the window and step 1 replayed the graph ({want})",
          summary.get("cuda_graph_replays") == want and summary.get("launches_per_step") == acc,
          (summary.get("cuda_graph_replays"), summary.get("launches_per_step")))
    ms = {r["step"]: r["step_time_ms"] for r in steps if r.get("step_time_ms") is not None}
    before = [ms[i] for i in range(3, first) if i in ms]
    after = [ms[i] for i in range(last + 2, n + 1) if i in ms]
    inside = [ms[i] for i in range(first, last + 1) if i in ms]
    if len(before) >= 3 and len(after) >= 3:
        b, a = statistics.median(before), statistics.median(after)
        print(f"  step time median: before the window {b:.3f} ms, traced (eager) "
              f"{statistics.median(inside) if inside else float('nan'):.3f} ms, after {a:.3f} ms")
        if os.environ.get("SPEED", "1") != "0":  # SPEED=0: the steps before and after differ in work
            check("step time (cuda_graph): the steps after the window run at the graph's speed again "
                  "(median within 25% of the steps before it)", 0.8 <= a / b <= 1.25, (b, a))
    else:
        print("  (too few steps before or after the window to compare graph speed)")


def safetensors(path):
    """{name: (dtype, shape, bytes)} and the metadata of a .safetensors file."""
    raw = open(path, "rb").read()
    n = struct.unpack("<Q", raw[:8])[0]
    head = json.loads(raw[8:8 + n])
    meta = head.pop("__metadata__", {})
    return {k: (v["dtype"], v["shape"], raw[8 + n + v["data_offsets"][0]:8 + n + v["data_offsets"][1]])
            for k, v in head.items()}, meta


def floats(dtype, b):
    if dtype == "F32":
        return struct.unpack(f"<{len(b) // 4}f", b)
    if dtype == "F64":
        return struct.unpack(f"<{len(b) // 8}d", b)
    if dtype == "F16":
        return struct.unpack(f"<{len(b) // 2}e", b)
    if dtype == "BF16":
        return [struct.unpack("<f", b"\0\0" + b[i:i + 2])[0] for i in range(0, len(b), 2)]
    return None


def same_as(other):
    """The same training, bitwise (or within SAME_TOL): checkpoint and logged losses."""
    tol = float(os.environ.get("SAME_TOL", "0"))
    a, ma = safetensors(f"{run}/checkpoint.safetensors")
    b, mb = safetensors(f"{other}/checkpoint.safetensors")
    check("same run: the checkpoints hold the same tensors", a.keys() == b.keys(), sorted(a.keys() ^ b.keys())[:4])
    differ, worst = [], (0.0, None)
    for k in sorted(a.keys() & b.keys()):
        if a[k][:2] != b[k][:2]:
            differ.append(k)
            continue
        if a[k][2] == b[k][2]:
            continue
        differ.append(k)
        x, y = floats(a[k][0], a[k][2]), floats(b[k][0], b[k][2])
        if x is not None:
            d = math.sqrt(sum((p - q) ** 2 for p, q in zip(x, y))) / max(math.sqrt(sum(p * p for p in x)), 1e-30)
            worst = max(worst, (d, k), key=lambda t: t[0])
    weights = [k for k in differ if not k.startswith("optimizer.")]
    print(f"  same run: {len(differ)} of {len(a)} tensors differ ({len(weights)} weights); worst {worst[1]} "
          f"{worst[0]:.2e} relative")
    if tol == 0:
        check("same run: weights and optimizer state bitwise equal", not differ, differ[:4])
    else:
        check(f"same run: weights and optimizer state within {tol:g} relative", worst[0] <= tol
              and not [k for k in differ if a[k][:2] != b[k][:2]], worst)
    keys = ("step", "loss_scale", "skipped_steps")
    check("same run: the checkpoint's step, loss scale and skipped steps", all(ma.get(k) == mb.get(k) for k in keys),
          [(k, ma.get(k), mb.get(k)) for k in keys])
    other_rows = {r["step"]: r for r in map(json.loads, open(f"{other}/metrics.jsonl")) if "loss" in r}
    bad = [(r["step"], r["loss"], other_rows.get(r["step"], {}).get("loss")) for r in steps
           if r["step"] not in other_rows or not (r["loss"] == other_rows[r["step"]]["loss"]
                                                   or abs(r["loss"] - other_rows[r["step"]]["loss"]) <= tol * abs(r["loss"]))
           or r.get("loss_scale") != other_rows[r["step"]].get("loss_scale")]
    check(f"same run: every logged loss and loss scale equal ({len(steps)} steps)", steps and not bad, bad[:3])


# ------------------------------------------------------------ trace.json
path = f"{run}/trace.json"
if os.path.exists(path):
    try:
        ev = json.load(open(path))["traceEvents"]
        check("trace: trace.json is Chrome trace-event JSON", True)
    except (ValueError, KeyError) as e:
        ev = []
        check("trace: trace.json is Chrome trace-event JSON", False, e)
    first, last = (int(x) for x in os.environ.get("TRACE", "10-14").split("-"))
    want = [f"step {i}" for i in range(first, last + 1)]
    gpu = [e for e in ev if e.get("cat") == "step" and e["pid"] % 2 == 1]
    host = [e for e in ev if e.get("cat") == "step" and e["pid"] % 2 == 0]
    check("trace: one GPU and one host slice per traced step", [e["name"] for e in gpu] == want
          and [e["name"] for e in host] == want, ([e["name"] for e in gpu], [e["name"] for e in host]))
    by_step = {r["step"]: r for r in steps}
    check("trace: each GPU step's time is metrics.jsonl's", all(
        abs(e["dur"] / 1e3 - by_step[int(e["name"].split()[1])]["step_time_ms"]) < 2e-3 * max(1, e["dur"] / 1e3)
        for e in gpu), [(e["name"], e["dur"]) for e in gpu])
    rows = [l.split() for l in open(f"{run}/plan.txt").read().split("\n")[2:] if l.startswith("  ") and len(l.split()) > 3]
    plan = [r[0] for r in rows if r[2] != "update"]  # the nodes (grad_clip and optimizer: the update's rows)
    ops = [e for e in ev if e.get("cat") == "op"]
    names = [e["name"] for e in ops]
    per_step = len(plan) + 1  # the nodes, then "optimizer + scaler" (the update: clipping, optimizer, scaler)
    check("trace: every node of the plan per traced step, named as in plan.txt, with engine",
          len(ops) == per_step * len(want)
          and names == (plan + ["optimizer + scaler"]) * len(want)
          and all(e["args"].get("engine") for e in ops), (len(ops), per_step, names[:4], plan[:4]))
    inside = all(any(g["ts"] - 1 <= o["ts"] and o["ts"] + o["dur"] <= g["ts"] + g["dur"] + 1 for g in gpu) for o in ops)
    check("trace: the op slices lie inside their step's GPU slice", inside)
    lane = {(e["pid"], e["tid"]) for e in ops}
    compute = {(e["pid"], e["tid"]) for e in ev if e["ph"] == "M" and e["name"] == "thread_name"
               and e["args"]["name"] == "compute stream"}
    check("trace: the op slices are on the compute stream's lane", ops and lane <= compute, (lane, compute))
    check("trace: its cost is on the page and in the summary",
          "What tracing cost: the traced steps' median device step time" in open(f"{run}/report.html").read())
    # data made on the device (data.on_device = true: gpu_suite's synthetic resnet50) has no
    # loader, pinned copy or data wait: those lanes are checked where a loader runs
    cfg = configparser.ConfigParser(inline_comment_prefixes=(";", "#"), strict=False, interpolation=None)
    cfg.read(f"{run}/config.ini")
    if cfg.get("data", "on_device", fallback="false").strip() == "true":
        print("  trace: data made on the device: no loader lanes to check")
    else:
        copies = [e for e in ev if e.get("cat") == "copy" and e["pid"] % 2 == 0]
        waits = [e for e in ev if e.get("cat") == "wait" and e["name"] == "data wait"]
        check("trace: the pinned copy and the data wait of each traced step on the host lane",
              len(copies) == len(want) and len(waits) == len(want), (len(copies), len(waits)))
        workers = {e["tid"] for e in ev if e.get("cat") == "loader"}
        named = {e["tid"] for e in ev if e["ph"] == "M" and e["name"] == "thread_name" and "loader worker" in e["args"]["name"]}
        check("trace: loader worker lanes, named", workers and workers <= named, (workers, named))
        starts = {e["id"] for e in ev if e["ph"] == "s"}
        ends = [e["id"] for e in ev if e["ph"] == "f"]
        check("trace: an arrow from each used batch's decode to its step", len(ends) == len(want) and set(ends) <= starts,
              (ends, sorted(starts)[:10]))

    cfg_graph = configparser.ConfigParser(inline_comment_prefixes=(";", "#"), strict=False, interpolation=None)
    cfg_graph.read(f"{run}/config.ini")
    if os.environ.get("GRAPH") or (cfg_graph.get("run", "cuda_graph", fallback="false").strip() == "true"
                                   and 0 < summary.get("launches_per_step", 0) <= int(cfg_graph.get("run", "accumulate", fallback="1").split()[0])):
        graph_checks(cfg_graph, ev, gpu, first, last)


if os.environ.get("SAME_AS"):
    same_as(os.environ["SAME_AS"])

print(f"[  PASSED  ] {passed} test(s).")
if failed:
    print(f"[  FAILED  ] {failed} test(s), listed above")
sys.exit(1 if failed else 0)
