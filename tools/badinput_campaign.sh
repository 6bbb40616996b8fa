#!/usr/bin/env bash
# tools/badinput_campaign.sh: issue 19's bad-input campaign, reproducible
# from a seed: tools/train and tools/convert built with ASan + UBSan fed
# fuzzed INI files, damaged and crafted checkpoints, cut-short and damaged
# LMDB data sets, bad JPEGs, signals (during training, during the final
# save, kill -9 while checkpointing) and resource limits (file size, full
# disk, open files, address space). Every run is classified:
#
#   ok      exit 0
#   error   exit 1 or 2 with a message ("error" in its output), no sanitizer report
#   crash   death by a signal nobody sent, a sanitizer report, or a silent non-zero exit
#   hang    still running after --timeout seconds (then killed)
#   lost    training had done steps, and no valid checkpoint holds them
#   wrong   damage accepted silently (a flipped bit in a checkpoint's data resumed)
#
# and the table (runs, clean errors, crashes, hangs, data lost) is printed
# per category; exits 1 when any run crashed, hung, lost data or was wrong.
#
#   tools/badinput_campaign.sh [--seed N] [--scale X] [--timeout S] [--work DIR]
#                              [--photos DIR] [--no-build] [--only CATEGORY,...]
#
# --scale multiplies the number of generated cases (1: about 500 runs, some
# 20 minutes of CPU on 2 cores); --no-build reuses the binaries copied into
# --work by an earlier run. Categories: ini ckpt lmdb jpeg signal limits.
# `ulimit -v` needs binaries without ASan (whose shadow memory needs the
# address space): a second, plain build. The full-disk cases mount a small
# tmpfs and run only as root. Logs: <work>/logs/, results: <work>/results.tsv.
set -uo pipefail
cd "$(dirname "$0")/.."
REPO=$PWD
seed=1 scale=1 timeout_s=60 work=/tmp/stoke-badinput photos=../shared/data/photos build=1 only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --seed) seed=$2; shift 2 ;;
    --scale) scale=$2; shift 2 ;;
    --timeout) timeout_s=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --photos) photos=$2; shift 2 ;;
    --no-build) build=0; shift ;;
    --only) only=$2; shift 2 ;;
    -h|--help) sed -n '2,30p' "$0"; exit 0 ;;
    *) echo "badinput_campaign: unknown argument '$1' (see --help)" >&2; exit 2 ;;
  esac
done
MUT="python3 $REPO/tools/badinput_mutate.py"
BIN=$work/asan PLAIN=$work/plain
PLUGINS="libstoke_cpu.so libstoke_synthetic.so libstoke_jpeg.so libstoke_lmdb.so libstoke_mlp.so"
n_of() { python3 -c "print(max(1, round($1 * $scale)))"; }
want() { [ -z "$only" ] || [[ ",$only," == *",$1,"* ]]; }

# ------------------------------------------------------------ build
stage() { # bazel's outputs -> $1 (train, convert, make_jpeg_bench, plugins/)
  mkdir -p "$1/plugins"
  for t in train convert make_jpeg_bench bench_loader; do cp -f "bazel-bin/tools/$t" "$1/"; done
  for p in $PLUGINS; do cp -f "bazel-bin/tools/plugins/$p" "$1/plugins/"; done
}
if [ "$build" = 1 ]; then
  rm -rf "$work" && mkdir -p "$work"
  # what the binaries are built from, for the table
  echo "$(git rev-parse --short HEAD)$(git diff --quiet HEAD -- . 2>/dev/null || echo +changes)" > "$work/commit"
  targets="//tools:train //tools:convert //tools:make_jpeg_bench //tools:bench_loader"
  bazel build --config=asan $targets >&2 || exit 1
  stage "$BIN"
  bazel build $targets >&2 || exit 1
  stage "$PLAIN"
fi
[ -x "$BIN/train" ] || { echo "badinput_campaign: no binaries in $BIN (run without --no-build)" >&2; exit 1; }
mkdir -p "$work/logs" "$work/in" "$work/runs"
RES=$work/results.tsv
: > "$RES"
export ASAN_OPTIONS=detect_leaks=1:abort_on_error=0:exitcode=86:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1:exitcode=87
export STOKE_PLUGIN_PATH=""

