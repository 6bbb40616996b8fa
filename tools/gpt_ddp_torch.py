"""The PyTorch side of issue 12's 2-GPU scaling goal: BENCH.md's GPT-2 124M
anchor (../shared/anchors/gpt_bench.py's model, imported unchanged) under
DistributedDataParallel (25 MB buckets, gradient_as_bucket_view), bf16
autocast, fused AdamW, clipping at 1.0, random tokens on each GPU, B
sequences per GPU: tokens/s over all ranks, so that stoke's scaling is read
beside PyTorch's on the same machine (gpu_suite ddp_gpt, DDP_GPT_TORCH=1).
Run: torchrun --nproc_per_node=N gpt_ddp_torch.py ANCHORS_DIR OUT.jsonl [mode]
  mode: bf16 | bf16+compile   Env: B, T, STEPS, WARMUP (gpt_bench's); ACCUM
  micro-batches a step (1), all but the last under DDP's no_sync(), as
  nanoGPT's train.py accumulates (its loss divided by ACCUM)."""
import json, os, sys, time

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import gpt_bench as gb  # noqa: E402

mode = sys.argv[3] if len(sys.argv) > 3 else "bf16"
dist.init_process_group("nccl")
rank, world = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", 0)))
torch.manual_seed(0)
torch.backends.cuda.matmul.allow_tf32 = True
m = gb.GPT().cuda()
ddp = torch.nn.parallel.DistributedDataParallel(m, device_ids=[torch.cuda.current_device()], gradient_as_bucket_view=True)
ps = [p for p in m.parameters() if p.requires_grad]
groups = [{"params": [p for p in ps if p.dim() >= 2], "weight_decay": 0.1},
          {"params": [p for p in ps if p.dim() < 2], "weight_decay": 0.0}]
opt = torch.optim.AdamW(groups, lr=6e-4, betas=(0.9, 0.95), fused=True)
f = torch.compile(ddp) if "compile" in mode else ddp
g = torch.Generator(device="cuda").manual_seed(1 + rank)  # each rank its own tokens
x = torch.randint(0, gb.V, (gb.B, gb.T), device="cuda", generator=g)
y = torch.randint(0, gb.V, (gb.B, gb.T), device="cuda", generator=g)

accum = int(os.environ.get("ACCUM", 1))

def micro(k):
    with torch.autocast("cuda", dtype=torch.bfloat16):
        loss = f(x, y) / accum
    loss.backward()
    return loss

def step():
    opt.zero_grad(set_to_none=True)
    for k in range(accum - 1):
        with ddp.no_sync():  # the gradients stay local until the last micro-batch
            micro(k)
    loss = micro(accum - 1)
    torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0)
    opt.step()
    return loss

steps, warmup = int(os.environ.get("STEPS", 30)), int(os.environ.get("WARMUP", 10))
for _ in range(warmup): step()
torch.cuda.synchronize(); dist.barrier()
e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
e0.record()
for _ in range(steps): loss = step()
e1.record(); torch.cuda.synchronize()
ms = e0.elapsed_time(e1) / steps
if rank == 0:
    r = {"workload": "gpt2_124m_ddp", "mode": mode, "world": world, "B_per_gpu": gb.B, "T": gb.T, "accumulate": accum,
         "step_ms": round(ms, 2), "tokens_per_s_total": round(world * accum * gb.B * gb.T / (ms / 1e3)),
         "loss": float(loss), "torch": torch.__version__, "gpu": torch.cuda.get_device_name()}
    print(json.dumps(r), flush=True)
    open(sys.argv[2], "a").write(json.dumps(r) + "\n")
dist.destroy_process_group()
