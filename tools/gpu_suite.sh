#!/usr/bin/env bash
# tools/gpu_suite.sh: the GPU machine's end-to-end runs, called by
# tools/gpu_check.sh with $S (unpacked stage) and $OUT set. Parts by name:
#   fp16      fp16 run whose loss scaler is forced to overflow
#   generate  tools/generate on the GPU: a small bf16 gpt trained 20 steps,
#             greedy text with two pad tokens, a seed twice, and the same
#             checkpoint sampled on the cpu backend
#   fmnist    Fashion-MNIST CNN on the GPU (convert + train + eval)
#   bench     stoke's mlp / resnet50 / resnet18c in tf32, bf16, fp16
#   torch     PyTorch anchors (eager, and compile with TORCH_COMPILE=1)
#   issue6    loss curves and A/B (tools/bench) of the baseline against
#             fused kernels + CUDA graphs, then PyTorch eager and compile
#   graph     whole-step CUDA graphs: every step's loss with and without
#             (fp32 deterministic exact, bf16, fp16 with forced overflow),
#             then speed with and without (tools/bench, GRAPH_W workloads, bf16)
#   optim     issue 17's update hooks end to end: AdamW with GPT-2's groups
#             (weight decay on matrices only) and clipping at norm 1, eager
#             against CUDA-graph replay, bf16 and fp16 with forced overflows
#             (skipped steps: the bias corrections count applied ones), and
#             clipping on against off
#   policies  issue 17's precision policy from a plugin: bf16_fp32norm (batch
#             norm and the loss in f32) against bf16 and fp32, loss curves
#             and the first lines of the run (the autocast nodes)
#   plugkit   issue 18: tools/plugin_check on the CUDA op plugins, the
#             example (leaky_relu) and the new-user trial's (hardswish,
#             tests/plugins/newuser): their cuda kernels, forward and
#             backward, against their cpu f64 ones; examples/spirals.ini
#             trained with backends = cuda, with leaky_relu and with
#             hardswish
#   loader    jpeg-bench folder: stoke's loader by worker count, ResNet-50
#             bf16 trained from it against synthetic data, PyTorch's loader
#   kernels   tests/op/every_kernel_test with the GPU engines (every registered
#             kernel against the cpu reference), KERNEL_REPS times (5), each
#             run its own seed; per engine the kernel count and the worst
#             error as a fraction of its tolerance (how close the derived
#             tolerances are)
#   gemms     GPT-2 124M's 12 linear products: every cuBLASLt candidate,
#             split-K and strided-batch splits of the weight gradients
#             (tests/gpu/lt_gemm_bench), then PyTorch's time (gemm_torch.py)
#   epilogues cuBLASLt's activation epilogues against the plain products and
#             the separate activation passes, heuristic and autotuned
#             algorithms (tests/gpu/lt_epilogue_bench)
#   autotune  mlp bf16 A/B (tools/bench): cuBLASLt heuristic against
#             autotuned (run.conv_autotune), run.fuse off/on (relu, gelu tanh)
#   fuse      the mlp bench (bf16) with ReLU and with GELU (tanh), run.fuse
#             off and on, alternating, FUSE_REPS times; the loss curves of
#             fused and unfused compared; one per-op profile of each
#   convs     every ResNet-50 / ResNet-18c convolution through the cudnn engine
#             (graph API) and cudnn_classic, the fused conv + batch-norm graph
#             probe (tests/gpu/conv_bench), PyTorch's same convolutions
#             (conv_bench_torch.py), then tools/bench A/B of the two engines
#             on resnet50 and resnet18c (fused + CUDA graphs both sides)
#   bn        the batch-norm family (bn_relu, bn_add_relu, bn_add_bn_relu; BN_SHORTCUT=kept: the shortcuts'
#             batch_norm) on every ResNet-50 shape against the memory floor
#             (tests/gpu/bn_bench, BN_PRECS: bf16 f16), then ResNet-50's
#             per-op profile (examples/resnet50.ini)
#   gpt       GPT-2 124M bf16 (examples/gpt2_124m.ini): stoke at B = 16 and
#             32 in tokens/s and device memory allocated (against PyTorch's
#             peak_mem_gb), cuDNN flash attention, one per-op profile, the
#             PyTorch anchor (gpt_bench.py, eager and compile), and a small
#             gpt's checkpoint loaded into nanoGPT's module structure with
#             load_state_dict(strict=True), its loss on the same tokens
#             against stoke's
#   gpt_det   GPT-2 124M bf16 B = 8 under run.deterministic, twice: every
#             step's loss and the weights must be the same bits (PASS/FAIL line)
#   wgrad     [run] wgrad_stream: resnet18c bf16 under run.deterministic with
#             the weight gradients on the side stream (lag 1, 2, 64) against
#             none, eager and CUDA graphs: every step's loss and the weights
#             the same bits (PASS/FAIL line)
#   shortcut  [run] fuse_shortcut: resnet50 bf16 (batch 32) under run.deterministic,
#             the shortcut batch norms joined (bn_add_bn_relu) against kept, eager
#             and CUDA graphs: every step's loss and the weights the same bits
#             (PASS/FAIL line)
#   pool_index [run] pool_index: resnet50 bf16 (batch 32) under run.deterministic,
#             max_pool2d's indices saved (max_pool2d_idx) against found again,
#             eager and CUDA graphs: the same bits (PASS/FAIL line)
#   samebits  a plugin change that must keep every bit: resnet18c and resnet50
#             (SB_W) bf16 at batch SB_BATCH (64) under run.deterministic with
#             CUDA graphs, 10 steps with BEFORE's plugins (an unpacked stage)
#             and with these (SB_EXTRA: more overrides): the same bits
#             (PASS/FAIL line)
#   ncu       Nsight Compute (clocks left alone) on one workload's kernels:
#             NCU_INI (examples/resnet50.ini), NCU_KERNELS (an ncu -k regex;
#             max_pool), launches NCU_SKIP (3) then NCU_COUNT (6); speed of
#             light, occupancy and launch statistics, a line per launch
#             (ncu_summary.py: DRAM and SM % of peak, occupancy, registers)
#   ktrace    every kernel of a run, with its device times (CUPTI,
#             bin/libkernel_trace.so), for stoke's KT_W (resnet18c) in its
#             INI's configuration (KT_EXTRA: overrides) and for PyTorch's
#             anchor (KT_TORCH: resnet18c:bf16+compile-ro); kernel_trace.py
#             prints each one's step: wall, idle, gaps, kernels by family
#   gpt_graph GPT-2 124M bf16 B = 16 eager against cuda_graph = true,
#             alternating GPT_GRAPH_R (2) rounds (stoke_gpt: tokens/s, memory)
#   ddp_recompute  (2 GPUs) issue 14 with data parallel: a small gpt, recompute
#             none against h.* and auto, eager and CUDA graphs (fp32
#             deterministic: weights bitwise equal expected)
#   recompute issue 14 (run.recompute), all of:
#             recompute_eq: training with and without recomputation, all
#             under run.deterministic (fp32 eager; bf16 and fp16 (scaler)
#             with CUDA graphs and accumulation) for a small gpt, resnet18c
#             and the mlp (RC_EQ_NETS, RC_EQ_PREC): the same weights and
#             every loss bit for bit (same_bits), a PASS/FAIL line;
#             recompute_fit: gpt2_124m and resnet50, the largest batch that
#             fits with recompute = none and = auto (--dry-run on this GPU),
#             peak memory and speed at B = 16, 128, 256 (gpt, RC_GPT_B) and
#             256, 1024, 2048 (resnet50, RC_R50_B);
#             recompute_ab: A/B step time at equal B (RC_AB_B, 32; tools/bench:
#             none against h.*.attn, and against auto at the budget h.*.attn
#             fits);
#             recompute_torch: PyTorch's torch.utils.checkpoint on every block
#             (gpt_ckpt_torch.py) at B = RC_TORCH_B (16 32 64), then stoke's
#             recompute = auto at the same B within PyTorch's checkpointed peak
#   steptime  issue 16: train's step times are device times: ResNet-50 bf16
#             (examples/resnet50.ini, log_every 4 and 1) with and without
#             cuda_graph, and tools/bench's median of the same two variants;
#             the p50 step times must agree within 10% (PASS/FAIL lines)
#   matrix    issue 11's ResNet matrix: each MATRIX cell depth:batch:res
#             (ResNet-18/34/50, bf16, synthetic data on the device) through
#             stoke's default configuration (fused + cudnn graph API + CUDA
#             graphs) and its baseline (cudnn, cublaslt, cuda; eager), then
#             PyTorch (tools/resnet_matrix_torch.py, MATRIX_TORCH modes,
#             compile-ro by default) for as many cells as MATRIX_S seconds allow
#   binab     two builds A/B'd (issue 17's check): $BEFORE is another
#             unpacked stage (bin/, its own plugins; gpu_stage.sh AB_KEEP=1
#             stages one, gpu_check.sh sets BEFORE); for each BINAB_W
#             workload (an example's name, with overrides after @ signs:
#             gpt2_124m@data.batch_size=8@model.n_layer=24), BINAB_R rounds
#             of one tools/bench round of the before build then one of this
#             build, interleaved; B/A as tools/bench reports it (geometric
#             mean of the paired ratios, 95% t-interval on their logs)
#   observe   issue 13: ResNet-50 with run.trace=20-24 (eager and CUDA graph)
#             and run.tensorboard=true: the trace's lanes, op slices and what
#             tracing cost in its steps; observe_check.py on the eager run;
#             tools/bench A/B of the trace off/on and of NVTX off/on (eager and
#             graphs); nsys's NVTX summary where nsys is installed
#   observe_graph  issue 13 under CUDA graphs: runs with run.cuda_graph=true and
#             run.trace=N-M (resnet18c fp32; mlp fp16 with forced loss-scaler
#             overflows, clipping and accumulate=2), each beside the same run
#             untraced; observe_check.py (GRAPH=1, SAME_AS): per-node slices
#             named from the plan on the compute lane for the traced steps, which
#             say they ran eagerly; every other micro-batch but step 1's replayed
#             the graph (summary cuda_graph_replays) at graph speed after the
#             window; checkpoint and losses bitwise equal to the untraced run's
#             (run.deterministic, conv_autotune off). Pass: each run rc=0, no
#             FAILED line, "observe_graph: PASS"
#   observe_ddp  the trace of 3 ResNet-50 steps on 2 GPUs (tools/launch), eager
#             and with run.cuda_graph=true (traced steps eager, buckets timed):
#             each rank's all-reduce buckets on the comm lane, how many start
#             while the backward still runs; both ranks of step 21 drawn by
#             trace_svg.py into $OUT/obs_ddp_timeline.svg (eager) and
#             obs_ddp_graph_timeline.svg (BENCHMARKS.md's picture: the
#             chromium line at the part). Pass: both runs rc=0, each rank's
#             "PASS (N bucket slices, M overlapping the backward)", the SVGs
#             written, "observe_ddp: PASS"
#   ddp       data parallel on 2 GPUs, all of: ddp_eq (weights of a 2-GPU run
#             against a 1-GPU run of the same global batch), ddp_resume (a
#             2-GPU checkpoint resumed on 1 GPU), ddp_kill (a killed rank ends
#             the other within comm_timeout), ddp_bench (all-reduce bus
#             bandwidth of a 234 MB gradient buffer; ResNet-50 bf16 256/GPU on
#             1 and 2 GPUs beside PyTorch DDP; each GPU alone, DDP_BOTH=0 GPU 0 only)
#   ddp_gpt   GPT-2 124M bf16 B=16 per GPU on 1 and 2 GPUs: tokens/s and scaling;
#             DDP_GPT_VARIANTS (label:environment:overrides, each comma-separated) A/B the 2-GPU run
#             (NCCL_MAX_NCHANNELS, run.bucket_mb), DDP_GPT_STEPS its length;
#             DDP_GPT_TORCH=1 adds PyTorch DDP (tools/gpt_ddp_torch.py, eager and
#             compiled, 1 and 2 GPUs) for the scaling beside stoke's
#             DDP_GPT_ACCUM micro-batches a step (both sides; PyTorch's under
#             no_sync), DDP_GPT_TORCH_MODES (bf16 bf16+compile)
#             DDP_GPT_BOTH=0 runs GPU 0 alone only (default: both GPUs alone,
#             the reference their mean)
#   gpt_shapes  GPT shapes outside BENCH.md's suite (GPT_SHAPES: cells
#             B:T:L:H:D:V, sequences, context, layers, heads, width, padded
#             vocabulary): stoke (gpt2_124m.ini with those keys) against
#             torch.compile (tools/gpt_shapes_torch.py: the anchor's model at
#             that size) in tokens/s and peak memory, one table
#   ddp_gpt_rounds  the same scaling with the 1- and 2-GPU runs interleaved
#             (DDP_GPT_ROUNDS, 3; DDP_GPT_STEPS, 60): each round's and the median
#   ddp_graph_diag  where a 2-GPU run with cuda_graph = true stops: the mlp on
#             1 and 2 GPUs cut at 40 s each, a stuck rank's host stacks
#             (cuda-gdb) at 30 s, NCCL's variables each way, and PyTorch's own
#             captured all-reduce (nccl_graph_check.py) as the control. Found
#             (2026-11-23) that NCCL's abort waits for every graph holding its
#             captured collectives: the step graphs now go first
#   two_gpu   what waits for a 2-GPU machine: two_gpu_a (observe_ddp,
#             ddp_recompute) and two_gpu_b (ddp_gpt, ddp_graph, ddp_bench),
#             each one device call
set -uo pipefail
HERE="$(cd "$(dirname "$0")" && pwd)" # the stage folder: loss_curves.py beside this script
T="$S/bin/train"
# NCCL: the system's, else the one PyTorch's wheels bring
if ! ldconfig -p | grep libnccl.so.2 > /dev/null; then # (grep -q would close the pipe early: SIGPIPE under pipefail)
  nccl=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
  [ -n "$nccl" ] && export LD_LIBRARY_PATH="$(dirname "$nccl"):$LD_LIBRARY_PATH"
