#!/usr/bin/env bash
# tools/gpu_suite.sh: the GPU machine's end-to-end runs, called by
# tools/gpu_check.sh with $S (unpacked stage) and $OUT set. Parts by name:
#   fp16      fp16 run whose loss scaler is forced to overflow
#   fmnist    Fashion-MNIST CNN on the GPU (convert + train + eval)
#   bench     stoke's mlp / resnet50 / resnet18c in tf32, bf16, fp16
#   torch     PyTorch anchors (eager, and compile with TORCH_COMPILE=1)
#   fusedab   resnet50 / resnet18c bf16 (FUSED_W), A: backends = cudnn,
#             cublaslt, cuda against B: fused first and run.fuse: samples/s,
#             the loss curves over 200 steps (same seed), per-op profiles
#   loader    jpeg-bench folder: stoke's loader by worker count, ResNet-50
#             bf16 trained from it against synthetic data, PyTorch's loader
set -uo pipefail
T="$S/bin/train"
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
    fusedab)
      A="run.backends=cudnn,cublaslt,cuda"; B="run.backends=fused,cudnn,cublaslt,cuda run.fuse=true"
      summ() { python3 -c 'import json,sys; r=[json.loads(l) for l in open(sys.argv[1]) if "\"summary\"" in l][-1]; print(r.get("samples_per_s_median"), r.get("step_time_ms_p50"), r.get("final_loss"))' "$1" 2>/dev/null; }
      for w in ${FUSED_W:-resnet50 resnet18c}; do
        for v in A B; do
          args=${!v}
          # speed (log every 20 steps: no per-step sync)
          timeout 120 "$T" "$S/examples/$w.ini" run.checkpoint=false run.progress=off run.steps=${FUSED_STEPS:-120} run.log_every=20 \
            $args run.out_dir="$OUT/ab_${w}_$v" > "$OUT/ab_${w}_$v.log" 2>&1
          echo "$w $v rc=$? samples/s,step_ms,loss: $(summ "$OUT/ab_${w}_$v/metrics.jsonl")"
          # the loss at every step of the first 200
          timeout 120 "$T" "$S/examples/$w.ini" run.checkpoint=false run.progress=off run.steps=200 run.log_every=1 \
            $args run.out_dir="$OUT/loss_${w}_$v" > "$OUT/loss_${w}_$v.log" 2>&1
          echo "$w $v loss run rc=$? samples/s,step_ms,loss: $(summ "$OUT/loss_${w}_$v/metrics.jsonl")"
          timeout 90 "$T" "$S/examples/$w.ini" run.checkpoint=false run.progress=off run.steps=12 run.log_every=4 \
            run.profile_ops=true $args run.out_dir="$OUT/prof_${w}_$v" > "$OUT/prof_${w}_$v.log" 2>&1
          echo "$w $v profile rc=$?"; grep -A24 "per-op GPU time" "$OUT/prof_${w}_$v.log" | head -26
        done
        python3 - "$OUT/loss_${w}_A/metrics.jsonl" "$OUT/loss_${w}_B/metrics.jsonl" <<'PY'
import json, sys
def losses(p):
    return {r["step"]: r["loss"] for r in (json.loads(l) for l in open(p)) if "loss" in r and "step" in r and "summary" not in r}
a, b = losses(sys.argv[1]), losses(sys.argv[2])
steps = sorted(set(a) & set(b))
if not steps:
    print("no common steps"); sys.exit()
d = [abs(a[s] - b[s]) / max(abs(a[s]), 1e-12) for s in steps]
print("loss curves: %d common steps, max rel diff %.4g (step %d), mean %.4g; A/B at steps 1, 50, 100, 200:" %
      (len(steps), max(d), steps[d.index(max(d))], sum(d) / len(d)),
      [(s, round(a[s], 4), round(b[s], 4)) for s in (1, 50, 100, 200) if s in a and s in b])
PY
      done
      ;;
    torch)
      modes="mlp:tf32 mlp:bf16 mlp:fp16 resnet50:tf32 resnet50:bf16 resnet50:fp16 resnet18c:tf32 resnet18c:bf16 resnet18c:fp16"
      [ "${TORCH_COMPILE:-0}" = 1 ] && modes="mlp:bf16+compile resnet50:bf16+compile resnet18c:bf16+compile"
      python3 "$S/anchors/torch_bench.py" "$OUT/torch.jsonl" $modes 2>&1 | grep -v Warning | tail -20
      ;;
  esac
done
