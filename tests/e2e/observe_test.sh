#!/usr/bin/env bash
# tests/e2e/observe_test.sh: issue 13 on the CPU, as a user runs it: a small
# MLP with an evaluation set, run.tensorboard = true and run.trace = 10-14; then
# observe_check.py reads the event file back (its own CRC-32C and protobuf
# decoder; TensorBoard's reader too where installed) against
# metrics.jsonl, and checks report.html and trace.json. Prints cmocka-style lines.
set -uo pipefail
T="${TEST_TMPDIR:-$(mktemp -d)}"
HERE=tests/e2e
tools/train examples/quickstart.ini run.steps=40 run.log_every=1 run.progress=lines run.eval_every=0.25 \
  data.length=4096 eval_data.source=synthetic eval_data.shape=64 eval_data.classes=10 eval_data.length=512 \
  run.tensorboard=true run.trace=10-14 run.out_dir="$T/run" > "$T/run.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  echo "[  FAILED  ] train exited $rc:"
  tail -20 "$T/run.log"
  exit 1
fi
python3 "$HERE/observe_check.py" "$T/run"