fi
export NCCL_NVLS_ENABLE=0 # KINDS.md: multicast stays off
# data parallel checks: a small mlp read through the loader (each rank its shard)
MLP="$S/examples/mlp.ini run.backends=cublaslt,cuda run.log_every=10 run.progress=lines data.on_device=false
     data.shape=256 data.classes=100 model.hidden=1024,1024 optimizer.lr=0.05"
# scaling ONE_GPU_DIR[,ONE_GPU_DIR...] TWO_GPU_DIR PER_SAMPLE UNIT: "1 GPU X UNIT, 2 GPUs Y (Z per GPU), scaling S%"
# from the runs' summaries (samples/s median over logged intervals, times PER_SAMPLE: 1024 tokens a GPT-2
# sequence). Given each GPU's run alone (GPU 0's, GPU 1's), the reference is their mean, and the scaling against
# each is printed too: two boards of one machine differ by 1-2% at the power cap (run 35), and the ranks go at
# the slower one's pace
scaling() {
  python3 - "$@" <<'PY'
import json, sys
def rate(d):
    try: return [json.loads(l) for l in open(d + "/metrics.jsonl") if '"summary"' in l][-1]["samples_per_s_median"] * float(sys.argv[3])
    except Exception: return float("nan")
ones, two = [rate(d) for d in sys.argv[1].split(",")], rate(sys.argv[2])
one = sum(ones) / len(ones)
each = ""
if len(ones) > 1:
    each = " (" + ", ".join(f"GPU {i} alone {v:.0f}: {100 * two / (2 * v):.1f}%" for i, v in enumerate(ones)) + ")"
print(f"1 GPU {one:.0f} {sys.argv[4]}{' (mean of the GPUs alone)' if len(ones) > 1 else ''}, 2 GPUs {two:.0f} "
      f"({two/2:.0f} per GPU), scaling {100*two/(2*one):.1f}%{each}")
PY
}
# compare A.safetensors B.safetensors LABEL: the worst relative difference of the weights and of the optimizer state
compare() {
  python3 - "$@" <<'PY'
import sys, torch
from safetensors.torch import load_file
try: a, b = load_file(sys.argv[1]), load_file(sys.argv[2])
except Exception as e: print(f"{sys.argv[3]}: cannot compare: {e}"); sys.exit()
rows = []
for k in sorted(a):
    if k not in b or not a[k].is_floating_point(): continue
    x, y = a[k].double(), b[k].double()
    rows.append(((x - y).norm().item() / max(x.norm().item(), 1e-30), (x - y).abs().max().item(), torch.equal(x, y), k))
w = [r for r in rows if not r[3].startswith("optimizer.")]
o = [r for r in rows if r[3].startswith("optimizer.")]
fmt = lambda r: f"{r[3]} {r[0]:.2e} (max abs {r[1]:.2e})"
print(f"{sys.argv[3]}: weights bitwise equal {all(r[2] for r in w)}; worst weight {fmt(max(w))}; worst optimizer state {fmt(max(o)) if o else '-'}")
print("   per weight: " + ", ".join(f"{r[3]} {r[0]:.1e}" for r in w))
PY
}
log() { echo "== $*"; }
# same_bits BASE DIR LABEL STEPS: the run in DIR against the run in BASE (both with run.checkpoint=true
# and run.log_every=1): the checkpoints' weights bitwise (compare) and every logged loss (loss_curves.py),
# the two summary lines printed, the details in DIR.cmp and DIR.curves; true when both are the same bits
same_bits() {
  local base=$1 dir=$2 label=$3 steps=$4
  compare "$base/checkpoint.safetensors" "$dir/checkpoint.safetensors" "$label" > "$dir.cmp"
  python3 "$HERE/loss_curves.py" "$label (base: $(basename "$base"))" "$base/metrics.jsonl" "run=$dir/metrics.jsonl" \
    > "$dir.curves"
  head -1 "$dir.cmp"; tail -1 "$dir.curves"
  grep -q "weights bitwise equal True" "$dir.cmp" && grep -q " $steps steps, $steps identical" "$dir.curves"
}
# switch_same_bits PART KEY PLAN_LINE: resnet50 bf16 (batch 32), 10 steps under run.deterministic with [run] KEY
# false against true, eager and CUDA graphs: every step's loss and every weight the same bits (a "PART: PASS" or
# "PART: FAIL" line); each run's line shows its plan's line matching PLAN_LINE
switch_same_bits() {
  local part=$1 key=$2 line=$3 ok=1 cg v
  log "resnet50 bf16 (batch 32) under run.deterministic, $key false against true, eager and CUDA graphs: the same bits"
  for cg in false true; do
    for v in false true; do
      timeout 300 "$T" "$S/examples/resnet50.ini" data.batch_size=32 run.steps=10 run.log_every=1 run.deterministic=true \
        run.cuda_graph=$cg run.$key=$v run.progress=off run.checkpoint=true \
        run.out_dir="$OUT/${part}_${cg}_$v" > "$OUT/${part}_${cg}_$v.log" 2>&1
      echo "cuda_graph=$cg $key=$v rc=$? $(grep -hE "$line|^stoke: error" "$OUT/${part}_${cg}_$v.log" | head -2 | cut -c1-60 | tr '\n' ' ')"
    done
    same_bits "$OUT/${part}_${cg}_false" "$OUT/${part}_${cg}_true" "cuda_graph=$cg $key false vs true" 10 || ok=0
  done
  [ $ok = 1 ] && echo "$part: PASS" || echo "$part: FAIL"
}
# stoke_gpt B LABEL OVERRIDES...: gpt2_124m bf16 at batch B, 30 steps: tokens/s, the plan and NVML's peak
stoke_gpt() {
  local b=$1 label=$2; shift 2
  local tag=$(echo "$label" | tr -c 'a-zA-Z0-9\n' '_')
  log "stoke gpt2_124m bf16 B=$b $label"
  timeout 600 "$T" "$S/examples/gpt2_124m.ini" run.progress=off run.steps=30 data.batch_size=$b "$@" \
    run.out_dir="$OUT/gpt_${b}_$tag" > "$OUT/gpt_${b}_$tag.log" 2>&1
  echo "rc=$? $(grep -E '^recompute \(|^dry run|^stoke: error|^memory:' "$OUT/gpt_${b}_$tag.log" | head -3 | tr '\n' ' ')"
  python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if 'summary' in l][-1]; print('stoke tokens/s', round(r['samples_per_s_median'] * 1024), '; peak GPU memory of the process (NVML, MiB, with the CUDA context)', r['gpu_mem_max_mib'])" \
    "$OUT/gpt_${b}_$tag/metrics.jsonl" 2>/dev/null || echo "no summary"
}
for part in "$@"; do
  case "$part" in
    kernels)
      log "every kernel against the cpu reference, ${KERNEL_REPS:-5} runs"
      for rep in $(seq "${KERNEL_REPS:-5}"); do
        timeout 600 "$S/tests/every_kernel_test" > "$OUT/kernels.$rep.log" 2>&1
        echo "run $rep rc=$? $(grep -m1 -o 'seed [0-9]*' "$OUT/kernels.$rep.log") $(grep -E '^\[  (PASSED|FAILED)  \]' "$OUT/kernels.$rep.log" | tr '\n' ' ')"
        grep -E '^\[  FAILED  \] [a-z]' "$OUT/kernels.$rep.log" | sort -u | head -20
      done
      grep -h -E '^  engine ' "$OUT/kernels.1.log"
      # the worst error / tolerance per check over every run
      python3 "$HERE/test_margins.py" "$OUT"/kernels.*.log --top 15
      ;;
    generate)
      # tools/generate on the GPU (bf16 forward plan, the logits row read from the device): a small gpt
      # trained 20 steps on random bytes, then the invariants charlm_test checks on the CPU: greedy text
      # independent of the pad token, a seed repeating its text; and on the cpu backend from the same
      # checkpoint (bf16 tensors into an fp32 plan)
      small="run.checkpoint=true data.classes=256 data.shape=257 model.context=256 model.n_layer=2 model.n_embd=128 model.n_head=2"
      log "generate: train a small gpt (bf16), then sample"
      timeout 300 "$T" "$S/examples/gpt2_124m.ini" run.progress=off run.steps=20 $small run.out_dir="$OUT/gen_train" \
        > "$OUT/gen_train.log" 2>&1
      echo "train rc=$?"
      G="$S/bin/generate"
      ck="$OUT/gen_train/checkpoint.safetensors"
      i=0 # (numbered: the same arguments twice must be two files)
      for a in "--pad 0" "--pad 101" "--seed 5 --temperature 1" "--seed 5 --temperature 1"; do
        f="$OUT/gen_$((++i))_${a// /_}"
        timeout 120 "$G" "$S/examples/gpt2_124m.ini" "$ck" $small --prompt "The cat" --tokens 48 --ids $a > "$f.ids" 2> "$f.err"
        echo "generate $a: rc=$? $(wc -l < "$f.ids") tokens, md5 $(md5sum < "$f.ids" | cut -c1-12) $(grep -v '^stoke info' "$f.err" | head -c 300)"
      done
      timeout 300 "$G" "$S/examples/gpt2_124m.ini" "$ck" $small run.backends=cpu run.precision=fp32 run.device=cpu \
        --prompt "The cat" --tokens 16 --ids --pad 0 > "$OUT/gen_cpu.ids" 2> "$OUT/gen_cpu.err"
      echo "generate on the cpu from the bf16 checkpoint: rc=$? $(wc -l < "$OUT/gen_cpu.ids") tokens $(head -c 300 "$OUT/gen_cpu.err")"
      # checkpoints across precisions on the GPU: an fp32 run's file (no master copies) resumed by a bf16 plan,
      # which takes its fp32 masters from the file's parameters
      log "an fp32 checkpoint resumed in bf16"
      timeout 300 "$T" "$S/examples/gpt2_124m.ini" run.progress=off run.steps=20 $small run.precision=fp32 \
        run.out_dir="$OUT/gen_f32" > "$OUT/gen_f32.log" 2>&1
      echo "fp32 train rc=$? $(grep -m1 '^summary' "$OUT/gen_f32.log")"
      timeout 300 "$T" "$S/examples/gpt2_124m.ini" run.progress=off run.steps=30 $small \
        run.resume="$OUT/gen_f32/checkpoint.safetensors" run.out_dir="$OUT/gen_f32_bf16" > "$OUT/gen_f32_bf16.log" 2>&1
      echo "bf16 resume rc=$? master note: $(grep -c 'has no master copies' "$OUT/gen_f32_bf16.log"); $(grep -E '^stoke error|^summary' "$OUT/gen_f32_bf16.log" | head -3 | tr '\n' ' ')"
      ;;
    fp16)
      log "fp16 forced overflow"
      timeout 120 "$T" "$S/examples/mlp.ini" run.checkpoint=false run.precision=fp16 run.loss_scale_init=1e10 run.steps=40 run.log_every=1 \
        run.progress=lines model.hidden=1024,1024 data.batch_size=1024 run.out_dir="$OUT/fp16" \
        > "$OUT/fp16.log" 2>&1
      echo "rc=$?"; grep -E "summary|loss scale|error" "$OUT/fp16.log"
      python3 - "$OUT/fp16/metrics.jsonl" <<'PY'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if '"step"' in l and '"loss"' in l]
prev = None
for r in rows[:30]:
    print(r["step"], r["loss"], r["loss_scale"], r["skipped_steps"])
PY
      ;;
    bn)
      for prec in ${BN_PRECS:-bf16}; do
        log "batch-norm family on ResNet-50's shapes, $prec (tests/gpu/bn_bench)"
        timeout 150 "$S/tests/bn_bench" 256 $prec > "$OUT/bn_bench_$prec.log" 2>&1
        echo "rc=$?"; cat "$OUT/bn_bench_$prec.log"
      done
      log "ResNet-50 bf16 per-op profile (examples/resnet50.ini)"
      timeout 240 "$T" "$S/examples/resnet50.ini" run.steps=24 run.profile_ops=true run.progress=off run.checkpoint=false \
        run.out_dir="$OUT/bn_prof" > "$OUT/bn_prof.log" 2>&1
      echo "rc=$?"; sed -n '/per-op GPU time/,/slowest nodes/p' "$OUT/bn_prof.log" | head -30
      ;;
    gpt)
      for b in 16 32; do
        log "gpt2_124m bf16 B=$b"
        timeout 900 "$T" "$S/examples/gpt2_124m.ini" data.batch_size=$b run.progress=lines run.out_dir="$OUT/gpt_$b" \
          > "$OUT/gpt_$b.log" 2>&1
        echo "rc=$?"; grep -E "summary|MFU|memory|operations|error" "$OUT/gpt_$b.log" | head -8
        python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if 'summary' in l][-1]; print('tokens/s', round(r['samples_per_s_median'] * 1024), ' device memory allocated', round(r.get('device_alloc_mib', float('nan')) * 1048576 / 1e9, 2), 'GB (PyTorch peak_mem_gb: max_memory_allocated)')" \
          "$OUT/gpt_$b/metrics.jsonl" 2>/dev/null
      done
      log "gpt2_124m bf16 B=16 per-op profile"
      timeout 600 "$T" "$S/examples/gpt2_124m.ini" run.steps=12 run.profile_ops=true run.progress=off \
        run.out_dir="$OUT/gpt_prof" > "$OUT/gpt_prof.log" 2>&1
      echo "rc=$?"; sed -n '/per-op GPU time/,/slowest nodes/p' "$OUT/gpt_prof.log" | head -30
      log "PyTorch anchor (gpt_bench.py)"
      B=16 timeout 900 python3 "$S/anchors/gpt_bench.py" "$OUT/gpt_torch.jsonl" bf16 bf16+compile 2>&1 | tail -2
      log "a small gpt's checkpoint in nanoGPT's module, strict"
      timeout 600 "$T" "$S/examples/gpt2_124m.ini" model.n_layer=2 model.n_embd=128 model.n_head=4 model.context=128 \
        data.shape=129 data.batch_size=8 run.steps=20 optimizer.warmup_epochs=0.001 run.checkpoint=true run.out_dir="$OUT/gpt_small" \
        > "$OUT/gpt_small.log" 2>&1
      echo "rc=$?"
      python3 - "$OUT/gpt_small/checkpoint.safetensors" <<'PY'
