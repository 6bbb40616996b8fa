#!/usr/bin/env bash
# tests/tools/kernel_trace_test.sh: tools/kernel_trace.py on traces made
# here (tools/kernel_trace.c writes the real ones on a GPU, through CUPTI,
# which CI has not): the step found by the kernels' period with start-up
# and an end's stray kernels around it, the compute stream chosen from the
# trace's end (PyTorch's warm-up runs eagerly on one stream, its CUDA-graph
# steps on another), and the step's wall time, idle time, gaps, the waits
# around its memset and families computed from known numbers.
set -euo pipefail
py="tools/kernel_trace.py"  # in the runfiles; by hand, from the checkout
[ -f "$py" ] || py="$(dirname "$(readlink -f "$0")")/../../tools/kernel_trace.py"
dir="${TEST_TMPDIR:-/tmp}"
python3 - "$dir/kt.csv" <<'PY'
import random, sys
random.seed(7)
rows = ["kind,start_ns,end_ns,stream,graph,gx,gy,gz,bx,by,bz,name"]
t = 0
# start-up: 3000 kernels of autotuning on stream 5, in no order
for _ in range(3000):
    rows.append(f"K,{t},{t + 4000},5,0,1,1,1,1,1,1,cand{random.randint(0, 40)}"); t += 5000
# 30 steps on stream 7: 100 kernels each, 40 us convolutions and 10 us batch norms, 1 us apart;
# a side stream's 50 us kernel beside each step; one 4-byte memset a step
# (names that repeat only once a step, as a real step's do: the optimizer's is its one)
names = [f"sm90_xmma_dgrad_implicit_gemm_bf16_tilesize128x{64 * (1 + i % 7)}x64_warpgroupsize1x1x1"
         if i % 2 == 0 else "_ZN12_GLOBAL__N_17k_statsI13__nv_bfloat16Li8EEEvPKT_" for i in range(99)] + ["sgd_kernel"]
for s in range(30):
    for i, n in enumerate(names):
        d = 40000 if i % 2 == 0 else 10000 if i < 99 else 2000
        rows.append(f"K,{t},{t + d},7,3,{132 if i % 2 == 0 else 396},1,1,256,1,1,{n}")
        if i == 10:
            rows.append(f"K,{t},{t + 50000},9,3,1,1,1,1,1,1,side_wgrad")
        t += d + 1000
    rows.append(f"S,{t},{t + 500},7,3,0,0,0,0,0,0,memset 4 bytes")
    t += 1000
# the end: a checkpoint's stray kernels
for k in range(5):
    rows.append(f"K,{t},{t + 3000},7,0,1,1,1,1,1,1,ckpt{k}"); t += 4000
open(sys.argv[1], "w").write("\n".join(rows) + "\n")
PY
out=$(python3 "$py" "$dir/kt.csv" --steps 10 --top 4 --list --family "batch norm")
echo "$out"
fail=0
want() { grep -qF -- "$1" <<<"$out" || { echo "FAIL: wanted '$1'"; fail=1; }; }
want "stream 7 repeats every 100 kernels"
want "the last 10 measured"
# a step: 50 x 40 us + 49 x 10 us + the optimizer's 2 us + 100 x 1 us apart + 1 us for the memset's slot
want "wall 2.593 ms"
# nothing runs in the 1 us gaps except where the memset (0.5 us) or the side kernel sits
want "convolution               2.000      50"
want "batch norm                0.490      49"
want "k_stats<__nv_bfloat16, 8>"
# the memset: 0.5 us, 1 us after the step's last kernel, 0.5 us before the next step's first
want "memsets: 1 a step, 0.5 us each (median); on their stream the operation before ends 1.0 us before one, the next starts 0.5 us after it"
want "(compute stream's kernels: 1.0 us apart, median)"
want "396x1x1  k_stats<__nv_bfloat16, 8>"  # --list shows each kernel's grid
[ "$(grep -c "k_stats" <<<"$out")" -ge 49 ] || { echo "FAIL: --list --family 'batch norm' did not list the step's 50"; fail=1; }
if grep -q "xmma dgrad" <<<"$(sed -n '/one step in order/,$p' <<<"$out")"; then
  echo "FAIL: --family 'batch norm' listed a convolution"; fail=1
fi
# the counts tools/test.sh reads, as cmocka prints them: the checks above as one test
if [ "$fail" -eq 0 ]; then echo "[  PASSED  ] 1 test(s)."; else echo "[  FAILED  ] 1 test(s), listed above"; fi
exit "$fail"