# ------------------------------------------------------------ running and classifying
n_run=0
# run_case CATEGORY NAME CMD...: runs CMD under the time limit, output in
# logs/CATEGORY-N.log; sets CLASS, RC, LOG (record is called by the caller).
run_case() {
  local cat=$1 name=$2
  shift 2
  n_run=$((n_run + 1))
  LOG=$work/logs/$cat-$n_run.log
  echo "# $name: $*" > "$LOG"
  timeout -k 5 "$timeout_s" "$@" >> "$LOG" 2>&1 < /dev/null
  RC=$?
  classify
}
classify() {
  if grep -qE 'Sanitizer|runtime error:' "$LOG"; then CLASS=crash
  elif [ "$RC" = 124 ] || [ "$RC" = 137 ]; then CLASS=hang
  elif [ "$RC" = 0 ]; then CLASS=ok
  elif { [ "$RC" = 1 ] || [ "$RC" = 2 ]; } && grep -qi 'error' "$LOG"; then CLASS=error
  else CLASS=crash
  fi
}
record() { # CATEGORY NAME (after run_case or a category's own checks)
  printf '%s\t%s\t%s\t%s\t%s\n' "$1" "$CLASS" "$RC" "$LOG" "$2" >> "$RES"
  case "$CLASS" in ok|error) ;; *) echo "  $1 $2: $CLASS (rc $RC), $LOG" >&2 ;; esac
}
# The step of a valid checkpoint (train --verify), or -1.
ckpt_step() {
  [ -f "$1" ] || { echo -1; return; }
  local out
  out=$("$PLAIN/train" --verify "$1" 2>/dev/null) || { echo -1; return; }
  sed -E 's/.*: step ([0-9]+),.*/\1/' <<< "$out"
}
# The last step metrics.jsonl recorded (0: none).
last_step() {
  local m=$1/metrics.jsonl
  [ -s "$m" ] || { echo 0; return; }
  grep -oE '"step": ?[0-9]+' "$m" | tail -1 | grep -oE '[0-9]+$' || echo 0
}

TINY=$work/in/tiny.ini
cat > "$TINY" <<'EOF'
[run]
backends = cpu
steps = 3
seed = 1
log_every = 1
progress = off
checkpoint_every = 2

[data]
source = synthetic
shape = 16
classes = 4
length = 256
batch_size = 16
workers = 2

[model]
name = mlp
hidden = 16

[optimizer]
name = sgd
lr = 0.05
momentum = 0.9
EOF
# the same run on a data set of files: [data] of the lmdb and jpeg sources
SRC=$work/in/source.ini
grep -vE '^(shape|classes|length) =' "$TINY" > "$SRC"
T="$BIN/train"
rng_state=$seed
rand() { # a number in [0, $1) from the campaign's own stream
  rng_state=$(( (rng_state * 6364136223846793005 + 1442695040888963407) & 0x7fffffffffffffff ))
  echo $(( (rng_state >> 16) % $1 ))
}

# ------------------------------------------------------------ fuzzed INI files
if want ini; then
  echo "== fuzzed INI files" >&2
  for i in $(seq "$(n_of 220)"); do
    f=$work/in/ini-$i.ini
    $MUT ini $((seed * 100000 + i)) "$TINY" "$f"
    rm -rf "$work/runs/ini"
    run_case ini "ini seed $((seed * 100000 + i))" "$T" "$f" run.steps=3 "run.out_dir=$work/runs/ini"
    record ini "ini-$i"
  done
fi