import sys, torch, torch.nn as nn, torch.nn.functional as F
from safetensors.torch import load_file
L, H, D, T, V = 2, 4, 128, 128, 50304
class Attn(nn.Module):  # nanoGPT's CausalSelfAttention (flash path), its names
    def __init__(s): super().__init__(); s.c_attn, s.c_proj = nn.Linear(D, 3 * D), nn.Linear(D, D)
    def forward(s, x):
        B, T_, C = x.shape
        q, k, v = s.c_attn(x).split(D, dim=2)
        q, k, v = (t.view(B, T_, H, C // H).transpose(1, 2) for t in (q, k, v))
        return s.c_proj(F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(B, T_, C))
class MLP(nn.Module):
    def __init__(s): super().__init__(); s.c_fc, s.c_proj = nn.Linear(D, 4 * D), nn.Linear(4 * D, D)
    def forward(s, x): return s.c_proj(F.gelu(s.c_fc(x), approximate="tanh"))
class Block(nn.Module):
    def __init__(s): super().__init__(); s.ln_1, s.attn, s.ln_2, s.mlp = nn.LayerNorm(D), Attn(), nn.LayerNorm(D), MLP()
    def forward(s, x): x = x + s.attn(s.ln_1(x)); return x + s.mlp(s.ln_2(x))
class GPT(nn.Module):
    def __init__(s):
        super().__init__()
        s.transformer = nn.ModuleDict(dict(wte=nn.Embedding(V, D), wpe=nn.Embedding(T, D),
                                           h=nn.ModuleList(Block() for _ in range(L)), ln_f=nn.LayerNorm(D)))
        s.lm_head = nn.Linear(D, V, bias=False)
        s.transformer.wte.weight = s.lm_head.weight
    def forward(s, idx):
        x = s.transformer.wte(idx) + s.transformer.wpe(torch.arange(idx.size(1)))
        for b in s.transformer.h: x = b(x)
        return s.lm_head(s.transformer.ln_f(x))
sd = {k: v.float() for k, v in load_file(sys.argv[1]).items() if not k.startswith("optimizer.")}
m = GPT()
print("load_state_dict(strict=True):", m.load_state_dict(sd, strict=True))
torch.manual_seed(0)
idx = torch.randint(0, 50257, (4, 129))
with torch.no_grad(): loss = F.cross_entropy(m(idx[:, :-1]).reshape(-1, V), idx[:, 1:].reshape(-1))
print("nanoGPT-structured loss on random tokens: %.4f (ln 50304 = %.4f)" % (loss.item(), torch.log(torch.tensor(50304.)).item()))
PY
      ;;
    gpt_graph) # GPT-2 124M bf16 B=16 eager against CUDA graphs (the INI sets none), alternating GPT_GRAPH_R (2) rounds
      for r in $(seq "${GPT_GRAPH_R:-2}"); do
        for g in false true; do stoke_gpt 16 "cuda_graph=$g round $r" run.cuda_graph=$g; done
      done
      ;;
    ncu)
      ini=${NCU_INI:-$S/examples/resnet50.ini}
      log "ncu on $(basename "$ini"): kernels /${NCU_KERNELS:-max_pool}/, launches ${NCU_SKIP:-3} skipped, ${NCU_COUNT:-6} profiled"
      (cd /tmp && timeout 400 ncu --clock-control none -k "regex:${NCU_KERNELS:-max_pool}" --launch-skip "${NCU_SKIP:-3}" \
        --launch-count "${NCU_COUNT:-6}" --section SpeedOfLight --section Occupancy --section LaunchStats \
        "$T" "$ini" run.steps=3 run.cuda_graph=false run.progress=off run.out_dir=/tmp/stoke_ncu > "$OUT/ncu.txt" 2>&1)
      echo "ncu rc=$?"
      python3 "$HERE/ncu_summary.py" "$OUT/ncu.txt"
      ;;
    ktrace)
      w=${KT_W:-resnet18c}
      log "kernel trace (CUPTI) of $w: stoke ($S/examples/$w.ini ${KT_EXTRA:-}) and PyTorch (${KT_TORCH:-resnet18c:bf16+compile-ro})"
      (cd /tmp && CUDA_INJECTION64_PATH="$S/bin/libkernel_trace.so" KTRACE_OUT="$OUT/ktrace_stoke.csv" timeout 400 "$T" \
        "$S/examples/$w.ini" run.steps=${KT_STEPS:-60} run.progress=off run.out_dir=/tmp/stoke_ktrace run.overwrite=true \
        ${KT_EXTRA:-} > "$OUT/ktrace_stoke.log" 2>&1)
      echo "stoke rc=$?: $(grep -E 'samples/s median' "$OUT/ktrace_stoke.log")"
      python3 "$HERE/kernel_trace.py" "$OUT/ktrace_stoke.csv" ${KT_ARGS:-}
      if [ "${KT_TORCH:-resnet18c:bf16+compile-ro}" != none ]; then
        (cd /tmp && CUDA_INJECTION64_PATH="$S/bin/libkernel_trace.so" KTRACE_OUT="$OUT/ktrace_torch.csv" timeout 600 \
          python3 "$S/anchors/torch_bench.py" "$OUT/ktrace_torch.jsonl" ${KT_TORCH:-resnet18c:bf16+compile-ro} \
          > "$OUT/ktrace_torch.log" 2>&1)
        echo "torch rc=$?: $(tail -1 "$OUT/ktrace_torch.jsonl" 2>/dev/null | cut -c1-200)"
        python3 "$HERE/kernel_trace.py" "$OUT/ktrace_torch.csv" ${KT_ARGS:-}
      fi
      ;;
    wgrad) # [run] wgrad_stream: the same bits with the weight gradients on the side stream
      log "resnet18c bf16 under run.deterministic, wgrad_stream 0 against 1, 2 and 64, eager and CUDA graphs: the same bits"
      ok=1
      for cg in false true; do
        for k in 0 1 2 64; do
          timeout 300 "$T" "$S/examples/resnet18c.ini" run.steps=12 run.log_every=1 run.deterministic=true \
            run.cuda_graph=$cg run.wgrad_stream=$k run.progress=off run.checkpoint=true \
            run.out_dir="$OUT/wgrad_${cg}_$k" > "$OUT/wgrad_${cg}_$k.log" 2>&1
          echo "cuda_graph=$cg wgrad_stream=$k rc=$? $(grep -hE 'wgrad_stream:|^stoke: error' "$OUT/wgrad_${cg}_$k.log" | head -2 | tr '\n' ' ')"
          [ "$k" = 0 ] && continue
          same_bits "$OUT/wgrad_${cg}_0" "$OUT/wgrad_${cg}_$k" "cuda_graph=$cg wgrad_stream 0 vs $k" 12 || ok=0
        done
      done
      [ $ok = 1 ] && echo "wgrad: PASS" || echo "wgrad: FAIL"
      ;;
    samebits) # a plugin change that must not change a bit: BEFORE's plugins against these (SB_W workloads
              # at batch SB_BATCH, SB_EXTRA more overrides: gpt2_124m needs optimizer.warmup_epochs=0.0001)
      [ -d "${BEFORE:-}/bin/plugins" ] || { echo "samebits: BEFORE (an unpacked stage) has no bin/plugins"; continue; }
      ok=1
      for w in ${SB_W:-resnet18c resnet50}; do
        log "$w bf16 (batch ${SB_BATCH:-64}) under run.deterministic with CUDA graphs, BEFORE's plugins against these: the same bits"
        for side in before after; do
          root=$S; [ $side = before ] && root=$BEFORE
          STOKE_PLUGIN_PATH="$root/bin/plugins" timeout 300 "$T" "$S/examples/$w.ini" data.batch_size=${SB_BATCH:-64} \
            run.steps=10 run.log_every=1 run.deterministic=true run.progress=off run.checkpoint=true ${SB_EXTRA:-} \
            run.out_dir="$OUT/sb_${w}_$side" > "$OUT/sb_${w}_$side.log" 2>&1
          echo "$side rc=$?"
        done
        same_bits "$OUT/sb_${w}_before" "$OUT/sb_${w}_after" "$w before vs after" 10 || ok=0
      done
      [ $ok = 1 ] && echo "samebits: PASS" || echo "samebits: FAIL"
      ;;
    pool_index) # [run] pool_index: max_pool2d_idx's saved window indices change no bit
      switch_same_bits pool_index pool_index '^max pools:'
      ;;
    shortcut) # [run] fuse_shortcut: bn_add_bn_relu computes what batch_norm -> bn_add_relu compute, bit for bit
      switch_same_bits shortcut fuse_shortcut '^shortcut batch norms:'
      ;;
    gpt_det)
      log "gpt2_124m bf16 B=8 under run.deterministic, two runs: the same bits"
      for r in 1 2; do
        timeout 600 "$T" "$S/examples/gpt2_124m.ini" data.batch_size=8 run.steps=12 run.log_every=1 optimizer.warmup_epochs=0.001 \
          run.deterministic=true run.progress=off run.checkpoint=true run.out_dir="$OUT/gpt_det_$r" > "$OUT/gpt_det_$r.log" 2>&1
        echo "run $r rc=$? $(grep -E 'deterministic engine|^stoke: error' "$OUT/gpt_det_$r.log" | head -2 | tr '\n' ' ')"
      done
      if same_bits "$OUT/gpt_det_1" "$OUT/gpt_det_2" "gpt_det run 1 vs 2" 12; then echo "gpt_det: PASS"; else echo "gpt_det: FAIL"; fi
      ;;
    fmnist)
      log "fashion-mnist CNN on the GPU"
      D="$S/data"; mkdir -p /tmp/fm
      "$S/bin/convert" idx --images $D/train-images-idx3-ubyte.gz --labels $D/train-labels-idx1-ubyte.gz --out /tmp/fm/train --force | tail -1
      "$S/bin/convert" idx --images $D/t10k-images-idx3-ubyte.gz --labels $D/t10k-labels-idx1-ubyte.gz --out /tmp/fm/test --force | tail -1
      for prec in ${FMNIST_PRECS:-fp32 bf16}; do
        timeout 150 "$T" "$S/examples/fmnist_cnn.ini" run.backends=cudnn,cublaslt,cuda run.precision=$prec run.progress=lines \
          data.path=/tmp/fm/train eval_data.path=/tmp/fm/test data.workers=8 run.out_dir="$OUT/fmnist_$prec" \
          > "$OUT/fmnist_$prec.log" 2>&1
        echo "fmnist $prec rc=$?"; grep -E "^eval|summary|samples/s median|MFU|error" "$OUT/fmnist_$prec.log" | head -12
      done
      ;;
    bench)
      for w in ${BENCH_W:-mlp resnet50 resnet18c}; do
        for prec in ${BENCH_P:-tf32 bf16 fp16}; do
          timeout 100 "$T" "$S/examples/$w.ini" run.checkpoint=false run.precision=$prec run.progress=lines run.out_dir="$OUT/bench_${w}_$prec" \
            > "$OUT/bench_${w}_$prec.log" 2>&1
          rc=$?
          s=$(grep -h '"summary"' "$OUT/bench_${w}_$prec/metrics.jsonl" 2>/dev/null | python3 -c 'import json,sys; r=json.loads(sys.stdin.read() or "{}"); print(r.get("samples_per_s_median"), r.get("step_time_ms_p50"), r.get("mfu"), r.get("final_loss"))')
          echo "stoke $w $prec rc=$rc samples/s,step_ms,mfu,loss: $s"
          [ $rc -ne 0 ] && tail -5 "$OUT/bench_${w}_$prec.log"
        done
      done
      ;;
    loader)
      log "jpeg-bench loader"
      "$S/bin/make_jpeg_bench" --photos "$S/photos" --out /tmp/jb --count 3000 --seed 1 | tail -1
      printf '[run]\nbackends = cpu\n[data]\nsource = jpeg\nroot = /tmp/jb\nsize = 224\nbatch_size = 256\n[model]\nname = mlp\n' > /tmp/jb.ini
      timeout 200 "$S/bin/bench_loader" /tmp/jb.ini --workers 1,4,8,16 --batches 24 --warmup 4 --json "$OUT/loader.jsonl" 2>&1 | grep -v "^;" | tail -6
      for ini in resnet50 resnet50_jpeg; do
        timeout 150 "$T" "$S/examples/$ini.ini" run.checkpoint=false run.steps=60 run.progress=off \
          run.out_dir="$OUT/$ini" > "$OUT/$ini.log" 2>&1
        echo "$ini bf16 rc=$?: $(grep -E 'samples/s median' "$OUT/$ini.log")"
      done
      timeout 240 python3 "$S/anchors/loader_bench.py" "$S/photos" /tmp/anchor "$OUT/loader_anchor.json" 2>&1 | tail -1
      ;;
    recompute) # all of issue 14's parts below, in one call (over 10 minutes: give each its own call where that limits)
      bash "$0" recompute_eq recompute_fit recompute_ab recompute_torch
      ;;
    recompute_eq) # every recompute pattern against none: the same weights and losses, bit for bit
      set -f # the patterns (h.*) are words, not file globs
      ok=1
      GPTS="$S/examples/gpt2_124m.ini model.n_layer=2 model.n_embd=128 model.n_head=4 model.context=128 data.shape=129
            data.batch_size=8 run.steps=30 run.log_every=1 run.progress=off run.checkpoint=true"
      RN="$S/examples/resnet18c.ini data.batch_size=64 run.steps=30 run.log_every=1 run.progress=off run.checkpoint=true"
      MLPR="$S/examples/mlp.ini run.steps=30 run.log_every=1 run.progress=off run.checkpoint=true"
      for net in ${RC_EQ_NETS:-gpt rn mlp}; do
        case $net in
          gpt) base=$GPTS pats="h.*.attn h.* auto" ;;
          rn) base=$RN pats="layer*.* layer2.*,layer4.* auto" ;;
          mlp) base=$MLPR pats="layers.* auto" ;;
        esac
        for prec in ${RC_EQ_PREC:-fp32 bf16 fp16}; do
          # deterministic engines everywhere: then recomputation must change nothing, bit for bit (with
          # run.conv_autotune's timed choice two runs may pick different engines and differ by rounding)
          [ $prec = fp32 ] && extra="run.deterministic=true run.cuda_graph=false" || extra="run.deterministic=true run.cuda_graph=true data.batch_size=4 run.accumulate=2"
          [ $net = rn ] && [ $prec != fp32 ] && extra="run.deterministic=true run.cuda_graph=true data.batch_size=32 run.accumulate=2"
          log "recompute correctness: $net $prec ($extra), none against each of: $pats"
          timeout 300 "$T" $base $extra run.precision=$prec run.recompute=none run.out_dir="$OUT/rc_${net}_${prec}_none" \
            > "$OUT/rc_${net}_${prec}_none.log" 2>&1; echo "none rc=$?"
          for p in ${RC_EQ_NOISE:+none} $pats; do # RC_EQ_NOISE=1: none twice, the run-to-run reference
            tag=$(echo "$p" | tr -c 'a-z0-9\n' '_'); [ "$p" = none ] && tag=none_again
            mem=""; [ "$p" = auto ] && mem="run.memory_gb=0.001" # a budget nothing fits: auto recomputes all it can
            timeout 300 "$T" $base $extra run.precision=$prec run.recompute="$p" $mem run.out_dir="$OUT/rc_${net}_${prec}_$tag" \
              > "$OUT/rc_${net}_${prec}_$tag.log" 2>&1
            echo "$p rc=$? $(grep -E '^recompute \(|^stoke: error' "$OUT/rc_${net}_${prec}_$tag.log" | head -2 | tr '\n' ' ')"
            same_bits "$OUT/rc_${net}_${prec}_none" "$OUT/rc_${net}_${prec}_$tag" "$net $prec none vs $p" 30 || ok=0
          done
        done
      done
      set +f
      [ $ok = 1 ] && echo "recompute_eq: PASS" || echo "recompute_eq: FAIL"
      ;;
    recompute_fit)
      G="$S/examples/gpt2_124m.ini run.progress=off run.steps=30"
      R50="$S/examples/resnet50.ini run.progress=off run.steps=30"
      log "gpt2_124m / resnet50 bf16: the largest batch that fits this GPU (--dry-run, batch_size = auto)"
      for rc in none auto; do
        timeout 600 "$T" --dry-run $G data.batch_size=auto run.recompute=$rc 2>&1 | grep -E "^dry run|batch_size = auto|error"
        timeout 600 "$T" --dry-run $R50 data.batch_size=auto run.recompute=$rc 2>&1 | grep -E "^dry run|batch_size = auto|error"
      done
      summary() { python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if 'summary' in l][-1]; print('samples/s', r['samples_per_s_median'], 'x', sys.argv[2], '=', round(r['samples_per_s_median'] * int(sys.argv[2])), 'per s; step ms p50', r['step_time_ms_p50'], '; peak GPU memory (NVML, MiB)', r['gpu_mem_max_mib'])" "$@" 2>/dev/null || echo "no summary"; }
      # rc_runs TAG PER_SAMPLE BATCHES CONFIG...: each batch with recompute none and auto
      rc_runs() {
        local tag=$1 per=$2 batches=$3; shift 3
        for b in $batches; do
          for rc in none auto; do
            log "$tag batch $b recompute=$rc"
            timeout 600 "$T" "$@" data.batch_size=$b run.recompute=$rc run.out_dir="$OUT/rc_${tag}_${b}_$rc" \
              > "$OUT/rc_${tag}_${b}_$rc.log" 2>&1
            echo "rc=$? $(grep -E '^recompute \(|^memory:|^stoke: error' "$OUT/rc_${tag}_${b}_$rc.log" | head -3 | tr '\n' ' ')"
            summary "$OUT/rc_${tag}_${b}_$rc/metrics.jsonl" $per
          done
        done
      }
      rc_runs gpt2_124m 1024 "${RC_GPT_B:-16 128 256}" $G
      rc_runs resnet50 1 "${RC_R50_B:-256 1024 2048}" $R50
      ;;
    r50_batches) # issue 14's ResNet-50 goal: per-image speed at batch 1024 against 256, and where the difference is
      for b in ${R50_BATCHES:-256 1024}; do
        log "ResNet-50 bf16 batch $b per-op profile"
        timeout 300 "$T" "$S/examples/resnet50.ini" data.batch_size=$b run.steps=12 run.profile_ops=true run.progress=off \
          run.checkpoint=false run.out_dir="$OUT/r50_prof_$b" > "$OUT/r50_prof_$b.log" 2>&1
        echo "rc=$?"; sed -n '/per-op GPU time/,/slowest nodes/p' "$OUT/r50_prof_$b.log" | head -${R50_PROF_LINES:-40}
      done
      ;;
    recompute_ab)
      set -f
      G="$S/examples/gpt2_124m.ini" # the bench sets steps, progress and checkpointing itself
      B=${RC_AB_B:-32}
      log "gpt2_124m bf16 B=$B step time A/B: recompute none (A) against h.*.attn (B), then against auto at the budget h.*.attn fits"
      timeout 900 "$S/bin/bench" $G data.batch_size=$B --rounds ${AB_ROUNDS:-3} --steps ${AB_STEPS:-30} run.out_dir="$OUT/rc_ab_attn_runs" \
        --a run.recompute=none --b run.recompute=h.*.attn --json "$OUT/rc_ab_attn.json" --md "$OUT/rc_ab_attn.md" > "$OUT/rc_ab_attn.log" 2>&1; echo "rc=$?"; tail -6 "$OUT/rc_ab_attn.log"
      need=$("$T" --dry-run $G data.batch_size=$B run.recompute=h.*.attn run.memory_gb=1000 2>&1 | grep -Eo 'the plan needs [0-9.]+' | grep -Eo '[0-9.]+$')
      gb=$(python3 -c "print(round($need / 0.85 + 0.005, 3))" 2>/dev/null)
      echo "h.*.attn's plan at B=$B needs $need GiB: auto with run.memory_gb=$gb"
      timeout 900 "$S/bin/bench" $G data.batch_size=$B --rounds ${AB_ROUNDS:-3} --steps ${AB_STEPS:-30} run.out_dir="$OUT/rc_ab_auto_runs" \
        --a run.recompute=none --b run.recompute=auto run.memory_gb=$gb --json "$OUT/rc_ab_auto.json" --md "$OUT/rc_ab_auto.md" > "$OUT/rc_ab_auto.log" 2>&1; echo "rc=$?"; tail -6 "$OUT/rc_ab_auto.log"
      set +f
      grep -hE "^recompute \(" "$OUT"/rc_ab_*_runs/B/plan.txt 2>/dev/null
      ;;
    recompute_torch)
      log "PyTorch: torch.utils.checkpoint on every block (gpt_ckpt_torch.py), tokens/s and peak memory"
      for b in ${RC_TORCH_B:-16 32 64}; do
        B=$b timeout 900 python3 "$HERE/gpt_ckpt_torch.py" "$S/anchors" "$OUT/rc_torch.jsonl" ${RC_TORCH_MODES:-bf16 bf16+ckpt bf16+compile+ckpt} 2>&1 | grep '^{'
        # the same B in stoke: recompute = auto with each checkpointed PyTorch peak as the plan's budget
        # (memory_gb = peak / 0.85: 85% of memory_gb is the budget), and h.* (every block, as PyTorch)
        for mode in ${RC_TORCH_MODES:-bf16+ckpt bf16+compile+ckpt}; do
          case $mode in *ckpt) ;; *) continue ;; esac
          gb=$(python3 -c "import json,sys; r=[json.loads(l) for l in open(sys.argv[1])]; r=[x for x in r if x.get('B')==$b and x.get('mode')=='$mode' and 'peak_mem_gb' in x]; print(round(r[-1]['peak_mem_gb'] * 1e9 / 2**30 / 0.85, 3))" "$OUT/rc_torch.jsonl" 2>/dev/null)
          [ -z "$gb" ] && { echo "B=$b: no PyTorch $mode peak"; continue; }
          stoke_gpt $b "auto (budget: PyTorch $mode's peak)" run.recompute=auto run.memory_gb=$gb
        done
        set -f; stoke_gpt $b "h.* (every block)" run.recompute=h.*; set +f
      done
      ;;
    steptime)
      log "issue 16: device step times, train with and without CUDA graphs against tools/bench"
      w=${STEPTIME_W:-resnet50}
      for le in 4 1; do
        for g in true false; do
          timeout 200 "$T" "$S/examples/$w.ini" run.checkpoint=false run.steps=60 run.log_every=$le run.cuda_graph=$g \
            run.progress=lines run.out_dir="$OUT/st_${w}_${le}_$g" > "$OUT/st_${w}_${le}_$g.log" 2>&1
          echo "$w log_every=$le cuda_graph=$g rc=$?"; grep -A2 "samples/s median" "$OUT/st_${w}_${le}_$g.log" | head -2
        done
      done
      timeout 400 "$S/bin/bench" "$S/examples/$w.ini" --rounds ${AB_ROUNDS:-3} --a run.cuda_graph=false \
        --b run.cuda_graph=true --json "$OUT/st_bench.json" > "$OUT/st_bench.log" 2>&1
      echo "bench rc=$?"; grep -E "^  (A|B) |B/A" "$OUT/st_bench.log"
      python3 - "$OUT" "$w" <<'PY'
