#!/usr/bin/env python3
"""tools/kernel_trace.py: reads tools/kernel_trace.c's CSV (every kernel a
process ran, with its device start and end) and says where a training
step's time goes: the wall time a step, the time no kernel ran, the compute
stream's gaps between kernels, the memsets and the waits around them, and
the kernels by family and by name.

The steps are found without markers: the compute stream (the stream with the
most kernels in the trace's last fifth) runs the same sequence of kernels every step, so the period is
the shift under which the names repeat, and the last K whole periods of the
longest repeating stretch are the steps measured (autotuning, start-up and
the end's evaluation or checkpoint stay out). Every stream's kernels that
start within those periods count, so a second stream's overlap shows as
kernel time above the busy time.

  kernel_trace.py TRACE.csv [--steps K] [--top N] [--list] [--family REGEX]
--list prints one step's kernels in order with the gap before each and its grid;
--family REGEX restricts that list to names matching it (a family's word or
a kernel's name).
"""
import argparse
import re
import shutil
import subprocess
import sys

FAMILIES = [
    ("convolution", r"xmma_(fprop|dgrad|wgrad)|implicit|conv|cudnn|cask|nchwToNhwc|nhwcToNchw|nhwcAddPadding|unfold"),
    ("attention", r"fmha|flash|sdpa|attention"),
    ("batch norm", r"k_stats|k_apply|k_gsum|k_fin_fwd|k_fin_bwd|k_dx|batch_norm"),
    ("layer norm", r"layer_norm|layernorm|\bln_"),
    ("optimizer", r"sgd|adam|multi_tensor|foreach|optim"),
    ("GEMM", r"gemm|cutlass|cublas|nvjet|sm90_xmma"),
    ("triton (other)", r"triton"),
    ("copy / memset", r"^memcpy|^memset"),
]


def family(name):
    for fam, rx in FAMILIES:
        if re.search(rx, name, re.I):
            return fam
    return "other"


def demangle(names):
    tool = shutil.which("c++filt") or shutil.which("cu++filt")
    if not tool or not names:
        return {n: n for n in names}
    try:
        res = subprocess.run([tool], input="\n".join(names), capture_output=True, text=True, timeout=60)
        out = res.stdout.splitlines()
        if len(out) == len(names):
            return dict(zip(names, out))
    except (OSError, subprocess.SubprocessError):
        pass
    return {n: n for n in names}


def short(name):
    m = re.search(r"(fprop|dgrad|wgrad)\w*?tilesize(\w+?)_", name)
    if m:
        return f"cudnn xmma {m.group(1)} {m.group(2)}"
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::", "", name)
    name = re.sub(r"\(.*$", "", name)  # the argument list
    return name[:90]


def load(path):
    rows = []
    with open(path, errors="replace") as f:
        next(f, None)
        for line in f:
            p = line.rstrip("\n").split(",", 11)
            if len(p) < 12:
                continue
            rows.append((p[0], int(p[1]), int(p[2]), int(p[3]), p[11], f"{p[5]}x{p[6]}x{p[7]}"))
    rows.sort(key=lambda r: r[1])
    return rows


def prefix_function(seq):
    pi = [0] * len(seq)
    for i in range(1, len(seq)):
        k = pi[i - 1]
        while k and seq[i] != seq[k]:
            k = pi[k - 1]
        if seq[i] == seq[k]:
            k += 1
        pi[i] = k
    return pi


