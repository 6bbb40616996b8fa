#!/usr/bin/env python3
"""tools/overlap_torch.py: does running the weight gradients on a second
stream pay off? Before stoke's executor learns to fork a backward node's
weight-gradient product onto a side stream, this measures the idea on the
same GPU with PyTorch's own cuBLAS and cuDNN calls (no stoke code): the
backward's products of GPT-2 124M (B 16, T 1024) and ResNet-18c's
convolutions (batch 512, 32 px), captured as one CUDA graph each, in three
schedules:

  seq       every layer's dgrad then wgrad on one stream (stoke today)
  pair      the wgrad forked onto a side stream, joined at the layer's end
  deferred  the wgrads on the side stream, joined once at the graph's end

Between layers a memory-bound pass (a multiply over dx, like a norm's
backward) stands in for what separates the products in a real step. Prints
the median of REPS timed replays for each schedule and the ratio to seq.

  python3 tools/overlap_torch.py [gpt|resnet18c|all] [--reps N]
"""
import argparse
import statistics

import torch
import torch.nn.functional as F


def gpt_layers(B=16, T=1024, C=768, L=12):
    n = B * T
    shapes = [(4 * C, C), (C, 4 * C), (C, C), (C, 3 * C)]  # backward order: mlp.c_proj, c_fc, attn.c_proj, c_attn
    out = []
    for _ in range(L):
        for k, o in shapes:  # y[n, o] = x[n, k] W[o, k]^T
            out.append(("linear", n, k, o))
    return out


def resnet18c_layers(N=512):
    # (kind, N, C_in, C_out, H_in, stride) in the forward order; the backward runs them reversed
    spec = [("conv", N, 3, 64, 32, 1)]
    c, h = 64, 32
    for co, st in ((64, 1), (128, 2), (256, 2), (512, 2)):
        for b in range(2):
            s = st if b == 0 else 1
            spec.append(("conv", N, c, co, h, s))
            h2 = h // s
            spec.append(("conv", N, co, co, h2, 1))
            c, h = co, h2
    return list(reversed(spec))


def make_ops(layers, dt, dev):
    """Per layer: dgrad(), wgrad() and a memory pass, closures over fixed tensors."""
    ops = []
    for lay in layers:
        if lay[0] == "linear":
            _, n, k, o = lay
            x = torch.randn(n, k, device=dev, dtype=dt)
            w = torch.randn(o, k, device=dev, dtype=dt) * 0.02
            dy = torch.randn(n, o, device=dev, dtype=dt)
            dx = torch.empty(n, k, device=dev, dtype=dt)
            dw = torch.empty(o, k, device=dev, dtype=dt)
            m = torch.randn(n, k, device=dev, dtype=dt)
            ops.append((lambda dy=dy, w=w, dx=dx: torch.mm(dy, w, out=dx),
                        lambda dy=dy, x=x, dw=dw: torch.mm(dy.t(), x, out=dw),
                        lambda dx=dx, m=m: dx.mul_(m)))
        else:
            _, N, ci, co, h, s = lay
            x = torch.randn(N, ci, h, h, device=dev, dtype=dt).to(memory_format=torch.channels_last)
            w = (torch.randn(co, ci, 3, 3, device=dev, dtype=dt) * 0.05).to(memory_format=torch.channels_last)
            y = F.conv2d(x, w, stride=s, padding=1)
            dy = torch.randn_like(y)
            m = torch.randn_like(x)

            def dgrad(dy=dy, x=x, w=w, s=s):
                return torch.ops.aten.convolution_backward(dy, x, w, None, [s, s], [1, 1], [1, 1], False, [0, 0], 1,
                                                           [True, False, False])[0]

            def wgrad(dy=dy, x=x, w=w, s=s):
                return torch.ops.aten.convolution_backward(dy, x, w, None, [s, s], [1, 1], [1, 1], False, [0, 0], 1,
                                                           [False, True, False])[1]

            ops.append((dgrad, wgrad, lambda m=m: m.mul_(1.0)))
    return ops


def schedule(ops, how, side):
    main = torch.cuda.current_stream()
    for dgrad, wgrad, memp in ops:
        if how == "seq":
            dgrad()
            wgrad()
        else:
            side.wait_stream(main)  # the wgrad may start once this layer's dy exists
            with torch.cuda.stream(side):
                wgrad()
            dgrad()
            if how == "pair":
                main.wait_stream(side)
        memp()
    if how == "deferred":
        main.wait_stream(side)


def time_graph(ops, how, reps):
    side = torch.cuda.Stream()
    for _ in range(3):  # warm-up outside the graph (cuDNN's benchmark picks its algorithms here)
        schedule(ops, how, side)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    cap = torch.cuda.Stream()
    cap.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(cap):
        with torch.cuda.graph(g, stream=cap):
            schedule(ops, how, side)
    torch.cuda.synchronize()
    for _ in range(5):
        g.replay()
    times = []
    for _ in range(reps):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        g.replay()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    return statistics.median(times)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("what", nargs="?", default="all")
    p.add_argument("--reps", type=int, default=30)
    a = p.parse_args()
    torch.backends.cudnn.benchmark = True
    dev = torch.device("cuda")
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__, "cuDNN", torch.backends.cudnn.version())
    work = {"gpt": gpt_layers, "resnet18c": resnet18c_layers}
    for name in (work if a.what == "all" else [a.what]):
        ops = make_ops(work[name](), torch.bfloat16, dev)
        res = {}
        for rnd in range(2):  # two rounds, alternating, so drift shows
            for how in ("seq", "pair", "deferred"):
                res.setdefault(how, []).append(time_graph(ops, how, a.reps))
        base = statistics.median(res["seq"])
        for how, v in res.items():
            med = statistics.median(v)
            print(f"{name:10s} {how:9s} {med:8.3f} ms  rounds {' '.join(f'{t:.3f}' for t in v)}  seq/this {base / med:.4f}")
        del ops
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