import json, sys
out, w = sys.argv[1], sys.argv[2]
def summary(le, g):
    try: return [json.loads(l) for l in open(f"{out}/st_{w}_{le}_{g}/metrics.jsonl") if '"summary"' in l][-1]
    except Exception as e: print(f"FAIL no summary for log_every={le} cuda_graph={g}: {e}"); sys.exit(1)
b = json.load(open(f"{out}/st_bench.json"))
bench_ms = {v["name"]: 1e3 * v["batch"] / v["median"] for v in b["variants"]}
ok = True
def check(what, x, y):
    global ok
    r = x / y
    good = 0.9 <= r <= 1.1
    ok &= good
    print(f"{'PASS' if good else 'FAIL'} {what}: {x:.3f} ms against {y:.3f} ms (ratio {r:.3f})")
for le in (4, 1):
    e, g = summary(le, "false"), summary(le, "true")
    print(f"log_every={le}: eager p50 {e['step_time_ms_p50']:.3f} p95 {e['step_time_ms_p95']:.3f} max {e['step_time_ms_max']:.3f} "
          f"host p50 {e['host_ms_p50']:.3f} | graph p50 {g['step_time_ms_p50']:.3f} p95 {g['step_time_ms_p95']:.3f} "
          f"max {g['step_time_ms_max']:.3f} host p50 {g['host_ms_p50']:.3f} (ms)")
    check(f"log_every={le} p50 graph vs eager", g["step_time_ms_p50"], e["step_time_ms_p50"])
    check(f"log_every={le} p50 eager vs bench A (eager) median", e["step_time_ms_p50"], bench_ms["A"])
    check(f"log_every={le} p50 graph vs bench B (graph) median", g["step_time_ms_p50"], bench_ms["B"])
    check(f"log_every={le} samples/s median graph vs bench B", 1e3 * b["variants"][1]["batch"] / g["samples_per_s_median"], bench_ms["B"])
print("steptime:", "PASS" if ok else "FAIL")
PY
      ;;
    matrix)
      cells=${MATRIX:-"50:256:224 50:128:224 50:64:224 50:32:224 50:256:160 50:256:128 50:128:288 34:256:224 18:256:224 18:64:160"}
      for c in $cells; do
        IFS=: read -r d b r <<< "$c"
        for cfg in best base; do
          extra=""
          [ $cfg = base ] && extra="run.backends=cudnn,cublaslt,cuda run.cuda_graph=false"
          o="$OUT/matrix_${d}_${b}_${r}_$cfg"
          timeout 150 "$T" "$S/examples/resnet50.ini" run.checkpoint=false run.progress=lines run.steps=40 run.out_dir="$o" \
            model.depth=$d data.batch_size=$b data.shape=3,$r,$r $extra > "$o.log" 2>&1
          echo "stoke $c $cfg rc=$? $(grep -h '"summary"' "$o/metrics.jsonl" 2>/dev/null | python3 -c 'import json,sys; r=json.loads(sys.stdin.read() or "{}"); print("samples/s", r.get("samples_per_s_median"))')"
        done
      done
      timeout "${MATRIX_S:-420}" python3 "$HERE/resnet_matrix_torch.py" "$OUT/matrix_torch.jsonl" "${MATRIX_TORCH:-compile-ro}" $cells 2>&1 | grep -v -i warn | tail -40
      python3 - "$OUT" $cells <<'PY'
