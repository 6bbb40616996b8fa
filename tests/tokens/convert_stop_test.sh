#!/usr/bin/env bash
# tests/tokens/convert_stop_test.sh: `convert text` stopped or failing once it
# has begun writing shards leaves no partial set under its prefix (the tokens
# source's glob trained on part of the text without a word):
#   - a shard that cannot be written (its name taken by a folder, --force):
#     the shards written before it are removed and the error says so;
#   - Ctrl-C (SIGINT) while the shards are written: the process is frozen
#     (SIGSTOP) as soon as the first shard appears, sent SIGINT, then let go;
#     it stops at the next shard, removes what it wrote and says so;
#   - --out ending in '/' (a folder, no prefix) is refused before anything is written.
set -uo pipefail
convert="$PWD/tools/convert"
tmp="${TEST_TMPDIR:-$(mktemp -d)}"
cd "$tmp"
passed=0
failed=0
check() { # check NAME CONDITION-STATUS DETAIL
  if [ "$2" = 0 ]; then passed=$((passed + 1)); echo "ok: $1"; else failed=$((failed + 1)); echo "FAIL: $1: $3"; fi
}
mkdir -p in out
# 2.6 MB of text: with --shard-tokens 20000, about 120 training shards and 13 validation shards
python3 -c 'import random; r = random.Random(1); print(" ".join("".join(r.choice("etaoinshrdlu") for _ in range(r.randint(1, 9))) for _ in range(400000)))' > in/a.txt

# a shard whose name is a folder: rename fails there, after the validation shards and 4 training shards
mkdir -p out/f_train_000005.bin
rc=0
msg=$("$convert" text --input in/a.txt --out out/f --shard-tokens 20000 --force 2>&1) || rc=$?
left=$(ls out | grep -c '^f_.*\.bin$' || true)
[ "$rc" != 0 ] && [ "$left" = 1 ] && [ -d out/f_train_000005.bin ] && [[ "$msg" == *"Is a directory"* ]] &&
  [[ "$msg" =~ "removed the "[0-9]+" shards written under 'out/f'" ]]
check "a shard that cannot be written: the shards before it removed" $? "rc $rc, left $left: $msg"
rmdir out/f_train_000005.bin

# Ctrl-C while writing
"$convert" text --input in/a.txt --out out/s --shard-tokens 20000 > stop.log 2>&1 &
pid=$!
for _ in $(seq 3000); do [ -e out/s_val_000000.bin ] && break; sleep 0.005; done
kill -STOP "$pid" 2>/dev/null || true
written=$(ls out | grep -c '^s_train_.*\.bin$' || true)
kill -INT "$pid" 2>/dev/null || true
kill -CONT "$pid" 2>/dev/null || true
rc=0
wait "$pid" || rc=$?
left=$(ls out | grep -c '^s_' || true)
msg=$(cat stop.log)
if grep -q "wrote" stop.log; then
  check "Ctrl-C while writing (the conversion ended before the signal: no test)" 1 "all shards were written first"
else
  [ "$rc" != 0 ] && [ "$left" = 0 ] && [[ "$msg" == *"interrupted (Ctrl-C)"* ]] && [[ "$msg" == *"so that no partial set"* ]]
  check "Ctrl-C while writing: nothing left under the prefix ($written training shards written when stopped)" $? \
    "rc $rc, $left files left: $msg"
fi
# --out ending in a slash names no prefix: refused (it wrote '_train_000001.bin' into the folder)
rc=0
msg=$("$convert" text --input in/a.txt --out out/ 2>&1) || rc=$?
[ "$rc" != 0 ] && [[ "$msg" == *"--out 'out/' is a folder; it names the shards' prefix"* ]] && [ -z "$(ls out | grep '^_')" ]
check "--out as a folder is refused" $? "rc $rc: $msg"
# a folder of inputs: text files taken (a link to a file elsewhere too), and said what is left out: a hidden
# file, a binary one (NUL bytes: fortune's *.dat, an executable), a second name of a file taken, a sub-folder
mkdir -p fold/sub elsewhere
printf 'alpha beta gamma\n' > fold/a.txt
printf 'delta epsilon\n' > fold/b.md
printf 'zeta eta theta\n' > elsewhere/c.txt
ln -sf ../elsewhere/c.txt fold/c_link.txt
ln -sf a.txt fold/a.u8
printf 'hidden\n' > fold/.notes
printf 'bin\0ary' > fold/x.dat
printf 'in a sub-folder\n' > fold/sub/d.txt
rc=0
msg=$("$convert" text --input fold --out out/fold --val 0 2>&1) || rc=$?
[ "$rc" = 0 ] && [[ "$msg" == *"folder 'fold': 3 files taken; left out 1 hidden, 1 binary (NUL bytes: fold/x.dat), 1 second names of a file taken (links) and 1 sub-folders"* ]] &&
  [[ "$msg" == *"from 3 files"* ]]
check "a folder's text files taken, the rest said" $? "rc $rc: $msg"
# a binary file named on its own: refused
rc=0
msg=$("$convert" text --input fold/x.dat --out out/bin 2>&1) || rc=$?
[ "$rc" != 0 ] && [[ "$msg" == *"--input 'fold/x.dat' holds NUL bytes: a binary file, not text"* ]]
check "a binary --input refused" $? "rc $rc: $msg"
echo "[==========] $((passed + failed)) test(s) run."
[ "$failed" -eq 0 ] && echo "[  PASSED  ] $passed test(s)." || { echo "[  FAILED  ] $failed test(s), listed above"; exit 1; }
