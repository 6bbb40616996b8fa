#!/usr/bin/env bash
# tools/gpu_check.sh: runs on the GPU machine, from the repository root,
# with .stage/ carried (tools/gpu_stage.sh): every GPU test binary, then the
# given extra commands. Full logs go to $OUT (or ./gpu-out); the closing
# lines summarize.
set -uo pipefail
out="${OUT:-gpu-out}"
mkdir -p "$out"
export STOKE_PLUGIN_PATH="$PWD/.stage/bin/plugins"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader > "$out/device.txt" 2>&1
summary=""
for t in .stage/tests/*_test; do
  [ -x "$t" ] || continue
  name=$(basename "$t")
  "$t" > "$out/$name.log" 2>&1
  rc=$?
  line=$(grep -E '^\[  (PASSED|FAILED)  \]' "$out/$name.log" | tail -2 | tr '\n' ' ')
  summary="$summary$name rc=$rc $line\n"
done
printf "device: %s\n" "$(cat "$out/device.txt")"
printf "%b" "$summary"