import json, sys, os
out, cells = sys.argv[1], sys.argv[2:]
def stoke(c, cfg):
    try:
        rows = [json.loads(l) for l in open(f"{out}/matrix_{c.replace(':', '_')}_{cfg}/metrics.jsonl") if '"summary"' in l]
        return rows[-1].get("samples_per_s_median")
    except (OSError, IndexError, ValueError):
        return None
torch = {}
if os.path.exists(f"{out}/matrix_torch.jsonl"):
    for l in open(f"{out}/matrix_torch.jsonl"):
        r = json.loads(l)
        torch[f"{r['depth']}:{r['batch']}:{r['res']}"] = r.get("samples_per_s")
f = lambda v: f"{v:,.0f}" if v else "-"
print("| ResNet | batch | res | stoke best | stoke baseline | best/base | torch.compile-ro | best/torch |")
print("|---|---|---|---|---|---|---|---|")
for c in cells:
    d, b, r = c.split(":")
    s, base, t = stoke(c, "best"), stoke(c, "base"), torch.get(c)
    print(f"| {d} | {b} | {r} | {f(s)} | {f(base)} | {s / base:.3f} |" if s and base else f"| {d} | {b} | {r} | {f(s)} | {f(base)} | - |", end="")
    print(f" {f(t)} | {s / t:.3f} |" if s and t else f" {f(t)} | - |")
PY
      ;;
    binab)
      [ -x "${BEFORE:-}/bin/bench" ] || { echo "binab: BEFORE (an unpacked stage) has no bin/bench"; continue; }
      log "binab: $(cat "$BEFORE/bin/COMMIT" 2>/dev/null || echo '?') (before) against $(cat "$S/bin/COMMIT" 2>/dev/null || echo '?')"
      for item in ${BINAB_W:-mlp resnet50 resnet18c}; do
        w=${item%%@*}; over=""; [ "$item" != "$w" ] && over=$(echo "${item#*@}" | tr '@' ' ')
        tag=$(echo "$item" | tr -c 'A-Za-z0-9_\n' '_' | cut -c1-80)
        for r in $(seq "${BINAB_R:-5}"); do
          for side in before after; do
            root=$S; [ $side = before ] && root=$BEFORE
            STOKE_PLUGIN_PATH="$root/bin/plugins" timeout 200 "$root/bin/bench" "$S/examples/$w.ini" --rounds 1 \
              --json "$OUT/binab_${tag}_${side}_$r.json" $over run.out_dir="/tmp/binab_$side" > "$OUT/binab_${tag}_${side}_$r.log" 2>&1 ||
              { echo "binab $item $side round $r failed:"; tail -3 "$OUT/binab_${tag}_${side}_$r.log"; }
          done
        done
        python3 - "$OUT" "$tag" "${BINAB_R:-5}" "$item" <<'PY'
import json, math, sys
out, w, n, label = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4]
def sps(side, r):
    try: return json.load(open(f"{out}/binab_{w}_{side}_{r}.json"))["variants"][0]["samples_per_s"][0]
    except (OSError, KeyError, IndexError, ValueError): return None
pairs = [(sps("before", r), sps("after", r)) for r in range(1, n + 1)]
pairs = [(a, b) for a, b in pairs if a and b]
if len(pairs) < 2: print(f"binab {label}: too few rounds ({len(pairs)})"); sys.exit()
logs = [math.log(b / a) for a, b in pairs]
m = sum(logs) / len(logs)
sd = math.sqrt(sum((x - m) ** 2 for x in logs) / (len(logs) - 1))
t = {1: 12.71, 2: 4.30, 3: 3.18, 4: 2.78, 5: 2.57, 6: 2.45, 7: 2.36, 8: 2.31, 9: 2.26}.get(len(logs) - 1, 2.0)
h = t * sd / math.sqrt(len(logs))
med = lambda v: sorted(v)[len(v) // 2]
print(f"binab {label}: before {med([a for a, _ in pairs]):,.0f} after {med([b for _, b in pairs]):,.0f} samples/s (medians of {len(pairs)}), "
      f"after/before {math.exp(m):.4f} [95% CI {math.exp(m - h):.4f}, {math.exp(m + h):.4f}]")
PY
      done
      ;;
    observe)
      log "issue 13: trace of steps 20-24 (eager and CUDA graph), TensorBoard, report; costs by tools/bench"
      w=${OBSERVE_W:-resnet50}
      for g in false true; do
        timeout 200 "$T" "$S/examples/$w.ini" run.checkpoint=false run.steps=40 run.log_every=1 run.cuda_graph=$g \
          run.trace=20-24 run.tensorboard=true run.progress=off run.out_dir="$OUT/obs_${w}_$g" > "$OUT/obs_${w}_$g.log" 2>&1
        echo "$w cuda_graph=$g rc=$?"
        python3 - "$OUT/obs_${w}_$g" <<'PY'
import json, statistics, sys
d = sys.argv[1]
t = json.load(open(f"{d}/trace.json"))["traceEvents"]
rows = {r["step"]: r for r in map(json.loads, open(f"{d}/metrics.jsonl")) if "step_time_ms" in r}
gpu_steps = [e for e in t if e.get("cat") == "step" and e["pid"] % 2 == 1]
ops = [e for e in t if e.get("cat") == "op"]
lanes = sorted({(e["pid"], e["tid"]) for e in t if e["ph"] == "X"})
names = {(e["pid"], e["tid"]): e["args"]["name"] for e in t if e["ph"] == "M" and e["name"] == "thread_name"}
flows = [e for e in t if e["ph"] in "sf"]
traced = [rows[s]["step_time_ms"] for s in range(20, 25) if s in rows]
other = [rows[s]["step_time_ms"] for s in range(8, 19) if s in rows] + [rows[s]["step_time_ms"] for s in range(27, 41) if s in rows]
print(f"  trace: {len(gpu_steps)} GPU steps, {len(ops)} op slices, {len(flows)} flow events, lanes "
      f"{[names.get(l, l) for l in lanes]}")
print(f"  op slices per step {len(ops) / max(1, len(gpu_steps)):.0f}; first ops: {[o['name'] for o in ops[:4]]}")
if traced and other:
    a, b = statistics.median(traced), statistics.median(other)
    print(f"  step time traced (20-24) median {a:.3f} ms, untraced median {b:.3f} ms: tracing costs {100 * (a / b - 1):+.1f}% in its steps")
print("  trace", "PASS" if len(gpu_steps) == 5 and ops else "FAIL")  # under cuda_graph too: traced steps run eagerly
PY
      done
      TRACE=20-24 python3 "$HERE/observe_check.py" "$OUT/obs_${w}_false" | grep -v "^\[       OK"
      GRAPH=1 TRACE=20-24 python3 "$HERE/observe_check.py" "$OUT/obs_${w}_true" | grep -v "^\[       OK"
      [ "${OBSERVE_QUICK:-0}" = 1 ] && continue # the runs above only: no bench rounds, no nsys
      log "tools/bench: trace of 5 steps off/on (whole-run rate), NVTX off/on"
      timeout 300 "$S/bin/bench" "$S/examples/$w.ini" --rounds ${AB_ROUNDS:-3} --a run.trace= --b run.trace=14-18 > "$OUT/obs_trace_ab.log" 2>&1
      echo "trace A/B rc=$?"; grep -E "^  (A|B) |B/A" "$OUT/obs_trace_ab.log"
      for g in true false; do
        timeout 300 "$S/bin/bench" "$S/examples/$w.ini" run.cuda_graph=$g --rounds ${AB_ROUNDS:-3} --a run.nvtx=false --b run.nvtx=true > "$OUT/obs_nvtx_$g.log" 2>&1
        echo "nvtx A/B cuda_graph=$g rc=$?"; grep -E "^  (A|B) |B/A" "$OUT/obs_nvtx_$g.log"
      done
      if command -v nsys > /dev/null; then
        timeout 200 nsys profile -o "$OUT/obs_nsys" --force-overwrite true "$T" "$S/examples/$w.ini" run.steps=12 \
          run.cuda_graph=false run.checkpoint=false run.progress=off run.out_dir="$OUT/obs_nsys_run" > "$OUT/obs_nsys.log" 2>&1
        nsys stats --report nvtx_sum "$OUT/obs_nsys.nsys-rep" 2>/dev/null | head -20
      else
        echo "nsys not installed here: NVTX names not checked"
      fi
      ;;
    observe_graph)
      log "issue 13: traced steps under CUDA graphs: per-op slices, replays after the window, training as untraced"
      ok=1
      # tag workload steps window settings: fp32 resnet18c (bitwise expected); mlp fp16 whose scaler starts at
      # 1e10 (skipped steps while it halves, then clean ones, across the window) with clipping and accumulation
      # (SPEED: the graph-speed check; mlp16's steps before its window skip their update, those after do not)
      for spec in "rn18c resnet18c 30 10-12 1 run.precision=fp32 data.batch_size=64" \
                  "mlp16 mlp 40 12-26 0 run.precision=fp16 run.loss_scale_init=1e10 run.accumulate=2 optimizer.grad_clip=1
                   model.hidden=1024,1024 data.batch_size=1024"; do
        set -- $spec; tag=$1; w=$2; n=$3; win=$4; speed=$5; shift 5
        for tr in $win off; do
          d="$OUT/og_${tag}_$tr"; spec_tr=$tr; [ $tr = off ] && spec_tr=""
          timeout 300 "$T" "$S/examples/$w.ini" run.cuda_graph=true run.deterministic=true run.conv_autotune=false \
            run.steps=$n run.log_every=1 run.progress=off run.tensorboard=true run.checkpoint=true run.trace=$spec_tr "$@" \
            run.out_dir="$d" > "$d.log" 2>&1
          rc=$?; [ $rc -ne 0 ] && ok=0
          echo "$tag trace=$tr rc=$rc $(grep -hE 'replayed the CUDA graph|run eagerly, outside|^stoke: error' "$d.log" | head -3 | tr '\n' ' ')"
        done
        GRAPH=1 TRACE=$win SPEED=$speed SAME_AS="$OUT/og_${tag}_off" python3 "$HERE/observe_check.py" "$OUT/og_${tag}_$win" \
          > "$OUT/og_${tag}_check.log" 2>&1 || ok=0
        grep -v "^\[       OK" "$OUT/og_${tag}_check.log"
      done
      echo "observe_graph: $([ $ok = 1 ] && echo PASS || echo FAIL)"
      ;;
    observe_ddp)
      # the trace of 3 steps on 2 GPUs, eager and under CUDA graphs (traced steps run eagerly there, the
      # bucket timers on), each rank's buckets against its backward; then both ranks of step 21 (the window's
      # middle: the first traced step also pays the switch to timing) drawn in one picture,
      # $OUT/obs_ddp_timeline.svg (eager) and obs_ddp_graph_timeline.svg. BENCHMARKS.md's PNG of it, on the
      # build machine (chromium, no GPU; H = the height trace_svg.py printed below):
      #   chromium --headless --no-sandbox --disable-gpu --hide-scrollbars --window-size=1600,H \
      #     --screenshot=docs/ddp_trace.png file://$PWD/obs_ddp_timeline.svg
      log "issue 13: trace of a data-parallel step on 2 GPUs: the all-reduce buckets against the backward"
      ok=1
      for graph in ${OBS_DDP_GRAPH:-false true}; do
        d=$OUT/obs_ddp; [ $graph = true ] && d=$OUT/obs_ddp_graph
        timeout 200 $S/bin/launch --gpus 2 $S/examples/resnet50.ini run.cuda_graph=$graph run.checkpoint=false \
          run.steps=30 run.log_every=1 run.trace=20-22 run.progress=off run.out_dir=$d > $d.log 2>&1
        rc=$?; echo "2 GPUs cuda_graph=$graph rc=$rc"; [ $rc -ne 0 ] && { ok=0; tail -5 $d.log; }
        for f in $d/trace.json $d/rank1/trace.json; do
          python3 - "$f" "$HERE" <<'PY' | tee $d.check.log
import json, sys
sys.path.insert(0, sys.argv[2])
from trace_svg import window_buckets  # a step's own buckets: the picture's rule
t = json.load(open(sys.argv[1]))["traceEvents"]
comm = [e for e in t if e.get("cat") == "comm"]
bwd = [e for e in t if e.get("cat") == "op" and e["args"].get("pass") == "backward"]
if not comm or not bwd:
    print(f"{sys.argv[1]}: FAIL {len(comm)} bucket slices, {len(bwd)} backward op slices"); sys.exit()
# per step: the buckets that started before the last backward node ended overlap the backward
steps = [e for e in t if e.get("cat") == "step" and e["pid"] % 2 == 1]
over = 0
for s in steps:
    c, b = window_buckets(t, s["ts"], s["ts"] + s["dur"])
    if b and c:
        last_bwd = max(e["ts"] + e["dur"] for e in b)
        over += sum(e["ts"] < last_bwd for e in c)
        print(f"  {s['name']}: {len(c)} buckets, {sum(e['ts'] < last_bwd for e in c)} started during the backward; "
              f"all-reduce {sum(e['dur'] for e in c) / 1e3:.2f} ms, backward {sum(e['dur'] for e in b) / 1e3:.2f} ms")
