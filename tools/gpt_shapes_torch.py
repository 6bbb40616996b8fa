"""The PyTorch side of gpu_suite's `gpt_shapes` part: GPT shapes outside
BENCH.md's suite (GPT-2 medium, other contexts, head sizes and
vocabularies), each through the GPT-2 anchor (../shared/anchors/
gpt_bench.py's model and step, imported unchanged, its sizes set before
the model is built): bf16 autocast, fused AdamW, clipping at 1.0, SDPA
flash attention, random tokens on the GPU, CUDA events around STEPS steps.
Run: python3 gpt_shapes_torch.py ANCHORS_DIR OUT.jsonl B:T:L:H:D:V ... [--mode bf16+compile]
A mode starting tf32 runs the same step without the anchor's bf16
autocast: fp32 weights and activations, TF32 products (the anchor sets
allow_tf32), SDPA's fp32 kernel; what stoke's run.precision = tf32 does.
One JSON line a cell; a cell that fails (out of memory, a shape the
compiler rejects) writes its error and the next one runs."""
import contextlib
import json
import sys

sys.path.insert(0, sys.argv[1])
import torch  # noqa: E402
import gpt_bench as gb  # noqa: E402

args = sys.argv[3:]
mode = "bf16+compile"
if "--mode" in args:
    i = args.index("--mode")
    mode = args[i + 1]
    del args[i:i + 2]
if mode.startswith("tf32"):
    # the anchor's step opens torch.autocast(bf16); without it the model runs in fp32
    torch.autocast = lambda *a, **k: contextlib.nullcontext()
for cell in args:
    B, T, L, H, D, V = map(int, cell.split(":"))
    # gpt_bench reads its sizes from module globals when the model is built and when FLOPs are counted
    gb.B, gb.T, gb.L, gb.H, gb.D, gb.V = B, T, L, H, D, V
    try:
        r = gb.run(mode)
    except Exception as e:  # noqa: BLE001 (one cell's failure is that cell's result)
        r = {"mode": mode, "error": repr(e)[:300]}
    r.update(cell=cell, workload="gpt_shape")
    print(json.dumps(r), flush=True)
    with open(sys.argv[2], "a") as f:
        f.write(json.dumps(r) + "\n")
    torch._dynamo.reset()
    torch.cuda.empty_cache()
    torch.cuda.reset_peak_memory_stats()
