#!/usr/bin/env bash
# tests/e2e/observe_test.sh: issue 13 on the CPU, as a user runs it: a small
# MLP with an evaluation set, run.tensorboard = true and run.trace = 10-14; then
# observe_check.py reads the event file back (its own CRC-32C and protobuf
# decoder; TensorBoard's reader too where installed) against
# metrics.jsonl, and checks report.html and trace.json, and that the
# checkpoint and losses equal an untraced run's bitwise; report_render.py
# loads the page in headless chromium. Prints cmocka-style lines.
set -uo pipefail
T="${TEST_TMPDIR:-$(mktemp -d)}"
HERE=tests/e2e
RUN="examples/quickstart.ini run.steps=40 run.log_every=1 run.progress=lines run.eval_every=0.25 data.length=4096
     eval_data.source=synthetic eval_data.shape=64 eval_data.classes=10 eval_data.length=512 run.tensorboard=true"
tools/train $RUN run.trace=10-14 run.out_dir="$T/run" > "$T/run.log" 2>&1
rc=$?
# the same run untraced: tracing must not change the training (SAME_AS below)
[ $rc -eq 0 ] && { tools/train $RUN run.trace= run.out_dir="$T/untraced" > "$T/untraced.log" 2>&1; rc=$?; }
if [ $rc -ne 0 ]; then
  echo "[  FAILED  ] train exited $rc:"
  tail -20 "$T/run.log" "$T/untraced.log"
  exit 1
fi
# a bad window is refused with where it was given
bad=$(tools/train examples/quickstart.ini run.steps=2 run.trace=9-3 run.out_dir="$T/bad" 2>&1)
case "$bad" in
  *"[run] trace = '9-3': give the steps to trace as FIRST-LAST"*) bad_ok="[       OK ] trace: run.trace = 9-3 refused" ;;
  *) bad_ok="[  FAILED  ] trace: run.trace = 9-3 not refused as expected: $bad" ;;
esac
# the checks, then the page in Debian's headless chromium (no console
# error, the plots drawn); one total for tools/test.sh's count
out=$({ echo "$bad_ok"; SAME_AS="$T/untraced" python3 "$HERE/observe_check.py" "$T/run"; python3 "$HERE/report_render.py" "$T/run/report.html" "$T/report.png"; } 2>&1)
echo "$out" | grep -v '^\[  PASSED  \]\|^\[  FAILED  \] [0-9]* test(s), listed above'
passed=$(echo "$out" | grep -c '^\[       OK \]')
failed=$(echo "$out" | grep -c '^\[  FAILED  \] [^0-9]')
echo "[  PASSED  ] $passed test(s)."
[ "$failed" -gt 0 ] && echo "[  FAILED  ] $failed test(s), listed above"
[ "$failed" -eq 0 ] && [ "$passed" -gt 0 ]