print(f"{sys.argv[1]}: {'PASS' if over else 'FAIL'} ({len(comm)} bucket slices, {over} overlapping the backward)")
PY
          grep -q ": PASS (" $d.check.log || ok=0
        done
        svg=$OUT/obs_ddp_timeline.svg; [ $graph = true ] && svg=$OUT/obs_ddp_graph_timeline.svg
        what=eager; [ $graph = true ] && what="cuda_graph = true (traced steps eager)"
        python3 "$HERE/trace_svg.py" $d/trace.json $d/rank1/trace.json --steps 21 -o $svg \
          --title "stoke: ResNet-50 on 2 GPUs, data parallel, step 21, $what: all-reduce buckets against the backward" \
          || ok=0
      done
      echo "observe_ddp: $([ $ok = 1 ] && echo PASS || echo FAIL)"
      ;;
    two_gpu) # what waits for a 2-GPU machine (nvidia-h200-x2), over the 10-minute limit of one call in all:
      # run two_gpu_a and two_gpu_b as two calls
      bash "$0" two_gpu_a two_gpu_b
      ;;
    two_gpu_a) # issue 13's trace of the buckets (eager and graphs), issue 14's recompute under data parallel
      bash "$0" observe_ddp ddp_recompute
      ;;
    two_gpu_b) # issue 12's GPT-2 scaling, issue 11's graphs with nccl and its 2-GPU ResNet-50 speed
      bash "$0" ddp_gpt ddp_graph ddp_bench
      ;;
    ddp_gpt) # issue 12: GPT-2 124M bf16, B=16 per GPU, 1 and 2 GPUs (the scaling goal: >= 98%); variants
      # label:environment:overrides for the 2-GPU run (DDP_GPT_VARIANTS), e.g. NCCL's channel count
      log "gpt2_124m bf16 B=16 per GPU: 1 and 2 GPUs"
      # DDP_GPT_ACCUM: micro-batches a step (nanoGPT's 0.5M-token batch is 16 of 16 x 1024 on 2 GPUs); only the
      # last all-reduces, in stoke and in PyTorch (no_sync)
      g="$S/examples/gpt2_124m.ini run.checkpoint=false run.progress=off run.steps=${DDP_GPT_STEPS:-40}"
      g="$g run.accumulate=${DDP_GPT_ACCUM:-1} run.log_every=${DDP_GPT_LOG:-10}"
      timeout 150 $T $g run.out_dir=$OUT/gpt1 > $OUT/gpt1.log 2>&1; echo "1 GPU rc=$?"
      one=$OUT/gpt1
      if [ "${DDP_GPT_BOTH:-1}" = 1 ]; then # GPU 1 alone too: the reference is both boards' mean
        CUDA_VISIBLE_DEVICES=1 timeout 150 $T $g run.out_dir=$OUT/gpt1b > $OUT/gpt1b.log 2>&1; echo "1 GPU (GPU 1) rc=$?"
        one=$OUT/gpt1,$OUT/gpt1b
      fi
      for v in ${DDP_GPT_VARIANTS:-default::}; do
        IFS=: read label envs over <<< "$v"
        envs=${envs//,/ } over=${over//,/ } # several variables or overrides: comma-separated
        timeout 200 env $envs $S/bin/launch --gpus 2 $g $over run.out_dir=$OUT/gpt2_$label > $OUT/gpt2_$label.log 2>&1
        echo "2 GPUs $label ($envs $over) rc=$?"
        grep -hE "^data parallel:|gradient all-reduce" $OUT/gpt2_$label.log | head -3
        echo "stoke GPT-2 124M bf16 B=16/GPU $label: $(scaling $one $OUT/gpt2_$label 1024 tokens/s)"
      done
      if [ "${DDP_GPT_TORCH:-0}" = 1 ]; then # PyTorch DDP on the same machine, 1 and 2 GPUs (eager and compiled)
        rm -f $OUT/gpt_ddp_torch.jsonl
        for mode in ${DDP_GPT_TORCH_MODES:-bf16 bf16+compile}; do
          for n in 1 2; do
            B=16 ACCUM=${DDP_GPT_ACCUM:-1} timeout 300 python3 -m torch.distributed.run --standalone --nproc_per_node=$n "$HERE/gpt_ddp_torch.py" \
              "$S/anchors" $OUT/gpt_ddp_torch.jsonl $mode > $OUT/gpt_ddp_torch_${mode}_$n.log 2>&1
            echo "pytorch DDP $mode $n GPU(s) rc=$?"
          done
        done
        python3 - $OUT/gpt_ddp_torch.jsonl <<'PY'
import json, sys
r = {(d["mode"], d["world"]): d["tokens_per_s_total"] for d in map(json.loads, open(sys.argv[1]))}
acc = {d["mode"]: d.get("accumulate", 1) for d in map(json.loads, open(sys.argv[1]))}
for mode in ("bf16", "bf16+compile"):
    if (mode, 1) in r and (mode, 2) in r:
        print(f"pytorch DDP GPT-2 124M {mode} B=16/GPU x {acc.get(mode, 1)} micro-batches: 1 GPU {r[mode, 1]} tokens/s, 2 GPUs {r[mode, 2]}, "
              f"scaling {100 * r[mode, 2] / (2 * r[mode, 1]):.1f}%")
PY
      fi
      ;;
    gpt_shapes) # GPT shapes outside the suite: stoke against torch.compile, tokens/s and memory, per cell
      # GPT_SHAPES_PRECISION=tf32: both sides without bf16 autocast (stoke's run.precision; PyTorch's "tf32+compile":
      # fp32 weights, TF32 products, SDPA's fp32 kernel)
      prec=${GPT_SHAPES_PRECISION:-bf16}
      cells=${GPT_SHAPES:-"8:1024:24:16:1024:50304 32:512:12:12:768:50304 16:1024:12:6:768:50304 8:2048:12:12:768:50304 64:256:6:6:384:256 24:300:4:5:320:1024"}
      for c in $cells; do
        IFS=: read -r b t l h d v <<< "$c"
        cls=$v; [ "$v" = 50304 ] && cls=50257 # GPT-2's vocabulary, padded to 50304 by the model as nanoGPT does
        o="$OUT/gshape_$(echo $c | tr : _)"
        # no warm-up: a run of a few steps is shorter than 1% of a small batch's epoch (speed is the same either way)
        timeout 200 "$T" "$S/examples/gpt2_124m.ini" run.checkpoint=false run.progress=off run.steps=${GPT_SHAPES_STEPS:-40} \
          optimizer.warmup_epochs=0 run.precision=$prec run.out_dir="$o" data.batch_size=$b data.shape=$((t + 1)) data.classes=$cls model.context=$t model.n_layer=$l \
          model.n_head=$h model.n_embd=$d > "$o.log" 2>&1
        echo "stoke gpt $c rc=$? $(grep -hE '^stoke: error' "$o.log" | head -1)"
      done
      [ "${GPT_SHAPES_TORCH:-1}" = 1 ] && timeout "${GPT_SHAPES_S:-420}" python3 "$HERE/gpt_shapes_torch.py" "$S/anchors" \
        "$OUT/gpt_shapes_torch.jsonl" $cells --mode "$prec+compile" 2>&1 | grep -v -i warn | tail -20
      python3 - "$OUT" $cells <<'PY'
import json, os, sys
out, cells = sys.argv[1], sys.argv[2:]
def stoke(c):
    try:
        r = [json.loads(l) for l in open(f"{out}/gshape_{c.replace(':', '_')}/metrics.jsonl") if '"summary"' in l][-1]
        return r["samples_per_s_median"] * int(c.split(":")[1]), (r.get("device_alloc_mib") or 0) * 1048576 / 1e9
    except (OSError, IndexError, ValueError, KeyError, TypeError):
        return None, None
torch = {}
if os.path.exists(f"{out}/gpt_shapes_torch.jsonl"):
    for l in open(f"{out}/gpt_shapes_torch.jsonl"):
        r = json.loads(l)
        torch[r["cell"]] = r
f = lambda v: f"{v:,.0f}" if v else "-"
print("| B | T | layers | heads | width | vocab | stoke tokens/s | GB | torch.compile tokens/s | peak GB | ratio |")
print("|---|---|---|---|---|---|---|---|---|---|---|")
for c in cells:
    s, mem = stoke(c)
    t = torch.get(c, {})
    tt = t.get("tokens_per_s")
    ratio = f"{s / tt:.3f}" if s and tt else "-"
    print(f"| {' | '.join(c.split(':'))} | {f(s)} | {mem or 0:.2f} | {f(tt) if tt else t.get('error', '-')} | "
          f"{t.get('peak_mem_gb', '-')} | {ratio} |")
