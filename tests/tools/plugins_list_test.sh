#!/usr/bin/env bash
# tests/tools/plugins_list_test.sh: every stoke_plugin target of the tree
# (outside tests/) lands in tools/plugins/ beside train and bench, where the
# loader looks: a plugin left out of tools/BUILD's hand-written list fails
# here, not as "no libstoke_<name>.so" in a user's run. And each of them
# loads and registers (every part's ABI version and size checked; the GPU
# plugins register without a GPU).
set -euo pipefail
# the checkout this test was built from: the runfiles link back to it
root="$(cd "$(dirname "$(readlink -f "$0")")/../.." && pwd)"
plugins_dir="tools/plugins"
[ -d "$plugins_dir" ] || { echo "FAIL: no $plugins_dir in the runfiles"; exit 1; }
# names from `stoke_plugin(name = "x", ...)`, the name on the same line or a later one
names=$(find "$root" -name BUILD -not -path "*/bazel-*" -not -path "$root/tests/*" -not -path "$root/.*" \
          -exec awk '/stoke_plugin\(/ {open = 1} open && match($0, /name *= *"[^"]+"/) {
                       s = substr($0, RSTART, RLENGTH); gsub(/^name *= *"|"$/, "", s);
                       print s; open = 0 }' {} + | sort -u)
[ -n "$names" ] || { echo "FAIL: found no stoke_plugin targets under $root"; exit 1; }
missing=0
count=0
for n in $names; do
  count=$((count + 1))
  if [ ! -f "$plugins_dir/libstoke_$n.so" ]; then
    echo "FAIL: stoke_plugin '$n' is not in tools/plugins/: add its libstoke_$n.so to PLUGINS in tools/BUILD"
    missing=$((missing + 1))
  fi
done
echo "stoke_plugin targets: $(echo $names | tr '\n' ' ') ($count); in tools/plugins/: $(ls $plugins_dir | tr '\n' ' ')"
[ "$missing" -eq 0 ] || exit 1
# (under the sanitizers: the CUDA libraries the GPU plugins link allocate
# when they are loaded and never free it, which is theirs to keep)
for so in "$plugins_dir"/libstoke_*.so; do
  ASAN_OPTIONS="${ASAN_OPTIONS:+$ASAN_OPTIONS:}detect_leaks=0" tests/sdk/load_plugin "$PWD/$so" ||
    { echo "FAIL: $so does not load"; missing=$((missing + 1)); }
done
[ "$missing" -eq 0 ] || exit 1
echo "[==========] 1 test(s) run."
echo "[  PASSED  ] 1 test(s)."
