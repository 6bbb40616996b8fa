#!/usr/bin/env bash
# tools/gpu_check.sh: runs on the GPU machine as `bash .stage/gpu_check.sh`
# (tools/gpu_stage.sh copies it into the stage folder, which the device
# tool carries; the folder is found from this script's path): unpacks the binaries to
# /tmp/stoke, runs every GPU test binary, then any extra command given as
# arguments (run with the unpacked tree as $S, gpu_suite.sh as $SUITE and the
# stage folder as $ST: the Python helpers, $ST/kernel_trace.py and the like,
# are there, not in $S). Full logs go to $OUT (or ./gpu-out); the closing
# lines summarize.
#
#   bash .stage/gpu_check.sh [--repeat N] [--only NAME,...] [COMMAND...]
#
# --repeat N (or TEST_REPS=N) runs every test binary N times, as CI would on
# every commit, each run with a fresh STOKE_TEST_SEED (the seed of the
# tests' random inputs, on its line: a failure reruns with it), and ends
# with the flakes: per test, runs, failures, and the seeds and test cases
# that failed, then every_kernel_test's closest margins (tools/test_margins.py).
# --only runs just the named test binaries (cuda_ops_test,...).
set -uo pipefail
reps=${TEST_REPS:-1} only=""
while [ $# -gt 0 ]; do
  case "$1" in
    --repeat) reps=$2; shift 2 ;;
    --only) only=$2; shift 2 ;;
    *) break ;;
  esac
done
ST="$(cd "$(dirname "$0")" && pwd)"
final="${OUT:-gpu-out}"
out=/tmp/stoke-out   # everything, packed into $OUT/logs.tar.gz at the end (the device tool returns 8 files)
rm -rf "$out" && mkdir -p "$out" "$final"
export S=/tmp/stoke
rm -rf "$S" && mkdir -p "$S" && tar -C "$S" -xJf "$ST/bin.tar.xz" || exit 1
cp -r "$ST/examples" "$ST/anchors" "$S/" 2>/dev/null
[ -d "$ST/data" ] && ln -sfn "$ST/data" "$S/data"
[ -d "$ST/photos" ] && ln -sfn "$ST/photos" "$S/photos"
export STOKE_PLUGIN_PATH="$S/bin/plugins"
if [ -f "$ST/before.tar.xz" ]; then # tools/gpu_stage.sh AB_KEEP=1: the build before, for gpu_suite's binab
  export BEFORE=/tmp/stoke-before
  rm -rf "$BEFORE" && mkdir -p "$BEFORE" && tar -C "$BEFORE" -xJf "$ST/before.tar.xz" &&
    ln -sf "$S/bin/plugins/libstoke_cpu.so" "$BEFORE/bin/plugins/libstoke_cpu.so"
fi
export LD_LIBRARY_PATH="$S/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/device.txt" 2>&1
summary=""
declare -A runs fails failed_seeds
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  for rep in $(seq "$reps"); do
    for t in "$S"/tests/*_test; do
      [ -x "$t" ] || continue
      name=$(basename "$t")
      [ -z "$only" ] || [[ ",$only," == *",$name,"* ]] || continue
      log="$out/$name.log"; [ "$reps" -gt 1 ] && log="$out/$name.$rep.log"
      # a fresh seed every run (the tests' default, the time, repeats within a second)
      seed=$(( ($(date +%s%N) / 1000 + rep * 7919) % 4294967296 ))
      STOKE_TEST_SEED=$seed timeout 300 "$t" > "$log" 2>&1
      rc=$?
      line=$(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tail -2 | tr '\n' ' ')
      summary="$summary$name#$rep rc=$rc $line seed $seed\n"
      # as it goes too: a call cut off at its time limit still shows what ran
      echo "$name#$rep rc=$rc $line seed $seed" >> "$final/progress.txt"
      runs[$name]=$(( ${runs[$name]:-0} + 1 ))
      if [ "$rc" -ne 0 ]; then
        fails[$name]=$(( ${fails[$name]:-0} + 1 ))
        cases=$(grep -E '^\[  FAILED  \] [a-z_]' "$log" | sed 's/.*\] //' | tr '\n' ',' | sed 's/,$//')
        failed_seeds[$name]="${failed_seeds[$name]:-} $seed(${cases:-rc $rc})"
      fi
    done
  done
fi
printf "device: %s\n" "$(cat "$out/device.txt")"
printf "%b" "$summary"
if [ "$reps" -gt 1 ]; then
  printf '\nflakes over %d runs with fresh seeds (rerun one: STOKE_TEST_SEED=SEED $S/tests/NAME):\n' "$reps"
  printf '%-26s %4s %5s  %s\n' test runs fails "seeds that failed (test cases)"
  for name in $(printf '%s\n' "${!runs[@]}" | sort); do
    printf '%-26s %4d %5d %s\n' "$name" "${runs[$name]}" "${fails[$name]:-0}" "${failed_seeds[$name]:-}"
  done
fi
# how close the kernel checks came to their tolerances (tools/test_margins.py): a ratio near 1 flakes
ls "$out"/every_kernel_test*.log > /dev/null 2>&1 && python3 "$ST/test_margins.py" "$out"/every_kernel_test*.log --top 6
if [ $# -gt 0 ]; then
  OUT="$out" SUITE="$ST/gpu_suite.sh" ST="$ST" bash -c "$*"
fi
tar -C "$out" --exclude='*.safetensors' -czf "$final/logs.tar.gz" .
