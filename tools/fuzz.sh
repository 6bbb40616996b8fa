#!/usr/bin/env bash
# tools/fuzz.sh: runs stoke's fuzz targets (tests/fuzz/*_fuzz.c: every
# parser of outside bytes) under libFuzzer, with ASan and UBSan, each for a
# time budget. Built here with clang (Debian's clang-14 and its libFuzzer;
# tools/setup.sh installs them), outside Bazel, from the same sources as
# the Bazel build.
#
#   tools/fuzz.sh [--budget SECONDS] [--seed N] [--jobs N] [--out DIR] [TARGET...]
#
# Targets: every tests/fuzz/NAME_fuzz.c (bpe idx ini jpeg lmdb record
# safetensors shard; default: all), each run
# --budget seconds (default 30) starting from its seeds
# (tests/fuzz/corpus/NAME) and past findings (tests/fuzz/regress/NAME).
# A finding (crash, sanitizer report, leak, timeout over 10 s, more than
# 2 GiB) fails the script; its input is copied into tests/fuzz/regress/NAME/,
# where the normal test suite (//tests/fuzz:NAME_fuzz_test) replays it from
# then on: fix the bug, commit the input. The corpus libFuzzer grows is kept
# in --out (default /tmp/stoke-fuzz) for the next run; the seeds in the
# repository are not touched. The closing table gives, per target,
# executions, executions/s, coverage (edges) and findings.
#
# --seed N: libFuzzer's random seed, and each target starts from the
# repository's seeds and regress inputs alone (the corpus of earlier runs in
# --out is set aside): the same inputs in the same order on every machine,
# so a verdict can be reproduced. tools/test.sh (the README's test command,
# CI) runs seeded; without --seed, libFuzzer draws a seed and resumes the
# grown corpus: exploration, which finds what a fixed seed never reaches.
#
# A longer run of one target: tools/fuzz.sh --budget 600 jpeg
# By hand: /tmp/stoke-fuzz/bin/jpeg_fuzz -help=1 (libFuzzer's options).
set -uo pipefail
cd "$(dirname "$0")/.."
budget=30 out=/tmp/stoke-fuzz jobs=1 seed=""
targets=()
while [ $# -gt 0 ]; do
  case "$1" in
    --budget) budget=$2; shift 2 ;;
    --out) out=$2; shift 2 ;;
    --jobs) jobs=$2; shift 2 ;;
    --seed) seed=$2; shift 2 ;;
    -h|--help) sed -n '2,31p' "$0"; exit 0 ;;
    -*) echo "fuzz.sh: unknown option '$1' (see --help)" >&2; exit 2 ;;
    *) targets+=("$1"); shift ;;
  esac
