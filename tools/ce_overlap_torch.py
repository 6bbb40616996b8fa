#!/usr/bin/env python3
"""tools/ce_overlap_torch.py: what does a gradient exchange beside the
backward cost the backward's products, when NCCL's kernels move the bytes
and when the copy engines do? (BENCHMARKS.md run 27: on two H200s the
buckets' all-reduces overlapped with the backward gain nothing over running
them all after it: what the overlap hides, NCCL's kernels beside the GEMMs
cost back.) One process, two GPUs, PyTorch's own cuBLAS and NCCL (no stoke
code). Each GPU runs GPT-2 124M's backward products (B 16, T 1024: 12
layers x 4 linears, dgrad and wgrad) on its compute stream; after every
`--every` layers a bucket of the gradients (237 MiB of bf16 in all, split
evenly) is exchanged on a side stream, as a data-parallel step would:

  none   no exchange: the products alone
  nccl   torch.cuda.nccl.all_reduce of the bucket (NCCL's ring kernels)
  ce     a reduce-scatter and all-gather by peer copies over NVLink (copy
         engines) around one add kernel a GPU: half the bucket copied to
         the peer, added there, the sum copied back
  ce0 / nccl0: the same exchange alone, no products

Prints the median over REPS runs of: the products' time on GPU 0 (events
on its compute stream) and the whole step (until both streams of both GPUs
are done).

  python3 tools/ce_overlap_torch.py [--reps N] [--every K]
"""
import argparse
import statistics

import torch

B, T, C, L = 16, 1024, 768, 12
GRAD_ELEMS = 124_475_904  # GPT-2 124M's parameters (the padded vocabulary), bf16 gradients


def layers():
    shapes = [(4 * C, C), (C, 4 * C), (C, C), (C, 3 * C)]  # backward order: mlp.c_proj, c_fc, attn.c_proj, c_attn
    return [shapes[i % 4] for i in range(4 * L)]


