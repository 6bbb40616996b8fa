#!/usr/bin/env python3
"""tools/ncu_summary.py: one line per kernel launch of an `ncu` text report
(sections SpeedOfLight, Occupancy, LaunchStats): name and template
arguments, grid x block, duration, DRAM and SM throughput (% of peak),
achieved occupancy and registers per thread. Which of memory, instructions
or latency bounds a kernel is the first thing to know before changing it
(BENCHMARKS.md run 18: max pool was instruction-bound, the batch norms'
backward latency-bound).

Usage: ncu_summary.py NCU_OUTPUT.txt
"""
import re
import sys


def field(block, name):
    m = re.search(r"^\s+" + re.escape(name) + r"\s+\S+\s+([\d.,]+)\s*$", block, re.M)
    return m.group(1) if m else "-"


def main(path):
    text = open(path, errors="replace").read()
    # a launch's header: "  void ns::kernel<...>(args) (gx, gy, gz)x(bx, by, bz), Context ..."
    heads = list(re.finditer(r"^  (\S.*?) \((\d+, \d+, \d+)\)x\((\d+, \d+, \d+)\), Context", text, re.M))
    if not heads:
        print(f"{path}: no kernel launches (ncu failed? its last lines:)")
        print("\n".join(text.splitlines()[-5:]))
        return 1
    print(f"{'kernel':<44} {'grid':>14} {'block':>11} {'us':>9} {'DRAM%':>6} {'SM%':>6} {'occ%':>6} {'regs':>5}")
    for i, h in enumerate(heads):
        block = text[h.end(): heads[i + 1].start() if i + 1 < len(heads) else len(text)]
        sig = re.sub(r"\(.*", "", h.group(1)).replace("void ", "")
        sig = re.sub(r"^(<unnamed>|\(anonymous namespace\))::", "", sig)
        print(f"{sig[:44]:<44} {h.group(2):>14} {h.group(3):>11} {field(block, 'Duration'):>9} "
              f"{field(block, 'DRAM Throughput'):>6} {field(block, 'Compute (SM) Throughput'):>6} "
              f"{field(block, 'Achieved Occupancy'):>6} {field(block, 'Registers Per Thread'):>5}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]) if len(sys.argv) == 2 else (print(__doc__) or 2))
