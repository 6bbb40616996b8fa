#!/usr/bin/env python3
"""tools/gemm_torch.py: PyTorch's time for GPT-2 124M's linear products
(B = 16, T = 1024: 16,384 tokens, bf16), the same products and operands'
kind (random) as tests/gpu/lt_gemm_bench, for the comparison in the same
device call. Median of 20 timed calls after 3 warm-up calls (CUDA events).
  python3 tools/gemm_torch.py [tokens]"""
import sys

import torch


def med(fn):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    ts = []
    for i in range(23):
        s.record()
        fn()
        e.record()
        e.synchronize()
        if i >= 3:
            ts.append(s.elapsed_time(e))
    ts.sort()
    return ts[len(ts) // 2]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 16384
    print(f"gemm_torch: torch {torch.__version__}, N = {n}, bf16")
    for name, k, o in (("c_attn", 768, 2304), ("attn.c_proj", 768, 768), ("c_fc", 768, 3072), ("mlp.c_proj", 3072, 768)):
        x = torch.rand(n, k, device="cuda", dtype=torch.bfloat16) * 2 - 1
        dy = torch.rand(n, o, device="cuda", dtype=torch.bfloat16) * 2 - 1
        w = torch.rand(o, k, device="cuda", dtype=torch.bfloat16) * 2 - 1
        flop = 2.0 * n * k * o
        for what, fn in (("fwd", lambda: x @ w.t()), ("dx", lambda: dy @ w), ("dW", lambda: dy.t() @ x)):
            ms = med(fn)
            print(f"torch {name} {what}: {ms:.4f} ms {flop / ms / 1e9:.1f} TFLOP/s")


if __name__ == "__main__":
    main()