def find_period(names, tail_skip=300, most=40000):
    """The period p (kernels a step) and the last index j of the longest
    stretch at the trace's end (up to tail_skip kernels after it left out:
    an evaluation, the checkpoint) that repeats with period p at least 3
    times. One stream's kernels run in launch order, so the repetition is
    exact; the prefix function of the reversed names gives, for each length
    L of the end, its smallest period L - pi[L - 1]."""
    ids = {}
    seq = [ids.setdefault(n, len(ids)) for n in names[-most:]]
    off = len(names) - len(seq)
    best = None
    for t in range(0, min(tail_skip, len(seq) // 2)):
        rev = seq[::-1][t:]
        pi = prefix_function(rev)
        for L in range(len(rev), 0, -1):
            per = L - pi[L - 1]
            if L >= 3 * per and per >= 4:
                if best is None or L > best[2]:
                    best = (per, off + len(seq) - 1 - t, L)
                break
        if best and best[2] > 20 * best[0]:
            break
    return best


def union(intervals):
    total, cur_s, cur_e = 0, None, None
    for s, e in sorted(intervals):
        if cur_e is None or s > cur_e:
            if cur_e is not None:
                total += cur_e - cur_s
            cur_s, cur_e = s, e
        else:
            cur_e = max(cur_e, e)
    if cur_e is not None:
        total += cur_e - cur_s
    return total


def memset_waits(win, k, gaps):
    """The step's memsets and the waits around them on their own stream (run 33: in a CUDA graph replay a memset
    node starts about 3.5 us after the operation before it and holds the next one about 3.4 us, where kernels
    follow each other within 0.1-0.3 us), beside the compute stream's median kernel-to-kernel gap."""
    per = {}
    for r in win:
        per.setdefault(r[3], []).append(r)
    dur, before, after = [], [], []
    for ops in per.values():
        for i, r in enumerate(ops):
            if r[0] != "S":
                continue
            dur.append(r[2] - r[1])
            # waits of 50 us or more are for another stream (a graph's branch streams run a step's
            # branches one after another), not around the memset
            if i > 0 and r[1] - ops[i - 1][2] < 50000:
                before.append(max(0, r[1] - ops[i - 1][2]))
            if i + 1 < len(ops) and ops[i + 1][1] - r[2] < 50000:
                after.append(max(0, ops[i + 1][1] - r[2]))
    if not dur:
        return
    med = lambda v: sorted(v)[len(v) // 2] / 1e3 if v else float("nan")
    print(f"  memsets: {len(dur) / k:.0f} a step, {med(dur):.1f} us each (median); on their stream the operation "
          f"before ends {med(before):.1f} us before one, the next starts {med(after):.1f} us after it (waits under "
          f"50 us) "
          f"(compute stream's kernels: {med(gaps):.1f} us apart, median)")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("trace")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--top", type=int, default=25)
    ap.add_argument("--list", action="store_true")
    ap.add_argument("--family", default="")
    a = ap.parse_args()
    rows = load(a.trace)
    kern = [r for r in rows if r[0] == "K"]
    if not kern:
        print(f"{a.trace}: no kernels recorded")
        return 1
    # the compute stream: the most kernels among the trace's last fifth (PyTorch's warm-up and compilation run
    # eagerly on one stream, its timed steps as CUDA graph replays on another)
    streams = {}
    for r in kern[-max(1, len(kern) // 5):]:
        streams[r[3]] = streams.get(r[3], 0) + 1
    main_stream = max(streams, key=streams.get)
    comp = [r for r in kern if r[3] == main_stream]
    found = find_period([r[4] for r in comp])
    if not found:
        print(f"{a.trace}: no repeating step found in {len(comp)} kernels of stream {main_stream}")
        return 1
    p, j, run = found
    k = max(1, min(a.steps, run // p - 1))
    t0, t1 = comp[j - k * p][2], comp[j][2]
    win = [r for r in rows if t0 < r[1] <= t1 or (r[1] <= t0 < r[2])]
    wall = (t1 - t0) / k / 1e6
    busy = union([(max(r[1], t0), min(r[2], t1)) for r in win]) / k / 1e6
    ksum = sum(min(r[2], t1) - max(r[1], t0) for r in win) / k / 1e6
    step_comp = [r for r in comp if t0 < r[2] <= t1]
    gaps = [b[1] - a_[2] for a_, b in zip(step_comp, step_comp[1:]) if b[1] > a_[2]]
    hist = [(lo, hi, [g for g in gaps if lo <= g < hi]) for lo, hi in
            ((0, 2000), (2000, 5000), (5000, 20000), (20000, 1 << 62))]
    dm = demangle(sorted({r[4] for r in win}))
    print(f"{a.trace}: {len(kern)} kernels in all; stream {main_stream} repeats every {p} kernels "
          f"({run // p} periods); the last {k} measured")
    print(f"  per step: wall {wall:.3f} ms, some kernel running {busy:.3f} ms, idle {wall - busy:.3f} ms "
          f"({100 * (wall - busy) / wall:.1f}%); kernel time {ksum:.3f} ms (above busy: streams overlapping)")
    print(f"  compute stream {main_stream}: {p} kernels a step, gaps between them {sum(gaps) / k / 1e6:.3f} ms a step: "
          + ", ".join(f"{len(g) / k:.0f} of {lo / 1e3:g}-{hi / 1e3:g} us" if hi < 1 << 62 else
                      f"{len(g) / k:.0f} over {lo / 1e3:g} us" for lo, hi, g in hist))
    memset_waits(win, k, gaps)
    fams, names = {}, {}
    for r in win:
        d = (min(r[2], t1) - max(r[1], t0)) / k / 1e3
        n = short(dm.get(r[4], r[4]))
        f = family(dm.get(r[4], r[4]))
        fams[f] = (fams.get(f, (0, 0))[0] + d, fams.get(f, (0, 0))[1] + 1 / k)
        names[n] = (names.get(n, (0, 0))[0] + d, names.get(n, (0, 0))[1] + 1 / k)
    print("  by family (ms a step, launches a step):")
    for f, (us, c) in sorted(fams.items(), key=lambda t: -t[1][0]):
        print(f"    {f:22s} {us / 1e3:8.3f}  {c:6.0f}")
    print(f"  the {a.top} largest kernels (ms a step, launches a step, mean us):")
    for n, (us, c) in sorted(names.items(), key=lambda t: -t[1][0])[:a.top]:
        print(f"    {us / 1e3:8.3f} {c:5.0f} {us / c:8.1f}  {n}")
    if a.list:
        print(f"  one step in order (stream, gap before it on its stream us, us, grid, name):")
        last = {}
        one = [r for r in win if r[1] >= comp[j - p][2]]
        for r in one:
            n = dm.get(r[4], r[4])
            gap = (r[1] - last[r[3]]) / 1e3 if r[3] in last else 0.0
            last[r[3]] = r[2]
            if a.family and not re.search(a.family, family(n) + " " + n, re.I):
                continue
            print(f"    {r[3]:3d} {gap:7.1f} {(r[2] - r[1]) / 1e3:8.1f} {r[5]:>14s}  {short(n)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
