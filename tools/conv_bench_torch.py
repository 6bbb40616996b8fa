#!/usr/bin/env python3
# tools/conv_bench_torch.py: PyTorch's side of tests/gpu/conv_bench: the same
# ResNet convolutions (channels_last, cudnn.benchmark) forward, backward-data
# and backward-filter, median of 9 timed runs with CUDA events, in ms.
#   python3 conv_bench_torch.py rn50|rn18c [batch] [resolution] [bf16|f16|f32]
import sys
import torch

RN50 = [("stem 7x7/2", 3, 224, 64, 7, 2, 1), ("stem 7x7/2 C=4 (padded)", 4, 224, 64, 7, 2, 0),
        ("stem 7x7/2 C=8 (padded)", 8, 224, 64, 7, 2, 0), ("l1 1x1 64-64", 64, 56, 64, 1, 1, 1), ("l1 3x3 64", 64, 56, 64, 3, 1, 3),
        ("l1 1x1 64-256", 64, 56, 256, 1, 1, 4), ("l1 1x1 256-64", 256, 56, 64, 1, 1, 2),
        ("l2 1x1 256-128", 256, 56, 128, 1, 1, 1), ("l2 3x3/2 128", 128, 56, 128, 3, 2, 1),
        ("l2 1x1 128-512", 128, 28, 512, 1, 1, 4), ("l2 ds 1x1/2 256-512", 256, 56, 512, 1, 2, 1),
        ("l2 1x1 512-128", 512, 28, 128, 1, 1, 3), ("l2 3x3 128", 128, 28, 128, 3, 1, 3),
        ("l3 1x1 512-256", 512, 28, 256, 1, 1, 1), ("l3 3x3/2 256", 256, 28, 256, 3, 2, 1),
        ("l3 1x1 256-1024", 256, 14, 1024, 1, 1, 6), ("l3 ds 1x1/2 512-1024", 512, 28, 1024, 1, 2, 1),
        ("l3 1x1 1024-256", 1024, 14, 256, 1, 1, 5), ("l3 3x3 256", 256, 14, 256, 3, 1, 5),
        ("l4 1x1 1024-512", 1024, 14, 512, 1, 1, 1), ("l4 3x3/2 512", 512, 14, 512, 3, 2, 1),
        ("l4 1x1 512-2048", 512, 7, 2048, 1, 1, 3), ("l4 ds 1x1/2 1024-2048", 1024, 14, 2048, 1, 2, 1),
        ("l4 1x1 2048-512", 2048, 7, 512, 1, 1, 2), ("l4 3x3 512", 512, 7, 512, 3, 1, 2)]
RN18C = [("stem 3x3 3-64", 3, 32, 64, 3, 1, 1), ("stem 3x3 C=4 (padded)", 4, 32, 64, 3, 1, 0),
         ("stem 3x3 C=8 (padded)", 8, 32, 64, 3, 1, 0), ("l1 3x3 64", 64, 32, 64, 3, 1, 4),
         ("l2 3x3/2 64-128", 64, 32, 128, 3, 2, 1), ("l2 3x3 128", 128, 16, 128, 3, 1, 3),
         ("l2 ds 1x1/2 64-128", 64, 32, 128, 1, 2, 1), ("l3 3x3/2 128-256", 128, 16, 256, 3, 2, 1),
         ("l3 3x3 256", 256, 8, 256, 3, 1, 3), ("l3 ds 1x1/2 128-256", 128, 16, 256, 1, 2, 1),
         ("l4 3x3/2 256-512", 256, 8, 512, 3, 2, 1), ("l4 3x3 512", 512, 4, 512, 3, 1, 3),
         ("l4 ds 1x1/2 256-512", 256, 8, 512, 1, 2, 1)]


def timed(fn, reps=9):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    for _ in range(3):
        fn()
    ts = []
    for _ in range(reps):
        s.record()
        fn()
        e.record()
        e.synchronize()
        ts.append(s.elapsed_time(e))
    return sorted(ts)[reps // 2]


def main():
    net = sys.argv[1] if len(sys.argv) > 1 else "rn50"
    is50 = net != "rn18c"
    n = int(sys.argv[2]) if len(sys.argv) > 2 else (256 if is50 else 512)
    res = int(sys.argv[3]) if len(sys.argv) > 3 else (224 if is50 else 32)
    dt = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[sys.argv[4] if len(sys.argv) > 4 else "bf16"]
    torch.backends.cudnn.benchmark = True
    torch.backends.cudnn.allow_tf32 = False
    base = 224 if is50 else 32
    print(f"torch {torch.__version__} cuDNN {torch.backends.cudnn.version()} {net} batch {n} resolution {res} {dt}")
    print(f"{'conv':24s} {'uses':>4s} | {'fwd':>8s} {'dgrad':>8s} {'wgrad':>8s}")
    tot = [0.0, 0.0, 0.0]
    for what, c, h, k, r, stride, count in (RN50 if is50 else RN18C):
        h = h * res // base
        pad = r // 2
        x = torch.randn(n, c, h, h, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
        w = torch.randn(k, c, r, r, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
        y = torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)
        dy = torch.randn_like(y)
        args = (dy, x, w, None, [stride] * 2, [pad] * 2, [1, 1], False, [0, 0], 1)
        t = [timed(lambda: torch.nn.functional.conv2d(x, w, stride=stride, padding=pad)),
             timed(lambda: torch.ops.aten.convolution_backward(*args, [True, False, False])),
             timed(lambda: torch.ops.aten.convolution_backward(*args, [False, True, False]))]
        for i in range(3):
            tot[i] += t[i] * count
        print(f"{what:24s} {count:4d} | {t[0]:8.3f} {t[1]:8.3f} {t[2]:8.3f}", flush=True)
    print(f"TOTAL per step (uses counted): torch fwd {tot[0]:.2f} dgrad {tot[1]:.2f} wgrad {tot[2]:.2f} = {sum(tot):.2f} ms")


if __name__ == "__main__":
    main()
