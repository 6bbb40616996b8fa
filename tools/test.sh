#!/usr/bin/env bash
# tools/test.sh: set up, then run every test twice: a normal build and under
# AddressSanitizer + UBSan (--config=asan), and the loader test under
# ThreadSanitizer, then every fuzz target under libFuzzer for a short budget
# (tools/fuzz.sh; STOKE_FUZZ_BUDGET seconds each, default 25, libFuzzer
# seed STOKE_FUZZ_SEED, default 1). Prints "N
# passed, N failed" counting individual cmocka test cases (and each fuzz
# target as one); exits non-zero on any failure.
set -uo pipefail
cd "$(dirname "$0")/.."
tools/setup.sh || exit 1
passed=0
failed=0
# the logs of today's test targets only: bazel-testlogs keeps the logs of
# targets since renamed or removed, which would be counted again
targets=$(bazel query 'tests(//...)' 2>/dev/null | sed -e 's|^//||' -e 's|:|/|')
count() { # sum cmocka results over the test logs of the last bazel run
  local log p f t
  while IFS= read -r log; do
    [ -n "$filter" ] && case "$log" in *fmnist_test*) continue ;; esac
    t=${log#bazel-testlogs/}
    t=${t%/test.log}
    [ -n "$targets" ] && ! grep -qxF "$t" <<<"$targets" && continue
    p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
    f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$log" | grep -Eo '[0-9]+' | tail -1)
    if [ -z "$p$f" ]; then f=1; echo "no cmocka result in $log (crashed?)" >&2; fi
    passed=$((passed + ${p:-0}))
    failed=$((failed + ${f:-0}))
  done < <(find -L bazel-testlogs/ -name test.log -not -path '*/run_*_of_*' 2>/dev/null)
}
status=0
for cfg in "" "--config=asan"; do
  echo "== bazel test $cfg //..." >&2
  filter=""
  [ -n "$cfg" ] && filter="--test_tag_filters=-accuracy"  # the accuracy runs: once, without sanitizers
  bazel test $cfg $filter //... || status=1
  count
done
# the loader's ring under ThreadSanitizer
echo "== bazel test --config=tsan //tests/unit:loader_test" >&2
bazel test --config=tsan //tests/unit:loader_test || status=1
log=bazel-testlogs/tests/unit/loader_test/test.log
p=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | grep -Eo '[0-9]+$' | tail -1)
f=$(grep -Eo '^\[  FAILED  \] [0-9]+ test' "$log" | grep -Eo '[0-9]+' | tail -1)
[ -z "$p$f" ] && f=1
passed=$((passed + ${p:-0}))
failed=$((failed + ${f:-0}))
# the fuzz targets under libFuzzer (a finding's input lands in tests/fuzz/regress/)
# seeded (STOKE_FUZZ_SEED): a verdict any machine reproduces; exploring with
# fresh seeds is tools/fuzz.sh by hand (its --help)
fuzz_seed=${STOKE_FUZZ_SEED:-1}
echo "== tools/fuzz.sh --budget ${STOKE_FUZZ_BUDGET:-25} --seed $fuzz_seed" >&2
fuzz_log=$(mktemp)
tools/fuzz.sh --budget "${STOKE_FUZZ_BUDGET:-25}" --seed "$fuzz_seed" | tee "$fuzz_log" || status=1
f=$(awk -F'|' '$6 ~ /^ *[0-9]+ *$/ { n++; if ($6 + 0 > 0) bad++ } END { print n + 0, bad + 0 }' "$fuzz_log")
set -- $f
[ "$1" -eq 0 ] && { echo "tools/fuzz.sh ran no target" >&2; failed=$((failed + 1)); }
passed=$((passed + $1 - $2))
failed=$((failed + $2))
rm -f "$fuzz_log"
echo "$passed passed, $failed failed"
[ "$status" -eq 0 ] && [ "$failed" -eq 0 ]
