"""tests/e2e/observe_check.py: what a run writes to be looked at, checked
from outside: the TensorBoard event file (tfevents.py, and TensorBoard's
own reader where it is installed) against metrics.jsonl, and report.html
(well formed, self-contained, every plot with data). Prints cmocka-style
lines; exits non-zero on a failure.

    python3 observe_check.py RUN_DIR
"""
import configparser
import glob
import html.parser
import json
import math
import os
import re
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
                     ("perf/data_wait_ms", "data_wait_ms"), ("perf/host_ms", "host_ms"), ("perf/mfu", "mfu")]:
        same(tag, key, steps)
    if evals:
        same("eval/loss", "eval_loss", evals)
        same("eval/accuracy", "eval_accuracy", evals)
    else:
        print("(no evaluation in this run: eval/* not checked)")
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
    plan = [l.split()[0] for l in open(f"{run}/plan.txt").read().split("\n")[2:] if l.startswith("  ") and len(l.split()) > 3]
    ops = [e for e in ev if e.get("cat") == "op"]
    names = [e["name"] for e in ops]
    per_step = len(plan)  # the nodes, then "optimizer + scaler" (the plan's optimizer row)
    check("trace: every node of the plan per traced step, named as in plan.txt, with engine",
          len(ops) == per_step * len(want) and names[:per_step - 1] == plan[:per_step - 1]
          and all(e["args"].get("engine") for e in ops), (len(ops), per_step, names[:4], plan[:4]))
    inside = all(any(g["ts"] - 1 <= o["ts"] and o["ts"] + o["dur"] <= g["ts"] + g["dur"] + 1 for g in gpu) for o in ops)
    check("trace: the op slices lie inside their step's GPU slice", inside)
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

print(f"[  PASSED  ] {passed} test(s).")
if failed:
    print(f"[  FAILED  ] {failed} test(s), listed above")
sys.exit(1 if failed else 0)