done
if [ ${#targets[@]} -eq 0 ]; then
  for f in tests/fuzz/*_fuzz.c; do t=${f##*/}; targets+=("${t%_fuzz.c}"); done
fi
CC=${CC:-clang}
command -v "$CC" > /dev/null || { echo "fuzz.sh: no $CC (apt-get install clang, or tools/setup.sh)" >&2; exit 1; }

# ------------------------------------------------------------ build
# Every object instrumented for coverage (fuzzer-no-link) and sanitized.
FLAGS=(-g -O1 -std=gnu11 -fno-omit-frame-pointer -fsanitize=fuzzer-no-link,address,undefined
       -fno-sanitize-recover=undefined -Icore/include -Icore/sdk -I. -I"${CUDA_HOME:-/usr/local/cuda}/include"
       -D_GNU_SOURCE -w) # CUDA's include: the core's NVTX ranges (header-only nvtx3)
LIBS=(-l:libinih.a -l:libjpeg.a -l:libz.a -l:liblmdb.a -l:libpcre2-8.a -ldl -lpthread -lm)
obj=$out/obj bin=$out/bin
mkdir -p "$obj" "$bin"
srcs=(core/*.c sources/lmdb/record.c sources/lmdb/guard.c sources/jpeg/decode.c sources/jpeg/sample.c
      sources/jpeg/crop.c sources/tokens/shard.c tools/idx.c tools/bpe.c)
# a plugin's own source, linked only into its target (it defines the
# plugin's entry and host symbols)
declare -A own=([lmdb]=sources/lmdb/lmdb.c)
objs=()
pids=()
for s in "${srcs[@]}" "${own[@]}"; do
  o=$obj/$(echo "$s" | tr / _).o
  [[ " ${own[*]} " == *" $s "* ]] || objs+=("$o")
  # rebuilt when the source or any header is newer
  if [ ! -f "$o" ] || [ "$s" -nt "$o" ] || [ -n "$(find core/include core/sdk sources tools -name '*.h' -newer "$o" | head -1)" ]; then
    "$CC" "${FLAGS[@]}" -c "$s" -o "$o" &
    pids+=($!)
    if [ ${#pids[@]} -ge "$(nproc)" ]; then wait "${pids[0]}" || exit 1; pids=("${pids[@]:1}"); fi
  fi
done
for p in "${pids[@]}"; do wait "$p" || exit 1; done
for t in "${targets[@]}"; do
  [ -f "tests/fuzz/${t}_fuzz.c" ] || { echo "fuzz.sh: no target '$t' (tests/fuzz/${t}_fuzz.c)" >&2; exit 2; }
  extra=()
  [ -n "${own[$t]:-}" ] && extra=("$obj/$(echo "${own[$t]}" | tr / _).o")
  "$CC" "${FLAGS[@]}" -fsanitize=fuzzer "tests/fuzz/${t}_fuzz.c" "${objs[@]}" "${extra[@]}" "${LIBS[@]}" \
    -o "$bin/${t}_fuzz" || exit 1
done

# ------------------------------------------------------------ run
export ASAN_OPTIONS=detect_leaks=1:allocator_may_return_null=1
export UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1
status=0
table=""
for t in "${targets[@]}"; do
  work=$out/corpus/$t findings=$out/findings/$t
  rm -rf "$findings" # this run's findings only (past ones are in tests/fuzz/regress)
  seeded=()
  if [ -n "$seed" ]; then
    work=$out/corpus-seeded/$t
    rm -rf "$work"
    seeded=(-seed="$seed")
  fi
  mkdir -p "$work" "$findings"
  log=$out/$t.log
  seeds=(tests/fuzz/corpus/$t)
  [ -d "tests/fuzz/regress/$t" ] && seeds+=("tests/fuzz/regress/$t")
  echo "== $t: ${budget}s${seed:+, seed $seed}" >&2
  "$bin/${t}_fuzz" "${seeded[@]}" -max_total_time="$budget" -timeout=10 -rss_limit_mb=2048 -max_len=65536 -print_final_stats=1 \
    -artifact_prefix="$findings/" "$work" "${seeds[@]}" > "$log" 2>&1
  rc=$?
  execs=$(grep -oE 'stat::number_of_executed_units: *[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  rate=$(grep -oE 'stat::average_exec_per_sec: *[0-9]+' "$log" | tail -1 | grep -oE '[0-9]+$')
  cov=$(grep -oE 'cov: [0-9]+' "$log" | tail -1 | grep -oE '[0-9]+')
  found=$(find "$findings" -type f | wc -l)
  if [ "$rc" -ne 0 ] || [ "$found" -gt 0 ]; then
    status=1
    mkdir -p "tests/fuzz/regress/$t"
    for f in "$findings"/*; do
      [ -f "$f" ] && cp "$f" "tests/fuzz/regress/$t/" && echo "   finding: tests/fuzz/regress/$t/$(basename "$f")" >&2
    done
    grep -E 'ERROR|runtime error|SUMMARY' "$log" | head -5 >&2
    echo "   log: $log" >&2
  fi
  table="$table$(printf '| %-12s | %10s | %8s | %6s | %8s |' "$t" "${execs:-?}" "${rate:-?}" "${cov:-?}" "$found")\n"
done
printf '| %-12s | %10s | %8s | %6s | %8s |\n' target executions "execs/s" edges findings
printf '|--------------|------------|----------|--------|----------|\n'
printf "%b" "$table"
exit $status
