#!/usr/bin/env python3
"""tools/ncu_step.py: one training step's kernels, stoke's beside PyTorch's,
each kernel timed by Nsight Compute under the same options (serialized,
clocks locked to base, caches left as the step left them), so that the
convolutions each side chose can be set side by side kernel by kernel.
torch.profiler's sums (tools/torch_op_profile.py) and stoke's per-op
profile time different things (kernels alone against events around nodes);
this times the same thing on both sides.

Capture (on the GPU machine; tools/gpu_suite.sh part `ncustep` runs these):
  ncu --csv --page raw --metrics gpu__time_duration.sum --print-units base \
      --clock-control base --cache-control none --nvtx --nvtx-include "step 3/" \
      train examples/resnet18c.ini run.steps=4 run.cuda_graph=false \
      run.wgrad_stream=0 run.nvtx=true > stoke.csv
  NCU=1 ncu ... --profile-from-start off \
      python3 torch_op_profile.py ANCHORS resnet18c bf16+compile > torch.csv
Compare:
  ncu_step.py stoke.csv torch.csv
"""
import csv
import re
import sys


def family(name):
    n = name.lower()
    if "triton" in n:
        return "triton (batch norm, relu, adds)"
    if re.search(r"xmma|implicit|conv|cudnn|cask|dgrad|wgrad|unfold", n):
        return "convolution"
    if re.search(r"k_stats|k_apply|k_gsum|k_fin_|k_dx|batch_norm|bn_", n):
        return "batch norm (stoke)"
    if re.search(r"sgd|adam|multi_tensor|foreach|optim", n):
        return "optimizer"
    if re.search(r"gemm|cutlass|cublas", n):
        return "GEMM"
    return "other"


def load(path):
    rows = []
    with open(path, errors="replace") as f:
        lines = [l for l in f if l.startswith('"')]
    rd = csv.reader(lines)
    head = next(rd, None)
    if not head:
        return rows
    ki, gi, ti = head.index("Kernel Name"), head.index("Grid Size"), head.index("gpu__time_duration.sum")
    for r in rd:
        try:
            us = float(r[ti].replace(",", "")) / 1e3  # ns
        except ValueError:
            continue  # the units row
        rows.append((r[ki], r[gi], us))
    return rows


def short(name):
    m = re.search(r"(fprop|dgrad|wgrad)\w*?tilesize(\w+?)_", name)
    if m:
        return f"xmma {m.group(1)} {m.group(2)}"
    name = re.sub(r"^void ", "", name)
    name = re.sub(r"\(anonymous namespace\)::|<unnamed>::", "", name)
    return name[:60]


def main(argv):
    sides = [(p, load(p)) for p in argv[1:]]
    for path, rows in sides:
        fam = {}
        for name, _, us in rows:
            f = family(name)
            fam[f] = (fam.get(f, (0, 0))[0] + us, fam.get(f, (0, 0))[1] + 1)
        print(f"{path}: {len(rows)} kernels, {sum(r[2] for r in rows) / 1e3:.3f} ms")
        for f, (us, n) in sorted(fam.items(), key=lambda t: -t[1][0]):
            print(f"  {f:34s} {n:4d} kernels {us / 1e3:8.3f} ms")
    for path, rows in sides:
        print(f"\n{path}: convolution kernels in launch order (us, grid)")
        for i, (name, grid, us) in enumerate(r for r in rows if family(r[0]) == "convolution"):
            print(f"  {i:3d} {us:8.1f}  {grid:>16s}  {short(name)}")
    return 0 if all(rows for _, rows in sides) else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv))