PY
      ;;
    ddp_gpt_rounds) # issue 12's scaling, interleaved: 1 GPU and 2 GPUs alternately DDP_GPT_ROUNDS times (3), so
      # that clock drift between two long runs (seen: 31.5 -> 32.6 ms over 80 steps on one GPU) is in both
      log "gpt2_124m bf16 B=16 per GPU: 1 and 2 GPUs alternately, ${DDP_GPT_ROUNDS:-3} rounds"
      g="$S/examples/gpt2_124m.ini run.checkpoint=false run.progress=off run.steps=${DDP_GPT_STEPS:-60}"
      rm -f $OUT/gptr.txt
      for r in $(seq ${DDP_GPT_ROUNDS:-3}); do
        timeout 150 $T $g run.out_dir=$OUT/gptr1_$r > $OUT/gptr1_$r.log 2>&1; echo "round $r: 1 GPU rc=$?"
        timeout 200 $S/bin/launch --gpus 2 $g run.out_dir=$OUT/gptr2_$r > $OUT/gptr2_$r.log 2>&1; echo "round $r: 2 GPUs rc=$?"
        echo "  round $r: $(scaling $OUT/gptr1_$r $OUT/gptr2_$r 1024 tokens/s)" | tee -a $OUT/gptr.txt
      done
      echo "stoke GPT-2 124M bf16 B=16/GPU, interleaved: scaling median $(sed -n 's/.*scaling \([0-9.na]*\)%.*/\1/p' $OUT/gptr.txt |
        sort -g | awk '{v[NR] = $1} END {print (NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2)}')%"
      ;;
    ddp) # all of the data-parallel checks below, in one call
      bash "$0" ddp_eq ddp_graph ddp_resume ddp_kill ddp_bench
      ;;
    ddp_recompute)
      # issue 14 with data parallel: a small gpt on 2 GPUs, recompute none against patterns and auto (fp32
      # deterministic: the weights bitwise equal), eager and with CUDA graphs; the buckets go as backward makes them
      set -f
      G2="$S/examples/gpt2_124m.ini model.n_layer=4 model.n_embd=128 model.n_head=4 model.context=128 data.shape=129
          data.batch_size=8 data.on_device=false run.steps=20 run.precision=fp32 run.deterministic=true
          run.checkpoint=true run.progress=off run.bucket_mb=0.25"
      for graph in false true; do
        for rc in none h.* auto; do
          mem=""; [ $rc = auto ] && mem="run.memory_gb=0.001"
          tag=$(echo "${graph}_$rc" | tr -c 'a-z0-9\n' '_')
          timeout 200 $S/bin/launch --gpus 2 $G2 run.cuda_graph=$graph run.recompute=$rc $mem run.out_dir=$OUT/ddprc_$tag \
            > $OUT/ddprc_$tag.log 2>&1; echo "2 GPUs cuda_graph=$graph recompute=$rc rc=$? $(grep -hE '^recompute \(|^stoke: error' $OUT/ddprc_$tag.log | head -2 | tr '\n' ' ')"
          [ $rc != none ] && compare $OUT/ddprc_${graph}_none/checkpoint.safetensors $OUT/ddprc_$tag/checkpoint.safetensors \
            "2 GPUs cuda_graph=$graph: none vs $rc"
        done
      done
      grep -hE "^data parallel:" $OUT/ddprc_false_auto.log
      set +f
      ;;
    ddp_eq)
      log "data parallel: $(nvidia-smi --list-gpus | wc -l) GPUs, NCCL from ${nccl:-the system}"
      # the weights after N steps of 2 GPUs at batch 256 against 1 GPU at 512
      # (the same samples each step: the ranks' shards make the global batch)
      for cfg in ${DDP_EQ:-fp32:true:1 fp32:true:30 bf16:true:30 bf16:false:30}; do
        IFS=: read prec det n <<< "$cfg"; tag=${prec}_det${det}_$n
        timeout 60 $T $MLP run.precision=$prec run.deterministic=$det run.steps=$n data.batch_size=512 \
          run.out_dir=$OUT/eq1_$tag > $OUT/eq1_$tag.log 2>&1 || { echo "1 GPU $tag failed"; tail -3 $OUT/eq1_$tag.log; }
        timeout 90 $S/bin/launch --gpus 2 $MLP run.precision=$prec run.deterministic=$det run.steps=$n \
          data.batch_size=256 run.out_dir=$OUT/eq2_$tag > $OUT/eq2_$tag.log 2>&1 || { echo "2 GPUs $tag failed"; tail -3 $OUT/eq2_$tag.log; }
        compare $OUT/eq1_$tag/checkpoint.safetensors $OUT/eq2_$tag/checkpoint.safetensors "$prec deterministic=$det, $n steps"
      done
      grep -hE "^data parallel:|gradient all-reduce" $OUT/eq2_fp32_dettrue_30.log
      ;;
    ddp_graph_diag)
      # why 2 GPUs with cuda_graph = true did not finish (2026-11-23, H200 x2): the mlp on 1 and 2 GPUs,
      # each run cut at 40 s; a stuck rank's host stacks (cuda-gdb) at 30 s; NCCL's own variables each
      # way; PyTorch's captured all-reduce on the same machine as the control
      log "2 GPUs, cuda_graph = true: where it stops"
      gdb=$(command -v cuda-gdb || ls /usr/local/cuda*/bin/cuda-gdb 2>/dev/null | head -1)
      timeout 60 python3 -m torch.distributed.run --standalone --nproc_per_node=2 "$HERE/nccl_graph_check.py" \
        > $OUT/diag_torch.log 2>&1; echo "pytorch: rc=$? $(grep -h PASS\|FAIL $OUT/diag_torch.log | tr '\n' ' ')"
      for v in "1::" "2::" "2:NCCL_GRAPH_REGISTER=0:" "2:NCCL_GRAPH_MIXING_SUPPORT=0:" "2::run.log_every=1000"; do
        IFS=: read n envs over <<< "$v"; tag=diag_${n}_$(echo "$envs$over" | tr -dc 'A-Za-z0-9_')
        g=""; [ "$n$envs$over" = 2 ] && g=$gdb # the stacks once: the plain 2-GPU run
        ( for i in $(seq 30); do sleep 1; pgrep -f "$S/bin/train" > /dev/null || exit 0; done
          nvidia-smi --query-gpu=index,utilization.gpu,memory.used --format=csv,noheader
          for p in $(pgrep -f "$S/bin/train"); do
            echo "== pid $p: $(tr '\0' ' ' < /proc/$p/cmdline | head -c 80)"; cat /proc/$p/wchan; echo
            [ -n "$g" ] && timeout 25 $g -p $p -batch -ex "info threads" -ex "thread apply all bt 12" 2>&1 | grep -E "^#|^Thread|^\*|^  [0-9]" | head -80
          done ) > $OUT/$tag.stacks 2>&1 &
        wpid=$!
        timeout -s INT -k 5 40 env NCCL_DEBUG=WARN $envs $S/bin/launch --gpus $n $MLP run.cuda_graph=true run.deterministic=true \
          run.steps=30 run.log_every=1 $over data.batch_size=256 run.checkpoint=false run.out_dir=$OUT/$tag > $OUT/$tag.log 2>&1
        rc=$?; wait $wpid 2>/dev/null; pkill -9 -f "$S/bin/train"; sleep 1
        echo "$n GPU(s) $envs $over: rc=$rc, last: $(grep -hE '^step|error' $OUT/$tag.log | tail -2 | tr '\n' ' ')"
      done
      ;;
    ddp_graph)
      # CUDA graphs with the all-reduces captured inside: the same weights as
      # the eager 2-GPU run (deterministic, bitwise), and the watchdog still
      # ends a rank whose peer died
      for g in false true; do
        timeout 120 $S/bin/launch --gpus 2 $MLP run.cuda_graph=$g run.deterministic=true run.steps=30 \
          data.batch_size=256 run.out_dir=$OUT/dg_$g > $OUT/dg_$g.log 2>&1
        echo "2 GPUs cuda_graph=$g rc=$? $(grep -hE 'operations per step|graph' $OUT/dg_$g.log | head -2 | tr '\n' ' ')"
      done
      compare $OUT/dg_false/checkpoint.safetensors $OUT/dg_true/checkpoint.safetensors "2 GPUs eager vs CUDA graphs, 30 steps"
      ;;
    ddp_resume)
      log "resume on another GPU count: 2 GPUs x 256 for 20 steps, then 1 GPU x 512 to 30, against 1 GPU x 512 for 30"
      a="run.precision=fp32 run.deterministic=true data.batch_size"
      timeout 90 $S/bin/launch --gpus 2 $MLP $a=256 run.steps=20 run.out_dir=$OUT/res2 > $OUT/res2.log 2>&1; echo "2 GPUs, 20 steps: rc=$?"
      timeout 60 $T $MLP $a=512 run.steps=30 run.resume=$OUT/res2/checkpoint.safetensors run.out_dir=$OUT/res1 > $OUT/res1.log 2>&1
      echo "1 GPU resumed: rc=$?: $(grep -hE 'resumed from|error' $OUT/res1.log | head -2)"
      timeout 60 $T $MLP $a=512 run.steps=30 run.out_dir=$OUT/res0 > $OUT/res0.log 2>&1
      compare $OUT/res0/checkpoint.safetensors $OUT/res1/checkpoint.safetensors "fp32, 30 steps on 1 GPU vs 20 on 2 + 10 on 1"
      ;;
    ddp_kill)
      log "a killed rank ends the other within comm_timeout"
      ( export MASTER_ADDR=127.0.0.1 MASTER_PORT=29650 WORLD_SIZE=2 LOCAL_WORLD_SIZE=2
        for r in 0 1; do
          # rank 1 without `timeout`: SIGKILL must reach train itself
          [ $r = 0 ] && to="timeout 120" || to=""
          RANK=$r LOCAL_RANK=$r $to $T $MLP run.comm=nccl run.comm_timeout=10 run.steps=1000000 run.log_every=20 \
            run.checkpoint=false data.batch_size=256 run.out_dir=$OUT/kill > $OUT/kill_r$r.log 2>&1 &
          eval "pid$r=\$!"
        done
        for i in $(seq 60); do grep -q "^step" $OUT/kill_r0.log && break; sleep 0.5; done
        sleep 2; kill -9 $pid1; t0=$(date +%s.%N)
        wait $pid0; rc=$?; t1=$(date +%s.%N)
        echo "rank 1 killed (SIGKILL); rank 0 ended rc=$rc after $(python3 -c "print(round($t1-$t0,1))") s (comm_timeout 10 s)"
        grep -E "nccl|error" $OUT/kill_r0.log | tail -3 )
      ;;
    ddp_bench)
      log "all-reduce of a 234 MB fp32 gradient buffer (the mlp workload) on 2 GPUs"
      timeout 90 $S/bin/launch --gpus 2 $S/examples/mlp.ini run.precision=fp32 run.steps=8 run.checkpoint=false \
        run.out_dir=$OUT/bw > $OUT/bw.log 2>&1; echo "rc=$?: $(grep -h 'gradient all-reduce' $OUT/bw.log)"
      log "ResNet-50 bf16 256/GPU: stoke 1 and 2 GPUs, PyTorch DDP 1 and 2 GPUs"
      rn="$S/examples/resnet50.ini run.checkpoint=false run.progress=lines"
      # variants label:environment:overrides (the environment for the 2-GPU run)
      # resnet50.ini's defaults: fused, cuDNN graph API, CUDA graphs (the all-reduces inside)
      for v in ${DDP_VARIANTS:-graph:: eager::run.cuda_graph=false}; do
        IFS=: read label envs over <<< "$v"
        timeout 120 $T $rn $over run.out_dir=$OUT/rn1_$label > $OUT/rn1_$label.log 2>&1; echo "stoke 1 GPU $label rc=$?"
        one=$OUT/rn1_$label
        if [ "${DDP_BOTH:-1}" = 1 ]; then # GPU 1 alone too (see scaling)
          CUDA_VISIBLE_DEVICES=1 timeout 120 $T $rn $over run.out_dir=$OUT/rn1b_$label > $OUT/rn1b_$label.log 2>&1
          echo "stoke 1 GPU (GPU 1) $label rc=$?"; one=$one,$OUT/rn1b_$label
        fi
        timeout 150 env $envs $S/bin/launch --gpus 2 $rn $over run.bucket_mb=${DDP_BUCKET_MB:-25} \
          run.out_dir=$OUT/rn2_$label > $OUT/rn2_$label.log 2>&1
        echo "stoke 2 GPUs $label ($envs): rc=$?"; grep -hE "^data parallel:|gradient all-reduce|data parallel over" $OUT/rn2_$label.log
        echo "stoke ResNet-50 bf16 $label: $(scaling $one $OUT/rn2_$label 1 img/s)"
      done
      rm -f $OUT/ddp_anchor.jsonl
      for n in ${DDP_ANCHOR:-1 2}; do
        timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=$n $S/anchors/ddp_bench.py $OUT/ddp_anchor.jsonl \
          > $OUT/ddp_anchor_$n.log 2>&1; echo "pytorch DDP $n GPU(s) rc=$?"; tail -1 $OUT/ddp_anchor_$n.log
      done
      [ -s $OUT/ddp_anchor.jsonl ] && python3 - $OUT/ddp_anchor.jsonl <<'PY' # (DDP_ANCHOR=" ": none ran)
import json, sys
r = {d["world"]: d for d in map(json.loads, open(sys.argv[1]))}
if 1 in r and 2 in r:
    print(f"pytorch DDP ResNet-50 bf16: 1 GPU {r[1]['img_s_total']} img/s, 2 GPUs {r[2]['img_s_total']} img/s, scaling {100*r[2]['img_s_total']/(2*r[1]['img_s_total']):.1f}%")