class Gpu:
    def __init__(self, d):
        self.d = d
        torch.cuda.set_device(d)
        self.dev = torch.device("cuda", d)
        n = B * T
        self.acts = {}
        for k, o in set(layers()):
            self.acts[(k, o)] = (torch.randn(n, k, device=self.dev, dtype=torch.bfloat16),
                                 torch.randn(n, o, device=self.dev, dtype=torch.bfloat16),
                                 torch.randn(o, k, device=self.dev, dtype=torch.bfloat16))
        self.grads = torch.randn(GRAD_ELEMS, device=self.dev, dtype=torch.bfloat16)
        self.scratch = torch.empty(GRAD_ELEMS // 2 + 64, device=self.dev, dtype=torch.bfloat16)
        self.compute = torch.cuda.Stream(self.dev)
        self.comm = torch.cuda.Stream(self.dev)

    def products(self, i):
        k, o = layers()[i]
        x, dy, w = self.acts[(k, o)]
        dx = dy @ w          # dgrad [n, k]
        dw = dy.t() @ x      # wgrad [o, k]
        return dx, dw


def each_waits_for_other(g0, g1):
    """Each GPU's comm stream waits for what the other's has queued so far."""
    e0, e1 = torch.cuda.Event(), torch.cuda.Event()
    e0.record(g0.comm)
    e1.record(g1.comm)
    g0.comm.wait_event(e1)
    g1.comm.wait_event(e0)


def run(gpus, mode, n_buckets_every):
    """One step: returns (products ms on GPU 0, step ms)."""
    nl = 4 * L
    per = max(1, n_buckets_every * 4)
    n_b = (nl + per - 1) // per
    bsz = (GRAD_ELEMS // n_b) // 2 * 2
    start = [torch.cuda.Event(enable_timing=True) for _ in gpus]
    pend = [torch.cuda.Event(enable_timing=True) for _ in gpus]
    for g in gpus:
        torch.cuda.set_device(g.d)
        g.compute.wait_stream(torch.cuda.current_stream(g.dev))
        g.comm.wait_stream(torch.cuda.current_stream(g.dev))
        start[g.d].record(g.compute)
    b = -1  # the bucket being exchanged
    for i in range(nl):
        for g in gpus:
            torch.cuda.set_device(g.d)
            with torch.cuda.stream(g.compute):
                if mode not in ("nccl0", "ce0"):
                    g.products(i)
        if (i + 1) % per == 0 or i == nl - 1:
            evs = []
            for g in gpus:
                e = torch.cuda.Event()
                e.record(g.compute)
                evs.append(e)
            b += 1
            lo = b * bsz
            hi = min(GRAD_ELEMS, lo + bsz)
            if mode in ("nccl", "nccl0"):
                for g in gpus:
                    g.comm.wait_event(evs[g.d])
                torch.cuda.nccl.all_reduce([g.grads[lo:hi] for g in gpus], streams=[g.comm for g in gpus])
            elif mode in ("ce", "ce0"):
                half = (hi - lo) // 2
                g0, g1 = gpus
                for g in gpus:
                    g.comm.wait_event(evs[0])
                    g.comm.wait_event(evs[1])
                # reduce-scatter: GPU 0 owns the first half, GPU 1 the second
                with torch.cuda.stream(g0.comm):
                    g1.scratch[:half].copy_(g0.grads[lo + half:lo + 2 * half], non_blocking=True)
                with torch.cuda.stream(g1.comm):
                    g0.scratch[:half].copy_(g1.grads[lo:lo + half], non_blocking=True)
                each_waits_for_other(g0, g1)
                with torch.cuda.stream(g0.comm):
                    g0.grads[lo:lo + half].add_(g0.scratch[:half])
                with torch.cuda.stream(g1.comm):
                    g1.grads[lo + half:lo + 2 * half].add_(g1.scratch[:half])
                each_waits_for_other(g0, g1)
                # all-gather: each sends its reduced half back
                with torch.cuda.stream(g0.comm):
                    g1.grads[lo:lo + half].copy_(g0.grads[lo:lo + half], non_blocking=True)
                with torch.cuda.stream(g1.comm):
                    g0.grads[lo + half:lo + 2 * half].copy_(g1.grads[lo + half:lo + 2 * half], non_blocking=True)
    for g in gpus:
        pend[g.d].record(g.compute)
    for g in gpus:
        torch.cuda.set_device(g.d)
        torch.cuda.current_stream(g.dev).wait_stream(g.comm)
        torch.cuda.current_stream(g.dev).wait_stream(g.compute)
    ends = []
    for g in gpus:
        e = torch.cuda.Event(enable_timing=True)
        e.record(torch.cuda.current_stream(g.dev))
        ends.append(e)
    for g in gpus:
        torch.cuda.synchronize(g.dev)
    prod = start[0].elapsed_time(pend[0])
    step = max(start[g.d].elapsed_time(ends[g.d]) for g in gpus)
    return prod, step


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--every", type=int, default=2, help="layers between buckets")
    a = ap.parse_args()
    if torch.cuda.device_count() < 2:
        raise SystemExit("ce_overlap_torch: needs two GPUs")
    gpus = [Gpu(0), Gpu(1)]
    print(f"GPT-2 124M backward products (B {B}, T {T}) on 2 x {torch.cuda.get_device_name(0)}, "
          f"{GRAD_ELEMS * 2 / 2**20:.1f} MiB of bf16 gradients in buckets every {a.every} layers; "
          f"peer access 0->1: {torch.cuda.can_device_access_peer(0, 1)}")
    modes = ["none", "nccl", "ce", "nccl0", "ce0"]
    for m in modes:
        run(gpus, m, a.every)  # warm-up (NCCL's communicators, cuBLAS)
    res = {m: ([], []) for m in modes}
    for _ in range(a.reps):
        for m in modes:  # interleaved: clocks and neighbours the same for each
            p, s = run(gpus, m, a.every)
            res[m][0].append(p)
            res[m][1].append(s)
    base = statistics.median(res["none"][0])
    for m in modes:
        p, s = statistics.median(res[m][0]), statistics.median(res[m][1])
        print(f"{m:6s} products on GPU 0 {p:8.3f} ms ({p / base:.3f}x alone)   step {s:8.3f} ms")
    # the CE exchange's sums are right: every element of both GPUs' buckets the sum of the two
    torch.cuda.set_device(0)
    for g in gpus:
        g.grads.copy_(torch.full_like(g.grads, float(g.d + 1)))
    run(gpus, "ce0", a.every)
    ok = all(bool((g.grads == 3).all()) for g in gpus)
    print(f"ce exchange: every gradient 1 + 2 = 3 on both GPUs: {ok}")


if __name__ == "__main__":
    main()
