"""tools/nccl_graph_check.py: does an NCCL all-reduce captured into a CUDA
graph replay on this machine? PyTorch's own capture, as a control for
stoke's (gpu_suite part ddp_graph_diag). Run with torch.distributed.run,
2 processes: each replays a captured all-reduce 20 times and checks the sum."""
import os, sys, torch, torch.distributed as dist

dist.init_process_group("nccl")
r, w = dist.get_rank(), dist.get_world_size()
torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
x = torch.full((1 << 20,), float(r + 1), device="cuda")
s = torch.cuda.Stream()
s.wait_stream(torch.cuda.current_stream())
with torch.cuda.stream(s):  # warm-up outside capture, as PyTorch asks
    dist.all_reduce(x)
torch.cuda.current_stream().wait_stream(s)
torch.cuda.synchronize()
g = torch.cuda.CUDAGraph()
with torch.cuda.graph(g):
    dist.all_reduce(x)
ok = True
want = w * (w + 1) / 2
for i in range(20):
    x.fill_(float(r + 1))
    g.replay()
    torch.cuda.synchronize()
    ok &= bool((x == want).all())
print(f"rank {r}: pytorch captured all-reduce replayed 20 times: {'PASS' if ok else 'FAIL'}", flush=True)
del g  # NCCL's teardown waits for every graph holding its work
torch.cuda.synchronize()
dist.destroy_process_group()
sys.exit(0 if ok else 1)
