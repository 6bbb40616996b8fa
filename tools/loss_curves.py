#!/usr/bin/env python3
"""tools/loss_curves.py: compare the per-step losses of runs (their
metrics.jsonl) with a baseline run's, for the GPU suite's checks that a
change of kernels or of execution (CUDA graphs, fused kernels) keeps the
math: how many steps are identical, and the relative difference of the loss
(median, 90th percentile, the first 10 steps' max, the max).

Usage: loss_curves.py LABEL BASE.jsonl NAME=OTHER.jsonl [NAME=OTHER.jsonl ...]
"""
import json
import sys


def rows(path):
    try:
        with open(path) as f:
            return {r["step"]: r for r in map(json.loads, f) if "step" in r and "loss" in r}
    except OSError:
        return {}


def compare(base, other, name):
    steps = sorted(set(base) & set(other))
    if not steps:
        return f"  {name}: no steps to compare"
    d = [abs(base[s]["loss"] - other[s]["loss"]) / max(abs(base[s]["loss"]), 1e-3) for s in steps]
    q = sorted(d)
    same = sum(base[s]["loss"] == other[s]["loss"] for s in steps)
    last = steps[-1]
    skipped = other[last].get("skipped_steps")
    return (f"  {name}: {len(steps)} steps, {same} identical, final loss {other[last]['loss']:.4f}; relative "
            f"difference median {q[len(q) // 2]:.3g}, 90th pct {q[int(0.9 * len(q))]:.3g}, first 10 steps max "
            f"{max(d[:10]):.3g}, max {q[-1]:.3g}" + (f"; skipped steps {skipped:g}" if skipped is not None else ""))


def main(argv):
    if len(argv) < 4 or any("=" not in a for a in argv[3:]):
        sys.exit(__doc__.split("Usage: ")[1])
    base = rows(argv[2])
    if not base:
        print(f"{argv[1]}: no losses in {argv[2]}")
        return
    st = sorted(base)
    skipped = base[st[-1]].get("skipped_steps")
    print(f"{argv[1]}: baseline loss {base[st[0]]['loss']:.4f} -> {base[st[-1]]['loss']:.4f}"
          + (f", skipped steps {skipped:g}" if skipped is not None else ""))
    for spec in argv[3:]:
        name, path = spec.split("=", 1)
        print(compare(base, rows(path), name))


if __name__ == "__main__":
    main(sys.argv)
