#!/usr/bin/env python3
# tools/conv1x1_gemm_torch.py: are ResNet-50's stride-1 1x1 convolutions
# faster as plain GEMMs (cuBLAS) than through cuDNN? In NHWC a 1x1 stride-1
# convolution is Y[M, K] = X[M, C] W[K, C]^T (M = N H W), its backward-data
# dX = dY W and its backward-filter dW = dY^T X. Times both ways, bf16,
# cudnn.benchmark, median of 15 CUDA-event timed runs, ms.
#   python3 conv1x1_gemm_torch.py [batch] [resolution]
import sys
import torch
import torch.nn.functional as F

from conv_bench_torch import timed  # median of CUDA-event timed runs (this folder)

# (name, C in, H at 224, K out, uses in one ResNet-50 step)
SHAPES = [("l1 1x1 64-64", 64, 56, 64, 1), ("l1 1x1 64-256", 64, 56, 256, 4), ("l1 1x1 256-64", 256, 56, 64, 2),
          ("l2 1x1 256-128", 256, 56, 128, 1), ("l2 1x1 128-512", 128, 28, 512, 4), ("l2 1x1 512-128", 512, 28, 128, 3),
          ("l3 1x1 512-256", 512, 28, 256, 1), ("l3 1x1 256-1024", 256, 14, 1024, 6),
          ("l3 1x1 1024-256", 1024, 14, 256, 5), ("l4 1x1 1024-512", 1024, 14, 512, 1),
          ("l4 1x1 512-2048", 512, 7, 2048, 3), ("l4 1x1 2048-512", 2048, 7, 512, 2)]


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 256
    res = int(sys.argv[2]) if len(sys.argv) > 2 else 224
    dt = torch.bfloat16
    torch.backends.cudnn.benchmark = True
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    print(f"torch {torch.__version__} cuDNN {torch.backends.cudnn.version()} batch {n} resolution {res} bf16")
    print(f"{'conv':18s} {'uses':>4s} | {'cudnn fwd':>9s} {'dgrad':>7s} {'wgrad':>7s} | {'gemm fwd':>9s} {'dgrad':>7s} {'wgrad':>7s}"
          f" | {'floor':>6s} | worst rel err")
    tot = [0.0] * 7
    for what, c, h, k, uses in SHAPES:
        h = h * res // 224
        m = n * h * h
        x = torch.randn(n, c, h, h, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
        w = torch.randn(k, c, 1, 1, device="cuda", dtype=dt).to(memory_format=torch.channels_last) / c ** 0.5
        dy = torch.randn(n, k, h, h, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
        x2, w2, dy2 = x.permute(0, 2, 3, 1).reshape(m, c), w.reshape(k, c), dy.permute(0, 2, 3, 1).reshape(m, k)
        y2, dx2, dw2 = torch.empty(m, k, device="cuda", dtype=dt), torch.empty(m, c, device="cuda", dtype=dt), \
            torch.empty(k, c, device="cuda", dtype=dt)
        cv = [timed(lambda: F.conv2d(x, w), 15),
              timed(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                                [True, False, False]), 15),
              timed(lambda: torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                                [False, True, False]), 15)]
        gm = [timed(lambda: torch.mm(x2, w2.t(), out=y2), 15), timed(lambda: torch.mm(dy2, w2, out=dx2), 15),
              timed(lambda: torch.mm(dy2.t(), x2, out=dw2), 15)]
        # the same results both ways (bf16 outputs: relative to the largest magnitude)
        y = F.conv2d(x, w).permute(0, 2, 3, 1).reshape(m, k)
        gx, gw, _ = torch.ops.aten.convolution_backward(dy, x, w, None, [1, 1], [0, 0], [1, 1], False, [0, 0], 1,
                                                        [True, True, False])
        torch.mm(x2, w2.t(), out=y2), torch.mm(dy2, w2, out=dx2), torch.mm(dy2.t(), x2, out=dw2)
        errs = [((a.float() - b.float()).abs().max() / b.float().abs().max()).item() for a, b in
                ((y2, y), (dx2, gx.permute(0, 2, 3, 1).reshape(m, c)), (dw2, gw.reshape(k, c)))]
        floor = 2.0 * m * (c + k) / 4.2e9  # ms at 4.2 TB/s: one read of the inputs, one write (fwd / dgrad)
        print(f"{what:18s} {uses:4d} | {cv[0]:9.3f} {cv[1]:7.3f} {cv[2]:7.3f} | {gm[0]:9.3f} {gm[1]:7.3f} {gm[2]:7.3f}"
              f" | {floor:6.3f} | {max(errs):.2e}")
        for i in range(3):
            tot[i] += uses * cv[i]
            tot[3 + i] += uses * gm[i]
            tot[6] += uses * min(cv[i], gm[i])
    print(f"{'per step (uses)':18s}      | {tot[0]:9.3f} {tot[1]:7.3f} {tot[2]:7.3f} | {tot[3]:9.3f} {tot[4]:7.3f} {tot[5]:7.3f}")
    print(f"cudnn {sum(tot[:3]):.3f} ms, gemm {sum(tot[3:6]):.3f} ms, the faster of the two per pass {tot[6]:.3f} ms")


if __name__ == "__main__":
    main()
