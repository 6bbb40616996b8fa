#!/usr/bin/env bash
# tests/e2e/trace_svg_test.sh: tools/trace_svg.py, the picture of a trace, on
# a real one: the quickstart MLP trained on the CPU with run.trace = 3-5,
# then trace_svg_check.py draws it (one step, all three, two ranks stacked)
# and checks the SVG's lanes and slices against trace.json and the picture
# in headless chromium. Prints cmocka-style lines.
set -uo pipefail
T="${TEST_TMPDIR:-$(mktemp -d)}"
tools/train examples/quickstart.ini run.steps=8 run.log_every=1 run.progress=off run.trace=3-5 \
  run.out_dir="$T/run" > "$T/run.log" 2>&1
rc=$?
if [ $rc -ne 0 ]; then
  echo "[  FAILED  ] train exited $rc:"
  tail -20 "$T/run.log"
  exit 1
fi
mkdir -p "$T/svg"
python3 tests/e2e/trace_svg_check.py "$T/run" tools/trace_svg.py "$T/svg"