# ------------------------------------------------------------ checkpoints
if want ckpt; then
  echo "== damaged and crafted checkpoints" >&2
  good=$work/runs/good/checkpoint.safetensors
  rm -rf "$work/runs/good" "$work/runs/other"
  "$T" "$TINY" run.steps=4 "run.out_dir=$work/runs/good" > "$work/logs/good.log" 2>&1 ||
    { echo "badinput_campaign: the good run failed: $work/logs/good.log" >&2; exit 1; }
  j=0
  for kind in truncate flip dataflip meta header hlen; do
    case $kind in meta) k=$(n_of 40) ;; dataflip) k=$(n_of 25) ;; *) k=$(n_of 15) ;; esac
    for i in $(seq "$k"); do
      j=$((j + 1))
      bad=$work/in/ckpt-$j.safetensors
      $MUT ckpt $((seed * 100000 + j)) $kind "$good" "$bad"
      rm -rf "$work/runs/ckpt"
      run_case ckpt "$kind seed $((seed * 100000 + j))" "$T" "$TINY" run.steps=6 "run.resume=$bad" \
        "run.out_dir=$work/runs/ckpt"
      # a flipped data bit must never resume
      [ $kind = dataflip ] && [ $CLASS = ok ] && CLASS=wrong
      record ckpt "$kind-$j"
    done
  done
  # not files, and files of another model
  mkfifo "$work/in/fifo.safetensors" 2>/dev/null
  : > "$work/in/empty.safetensors"
  "$T" "$TINY" run.steps=2 model.hidden=32 "run.out_dir=$work/runs/other" > /dev/null 2>&1
  for r in "$work/in/fifo.safetensors" "$work/in/empty.safetensors" "$work/in" /dev/zero /dev/null \
           "$work/in/missing.safetensors" "$work/runs/other/checkpoint.safetensors" "$work/logs/good.log"; do
    rm -rf "$work/runs/ckpt"
    run_case ckpt "resume $r" "$T" "$TINY" run.steps=6 "run.resume=$r" "run.out_dir=$work/runs/ckpt"
    record ckpt "special $r"
  done
fi

# ------------------------------------------------------------ LMDB data sets
if want lmdb; then
  echo "== cut-short and damaged LMDB data sets" >&2
  $MUT idx 512 "$work/in/idx"
  "$BIN/convert" idx --images "$work/in/idx-images-idx3-ubyte" --labels "$work/in/idx-labels-idx1-ubyte" \
    --out "$work/in/lmdb-good" --force > "$work/logs/convert-idx.log" 2>&1 ||
    { echo "badinput_campaign: convert idx failed: $work/logs/convert-idx.log" >&2; exit 1; }
  LM=(data.source=lmdb run.steps=3 "run.out_dir=$work/runs/lmdb")
  size=$(stat -c %s "$work/in/lmdb-good/data.mdb")
  j=0
  lmdb_case() { # NAME: runs on $work/in/lmdb-$j
    rm -rf "$work/runs/lmdb"
    run_case lmdb "$1" "$T" "$SRC" "${LM[@]}" "data.path=$work/in/lmdb-$j"
    record lmdb "$1"
  }
  fresh() {
    j=$((j + 1))
    rm -rf "$work/in/lmdb-$j"
    cp -r "$work/in/lmdb-good" "$work/in/lmdb-$j"
    rm -f "$work/in/lmdb-$j/lock.mdb"
  }
  cuts="0 1 4095 4096 4097 8191 8192 8193 12288 $((size - 4096)) $((size - 1))"
  for i in $(seq "$(n_of 25)"); do cuts="$cuts $(rand "$size")"; done
  for c in $cuts; do
    fresh
    head -c "$c" "$work/in/lmdb-good/data.mdb" > "$work/in/lmdb-$j/data.mdb"
    lmdb_case "cut at $c of $size"
  done
  for i in $(seq "$(n_of 40)"); do
    fresh
    $MUT damage $((seed * 100000 + j)) "$work/in/lmdb-$j/data.mdb" $((1 + $(rand 64)))
    lmdb_case "random bytes, seed $((seed * 100000 + j))"
  done
  for i in $(seq "$(n_of 30)"); do
    fresh
    $MUT page $((seed * 100000 + j)) "$work/in/lmdb-$j/data.mdb"
    lmdb_case "page zeroed or random, seed $((seed * 100000 + j))"
  done
  fresh; head -c 8192 /dev/urandom > "$work/in/lmdb-$j/lock.mdb"; lmdb_case "lock.mdb random"
  fresh; rm "$work/in/lmdb-$j/data.mdb"; mkdir "$work/in/lmdb-$j/data.mdb"; lmdb_case "data.mdb a folder"
  fresh; rm "$work/in/lmdb-$j/data.mdb"; mkfifo "$work/in/lmdb-$j/data.mdb"; lmdb_case "data.mdb a FIFO"
  fresh; rm "$work/in/lmdb-$j/data.mdb"; ln -s /dev/zero "$work/in/lmdb-$j/data.mdb"; lmdb_case "data.mdb -> /dev/zero"
  # the same data set as [data] and [eval_data] (item 7), ten times
  for i in $(seq 10); do
    fresh
    rm -rf "$work/runs/lmdb"
    run_case lmdb "same path twice" "$T" "$SRC" "${LM[@]}" "data.path=$work/in/lmdb-$j" eval_data.source=lmdb \
      "eval_data.path=$work/in/lmdb-$j"
    record lmdb "same path twice $i"
  done
