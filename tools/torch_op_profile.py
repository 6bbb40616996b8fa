#!/usr/bin/env python3
# tools/torch_op_profile.py: where PyTorch's training step spends its GPU
# time, by kernel family, beside stoke's per-op profile (run.profile_ops).
# The anchor's own model and step (../shared/anchors/torch_bench.py, carried
# to the GPU machine as $S/anchors), timed by torch.profiler (CUPTI kernel
# records) over STEPS steps after WARMUP, without CUDA graphs (torch.compile's
# default mode: the same kernels as reduce-overhead, each recorded).
#   python3 torch_op_profile.py ANCHORS_DIR WORKLOAD MODE [STEPS]
#   e.g. python3 torch_op_profile.py $S/anchors resnet18c bf16+compile 20
# Prints GPU ms per step for each family (convolutions, GEMMs, Triton
# kernels, batch norms, optimizer, other) and the most expensive kernels (TOP
# of them, default 15).
import os
import sys

import torch
from torch.profiler import ProfilerActivity, profile

sys.path.insert(0, sys.argv[1])
import torch_bench as tb  # noqa: E402

name, mode = sys.argv[2], sys.argv[3]
steps = int(sys.argv[4]) if len(sys.argv) > 4 else 20
build, batch, shape, classes, cl = tb.WORKLOADS[name]
model = (tb.resnet18_cifar() if name == "resnet18c" else build()).cuda()
fmt = torch.channels_last if cl else torch.contiguous_format
model = model.to(memory_format=fmt)
x = torch.randn(batch, *shape, device="cuda").contiguous(memory_format=fmt)
y = torch.randint(0, classes, (batch,), device="cuda")
torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = mode != "fp32"
torch.backends.cudnn.benchmark = True
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
lossf = torch.nn.CrossEntropyLoss()
dtype = {"bf16": torch.bfloat16, "fp16": torch.float16}.get(mode.split("+")[0])
fwd = torch.compile(model) if "+compile" in mode else model


def step():
    opt.zero_grad(set_to_none=True)
    with torch.autocast("cuda", dtype=dtype or torch.float32, enabled=dtype is not None):
        loss = lossf(fwd(x), y)
    loss.backward()
    opt.step()


for _ in range(12):
    step()
torch.cuda.synchronize()
with profile(activities=[ProfilerActivity.CUDA]) as prof:
    for _ in range(steps):
        step()
    torch.cuda.synchronize()


def family(k):
    n = k.lower()
    if "triton" in n:
        return "triton (inductor's fused kernels: batch norm, relu, adds)"
    if any(s in n for s in ("conv", "dgrad", "wgrad", "implicit", "xmma_fprop", "cudnn")):
        return "convolution (cuDNN)"
    if any(s in n for s in ("gemm", "cutlass", "sm90_xmma", "cublas")):
        return "GEMM (cuBLAS)"
    if "batch_norm" in n or "bn_" in n:
        return "batch norm (ATen)"
    if "multi_tensor" in n or "foreach" in n:
        return "optimizer"
    return "other"


fams, kernels = {}, []
for e in prof.key_averages():
    us = getattr(e, "device_time_total", None)
    if us is None:
        us = e.cuda_time_total
    if us <= 0:
        continue
    ms = us / 1e3 / steps
    fams[family(e.key)] = fams.get(family(e.key), 0) + ms
    kernels.append((ms, e.count // steps, e.key))
print(f"torch {torch.__version__}, {torch.cuda.get_device_name()}, {name} {mode}, batch {batch}, {steps} steps")
print(f"GPU kernel time per step: {sum(fams.values()):.3f} ms")
for f, ms in sorted(fams.items(), key=lambda t: -t[1]):
    print(f"  {f:60s} {ms:8.3f} ms")
print("most expensive kernels (ms per step, calls per step):")
for ms, n, k in sorted(kernels, reverse=True)[:int(os.environ.get("TOP", "15"))]:
    print(f"  {ms:8.3f} {n:4d}  {k[:110]}")
