#!/usr/bin/env bash
# tests/sdk/build_plugin_test.sh: plugins build out of tree from the SDK
# headers alone (plain cc, no Bazel, no core sources, only core/sdk/stoke/)
# and export only their entry symbol; the core loads them and finds their
# parts: the example op plugin (swish), optimizer (lion) and precision
# policy (bf16_fp32norm), and one plugin with a part of every versioned kind. A part built against another header (struct size) or ABI
# version is refused, naming the file, the kind and both values.
set -euo pipefail
out="${TEST_TMPDIR:-$(mktemp -d)}"
mkdir -p "$out/sdk/stoke"
cp core/sdk/stoke/*.h "$out/sdk/stoke/"
# build SRC DIR [flags...]: libstoke_<basename>.so in DIR, checked to export one symbol
build() {
  local src="$1" dir="$2" name
  shift 2
  name=$(basename "$src" .c)
  mkdir -p "$dir"
  cc -std=gnu11 -shared -fPIC -fvisibility=hidden -Wall -Wextra -Werror -Wno-unused-parameter \
     -I "$out/sdk" "$@" "$src" -lm -o "$dir/libstoke_$name.so"
  exported=$(nm -D --defined-only "$dir/libstoke_$name.so" | awk '{print $3}' | grep -v '^_' | sort)
  exported=$(echo "$exported" | grep -vx stoke_testkit_v1_entry || true) # the test kit's cases may be exported too
  if [ "$exported" != "stoke_plugin_v1_entry" ]; then
    echo "FAIL: $name exports more than its entry symbol: $exported"
    exit 1
  fi
}
build plugins/swish/swish.c "$out"
STOKE_PLUGIN_PATH="$out" tests/sdk/load_plugin swish op:swish
build plugins/lion/lion.c "$out"
STOKE_PLUGIN_PATH="$out" tests/sdk/load_plugin lion optimizer:lion kernel:lion
build plugins/bf16_fp32norm/bf16_fp32norm.c "$out"
STOKE_PLUGIN_PATH="$out" tests/sdk/load_plugin bf16_fp32norm precision:bf16_fp32norm
build plugins/leaky_relu/leaky_relu.c "$out" # the cpu half (the cuda half: plugins/README.md's nvcc line)
STOKE_PLUGIN_PATH="$out" tests/sdk/load_plugin leaky_relu op:leaky_relu kernel:leaky_relu
build plugins/spirals/spirals.c "$out"
STOKE_PLUGIN_PATH="$out" tests/sdk/load_plugin spirals source:spirals
build tests/sdk/every_part.c "$out"
STOKE_PLUGIN_PATH="$out" tests/sdk/load_plugin every_part op:every_op kernel:every_op backend:every_backend \
  source:every_source model:every_model precision:every_precision comm:every_comm optimizer:every_optimizer
tests=6
kinds=(op backend source model precision comm optimizer)
for k in "${!kinds[@]}"; do
  build tests/sdk/every_part.c "$out/stale$k" -DSTALE="$k"
  tests/sdk/load_plugin --refused "$out/stale$k/libstoke_every_part.so" "stale$k/libstoke_every_part.so" \
    "${kinds[$k]} 'every_${kinds[$k]}' says its struct is" "rebuild the plugin"
  build tests/sdk/every_part.c "$out/old$k" -DOLD_ABI="$k"
  tests/sdk/load_plugin --refused "$out/old$k/libstoke_every_part.so" "old$k/libstoke_every_part.so" \
    "a ${kinds[$k]} part says stoke ABI version 1, this stoke expects version" "rebuild the plugin"
  tests=$((tests + 2))
done
echo "[==========] $tests test(s) run."
echo "[  PASSED  ] $tests test(s)."
