#!/usr/bin/env bash
# tests/tools/plugin_check_test.sh: the plugin test kit (tools/plugin_check)
# passes the example plugins (swish, leaky_relu with its CUDA kernels, the
# spirals source) and finds each mistake of tests/sdk/bad_kit.c: a backward
# reading an output bwd_needs does not name (named, not a crash), a wrong
# gradient, an f32 backward that disagrees with the f64 one, an f32
# backward overwriting a parameter's gradient under param_grad_beta 1,
# labels counting from 1, bytes left unwritten, a read that depends on more
# than (index, seed), a backward that claims STOKE_KCAP_WITH_FORWARD but
# leaves the forward's output unwritten, an f32 kernel writing doubles (past
# its output's end: named, where glibc had aborted later), an infer that
# sets no output, backward kernels beside has_backward 0, a kernel of a
# misspelt engine ("CPU"); and
# tests/sdk/no_host.c's register() that leaves stoke_host unset.
set -uo pipefail
out="${TEST_TMPDIR:-$(mktemp -d)}"
pc=tools/plugin_check
fail=0
check() { # check LOG WANTED_EXIT PLUGIN...
  local log="$1" want="$2"
  shift 2
  "$pc" "$@" > "$log" 2>&1
  local rc=$?
  if [ "$rc" -ne "$want" ]; then
    echo "FAIL: plugin_check $* exited $rc, expected $want:"
    cat "$log"
    fail=1
  fi
}
has() { # has LOG TEXT
  if ! grep -qF -- "$2" "$1"; then
    echo "FAIL: $(basename "$1") lacks: $2"
    cat "$1"
    fail=1
  fi
}
n=0
for p in plugins/swish/libstoke_swish.so plugins/leaky_relu/libstoke_leaky_relu.so plugins/spirals/libstoke_spirals.so; do
  log="$out/$(basename "$p" .so).log"
  check "$log" 0 "$p"
  n=$((n + 1))
done
has "$out/libstoke_swish.log" "ok   op swish [3x5]: gradient against finite differences (f64)"
has "$out/libstoke_leaky_relu.log" "ok   op leaky_relu [6x33] (negative_slope=0.1): gradient against finite differences (f64)"
has "$out/libstoke_leaky_relu.log" "ok   op leaky_relu [2x3x5x7] (negative_slope=0.25): backward reads only what bwd_needs names"
has "$out/libstoke_leaky_relu.log" "ok   op leaky_relu [6x33] (negative_slope=0.1): cpu f32 backward kernel against the cpu f64 one"
has "$out/libstoke_leaky_relu.log" "cuda f32 forward kernel against the cpu f64 one"
has "$out/libstoke_leaky_relu.log" "cuda f32 backward kernel against the cpu f64 one"
has "$out/libstoke_spirals.log" "ok   source spirals: 4 threads read what one thread reads"
has "$out/libstoke_spirals.log" "ok   source spirals: the same (index, seed) gives the same sample, every byte written"
log="$out/bad_kit.log"
check "$log" 1 tests/sdk/libstoke_bad_kit.so
has "$log" "FAIL op mis_relu [3x5]: backward reads only what bwd_needs names: it crashed when output 0 (STOKE_BWD_NEEDS_OUTPUT(0)) had no data"
has "$log" "FAIL op bad_grad [3x5]: gradient against finite differences (f64): relative error"
has "$log" "FAIL op bad_grad [3x5]: CPU f32 forward kernel against the cpu f64 one: no backend is named 'CPU' (did you mean 'cpu'?)"
has "$log" "FAIL op f32_grad [3x5]: cpu f32 backward kernel against the cpu f64 one: gradient of input 0: relative error 0.5 > tolerance"
has "$log" "ok   op mul_param [3x5]: cpu f32 backward kernel against the cpu f64 one"
has "$log" "FAIL op mul_param [3x5]: cpu f32 backward kernel, parameter gradients accumulated (param_grad_beta 1): gradient of input 1"
has "$log" "ok   op lazy_fwd [3x5]: gradient against finite differences (f64)"
has "$log" "FAIL op lazy_fwd [3x5]: backward with with_forward also writes the forward's outputs (STOKE_KCAP_WITH_FORWARD): output 0 element 0 is NaN: left unwritten"
has "$log" "FAIL op wide_f32 [3x5]: cpu f32 forward kernel against the cpu f64 one: cpu forward kernel (wide_f32, f32) wrote up to 60 bytes past the end of output 0 (f32 [3, 5]: 60 bytes)"
has "$log" "its infer() gave output 0 0 dimensions [], dtype 0: not a shape (1 to 6 dimensions, each >= 1) or not a dtype; infer must set every output"
has "$log" "FAIL op bwd_hidden [3x5]: backward kernels only with has_backward: the op's has_backward is 0, yet a STOKE_BWD kernel is registered (cpu f64)"
has "$log" "FAIL source sloppy: labels in [0, classes): sample 1 has label 2, outside [0, 2)"
has "$log" "FAIL source sloppy: the same (index, seed) gives the same sample, every byte written: sample 0 read twice differs at byte 4"
n=$((n + 1))
# a register() that forgets `stoke_host = h;`: the crash at the first stoke_host->log is named as that
log="$out/no_host.log"
check "$log" 1 tests/sdk/libstoke_no_host.so
has "$log" "FAIL op no_host_act [3x5]: cpu forward in f64, every output element written: the forward kernel crashed (SIGSEGV at address"
has "$log" "does the plugin's register() keep the host table (\`stoke_host = h;\`"
n=$((n + 1))
[ "$fail" -eq 0 ] || exit 1
echo "[==========] $n test(s) run."
echo "[  PASSED  ] $n test(s)."
