#!/usr/bin/env bash
# tests/e2e/fmnist_test.sh: Fashion-MNIST as a user runs it, on the CPU:
# convert Debian's IDX files to LMDB with tools/convert, train
# examples/fmnist_mlp.ini and examples/fmnist_cnn.ini, and check the test
# accuracy against the data set's published figures (MLP >= 0.88, small
# CNN >= 0.91). Prints cmocka-style result lines for tools/test.sh.
set -uo pipefail
D=/usr/share/datasets/fashion-mnist
T="${TEST_TMPDIR:-$(mktemp -d)}"
if [ ! -f "$D/train-images-idx3-ubyte.gz" ]; then
  echo "FAIL: $D is missing: apt-get install dataset-fashion-mnist (tools/setup.sh does)"
  echo "[  FAILED  ] 2 test(s)"
  exit 1
fi
tools/convert idx --images $D/train-images-idx3-ubyte.gz --labels $D/train-labels-idx1-ubyte.gz --out "$T/train" || exit 1
tools/convert idx --images $D/t10k-images-idx3-ubyte.gz --labels $D/t10k-labels-idx1-ubyte.gz --out "$T/test" || exit 1
passed=0
failed=0
check() { # name ini threshold
  local start=$(date +%s)
  tools/train "examples/$2" data.path="$T/train" eval_data.path="$T/test" run.out_dir="$T/$1" \
    run.progress=lines run.checkpoint=false > "$T/$1.log" 2>&1
  local rc=$? secs=$(( $(date +%s) - start ))
  local acc=$(sed -n 's/.*"summary".*"eval_accuracy": \([0-9.]*\).*/\1/p' "$T/$1/metrics.jsonl" 2>/dev/null)
  if [ $rc -eq 0 ] && [ -n "$acc" ] && awk -v a="$acc" -v t="$3" 'BEGIN { exit !(a >= t) }'; then
    echo "[       OK ] $1: test accuracy $acc >= $3 in ${secs} s"
    passed=$((passed + 1))
  else
    echo "[  FAILED  ] $1: rc=$rc, test accuracy '${acc}' (needs >= $3), ${secs} s"
    tail -20 "$T/$1.log"
    failed=$((failed + 1))
  fi
}
check fmnist_mlp fmnist_mlp.ini 0.88
check fmnist_cnn fmnist_cnn.ini 0.91
[ $passed -gt 0 ] && echo "[  PASSED  ] $passed test(s)."
[ $failed -gt 0 ] && echo "[  FAILED  ] $failed test(s), listed above"
[ $failed -eq 0 ]
