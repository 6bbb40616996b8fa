#!/usr/bin/env bash
# tools/gpu_suite.sh: the GPU machine's end-to-end runs, called by
# tools/gpu_check.sh with $S (unpacked stage) and $OUT set. Parts by name:
#   fp16      fp16 run whose loss scaler is forced to overflow
#   fmnist    Fashion-MNIST CNN on the GPU (convert + train + eval)
#   bench     stoke's mlp / resnet50 / resnet18c in tf32, bf16, fp16
#   torch     PyTorch anchors (eager, and compile with TORCH_COMPILE=1)
#   loader    jpeg-bench folder: stoke's loader by worker count, ResNet-50
#             bf16 trained from it against synthetic data, PyTorch's loader
#   ddp       data parallel on 2 GPUs, all of: ddp_eq (weights of a 2-GPU run
#             against a 1-GPU run of the same global batch), ddp_resume (a
#             2-GPU checkpoint resumed on 1 GPU), ddp_kill (a killed rank ends
#             the other within comm_timeout), ddp_bench (all-reduce bus
#             bandwidth of a 234 MB gradient buffer; ResNet-50 bf16 256/GPU on
#             1 and 2 GPUs beside PyTorch DDP)
set -uo pipefail
T="$S/bin/train"
# NCCL: the system's, else the one PyTorch's wheels bring
if ! ldconfig -p | grep -q libnccl.so.2; then
  nccl=$(find /opt /usr/local /usr/lib -name 'libnccl.so.2' 2>/dev/null | head -1)
  [ -n "$nccl" ] && export LD_LIBRARY_PATH="$(dirname "$nccl"):$LD_LIBRARY_PATH"
fi
export NCCL_NVLS_ENABLE=0 # KINDS.md: multicast stays off
# data parallel checks: a small mlp read through the loader (each rank its shard)
MLP="$S/examples/mlp.ini run.backends=cublaslt,cuda run.log_every=10 run.progress=lines data.on_device=false
     data.shape=256 data.classes=100 model.hidden=1024,1024 optimizer.lr=0.05"
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
for part in "$@"; do
  case "$part" in
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
    ddp) # all of the data-parallel checks below, in one call
      bash "$0" ddp_eq ddp_resume ddp_kill ddp_bench
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
      timeout 120 $T $rn run.out_dir=$OUT/rn1 > $OUT/rn1.log 2>&1; echo "stoke 1 GPU rc=$?"
      for mb in ${DDP_BUCKET_MB:-25}; do
        timeout 150 $S/bin/launch --gpus 2 $rn run.bucket_mb=$mb run.out_dir=$OUT/rn2_$mb > $OUT/rn2_$mb.log 2>&1
        echo "stoke 2 GPUs, bucket_mb $mb: rc=$?"; grep -hE "^data parallel:|gradient all-reduce|data parallel over" $OUT/rn2_$mb.log
        python3 - $OUT/rn1/metrics.jsonl $OUT/rn2_$mb/metrics.jsonl <<'PY'
import json, sys
def rate(p):
    try: return [json.loads(l) for l in open(p) if '"summary"' in l][-1]["samples_per_s_median"]
    except Exception: return float("nan")
one, two = rate(sys.argv[1]), rate(sys.argv[2])
print(f"stoke ResNet-50 bf16: 1 GPU {one:.0f} img/s, 2 GPUs {two:.0f} img/s ({two/2:.0f} per GPU), scaling {100*two/(2*one):.1f}%")
PY
      done
      rm -f $OUT/ddp_anchor.jsonl
      for n in ${DDP_ANCHOR:-1 2}; do
        timeout 150 python3 -m torch.distributed.run --standalone --nproc_per_node=$n $S/anchors/ddp_bench.py $OUT/ddp_anchor.jsonl \
          > $OUT/ddp_anchor_$n.log 2>&1; echo "pytorch DDP $n GPU(s) rc=$?"; tail -1 $OUT/ddp_anchor_$n.log
      done
      python3 - $OUT/ddp_anchor.jsonl <<'PY'
import json, sys
r = {d["world"]: d for d in map(json.loads, open(sys.argv[1]))}
if 1 in r and 2 in r:
    print(f"pytorch DDP ResNet-50 bf16: 1 GPU {r[1]['img_s_total']} img/s, 2 GPUs {r[2]['img_s_total']} img/s, scaling {100*r[2]['img_s_total']/(2*r[1]['img_s_total']):.1f}%")
if 2 in r: print(f"pytorch all-reduce 256 MB fp32, 2 GPUs: {r[2]['allreduce_256MB_ms']} ms, bus bandwidth {r[2]['allreduce_busbw_GBs']} GB/s")
PY
      ;;
    torch)
      modes="mlp:tf32 mlp:bf16 mlp:fp16 resnet50:tf32 resnet50:bf16 resnet50:fp16 resnet18c:tf32 resnet18c:bf16 resnet18c:fp16"
      [ "${TORCH_COMPILE:-0}" = 1 ] && modes="mlp:bf16+compile resnet50:bf16+compile resnet18c:bf16+compile"
      python3 "$S/anchors/torch_bench.py" "$OUT/torch.jsonl" $modes 2>&1 | grep -v Warning | tail -20
      ;;
  esac
done
