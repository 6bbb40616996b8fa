#!/usr/bin/env bash
# tests/plugins/newuser/newuser_test.sh: issue 18's new-user trial kept as a
# test: the op (hardswish, cpu + cuda) and the source (rings) a new user
# wrote from plugins/README.md alone build out of tree with the README's
# commands (build.sh), pass the test kit (tools/plugin_check; the cuda
# kernels are skipped without a GPU: gpu_suite part plugkit runs them), and
# train an MLP on the CPU to a held-out accuracy of 0.95 or more.
set -uo pipefail
out="${TEST_TMPDIR:-$(mktemp -d)}/newuser"
fail=0
tests/plugins/newuser/build.sh "$PWD" "$out" || { echo "FAIL: build.sh (the README's commands)"; exit 1; }
for so in hardswish rings; do
  if ! tools/plugin_check "$out/libstoke_$so.so" > "$out/check_$so.log" 2>&1; then
    echo "FAIL: plugin_check libstoke_$so.so:"
    cat "$out/check_$so.log"
    fail=1
  fi
done
grep -q "^ok   op hardswish \[8x37\]: cpu f32 backward kernel against the cpu f64 one" "$out/check_hardswish.log" ||
  { echo "FAIL: no hardswish backward check:"; cat "$out/check_hardswish.log"; fail=1; }
grep -q "^ok   source rings: 4 threads read what one thread reads" "$out/check_rings.log" ||
  { echo "FAIL: no rings thread check:"; cat "$out/check_rings.log"; fail=1; }
(cd / && "$OLDPWD/tools/train" "$out/rings.ini" run.steps=600 run.progress=off run.checkpoint=false \
   run.out_dir="$out/run") > "$out/train.log" 2>&1 || { echo "FAIL: train:"; cat "$out/train.log"; fail=1; }
acc=$(grep -oE "top-1 accuracy [0-9.]+" "$out/train.log" | grep -oE "[0-9.]+$" | tail -1)
echo "rings + hardswish, 600 steps on the cpu: held-out top-1 accuracy ${acc:-none}"
awk -v a="${acc:-0}" 'BEGIN { exit !(a >= 0.95) }' || { echo "FAIL: accuracy ${acc:-none} < 0.95"; tail -20 "$out/train.log"; fail=1; }
grep -q "layers.1  *hardswish  *forward   cpu" "$out/train.log" || { echo "FAIL: no hardswish node in the plan"; fail=1; }
[ "$fail" -eq 0 ] || exit 1
echo "[==========] 4 test(s) run."
echo "[  PASSED  ] 4 test(s)."
