#!/usr/bin/env bash
# tests/sdk/build_plugin_test.sh: the example plugin builds out of tree from
# the SDK headers alone (plain cc, no Bazel, no core sources), exports only
# its entry symbol, and the core loads it and finds its op.
set -euo pipefail
out="${TEST_TMPDIR:-$(mktemp -d)}"
# only the SDK's headers are visible, none of the core's host-side ones
mkdir -p "$out/sdk/stoke"
cp core/sdk/stoke/*.h "$out/sdk/stoke/"
cc -std=gnu11 -shared -fPIC -fvisibility=hidden -Wall -Wextra -Werror -Wno-unused-parameter \
   -I "$out/sdk" plugins/swish/swish.c -lm -o "$out/libstoke_swish.so"
exported=$(nm -D --defined-only "$out/libstoke_swish.so" | awk '{print $3}' | grep -v '^_' | sort)
if [ "$exported" != "stoke_plugin_v1_entry" ]; then
  echo "FAIL: the plugin exports more than its entry symbol: $exported"
  exit 1
fi
STOKE_PLUGIN_PATH="$out" tests/sdk/load_plugin swish swish
echo "[==========] 1 test(s) run."
echo "[  PASSED  ] 1 test(s)."
