#!/usr/bin/env python3
# tools/resnet_matrix_torch.py: PyTorch's side of gpu_suite's `matrix` part
# (issue 11's ResNet matrix): torchvision ResNet-18/34/50 at any batch and
# resolution, bf16 autocast, channels_last, cudnn.benchmark, SGD with
# momentum, on synthetic data already on the GPU; torch.compile with
# mode="reduce-overhead" (or eager with "eager"). Timed like the anchor
# (anchors/torch_bench.py): warm-up steps, then CUDA events around each step.
#   python3 resnet_matrix_torch.py OUT.jsonl compile-ro|eager depth:batch:res ...
import json
import sys
import time

import torch
import torch.nn as nn
import torchvision


def run(depth, batch, res, mode, steps=30, warmup=12):
    model = getattr(torchvision.models, f"resnet{depth}")(num_classes=1000).cuda()
    model = model.to(memory_format=torch.channels_last)
    x = torch.randn(batch, 3, res, res, device="cuda").contiguous(memory_format=torch.channels_last)
    y = torch.randint(0, 1000, (batch,), device="cuda")
    torch.backends.cuda.matmul.allow_tf32 = True
    torch.backends.cudnn.allow_tf32 = True
    torch.backends.cudnn.benchmark = True
    opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9, weight_decay=5e-5)
    lossf = nn.CrossEntropyLoss()
    fwd = model
    if mode == "compile-ro":
        torch._dynamo.reset()
        fwd = torch.compile(model, mode="reduce-overhead")

    def step():
        opt.zero_grad(set_to_none=True)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = lossf(fwd(x), y)
        loss.backward()
        opt.step()
        return loss

    t0 = time.time()
    for _ in range(warmup):
        step()
    torch.cuda.synchronize()
    warm_s = time.time() - t0
    ev = [torch.cuda.Event(enable_timing=True) for _ in range(steps + 1)]
    ev[0].record()
    for i in range(steps):
        step()
        ev[i + 1].record()
    torch.cuda.synchronize()
    total = ev[0].elapsed_time(ev[-1])
    per = sorted(ev[i].elapsed_time(ev[i + 1]) for i in range(steps))
    r = {"depth": depth, "batch": batch, "res": res, "mode": mode,
         "samples_per_s": round(batch * steps / (total / 1e3), 1),
         "step_ms_median": round(per[steps // 2], 3), "warmup_s": round(warm_s, 1),
         "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    del model, fwd, opt, x, y
    torch.cuda.empty_cache()
    return r


if __name__ == "__main__":
    out, mode = sys.argv[1], sys.argv[2]
    for cell in sys.argv[3:]:
        d, b, r = (int(v) for v in cell.split(":"))
        try:
            row = run(d, b, r, mode)
        except Exception as e:  # one failed cell must not end the others
            row = {"depth": d, "batch": b, "res": r, "mode": mode, "error": repr(e)[:300]}
        print(json.dumps(row), flush=True)
        with open(out, "a") as f:
            f.write(json.dumps(row) + "\n")
