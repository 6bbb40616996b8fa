#!/usr/bin/env bash
# tools/gpu_check.sh: runs on the GPU machine as `bash .stage/gpu_check.sh`
# (tools/gpu_stage.sh copies it into the stage folder, which the device
# tool carries; the folder is found from this script's path): unpacks the binaries to
# /tmp/stoke, runs every GPU test binary, then any extra command given as
# arguments (run with the unpacked tree as $S). Full logs go to $OUT (or
# ./gpu-out); the closing lines summarize.
set -uo pipefail
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
export LD_LIBRARY_PATH="$S/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/device.txt" 2>&1
summary=""
if [ "${SKIP_TESTS:-0}" != 1 ]; then
  # TEST_REPS=N runs every test N times (each run draws its own seed)
  for rep in $(seq "${TEST_REPS:-1}"); do
    for t in "$S"/tests/*_test; do
      [ -x "$t" ] || continue
      name=$(basename "$t")
      log="$out/$name.log"; [ "${TEST_REPS:-1}" -gt 1 ] && log="$out/$name.$rep.log"
      timeout 300 "$t" > "$log" 2>&1
      rc=$?
      line=$(grep -E '^\[  (PASSED|FAILED)  \]' "$log" | tail -2 | tr '\n' ' ')
      summary="$summary$name#$rep rc=$rc $line $(grep -m1 -o -i 'seed[ =:]*[0-9]*' "$log")\n"
    done
  done
fi
printf "device: %s\n" "$(cat "$out/device.txt")"
printf "%b" "$summary"
if [ $# -gt 0 ]; then
  OUT="$out" SUITE="$ST/gpu_suite.sh" bash -c "$*"
fi
tar -C "$out" --exclude='*.safetensors' -czf "$final/logs.tar.gz" .