fi

# ------------------------------------------------------------ bad JPEGs
if want jpeg && [ -d "$photos" ]; then
  echo "== bad JPEGs (jpeg source, convert folder, JPEG records in LMDB)" >&2
  "$BIN/make_jpeg_bench" --photos "$photos" --out "$work/in/jpegs" --count 20 --threads 2 --force \
    > "$work/logs/make_jpeg_bench.log" 2>&1 || { echo "badinput_campaign: make_jpeg_bench failed" >&2; exit 1; }
  JP=(data.source=jpeg data.size=16 data.batch_size=8 run.steps=2 "run.out_dir=$work/runs/jpeg")
  goods=("$work"/in/jpegs/c*/img_*.jpg)
  j=0
  for kind in truncate flip header zero junk; do
    case $kind in zero) k=1 ;; *) k=$(n_of 12) ;; esac
    for i in $(seq "$k"); do
      j=$((j + 1))
      d=$work/in/jpeg-$j
      rm -rf "$d" && cp -r "$work/in/jpegs" "$d"
      src=${goods[$(rand ${#goods[@]})]}
      $MUT jpeg $((seed * 100000 + j)) $kind "$src" "$d/c0/bad.jpg"
      # one case in three: every file of c1 bad too
      if [ $((j % 3)) = 0 ]; then
        for g in "$d"/c1/*.jpg; do $MUT jpeg $((seed * 100000 + j)) $kind "$src" "$g"; done
      fi
      rm -rf "$work/runs/jpeg"
      run_case jpeg "source, $kind seed $((seed * 100000 + j))" "$T" "$SRC" "${JP[@]}" "data.root=$d"
      record jpeg "source $kind-$j"
      run_case jpeg "convert, $kind seed $((seed * 100000 + j))" "$BIN/convert" folder --root "$d" \
        --out "$work/in/jpeg-lmdb-$j" --size 16x16 --threads 2 --force
      record jpeg "convert $kind-$j"
    done
  done
  # JPEG records in an LMDB data set, damaged
  "$BIN/convert" folder --root "$work/in/jpegs" --out "$work/in/jlmdb" --size 32x32 --encoding jpeg --threads 2 \
    --force > "$work/logs/convert-jpeg.log" 2>&1
  for i in $(seq "$(n_of 20)"); do
    j=$((j + 1))
    rm -rf "$work/in/jlmdb-$j" && cp -r "$work/in/jlmdb" "$work/in/jlmdb-$j" && rm -f "$work/in/jlmdb-$j/lock.mdb"
    $MUT damage $((seed * 100000 + j)) "$work/in/jlmdb-$j/data.mdb" $((1 + $(rand 32)))
    rm -rf "$work/runs/jpeg"
    run_case jpeg "lmdb jpeg records, seed $((seed * 100000 + j))" "$T" "$SRC" data.source=lmdb \
      "data.path=$work/in/jlmdb-$j" run.steps=2 "run.out_dir=$work/runs/jpeg"
    record jpeg "lmdb records $i"
  done
elif want jpeg; then
  echo "== bad JPEGs: skipped (no photos in $photos; --photos DIR)" >&2
fi

# ------------------------------------------------------------ signals
# A run in the background (output in LOG); PID is set.
start_bg() { # CATEGORY NAME ARGS...
  local cat=$1 name=$2
  shift 2
  n_run=$((n_run + 1))
  LOG=$work/logs/$cat-$n_run.log
  echo "# $name: $*" > "$LOG"
  "$@" >> "$LOG" 2>&1 < /dev/null &
  PID=$!
}
# Waits for PID (killed after the time limit: a hang); sets RC.
wait_bg() {
  local waited=0
  while kill -0 "$PID" 2>/dev/null && [ $waited -lt $((timeout_s * 10)) ]; do
    sleep 0.1
    waited=$((waited + 1))
  done
  if kill -0 "$PID" 2>/dev/null; then
    kill -KILL "$PID" 2>/dev/null
    wait "$PID" 2>/dev/null
    RC=124
  else
    wait "$PID"
    RC=$?
  fi
}
# After a signal: a death by the signal sent is expected only before the
# first step (nothing to lose); steps done and no checkpoint holding at
# least `$2` of them is data lost.
judge_signal() { # OUT_DIR MIN_STEP SENT_SIGNAL
  local out=$1 min=$2 sig=$3 step
  classify
  step=$(ckpt_step "$out/checkpoint.safetensors")
  if [ "$RC" = $((128 + sig)) ] && ! grep -qE 'Sanitizer|runtime error:' "$LOG"; then
    CLASS=error # killed by the signal we sent (kill -9, before the handlers, or the third one)
  fi
  if [ "$CLASS" != hang ] && [ "$min" -gt 0 ] && [ "$step" -lt "$min" ]; then CLASS=lost; fi
  echo "# checkpoint step $step, needed $min" >> "$LOG"
}
if want signal; then
  echo "== signals" >&2
  BIG=(data.shape=1024 model.hidden=2048,2048 data.batch_size=8)
  # SIGTERM / SIGINT at a random moment of a run without periodic checkpoints
  for i in $(seq "$(n_of 10)"); do
    out=$work/runs/sig-$i
    rm -rf "$out"
    sig=$([ $((i % 2)) = 0 ] && echo 15 || echo 2)
    start_bg signal "signal $sig at random" "$T" "$TINY" run.steps=1000000 run.checkpoint_every=0 "run.out_dir=$out" \
      data.shape=256 model.hidden=256
    sleep "$((1 + $(rand 4))).$(rand 10)$(rand 10)"
    kill -"$sig" "$PID" 2>/dev/null
    wait_bg
    done_steps=$(last_step "$out")
    judge_signal "$out" "$done_steps" "$sig"
    record signal "signal $sig at random ($done_steps steps logged)"
  done
  # during the final save: once (SIGTERM, SIGINT), twice
  for i in $(seq "$(n_of 9)"); do
    out=$work/runs/save-$i
    rm -rf "$out" && mkdir -p "$out"
    sig=$([ $((i % 3)) = 1 ] && echo 2 || echo 15)
    times=$([ $((i % 3)) = 2 ] && echo 2 || echo 1)
    start_bg signal "signal $sig x$times during the final save" "$T" "$TINY" "${BIG[@]}" run.steps=2 \
      run.checkpoint_every=0 "run.out_dir=$out"
    while kill -0 "$PID" 2>/dev/null && ! compgen -G "$out/checkpoint.safetensors.tmp.*" > /dev/null; do :; done
    for t in $(seq "$times"); do kill -"$sig" "$PID" 2>/dev/null; sleep 0.2; done
    wait_bg
    judge_signal "$out" 2 "$sig"
    record signal "signal $sig x$times during the final save"
  done
  # kill -9 while checkpointing every step: the last whole checkpoint survives
  for i in $(seq "$(n_of 10)"); do
    out=$work/runs/kill-$i
    rm -rf "$out"
    start_bg signal "kill -9 at random, checkpoint_every=1" "$T" "$TINY" "${BIG[@]}" run.steps=50 \
      run.checkpoint_every=1 "run.out_dir=$out"
    sleep "$((2 + $(rand 6))).$(rand 10)"
    kill -9 "$PID" 2>/dev/null
    wait_bg
    done_steps=$(last_step "$out")
    # metrics are written before the step's checkpoint: one step of slack
    judge_signal "$out" $((done_steps > 0 ? done_steps - 1 : 0)) 9
    record signal "kill -9 at random ($done_steps steps logged)"
  done
  # Ctrl-C in the middle of a long accumulated step
  out=$work/runs/midstep
  rm -rf "$out"
  start_bg signal "Ctrl-C mid-step" "$T" "$TINY" run.accumulate=20000 data.batch_size=1 run.steps=3 "run.out_dir=$out"
  while kill -0 "$PID" 2>/dev/null && [ ! -s "$out/metrics.jsonl" ]; do sleep 0.1; done
  kill -INT "$PID"
  t0=$SECONDS
  wait_bg
  judge_signal "$out" 1 2
  [ $((SECONDS - t0)) -gt 10 ] && CLASS=hang
  record signal "Ctrl-C mid-step (answered in $((SECONDS - t0)) s)"
fi

# ------------------------------------------------------------ resource limits
if want limits; then
  echo "== resource limits" >&2
  for kb in 1 4 16 64 256 1024 4096 16384; do
    out=$work/runs/fsize-$kb
    rm -rf "$out"
    run_case limits "ulimit -f $kb" bash -c "ulimit -f $kb; exec \"\$@\"" _ "$T" "$TINY" run.steps=20 \
      run.checkpoint_every=5 data.shape=256 model.hidden=256 "run.out_dir=$out"
    record limits "ulimit -f $kb KiB"
  done
  for n in 6 8 10 12 16 24 32; do
    rm -rf "$work/runs/nofile"
    run_case limits "ulimit -n $n" bash -c "ulimit -n $n; exec \"\$@\"" _ "$T" "$TINY" "run.out_dir=$work/runs/nofile"
    record limits "ulimit -n $n"
  done
  for mb in 50 100 150 200 250 300 400 800; do
    rm -rf "$work/runs/vmem"
    run_case limits "ulimit -v ${mb}M (no ASan)" bash -c "ulimit -v $((mb * 1024)); exec \"\$@\"" _ "$PLAIN/train" \
      "$TINY" run.steps=20 "run.out_dir=$work/runs/vmem"
    record limits "ulimit -v ${mb} MiB train"
    run_case limits "ulimit -v ${mb}M bench_loader" bash -c "ulimit -v $((mb * 1024)); exec \"\$@\"" _ \
      "$PLAIN/bench_loader" "$TINY" --workers 1
    record limits "ulimit -v ${mb} MiB bench_loader"
  done
  if [ "$(id -u)" = 0 ]; then
    for kb in 16 64 128 256 512 1024 4096; do
      mnt=$work/tmpfs-$kb
      mkdir -p "$mnt"
      if mount -t tmpfs -o size=${kb}k tmpfs "$mnt" 2>/dev/null; then
        run_case limits "full disk ${kb} KiB" "$T" "$TINY" run.steps=30 run.checkpoint_every=3 data.shape=256 \
          model.hidden=256 "run.out_dir=$mnt/run"
        # a checkpoint left on the full disk must be whole
        if [ -e "$mnt/run/checkpoint.safetensors" ] && [ "$(ckpt_step "$mnt/run/checkpoint.safetensors")" -lt 0 ]; then
          CLASS=lost
        fi
        record limits "full disk ${kb} KiB"
        umount "$mnt"
      fi
    done
  else
    echo "   (full-disk cases skipped: they mount a tmpfs, which needs root)" >&2
  fi
fi

# ------------------------------------------------------------ the table
echo
echo "Bad-input campaign, seed $seed, scale $scale, timeout ${timeout_s}s, binaries of $(cat "$work/commit" 2>/dev/null)"
awk -F'\t' '
  { n[$1]++; c[$1, $2]++; t++; tc[$2]++; if (!($1 in seen)) { seen[$1] = 1; order[++k] = $1 } }
  END {
    printf "| %-8s | %5s | %5s | %12s | %7s | %5s | %9s | %5s |\n", "category", "runs", "ok", "clean errors", "crashes", "hangs", "data lost", "wrong"
    printf "|----------|-------|-------|--------------|---------|-------|-----------|-------|\n"
    for (i = 1; i <= k; i++) { g = order[i]
      printf "| %-8s | %5d | %5d | %12d | %7d | %5d | %9d | %5d |\n", g, n[g], c[g, "ok"], c[g, "error"], c[g, "crash"], c[g, "hang"], c[g, "lost"], c[g, "wrong"] }
    printf "| %-8s | %5d | %5d | %12d | %7d | %5d | %9d | %5d |\n", "total", t, tc["ok"], tc["error"], tc["crash"], tc["hang"], tc["lost"], tc["wrong"]
  }' "$RES"
bad=$(awk -F'\t' '$2 != "ok" && $2 != "error"' "$RES" | wc -l)
if [ "$bad" -gt 0 ]; then
  echo
  echo "$bad runs crashed, hung, lost data or accepted damage:"
  awk -F'\t' '$2 != "ok" && $2 != "error" { print "  " $1 " " $5 ": " $2 " (rc " $3 "), " $4 }' "$RES"
  exit 1
fi
