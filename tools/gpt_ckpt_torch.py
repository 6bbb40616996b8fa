"""The PyTorch side of issue 14 (activation recomputation): BENCH.md's GPT-2
124M anchor (../shared/anchors/gpt_bench.py, imported unchanged) with every
block wrapped in torch.utils.checkpoint (use_reentrant=False), the call the
guides give for "out of memory": tokens/s and peak memory
(torch.cuda.max_memory_allocated; and the process's, the CUDA context plus the
caching allocator's peak reservation, as nvidia-smi shows it) at batch B,
beside the same model without.
Usage: python3 gpt_ckpt_torch.py ANCHORS_DIR OUT.jsonl [mode ...]
  mode: bf16 | bf16+ckpt | bf16+compile | bf16+compile+ckpt   Env: B, T, STEPS, WARMUP (gpt_bench's)."""
import json, sys

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
from torch.utils.checkpoint import checkpoint  # noqa: E402
import gpt_bench as gb  # noqa: E402

plain = gb.Block.forward
# what the process holds before the runs (the CUDA context): with the
# caching allocator's peak reservation it is what nvidia-smi shows, the
# measure stoke's gpu_mem_max_mib (NVML) gives
torch.zeros(1, device="cuda")
free, total = torch.cuda.mem_get_info()
context_gb = (total - free) / 1e9

def checkpointed(s, x):
    return checkpoint(plain, s, x, use_reentrant=False)

for mode in sys.argv[3:] or ["bf16", "bf16+ckpt"]:
    gb.Block.forward = checkpointed if "ckpt" in mode else plain
    torch.cuda.reset_peak_memory_stats()
    try:
        r = gb.run(mode)
    except Exception as e:  # an OOM at a large B is a result too
        r = {"workload": "gpt2_124m", "mode": mode, "B": gb.B, "error": repr(e)[:300]}
    if "error" not in r:
        r["peak_reserved_gb"] = round(torch.cuda.max_memory_reserved() / 1e9, 2)
        r["process_peak_gb"] = round(context_gb + torch.cuda.max_memory_reserved() / 1e9, 2)
    print(json.dumps(r), flush=True)
    open(sys.argv[2], "a").write(json.dumps(r) + "\n")
    torch.cuda.empty_cache()