if 2 in r: print(f"pytorch all-reduce 256 MB fp32, 2 GPUs: {r[2]['allreduce_256MB_ms']} ms, bus bandwidth {r[2]['allreduce_busbw_GBs']} GB/s")
PY
      ;;
    graph)
      log "CUDA graphs: losses step by step, eager against replayed"
      small="model.hidden=1024,1024 data.batch_size=1024"
      sed '/^momentum/d' "$S/examples/mlp.ini" > "$S/examples/mlp_adamw.ini" # momentum is sgd's key
      for spec in "mlp fp32 60 run.deterministic=true $small" "resnet18c bf16 200 run.deterministic=true" \
                  "resnet18c bf16 100" "mlp fp16 40 run.loss_scale_init=1e10 $small" "mlp_adamw bf16 40 optimizer.name=adamw optimizer.lr=1e-3 $small"; do
        set -- $spec; w=$1; prec=$2; n=$3; shift 3; tag="${w}_${prec}_$n$(echo "$*" | tr -dc 'a-z' | head -c 12)"
        for g in false true; do
          timeout 150 "$T" "$S/examples/$w.ini" run.checkpoint=false run.precision=$prec run.steps=$n run.log_every=1 \
            run.cuda_graph=$g run.progress=off optimizer.schedule=cosine "$@" run.out_dir="$OUT/g_${tag}_$g" > "$OUT/g_${tag}_$g.log" 2>&1
          echo "$tag cuda_graph=$g rc=$? $(grep -E 'GPU operations per step|error' "$OUT/g_${tag}_$g.log" | head -2 | tr '\n' ' ')"
        done
        python3 "$HERE/loss_curves.py" "$tag" "$OUT/g_${tag}_false/metrics.jsonl" graph="$OUT/g_${tag}_true/metrics.jsonl"
      done
      log "CUDA graphs: speed (bf16, tools/bench, ${AB_ROUNDS:-3} rounds)"
      for w in ${GRAPH_W:-mlp resnet18c resnet50}; do
        timeout 300 "$S/bin/bench" "$S/examples/$w.ini" run.log_every=1000 --rounds ${AB_ROUNDS:-3} \
          --a run.cuda_graph=false --b run.cuda_graph=true > "$OUT/gs_$w.log" 2>&1
        echo "== $w rc=$?"; grep -A8 "^stoke bench: /" "$OUT/gs_$w.log" | grep -E "^  (A|B) |B/A"
      done
      ;;
    optim)
      log "issue 17: AdamW with GPT-2's groups and clipping, eager against replayed CUDA graphs"
      sed '/^momentum/d' "$S/examples/mlp.ini" > "$S/examples/mlp_adamw.ini" # momentum is sgd's key
      gpt="optimizer.name=adamw optimizer.lr=1e-3 optimizer.beta2=0.95 optimizer.weight_decay=0.1 optimizer.weight_decay_1d=false"
      small="model.hidden=1024,1024 data.batch_size=1024 run.checkpoint=false run.log_every=1 run.progress=off optimizer.schedule=cosine run.deterministic=true"
      for prec in bf16 fp16; do
        scale=""; [ $prec = fp16 ] && scale="run.loss_scale_init=1e10" # overflows at first: skipped steps
        for v in "clip1_eager run.cuda_graph=false optimizer.grad_clip=1" "clip1_graph run.cuda_graph=true optimizer.grad_clip=1" \
                 "noclip_eager run.cuda_graph=false"; do
          set -- $v; tag="o_${prec}_$1"; shift
          timeout 150 "$T" "$S/examples/mlp_adamw.ini" run.precision=$prec run.steps=60 $gpt $small $scale "$@" \
            run.out_dir="$OUT/$tag" > "$OUT/$tag.log" 2>&1
          echo "$tag rc=$? $(grep -E 'grad_clip|GPU operations per step|error' "$OUT/$tag.log" | head -3 | tr '\n' ' ')"
        done
        python3 "$HERE/loss_curves.py" "adamw $prec groups+clip" "$OUT/o_${prec}_clip1_eager/metrics.jsonl" \
          graph="$OUT/o_${prec}_clip1_graph/metrics.jsonl" "no clipping"="$OUT/o_${prec}_noclip_eager/metrics.jsonl"
      done
      ;;
    plugkit)
      log "issue 18: the plugin test kit on the GPU: each example CUDA op plugin's kernels, forward and backward, against its cpu f64 kernels, and a run with them"
      for so in leaky_relu hardswish; do
        L="$OUT/plugkit_$so.log"
        timeout 120 "$S/bin/plugin_check" "$S/bin/plugins/libstoke_$so.so" > "$L" 2>&1
        echo "plugin_check $so rc=$? (0: pass): cuda forward $(grep -cE '^ok .*: cuda [a-z0-9]+ forward kernel' "$L") ok, cuda backward $(grep -cE '^ok .*: cuda [a-z0-9]+ backward kernel' "$L") ok, $(grep -c '^FAIL' "$L") failed, $(grep -c '^skip' "$L") skipped"
        grep -E 'cuda|FAIL|skip' "$L" | head -8
      done
      timeout 200 "$T" "$S/examples/spirals.ini" run.backends=cublaslt,cuda run.steps=600 run.progress=off \
        run.out_dir="$OUT/plugkit_spirals" > "$OUT/plugkit_spirals.log" 2>&1
      echo "spirals on cuda rc=$? $(grep -v '^;' "$OUT/plugkit_spirals.log" | grep -E '^  layers.1 |evaluation:|^stoke: error' | head -3 | tr -s ' \n' ' ')"
      # the new user's op (tests/plugins/newuser) in a run: its cuda kernels train the spirals MLP
      timeout 200 "$T" "$S/examples/spirals.ini" plugins.load=hardswish model.activation=hardswish run.backends=cublaslt,cuda \
        run.steps=600 run.progress=off run.out_dir="$OUT/plugkit_hardswish" > "$OUT/plugkit_hardswish.log" 2>&1
      echo "hardswish spirals on cuda rc=$? $(grep -v '^;' "$OUT/plugkit_hardswish.log" | grep -E '^  layers.1 |evaluation:|^stoke: error' | head -3 | tr -s ' \n' ' ')"
      ;;
    policies)
      log "issue 17: a precision policy from a plugin (bf16_fp32norm: batch norm and the loss in f32) against bf16 and fp32"
      for w in ${POLICY_W:-resnet18c mlp}; do
        for prec in fp32 bf16 bf16_fp32norm; do
          timeout 200 "$T" "$S/examples/$w.ini" run.checkpoint=false run.steps=${POLICY_STEPS:-150} run.log_every=1 \
            run.progress=off run.deterministic=true run.precision=$prec run.out_dir="$OUT/p_${w}_$prec" > "$OUT/p_${w}_$prec.log" 2>&1
          echo "$w $prec rc=$? $(grep -E '^precision |autocast|error' "$OUT/p_${w}_$prec.log" | head -3 | tr '\n' ' ')"
        done
        python3 "$HERE/loss_curves.py" "$w (base: fp32)" "$OUT/p_${w}_fp32/metrics.jsonl" bf16="$OUT/p_${w}_bf16/metrics.jsonl" \
          bf16_fp32norm="$OUT/p_${w}_bf16_fp32norm/metrics.jsonl"
      done
      ;;
    convs)
      for net in ${CONV_NETS:-rn50 rn18c}; do [ "$net" = none ] && continue
        log "convolutions, $net: graph API against classic (conv_bench), then PyTorch"
        timeout 240 "$S/tests/conv_bench" $net > "$OUT/conv_bench_$net.log" 2>&1; echo "conv_bench rc=$?"
        grep -vE "^\[|^ +\(" "$OUT/conv_bench_$net.log" | grep -v "^    " | tail -40
        grep -E "^    " "$OUT/conv_bench_$net.log" | sort | uniq -c | sort -rn | head -0
        timeout 200 python3 "$HERE/conv_bench_torch.py" $net > "$OUT/conv_torch_$net.log" 2>&1; echo "torch rc=$?"
        tail -30 "$OUT/conv_torch_$net.log"
      done
      log "tools/bench: cudnn_classic (A) against cudnn graph API (B), fused + CUDA graphs, bf16"
      for w in ${CONV_AB:-resnet50 resnet18c}; do
        timeout 300 "$S/bin/bench" "$S/examples/$w.ini" run.log_every=1000 run.cuda_graph=true --rounds ${AB_ROUNDS:-3} \
          --a run.backends=fused,cudnn_classic,cudnn,cublaslt,cuda --b run.backends=fused,cudnn,cublaslt,cuda \
          ${AB_PEROP:+--per-op} --json "$OUT/convab_$w.json" --md "$OUT/convab_$w.md" > "$OUT/convab_$w.log" 2>&1
        echo "== $w rc=$?"; grep -A8 "^stoke bench: /" "$OUT/convab_$w.log" | grep -E "^  (A|B) |B/A"
        grep -A40 "per op" "$OUT/convab_$w.log" | head -45
      done
      ;;
    issue6)
      # issue 6's check, one call: loss curves, then the A/B runs (tools/bench),
      # then PyTorch eager and compile; FUSED="" drops the fused backend from B
      base="${I6_BASE:-run.backends=cudnn,cublaslt,cuda}" # I6_BASE: another baseline (cudnn_classic,...)
      fast="run.backends=${FUSED-fused,}cudnn,cublaslt,cuda run.cuda_graph=true"
      want() { [[ " ${I6:-curves ab torch} " == *" $1 "* ]]; } # I6: which of the three to run
      want curves && log "issue 6: loss curves, baseline against '$fast' (same seed, ${CURVE_STEPS:-200} steps)"
      # noise: the baseline with the cuda engine's batch norm instead of cuDNN's (cuda listed first:
      # convs stay on cudnn), i.e. other roundings of the same math: how far two correct bf16 runs
      # drift apart on these workloads
      noise="run.backends=cublaslt,cuda,cudnn"
      # CURVE_SEEDS: several seeds (one curve of a chaotic run, ResNet-50 at lr 0.1 on random labels, cannot
      # tell a rounding difference from a defect); CURVE_ARGS: overrides for every run (optimizer.lr=0.02)
      # CURVE_VARIANTS: which runs to set against the baseline; fused and graph split the fast one in two (a bisection)
      # and fp32 (TF32 off): which of two bf16 runs is nearer the exact curve (CURVE_REF=fp32 compares each with it)
      fused="run.backends=fused,cudnn,cublaslt,cuda" graph="$base run.cuda_graph=true" fp32="$base run.precision=fp32"
      declare -A vlabel=([fast]="fused+graph" [noise]="the cuda engine's batch norm (noise)" [fused]="fused, no graph"
        [graph]="graph, not fused" [fp32]="fp32, TF32 off" [base]="the baseline")
      want curves && for w in ${CURVE_W:-mlp resnet18c resnet50}; do
        for seed in ${CURVE_SEEDS:-0}; do
          tag=${w}_s$seed${CURVE_TAG:-}
          vs=()
          for v in base ${CURVE_VARIANTS:-fast noise}; do
            timeout 120 "$T" "$S/examples/$w.ini" run.checkpoint=false run.steps=${CURVE_STEPS:-200} run.log_every=1 run.progress=off run.deterministic=true \
              run.seed=$seed ${CURVE_ARGS:-} ${!v} run.out_dir="$OUT/c_${tag}_$v" > "$OUT/c_${tag}_$v.log" 2>&1 ||
              { echo "$w $v failed:"; tail -3 "$OUT/c_${tag}_$v.log"; }
            [ $v = base ] || vs+=("${vlabel[$v]}=$OUT/c_${tag}_$v/metrics.jsonl")
          done
          python3 "$HERE/loss_curves.py" "$w seed $seed${CURVE_ARGS:+ ($CURVE_ARGS)}" "$OUT/c_${tag}_base/metrics.jsonl" "${vs[@]}"
          if [ -n "${CURVE_REF:-}" ]; then
            vs=("${vlabel[base]}=$OUT/c_${tag}_base/metrics.jsonl")
            for v in ${CURVE_VARIANTS:-fast noise}; do [ $v = $CURVE_REF ] || vs+=("${vlabel[$v]}=$OUT/c_${tag}_$v/metrics.jsonl"); done
            python3 "$HERE/loss_curves.py" "$w seed $seed against ${vlabel[$CURVE_REF]}" "$OUT/c_${tag}_$CURVE_REF/metrics.jsonl" "${vs[@]}"
          fi
        done
      done
      want ab && log "issue 6: A/B (tools/bench, ${AB_ROUNDS:-3} rounds)"
      want ab && for wp in ${AB_W:-mlp:bf16 resnet50:bf16 resnet50:fp16 resnet18c:bf16}; do
        w=${wp%%:*}; prec=${wp##*:}
        timeout 300 "$S/bin/bench" "$S/examples/$w.ini" run.precision=$prec run.log_every=1000 --rounds ${AB_ROUNDS:-3} \
          --a $base --b $fast --json "$OUT/ab_${w}_$prec.json" --md "$OUT/ab_${w}_$prec.md" > "$OUT/ab_${w}_$prec.log" 2>&1
        echo "== $w $prec rc=$?"; grep -A8 "^stoke bench: /" "$OUT/ab_${w}_$prec.log" | grep -E "^  (A|B) |B/A"
      done
      want torch && log "issue 6: PyTorch"
      want torch && python3 "$S/anchors/torch_bench.py" "$OUT/torch.jsonl" ${TORCH_MODES:-mlp:bf16 resnet50:bf16 resnet50:fp16 resnet18c:bf16 mlp:bf16+compile resnet50:bf16+compile resnet18c:bf16+compile-ro} 2>&1 | grep -v Warning | tail -12
      ;;
    gemms) # GPT-2 124M's 12 linear products: every cuBLASLt candidate (lt_gemm_bench) and PyTorch's time, same call
      log "GPT-2's linear products: cuBLASLt candidates and PyTorch"
      timeout 300 "$S/tests/lt_gemm_bench" 16384 > "$OUT/lt_gemm_bench.log" 2>&1
      echo "rc=$?"; grep -v "^  " "$OUT/lt_gemm_bench.log" | cut -c1-160
      timeout 300 python3 "$HERE/gemm_torch.py" 16384 2>&1 | tee "$OUT/gemm_torch.log"
      ;;
    epilogues)
      log "cuBLASLt activation epilogues, 4096^3"
      STOKE_LOG=debug timeout 60 "$S/tests/lt_epilogue_bench" > "$OUT/epilogues.log" 2>&1
      echo "rc=$?"; grep -E " ms |linear_dact '.*': dz1|linear_act '.*' forward" "$OUT/epilogues.log" | cut -c1-150 | head -40
      grep -E "\((autotuned|cached)\)" "$OUT/epilogues.log" | sed 's/^stoke info \[cublaslt\]: //' | cut -c1-230 | head -40
      ;;
    autotune)
      # tools/bench A/B runs of the mlp bench (bf16): run.fuse off/on
      # (autotuned, the default) with relu and gelu(tanh), cuBLASLt's
      # heuristic (run.conv_autotune=false) against autotuned, and run.fuse
      # off/on with the heuristic
      ab() { # name, then bench arguments
        local name=$1; shift
        timeout "${AB_TIMEOUT:-90}" "$S/bin/bench" "$S/examples/mlp.ini" run.log_every=1000 --rounds "${AB_ROUNDS:-3}" --steps "${AB_STEPS:-100}" "$@" \
          --json "$OUT/ab_$name.json" --md "$OUT/ab_$name.md" > "$OUT/ab_$name.log" 2>&1
        echo "== $name rc=$? ($*)"; grep -A8 "^stoke bench: /" "$OUT/ab_$name.log" | grep -E "^  (A|B) |B/A"
      }
      log "mlp bf16 A/B (tools/bench, ${AB_ROUNDS:-3} rounds)"
      ab fuse_relu --a run.fuse=false --b run.fuse=true
      ab fuse_gelu model.activation=gelu model.approximate=tanh --a run.fuse=false --b run.fuse=true
      ab tune_relu --a run.conv_autotune=false --b run.conv_autotune=true
      ab fuse_relu_heuristic run.conv_autotune=false --a run.fuse=false --b run.fuse=true
      grep -hE "\((autotuned|cached)\)" "$OUT/ab_fuse_relu.log" "$OUT/ab_fuse_gelu.log" | sed 's/^stoke info \[cublaslt\]: //' | cut -c1-230 | head -50
      ;;
    fuse)
      log "mlp bf16: fuse off/on, relu and gelu(tanh)"
      for rep in $(seq 1 "${FUSE_REPS:-2}"); do
        for act in relu gelu; do
          for fuse in false true; do
            tag=fuse_${act}_${fuse}_$rep
            timeout 100 "$T" "$S/examples/mlp.ini" run.checkpoint=false run.progress=lines run.fuse=$fuse \
              model.activation=$act model.approximate=tanh run.out_dir="$OUT/$tag" > "$OUT/$tag.log" 2>&1
            echo "$tag rc=$? $(grep -h '"summary"' "$OUT/$tag/metrics.jsonl" 2>/dev/null | python3 -c 'import json,sys; r=json.loads(sys.stdin.read() or "{}"); print("samples/s", r.get("samples_per_s_median"), "step_ms", r.get("step_time_ms_p50"), "loss", r.get("final_loss"))')"
          done
        done
      done
      for act in relu gelu; do
        python3 "$HERE/loss_curves.py" "mlp $act, unfused against fused" "$OUT/fuse_${act}_false_1/metrics.jsonl" \
          fused="$OUT/fuse_${act}_true_1/metrics.jsonl"
      done
      for act in relu gelu; do
        for fuse in false true; do
          timeout 100 "$T" "$S/examples/mlp.ini" run.checkpoint=false run.progress=off run.fuse=$fuse run.steps=24 \
            run.profile_ops=true model.activation=$act model.approximate=tanh run.out_dir="$OUT/prof_${act}_$fuse" \
            > "$OUT/prof_${act}_$fuse.log" 2>&1
          echo "profile $act fuse=$fuse rc=$?"; grep -A14 "per-op GPU time" "$OUT/prof_${act}_$fuse.log" | head -16
        done
      done
      ;;
    torch)
      modes="mlp:tf32 mlp:bf16 mlp:fp16 resnet50:tf32 resnet50:bf16 resnet50:fp16 resnet18c:tf32 resnet18c:bf16 resnet18c:fp16"
      [ "${TORCH_COMPILE:-0}" = 1 ] && modes="mlp:bf16+compile resnet50:bf16+compile resnet18c:bf16+compile"
      python3 "$S/anchors/torch_bench.py" "$OUT/torch.jsonl" $modes 2>&1 | grep -v Warning | tail -20
      ;;
  esac
done
